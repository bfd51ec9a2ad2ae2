// Optimizer offload to host memory (zero_optimization.offload_optimizer.device "cpu",
// docs/training_state.md §3): the rank's optimizer partition — the fp32 masters, kept apart from
// the params even in fp32 training, and the optimizer's states — lives in the engine's host
// allocator instead of the training device's.
//
// The contract checked here:
//   - equivalence: on the CPU device an offloaded run computes exactly what the same run without
//     offload computes (the same CPU optimizer kernel on the same fp32 values; a kept-apart fp32
//     master copied into fp32 params changes no bit), so losses, gradient norms and the final
//     masters are equal bit for bit — stages 1-3 × world 1, 2 in fp32 and bf16, with sub-groups
//     small enough that the step visits several;
//   - memory: the device allocator holds no optimizer bytes, the host allocator holds the masters
//     and both Adam moments of the rank's partition (3 fp32 copies of Ψ/W, the formula of
//     zero/model_states.h with the masters apart), and params and grads stay on the device as
//     without offload;
//   - the config rules: DeepSpeed's deprecated `cpu_offload: true` offloads the same way; "nvme"
//     at stages 1-2 behaves as "cpu" (DeepSpeed swaps to NVMe only at stage 3); at stage 0 the
//     block is ignored, as DeepSpeed ignores it: the run is the run without it, state on the device.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/gpt2/gpt2_family.h"
#include "train/memory_estimate.h"
#include "ops/error.h"
#include "zero/state_store.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

constexpr const char* kOffloadCpu = R"("offload_optimizer": {"device": "cpu", "pin_memory": true})";

RunSpec offload_run(int stage, int world, Precision p, const std::string& offload) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.gas = 2;
  s.precision = p;
  s.steps = 3;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.sub_group_size = 5000;  // several sub-groups per rank: the step's loop over the store
  s.knobs.zero_extra_json = offload;
  return s;
}

// Ψ/W: the rank's shard of every layer's padded flat buffer (zero/flat_layout.h), in elements.
std::uint64_t shard_elements(int world, Precision p) {
  std::uint64_t n = 0;
  for (const auto& layer : model_specs()) n += static_cast<std::uint64_t>(padded_numel(layer, world, storage_bytes(p)));
  return n / static_cast<std::uint64_t>(world);
}

using Combo = std::tuple<int, int, Precision>;  // stage, world, precision

class OptimizerOffload : public ::testing::TestWithParam<Combo> {};

TEST_P(OptimizerOffload, EqualsTheRunWithoutOffloadBitForBit) {
  const auto [stage, world, prec] = GetParam();
  const RunResult plain = run_zero(offload_run(stage, world, prec, ""));
  const RunResult off = run_zero(offload_run(stage, world, prec, kOffloadCpu));
  ASSERT_EQ(off.ranks.size(), plain.ranks.size());
  for (std::size_t r = 0; r < off.ranks.size(); ++r) {
    SCOPED_TRACE(testing::Message() << "rank " << r);
    const RankResult& a = off.ranks[r];
    const RankResult& b = plain.ranks[r];
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.grad_norms, b.grad_norms);
    EXPECT_EQ(a.skipped_steps, b.skipped_steps);
    ASSERT_EQ(a.params.size(), b.params.size());
    for (const auto& [name, values] : b.params) {
      ASSERT_TRUE(a.params.count(name)) << name;
      EXPECT_EQ(a.params.at(name), values) << name;
    }
  }
  // The run trained: the parameters moved and the losses are finite.
  for (float l : off.r0().losses) EXPECT_TRUE(std::isfinite(l));
}

