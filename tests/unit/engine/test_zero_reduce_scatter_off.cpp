// ZeRO with reduce_scatter: false (DeepSpeed's all-reduce path) trains like one rank with the same
// global batch (the full stage x world x dtype matrix is in test_zero_equivalence.cpp).
#include <cmath>
#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "zero/local_communicator.h"

namespace dstrain {
namespace {
using namespace engine_testing;

struct TrainRun {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

TrainRun train(int stage, int world, int gas, const std::string& precision, bool ckpt, int steps, bool reduce_scatter = true) {
  const std::string cfg = fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {},
     "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "weight_decay": 0.1}}}}, "gradient_clipping": 1.0,
     "zero_optimization": {{"stage": {}, "reduce_bucket_size": 3000, "stage3_prefetch_bucket_size": 5000,
       "stage3_param_persistence_threshold": 2000, "overlap_comm": {}, "reduce_scatter": {}}} {} }})",
                                      gas, stage, world > 1 && stage % 2 == 1 ? "true" : "false", reduce_scatter ? "true" : "false",
                                      precision == "fp32" ? "" : precision == "bf16" ? R"(, "bf16": {"enabled": true})" : R"(, "fp16": {"enabled": true, "initial_scale_power": 8})");
  TrainRun out;
  std::mutex mu;
  run_local_ranks(world, [&](Communicator& comm) {
    config::ConfigOptions opts;
    opts.world_size = world;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(cfg), opts);
    Engine e = initialize(make_gpt2_model("gpt2:L2-C32-H2-V96-T16"), c, {.seed = 7, .comm = &comm, .sequence_length = 16, .checkpoint_activations = ckpt});
    for (int s = 0; s < steps; ++s) {
      for (int m = 0; m < gas; ++m) {
        Tokens t = random_tokens(2, 16, 96, static_cast<std::uint32_t>(1000 * s + m * world + comm.rank()));
        e.forward(t.batch());
        e.backward();
        e.step();
      }
      if (comm.rank() == 0) out.losses.push_back(e.last_step_loss());
    }
    e.gather_master_params([&](const std::string& n, const Tensor& t) {
      if (comm.rank() != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      out.params[n] = values(t);
    });
  });
  return out;
}

// reduce_scatter: false all-reduces the gradients instead (DeepSpeed's option): same result, and
// the all-reduce counters, not the reduce-scatter ones, carry the traffic.
TEST(ZeroReduceScatterOff, AllReduceInsteadOfReduceScatter) {
  const TrainRun ref = train(0, 1, 2, "fp32", false, 2);
  for (int stage = 1; stage <= 3; ++stage) {
    const TrainRun r = train(stage, 2, 1, "fp32", false, 2, false);
    for (const auto& [n, v] : ref.params) {
      const auto& w = r.params.at(n);
      for (std::size_t k = 0; k < v.size(); ++k) ASSERT_NEAR(v[k], w[k], 1e-4) << n << " stage " << stage;
    }
  }
}

}  // namespace
}  // namespace dstrain
