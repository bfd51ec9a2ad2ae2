// DeepSpeed's model-states estimates (train/deepspeed_memory_estimate.h) against the tables
// DeepSpeed's own documentation prints (docs/code-docs/source/memory.rst: a 2851M-parameter model,
// 8 GPUs on one node, largest layer 32M) — but for one figure the docs took from an older formula
// (below) — and ZeroReport's figure walk (engine/zero_report.h): a report packed into numbers and
// unpacked is the same report, field by field.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <vector>

#include "engine/zero_report.h"
#include "models/model_registry.h"
#include "train/deepspeed_memory_estimate.h"

namespace dstrain {
namespace {

TEST(DeepSpeedEstimate, Zero2AsDeepSpeedsDocsPrintIt) {
  // The docs print 15.93GB per GPU without offload, from an older DeepSpeed's 4N + 16N/G; 0.19.6's
  // stage_1_and_2.py computes 2N + 18N/G (16-bit params, 16-bit and fp32 grads, fp32 masters and
  // Adam's two moments partitioned): 11.28GB.
  const auto rows = deepspeed_zero2_estimates(2851e6, 8, 1);
  const std::string table = format_deepspeed_estimates(rows, 2851e6, 0, 8, 1, false);
  EXPECT_EQ(table,
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 2851M total params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "  127.45GB |   5.31GB | offload_optimizer=cpu \n"
            "  127.45GB |  11.28GB | offload_optimizer=none\n");
}

TEST(DeepSpeedEstimate, Zero3AsDeepSpeedsDocsPrintIt) {
  const auto rows = deepspeed_zero3_estimates(2851e6, 32e6, 8, 1);
  EXPECT_EQ(format_deepspeed_estimates(rows, 2851e6, 32e6, 8, 1, true, 2),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 2851M total params, 32M largest layer params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
            "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
            "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1  <- this config\n"
            "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
            "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
            "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
  // Two nodes: the GPU count and the per-node share change (a = 1/2), as DeepSpeed's formulas say.
  const auto two = deepspeed_zero3_estimates(1e9, 1e7, 4, 2);
  EXPECT_DOUBLE_EQ(two[0].cpu_bytes, 1e9 * 18 * 0.5 * 1.5);
  EXPECT_DOUBLE_EQ(two[2].gpu_bytes, 4e7 + 250000000.0);  // 4L + ⌊2N/8⌋
}

// DeepSpeed's largest_layer_params is the most parameters one module holds itself: GPT-2's
// embedding table (wte, the padded vocabulary rows dstrain stores), Llama's embed_tokens.
TEST(DeepSpeedEstimate, LargestModuleOfTheModelTree) {
  EXPECT_EQ(largest_module_params(model_architecture("gpt2:d12")->forward_flops(1, 1)), 50304 * 768);
  EXPECT_EQ(largest_module_params(model_architecture("llama:L2-C64-H4-I512-V100-T16")->forward_flops(1, 1)), 512 * 64);  // an MLP matrix
}

TEST(ZeroReport, FiguresPackAndUnpackAsTheSameReport) {
  ZeroReport r;
  double next = 1.0;
  std::size_t fields = 0;
  for_each_figure(r, [&](auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    if constexpr (std::is_enum_v<T>) {
      field = StateHome::nvme;
    } else {
      field = static_cast<T>(next);
    }
    next += 1.0;
    ++fields;
  });
  // Every figure of the struct is walked: 3 ints, 5 byte counts, the home, 3 x kNumMemoryPurposes,
  // 2 x 3 I/O figures, 2 element counts, hpZ's secondary bytes, 3 x kCollectiveKinds comm counters
  // (bytes, calls, cross-node bytes).
  EXPECT_EQ(fields, 3 + 5 + 1 + 3 * kNumMemoryPurposes + 6 + 2 + 1 + 3 * static_cast<std::size_t>(kCollectiveKinds));
  EXPECT_EQ(r.stage, 1);
  EXPECT_EQ(r.optimizer_home, StateHome::nvme);
  EXPECT_EQ(r.step_comm.cross_node_bytes.back(), static_cast<std::uint64_t>(fields));
  std::vector<double> packed;
  for_each_figure(static_cast<const ZeroReport&>(r), [&](const auto& field) {
    if constexpr (std::is_enum_v<std::remove_cvref_t<decltype(field)>>) {
      packed.push_back(static_cast<double>(static_cast<int>(field)));
    } else {
      packed.push_back(static_cast<double>(field));
    }
  });
  ZeroReport back;
  const double* f = packed.data();
  for_each_figure(back, [&](auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    if constexpr (std::is_enum_v<T>) {
      field = static_cast<T>(static_cast<int>(*f++));
    } else {
      field = static_cast<T>(*f++);
    }
  });
  EXPECT_EQ(back.rank, r.rank);
  EXPECT_EQ(back.peak_gathered_param_elements, r.peak_gathered_param_elements);
  EXPECT_EQ(back.nvme_bytes, r.nvme_bytes);
  EXPECT_DOUBLE_EQ(back.train_io.wait_seconds, r.train_io.wait_seconds);
  EXPECT_EQ(back.optimizer_home, StateHome::nvme);
  EXPECT_EQ(back.step_comm.bytes, r.step_comm.bytes);
}

}  // namespace
}  // namespace dstrain