TEST_P(OptimizerOffload, DeviceHoldsNoOptimizerBytes) {
  const auto [stage, world, prec] = GetParam();
  const RunResult plain = run_zero(offload_run(stage, world, prec, ""));
  const RunResult off = run_zero(offload_run(stage, world, prec, kOffloadCpu));
  // Adam's exp_avg and exp_avg_sq, plus the fp32 masters, which offload keeps apart from the params
  // in fp32 training too (docs/training_state.md §1).
  const std::uint64_t expected_host = 3 * 4 * shard_elements(world, prec);
  for (std::size_t r = 0; r < off.ranks.size(); ++r) {
    SCOPED_TRACE(testing::Message() << "rank " << r);
    const RankResult& a = off.ranks[r];
    const RankResult& b = plain.ranks[r];
    EXPECT_EQ(a.report.optimizer_bytes, 0u);
    EXPECT_EQ(a.memory[MemoryPurpose::optimizer].current, 0u);
    EXPECT_EQ(a.memory[MemoryPurpose::optimizer].peak, 0u);
    EXPECT_EQ(a.report.host_optimizer_bytes, expected_host);
    EXPECT_EQ(a.host_memory[MemoryPurpose::optimizer].current, expected_host);
    // Without offload the same partition is on the device and nothing on the host.
    EXPECT_EQ(b.report.host_optimizer_bytes, 0u);
    EXPECT_EQ(b.report.optimizer_bytes, (prec == Precision::fp32 ? 2 : 3) * 4 * shard_elements(world, prec));
    // Params and grads stay on the training device, as without offload.
    EXPECT_EQ(a.report.param_bytes, b.report.param_bytes);
    EXPECT_EQ(a.report.grad_bytes, b.report.grad_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, OptimizerOffload,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2), ::testing::Values(Precision::fp32, Precision::bf16)),
                         [](const auto& pinfo) {
                           return fmt::format("Stage{}_W{}_{}", std::get<0>(pinfo.param), std::get<1>(pinfo.param),
                                              precision_name(std::get<2>(pinfo.param)));
                         });

// DeepSpeed's deprecated boolean `cpu_offload: true` means offload_optimizer {device: cpu}
// (docs/config.md §5), and "nvme" below stage 3 behaves as "cpu" (its ZeRO-1/2 optimizer swaps
// nothing to NVMe): both train with the partition in host memory, as "cpu" does.
TEST(OptimizerOffloadConfig, DeprecatedCpuOffloadAndNvmeBelowStage3OffloadToHost) {
  const RunResult cpu = run_zero(offload_run(2, 2, Precision::fp32, kOffloadCpu));
  for (const std::string& zero_json :
       {std::string(R"("cpu_offload": true)"), std::string(R"("offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"})")}) {
    SCOPED_TRACE(zero_json);
    const RunResult run = run_zero(offload_run(2, 2, Precision::fp32, zero_json));
    for (std::size_t r = 0; r < run.ranks.size(); ++r) {
      EXPECT_EQ(run.ranks[r].report.optimizer_bytes, 0u);
      EXPECT_EQ(run.ranks[r].report.host_optimizer_bytes, cpu.ranks[r].report.host_optimizer_bytes);
      EXPECT_EQ(run.ranks[r].losses, cpu.ranks[r].losses);
    }
  }
}

// The pre-flight's lower bound (train/memory_estimate.h) counts the masters offload keeps apart:
// in fp32 the optimizer's share grows from the two moments (8Ψ/W) to 12Ψ/W; in bf16 the masters
// were already apart.
TEST(OptimizerOffloadConfig, MemoryEstimateCountsTheMastersKeptApart) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    const auto estimate = [&](const std::string& offload) {
      config::ConfigOptions copts;
      copts.world_size = 2;
      const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(offload_run(2, 2, p, offload))), copts);
      return estimate_rank_memory(Gpt2Architecture(model_config(0.0f)), c, kT);
    };
    const MemoryEstimate plain = estimate(""), off = estimate(kOffloadCpu);
    const double psi = plain.parameters;
    EXPECT_DOUBLE_EQ(plain.optimizer, (p == Precision::fp32 ? 8.0 : 12.0) * psi / 2);
    EXPECT_DOUBLE_EQ(off.optimizer, 12.0 * psi / 2);
    EXPECT_DOUBLE_EQ(off.params, plain.params);
    EXPECT_DOUBLE_EQ(off.grads, plain.grads);
  }
}

// offload_optimizer.device "nvme" at stage 3 (docs/offload.md §5): the partition in swap files,
// buffer_count sub-groups in host memory. The same CPU optimizer kernel on the same values as "cpu"
// offload, so the runs are equal bit for bit; the device holds no optimizer bytes, the host only
// the buffers, and the swap folder is gone at the end.
TEST(OptimizerOffloadNvme, Stage3EqualsCpuOffloadBitForBitWithOnlyBuffersInMemory) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_nvme_offload_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = nlohmann::json(dir.string()).dump();
  // Synchronous (DeepSpeed's defaults) and pipelined (read ahead, write behind): the same values.
  const std::string nvme_sync = R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "nvme_path": )" + path + "}";
  const std::string nvme_pipe = R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "pipeline_read": true, )"
                                R"("pipeline_write": true, "nvme_path": )" +
                                path + "}";
  // Sub-groups of 1000 elements: each rank's partition is many of them, cycled through 2 buffers.
  const auto run = [](int world, Precision p, const std::string& offload) {
    RunSpec s = offload_run(3, world, p, offload);
    s.knobs.sub_group_size = 1000;
    return s;
  };
  for (const int world : {1, 2}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      for (const std::string& nvme : {nvme_sync, nvme_pipe}) {
        SCOPED_TRACE(testing::Message() << "world " << world << " " << precision_name(p) << " " << nvme);
        const RunResult cpu = run_zero(run(world, p, kOffloadCpu));
        const RunResult off = run_zero(run(world, p, nvme));
        ASSERT_EQ(off.ranks.size(), cpu.ranks.size());
        for (std::size_t r = 0; r < off.ranks.size(); ++r) {
          const RankResult& a = off.ranks[r];
          const RankResult& b = cpu.ranks[r];
          EXPECT_EQ(a.losses, b.losses);
          EXPECT_EQ(a.grad_norms, b.grad_norms);
          for (const auto& [name, values] : b.params) EXPECT_EQ(a.params.at(name), values) << name;
          EXPECT_EQ(a.report.optimizer_bytes, 0u);
          // 2 buffers of one sub-group (<= 1000 fp32, padded to 4096 bytes) for each of master,
          // exp_avg, exp_avg_sq: far less than the partition "cpu" holds.
          const std::uint64_t buffers = 2 * 3 * ((1000 * 4 + 4095) / 4096 * 4096);
          EXPECT_GT(a.host_memory[MemoryPurpose::optimizer].peak, 0u);
          EXPECT_LE(a.host_memory[MemoryPurpose::optimizer].peak, buffers);
          EXPECT_EQ(b.host_memory[MemoryPurpose::optimizer].current, 3 * 4 * shard_elements(world, p));
          EXPECT_LT(buffers, 3 * 4 * shard_elements(world, p)) << "the partition fits the buffers: nothing is swapped";
        }
      }
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "dstrain_swap")) << "swap files left behind";
  std::filesystem::remove_all(dir);
}

// The offload figures of ZeroReport (docs/offload.md §9) against the formula. Sub-groups of 1024
// elements (4096 bytes: no padding but the last group's) cycled through 2 buffers: every step
// misses every group, so it reads and writes each of master, exp_avg, exp_avg_sq once —
// ceil(Ψ/W / 1024) · 4096 bytes each, the swap files' size. "cpu" offload moves nothing to NVMe.
TEST(OptimizerOffloadNvme, ReportsTheBytesHeldAndMovedPerStep) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_nvme_report_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = nlohmann::json(dir.string()).dump();
  const std::string nvme_sync = R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "nvme_path": )" + path + "}";
  const std::string nvme_pipe = R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "pipeline_read": true, )"
                                R"("pipeline_write": true, "nvme_path": )" +
                                path + "}";
  constexpr std::uint64_t kSubGroup = 1024;
  for (const int world : {1, 2}) {
    for (const std::string& nvme : {nvme_sync, nvme_pipe}) {
      SCOPED_TRACE(testing::Message() << "world " << world << " " << nvme);
      RunSpec s = offload_run(3, world, Precision::bf16, nvme);
      s.knobs.sub_group_size = static_cast<std::int64_t>(kSubGroup);
      const RunResult run = run_zero(s);
      const std::uint64_t shard = shard_elements(world, Precision::bf16);
      const std::uint64_t partition = 3 * ((shard + kSubGroup - 1) / kSubGroup) * 4096;  // 3 buffers' swap files
      ASSERT_GT(shard, 4 * kSubGroup) << "too few sub-groups to cycle through the buffers";
      for (const RankResult& r : run.ranks) {
        const ZeroReport& z = r.report;
        const auto at = [](const auto& bytes, MemoryPurpose p) { return bytes[static_cast<std::size_t>(p)]; };
        EXPECT_EQ(z.optimizer_home, StateHome::nvme);
        EXPECT_EQ(at(z.nvme_bytes, MemoryPurpose::optimizer), partition);
        EXPECT_EQ(at(z.device_bytes, MemoryPurpose::optimizer), 0u);
        EXPECT_EQ(at(z.host_bytes, MemoryPurpose::optimizer), 2 * 3 * kSubGroup * 4);  // the 2 buffers
        EXPECT_EQ(at(z.device_bytes, MemoryPurpose::params), z.param_bytes);
        EXPECT_EQ(z.step_io.bytes_read, partition);
        EXPECT_EQ(z.step_io.bytes_written, partition);
        EXPECT_EQ(z.train_io.bytes_written, static_cast<std::uint64_t>(s.steps) * partition);
        // Step 1 may find the last groups initialisation wrote still in the buffers.
        EXPECT_LE(z.train_io.bytes_read, static_cast<std::uint64_t>(s.steps) * partition);
        EXPECT_GE(z.train_io.bytes_read, static_cast<std::uint64_t>(s.steps) * partition - 2 * 3 * kSubGroup * 4);
        EXPECT_GE(z.step_io.wait_seconds, 0.0);
        EXPECT_GE(z.train_io.wait_seconds, z.step_io.wait_seconds);
      }
    }
  }
  std::filesystem::remove_all(dir);
  const RunResult cpu = run_zero(offload_run(3, 2, Precision::bf16, kOffloadCpu));
  for (const RankResult& r : cpu.ranks) {
    const ZeroReport& z = r.report;
    EXPECT_EQ(z.optimizer_home, StateHome::host);
    for (std::uint64_t b : z.nvme_bytes) EXPECT_EQ(b, 0u);
    EXPECT_EQ(z.step_io.bytes_read + z.step_io.bytes_written + z.train_io.bytes_read + z.train_io.bytes_written, 0u);
    EXPECT_EQ(z.train_io.wait_seconds, 0.0);
    EXPECT_EQ(z.host_bytes[static_cast<std::size_t>(MemoryPurpose::optimizer)], 3 * 4 * shard_elements(2, Precision::bf16));
  }
}

std::string engine_error(const std::string& zero_json) {
  try {
    initialize(make_gpt2_model("gpt2:tiny"),
               ds(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                                  "zero_optimization": {)" +
                  zero_json + "}}"),
               {.sequence_length = 8});
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// What is refused names the key and the fix, before step 1; `check-config` gives the same message
// (check_engine_trains runs the same rules).
TEST(OptimizerOffloadConfig, RefusesWhatIsNotTrainedNamingTheKey) {
  EXPECT_EQ(engine_error(R"("stage": 1, "offload_optimizer": {"device": "cpu"})"), "<no error>");
  EXPECT_EQ(engine_error(R"("stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": false})"), "<no error>");
  // "nvme" at stage 3 trains (the NVMe store, below); a missing nvme_path is named before step 1.
  EXPECT_EQ(engine_error(R"("stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"})"), "<no error>");
  const std::string missing = engine_error(R"("stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/dstrain-no-such-folder"})");
  EXPECT_NE(missing.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos) << missing;
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  // Partial offload trains with Adam / AdamW (DeepSpeed's twin-flow needs its CPU Adam), below.
  EXPECT_EQ(engine_error(R"("stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5})"), "<no error>");
}

// DeepSpeed builds no ZeRO optimizer at stage 0, so it never reads offload_optimizer there (its
// engine takes the basic-optimizer path); the block is ignored, with a warning from the config
// layer. The run is the run without the block, bit for bit, with the optimizer state on the device.
TEST(OptimizerOffloadConfig, StageZeroIgnoresTheBlockAsDeepSpeedDoes) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(testing::Message() << "bf16 " << (p == Precision::bf16));
    const RunResult plain = run_zero(offload_run(0, 1, p, ""));
    const RunResult off = run_zero(offload_run(0, 1, p, kOffloadCpu));
    const RankResult &a = off.r0(), &b = plain.r0();
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.grad_norms, b.grad_norms);
    for (const auto& [name, values] : b.params) EXPECT_EQ(a.params.at(name), values) << name;
    EXPECT_GT(a.memory[MemoryPurpose::optimizer].current, 0u);
    EXPECT_EQ(a.memory[MemoryPurpose::optimizer].current, b.memory[MemoryPurpose::optimizer].current);
    EXPECT_EQ(a.host_memory[MemoryPurpose::optimizer].current, 0u);
    EXPECT_EQ(a.report.optimizer_home, StateHome::device);
  }
}

// offload_optimizer.ratio < 1 (partial offload, DeepSpeed's "ZeRO-Offload++" twin-flow;
// docs/offload.md §7): of the N sub-groups of the rank's optimizer partition, the first
// int((1 - ratio) * N) stay on the training device and the rest are offloaded, as DeepSpeed's
// stage3.py assigns them. The same optimizer kernel on the same values: bit for bit the run without
// offload in fp32 (and in bf16), world 1 and 2; the device holds exactly the device share's masters
// and moments, the host the rest.
TEST(OptimizerOffloadRatio, KeepsTheFirstSubGroupsOnTheDeviceBitForBit) {
  for (const int world : {1, 2}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      const RunResult plain = run_zero(offload_run(3, world, p, ""));
      const std::vector<FlatRange> groups = StateStoreLayout::cut(static_cast<std::int64_t>(shard_elements(world, p)), 5000);
      ASSERT_GE(groups.size(), 4u) << "the test needs several sub-groups";
      for (const double ratio : {0.0, 0.3, 0.5, 0.9}) {
        SCOPED_TRACE(testing::Message() << "world " << world << " " << precision_name(p) << " ratio " << ratio);
        const RunResult off = run_zero(offload_run(3, world, p, fmt::format(R"("offload_optimizer": {{"device": "cpu", "ratio": {}}})", ratio)));
        // DeepSpeed: sub-group i goes to the CPU when i >= int((1 - ratio) * N).
        const std::size_t on_device =
            std::min(groups.size(), static_cast<std::size_t>(std::trunc((1.0 - ratio) * static_cast<double>(groups.size()))));
        const std::uint64_t device_elems = on_device > 0 ? static_cast<std::uint64_t>(groups[on_device - 1].end) : 0;
        ASSERT_EQ(off.ranks.size(), plain.ranks.size());
        for (std::size_t r = 0; r < off.ranks.size(); ++r) {
          const RankResult& a = off.ranks[r];
          const RankResult& b = plain.ranks[r];
          EXPECT_EQ(a.losses, b.losses);
          EXPECT_EQ(a.grad_norms, b.grad_norms);
          for (const auto& [name, values] : b.params) EXPECT_EQ(a.params.at(name), values) << name;
          // masters + exp_avg + exp_avg_sq, split at the sub-group boundary.
          EXPECT_EQ(a.report.optimizer_bytes, 3 * 4 * device_elems);
          EXPECT_EQ(a.host_memory[MemoryPurpose::optimizer].current, 3 * 4 * (shard_elements(world, p) - device_elems));
        }
        if (ratio == 0.5) {
          EXPECT_EQ(on_device, groups.size() / 2);
        }
        if (ratio == 0.0) {
          EXPECT_EQ(on_device, groups.size());
        }
      }
    }
  }
}

// With "nvme" the offloaded share is the NVMe store of the sub-groups after the device share.
TEST(OptimizerOffloadRatio, NvmeShareEqualsTheRunWithoutOffload) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_ratio_nvme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    const RunResult plain = run_zero(offload_run(3, 2, p, ""));
    const RunResult off = run_zero(offload_run(3, 2, p,
                                               R"("offload_optimizer": {"device": "nvme", "ratio": 0.5, "buffer_count": 2, "nvme_path": )" +
                                                   nlohmann::json(dir.string()).dump() + "}"));
    for (std::size_t r = 0; r < off.ranks.size(); ++r) {
      EXPECT_EQ(off.ranks[r].losses, plain.ranks[r].losses);
      for (const auto& [name, values] : plain.ranks[r].params) EXPECT_EQ(off.ranks[r].params.at(name), values) << name;
      EXPECT_GT(off.ranks[r].report.optimizer_bytes, 0u);
      EXPECT_LT(off.ranks[r].report.optimizer_bytes, plain.ranks[r].report.optimizer_bytes + 4 * shard_elements(2, p));
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "dstrain_swap")) << "swap files left behind";
  std::filesystem::remove_all(dir);
}

TEST(OptimizerOffloadRatio, NeedsAdamAsDeepSpeedsTwinFlowDoes) {
  const std::string sgd = [] {
    try {
      initialize(make_gpt2_model("gpt2:tiny"),
                 ds(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 1e-3, "momentum": 0.9}},
                        "zero_allow_untested_optimizer": true,
                        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})"),
                 {.sequence_length = 8});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  }();
  EXPECT_NE(sgd.find("zero_optimization.offload_optimizer.ratio"), std::string::npos) << sgd;
  EXPECT_NE(sgd.find("Adam"), std::string::npos) << sgd;
}

}  // namespace
}  // namespace dstrain

namespace dstrain {
namespace {

using namespace zero_testing;

// The pre-flight's estimate places the offloaded shares where the engine's stores put them
// (train/memory_estimate.h, docs/offload.md §11), checked against the allocators' counts of real
// runs: ratio < 1 splits the optimizer at the same sub-group boundary as SplitStateStore, "nvme"
// keeps buffer_count sub-groups of every state in host memory (the store rounds each to 4096 bytes)
// and the rest in swap files, and offload_param "cpu" takes the params off the device. The estimate
// counts Ψ from the model's shape, the engine pads each layer: the tolerance is the padding.
TEST(OptimizerOffloadEstimate, PlacesTheOffloadedSharesAsTheAllocatorsCountThem) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_estimate_nvme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = nlohmann::json(dir.string()).dump();
  for (const int world : {1, 2}) {
    for (const std::string& offload : {std::string(R"("offload_optimizer": {"device": "cpu", "ratio": 0.5})"),
                                       std::string(R"("offload_optimizer": {"device": "cpu", "ratio": 0.3})"),
                                       R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "nvme_path": )" + path + "}",
                                       R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "ratio": 0.5, "nvme_path": )" + path + "}",
                                       std::string(R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})")}) {
      SCOPED_TRACE(testing::Message() << "world " << world << " " << offload);
      const RunSpec s = offload_run(3, world, Precision::fp32, offload);
      const RunResult run = run_zero(s);
      config::ConfigOptions copts;
      copts.world_size = world;
      const MemoryEstimate e =
          estimate_rank_memory(Gpt2Architecture(model_config(0.0f)), config::parse_ds_config(config::Json::parse(zero_config_json(s)), copts), kT);
      const double padding = static_cast<double>(shard_elements(world, Precision::fp32)) - e.parameters / world;
      ASSERT_GE(padding, 0.0);
      const double tolerance = 12.0 * padding;  // fp32 masters are the params here; + exp_avg + exp_avg_sq
      for (const RankResult& r : run.ranks) {
        const ZeroReport& z = r.report;
        const auto opt = static_cast<std::size_t>(MemoryPurpose::optimizer);
        EXPECT_NEAR(e.optimizer_device, static_cast<double>(z.optimizer_bytes), tolerance);
        // The swap files round each sub-group of each state up to 4096 bytes (docs/offload.md §5).
        const double offloaded_groups = std::ceil(e.optimizer_nvme / (12.0 * 4992.0));
        EXPECT_LE(e.optimizer_nvme, static_cast<double>(z.nvme_bytes[opt]) + tolerance);
        EXPECT_GE(e.optimizer_nvme + 3 * 4096.0 * offloaded_groups, static_cast<double>(z.nvme_bytes[opt]));
        if (e.optimizer_nvme > 0.0) {
          // 2 slots x 3 states, each rounded up to 4096 bytes.
          EXPECT_LE(e.optimizer_host, static_cast<double>(z.host_bytes[opt]));
          EXPECT_GE(e.optimizer_host + 2 * 3 * 4096.0, static_cast<double>(z.host_bytes[opt]));
          EXPECT_GT(e.optimizer_host, 0.0);
        } else {
          EXPECT_NEAR(e.optimizer_host, static_cast<double>(z.host_bytes[opt]), tolerance);
        }
        const auto par = static_cast<std::size_t>(MemoryPurpose::params);
        if (offload.find("offload_param") != std::string::npos) {
          EXPECT_EQ(e.params_device, 0.0);
          EXPECT_NEAR(e.params_host, e.params, 0.0);
          // On the cpu device the host store may share the training allocator: either count.
          EXPECT_LE(e.params_host, static_cast<double>(z.host_bytes[par] + z.device_bytes[par]));
        } else {
          EXPECT_EQ(e.params_host, 0.0);
        }
        // per_rank() is what is in memory: the swap files' bytes are not.
        EXPECT_DOUBLE_EQ(e.per_rank(), e.params_device + e.params_host + e.grads + e.optimizer_device + e.optimizer_host + e.activations);
        EXPECT_DOUBLE_EQ(e.device() + e.host(), e.per_rank());
      }
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dstrain
