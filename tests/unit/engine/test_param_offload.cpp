// Parameter offload at ZeRO stage 3 (zero_optimization.offload_param, docs/offload.md §6): the
// rank's storage-dtype parameter partition — every partitioned layer's shard — lives in host memory
// ("cpu") or in a swap file ("nvme", buffer_count host buffers of buffer_size elements, the first
// max_in_cpu elements kept in host memory), and each layer's shard is fetched ahead of its
// all-gather; the updated shards are written back after the optimizer step.
//
// The contract checked here:
//   - equivalence: the same CPU kernels on the same values, the shard only moved (copied, written
//     and read back bit for bit), so an offloaded run's losses, gradient norms and final masters
//     equal the run without offload_param bit for bit — fp32 and bf16, world 1 and 2, cpu and nvme,
//     with and without offload_optimizer, with gradient accumulation;
//   - memory: between steps the device allocator holds no parameter bytes (every layer is
//     partitioned here); "cpu" holds the shards in the host allocator, "nvme" at most
//     buffer_count buffers plus what max_in_cpu keeps;
//   - bad input is named before step 1 (stage below 3, buffer_size smaller than a shard, nvme_path
//     missing or on tmpfs); an injected read error is a named Error, not a crash or a hang.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint_manager.h"
#include "ops/error.h"
#include "zero_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace zero_testing;

// This rank's shard of every layer (all partitioned: persistence threshold 0), in elements; and the
// largest one.
std::int64_t shard_total(int world, Precision p) {
  std::int64_t n = 0;
  for (const auto& layer : model_specs()) n += padded_numel(layer, world, storage_bytes(p)) / world;
  return n;
}
std::int64_t largest_shard(int world, Precision p) {
  std::int64_t n = 0;
  for (const auto& layer : model_specs()) n = std::max(n, padded_numel(layer, world, storage_bytes(p)) / world);
  return n;
}

RunSpec param_run(int world, Precision p, const std::string& zero_json) {
  RunSpec s;
  s.stage = 3;
  s.world = world;
  s.gas = 2;
  s.precision = p;
  s.steps = 3;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.sub_group_size = 5000;        // several sub-groups: a layer's shard may straddle two
  s.knobs.persistence_threshold = 0;    // every layer partitioned: every shard offloaded
  s.knobs.prefetch_bucket_size = 4000;  // a few layers ahead: the reads run ahead of the gathers
  s.knobs.zero_extra_json = zero_json;
  return s;
}

struct SwapDir {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_param_offload_" + std::to_string(::getpid()));
  SwapDir() { std::filesystem::create_directories(dir); }
  ~SwapDir() { std::filesystem::remove_all(dir); }
  std::string json() const { return nlohmann::json(dir.string()).dump(); }
};

std::string nvme_param(const SwapDir& d, std::int64_t buffer_size, std::int64_t max_in_cpu, int buffer_count = 2) {
  return R"("offload_param": {"device": "nvme", "nvme_path": )" + d.json() + R"(, "buffer_count": )" + std::to_string(buffer_count) +
         R"(, "buffer_size": )" + std::to_string(buffer_size) + R"(, "max_in_cpu": )" + std::to_string(max_in_cpu) + "}";
}

void expect_same_run(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    SCOPED_TRACE(testing::Message() << "rank " << r);
    EXPECT_EQ(a.ranks[r].losses, b.ranks[r].losses);
    EXPECT_EQ(a.ranks[r].grad_norms, b.ranks[r].grad_norms);
    ASSERT_EQ(a.ranks[r].params.size(), b.ranks[r].params.size());
    for (const auto& [name, values] : b.ranks[r].params) EXPECT_EQ(a.ranks[r].params.at(name), values) << name;
  }
  for (float l : a.r0().losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(ParamOffload, EqualsTheRunWithoutItBitForBitAndTheDeviceHoldsNoParameterPartition) {
  const SwapDir d;
  for (const int world : {1, 2}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      const std::uint64_t s = storage_bytes(p);
      const std::int64_t largest = largest_shard(world, p);
      const std::uint64_t shards_bytes = static_cast<std::uint64_t>(shard_total(world, p)) * s;
      const std::uint64_t slot_bytes = (static_cast<std::uint64_t>(largest) * s + 4095) / 4096 * 4096;
      for (const std::string& opt : {std::string(), std::string(R"("offload_optimizer": {"device": "cpu"}, )")}) {
        const RunResult plain = run_zero(param_run(world, p, opt.empty() ? "" : opt.substr(0, opt.size() - 2)));
        // Every layer's shard is in the store with offload_param; the plain run keeps them on the device.
        for (const RankResult& r : plain.ranks) EXPECT_EQ(r.memory[MemoryPurpose::params].current, shards_bytes);
        struct Variant {
          std::string name, json;
        };
        const std::vector<Variant> variants{
            {"cpu", R"("offload_param": {"device": "cpu", "pin_memory": true})"},
            {"nvme, all swapped", nvme_param(d, largest, 0)},
            {"nvme, one buffer", nvme_param(d, largest, 0, 1)},
            {"nvme, most in cpu", nvme_param(d, largest, shard_total(world, p) - 1)},
        };
        for (const Variant& v : variants) {
          SCOPED_TRACE(testing::Message() << "world " << world << " " << precision_name(p) << " " << opt << v.name);
          const RunResult off = run_zero(param_run(world, p, opt + v.json));
          expect_same_run(off, plain);
          for (const RankResult& r : off.ranks) {
            EXPECT_EQ(r.memory[MemoryPurpose::params].current, 0u) << "parameter partition bytes on the device";
            if (v.name == "cpu") {
              EXPECT_EQ(r.host_memory[MemoryPurpose::params].current, shards_bytes);
            } else if (v.name == "nvme, all swapped") {
              EXPECT_EQ(r.host_memory[MemoryPurpose::params].peak, 2 * slot_bytes);
              EXPECT_GT(model_specs().size(), 2u) << "as many buffers as shards: nothing would be evicted";
            } else if (v.name == "nvme, most in cpu") {
              // The units in layer order while they fit max_in_cpu (all but the last), plus the buffers.
              EXPECT_GT(r.host_memory[MemoryPurpose::params].current, 2 * slot_bytes);
              EXPECT_LT(r.host_memory[MemoryPurpose::params].current, 2 * slot_bytes + shards_bytes);
            }
          }
        }
      }
    }
  }
  EXPECT_FALSE(std::filesystem::exists(d.dir / "dstrain_swap")) << "swap files left behind";
}

// Both partitions on NVMe: the optimizer's and the parameters' swap folders side by side.
TEST(ParamOffload, WithNvmeOptimizerOffloadToo) {
  const SwapDir d;
  const Precision p = Precision::bf16;
  const RunResult plain = run_zero(param_run(2, p, R"("offload_optimizer": {"device": "cpu"})"));
  const std::string both = R"("offload_optimizer": {"device": "nvme", "nvme_path": )" + d.json() + "}, " + nvme_param(d, largest_shard(2, p), 0);
  expect_same_run(run_zero(param_run(2, p, both)), plain);
  EXPECT_FALSE(std::filesystem::exists(d.dir / "dstrain_swap")) << "swap files left behind";
}

// The report (dstrain train's summary, --summary-json's bytes_held) names the parameter swap file
// under nvme params: every swapped unit (layer shard) at a 4096-aligned offset, so Σ round_up(shard
// bytes, 4096) over the units max_in_cpu does not keep (docs/offload.md §6, §9); the optimizer's
// swap files stay under nvme optimizer.
TEST(ParamOffload, ReportsTheSwapFileUnderNvmeParams) {
  const SwapDir d;
  const auto round_up = [](std::uint64_t v) { return (v + 4095) / 4096 * 4096; };
  for (const int world : {1, 2}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(testing::Message() << "world " << world << " " << precision_name(p));
      const std::uint64_t s = storage_bytes(p);
      std::uint64_t all_swapped = 0, last_only = 0;
      for (const auto& layer : model_specs()) {
        last_only = round_up(static_cast<std::uint64_t>(padded_numel(layer, world, s) / world) * s);
        all_swapped += last_only;
      }
      const std::uint64_t kParams = static_cast<std::size_t>(MemoryPurpose::params), kOptimizer = static_cast<std::size_t>(MemoryPurpose::optimizer);
      const RunResult all = run_zero(param_run(world, p, nvme_param(d, largest_shard(world, p), 0)));
      const RunResult most_in_cpu = run_zero(param_run(world, p, nvme_param(d, largest_shard(world, p), shard_total(world, p) - 1)));
      for (std::size_t r = 0; r < all.ranks.size(); ++r) {
        EXPECT_EQ(all.ranks[r].report.nvme_bytes[kParams], all_swapped) << "rank " << r;
        EXPECT_EQ(all.ranks[r].report.nvme_bytes[kOptimizer], 0u) << "rank " << r;
        EXPECT_EQ(most_in_cpu.ranks[r].report.nvme_bytes[kParams], last_only) << "rank " << r << ": only the last unit is swapped";
      }
      const RunResult cpu = run_zero(param_run(world, p, R"("offload_param": {"device": "cpu"})"));
      for (const RankResult& r : cpu.ranks) EXPECT_EQ(r.report.nvme_bytes[kParams], 0u);
    }
  }
  // Both on NVMe: each store's swap files under its own purpose.
  const Precision p = Precision::bf16;
  const std::string both = R"("offload_optimizer": {"device": "nvme", "nvme_path": )" + d.json() + "}, " + nvme_param(d, largest_shard(1, p), 0);
  const RankResult r = run_zero(param_run(1, p, both)).r0();
  EXPECT_GT(r.report.nvme_bytes[static_cast<std::size_t>(MemoryPurpose::params)], 0u);
  EXPECT_GT(r.report.nvme_bytes[static_cast<std::size_t>(MemoryPurpose::optimizer)], 0u);
  EXPECT_FALSE(std::filesystem::exists(d.dir / "dstrain_swap")) << "swap files left behind";
}

// Checkpoints read and write the 16-bit params through the store (read_owned_param /
// write_owned_param): saving from an NVMe-offloaded run and loading into a fresh one continues with
// the losses of the run that went on without a break.
TEST(ParamOffload, CheckpointRoundTripThroughTheNvmeStore) {
  const SwapDir d;
  const std::filesystem::path ckpt = d.dir / "ckpt";
  const RunSpec spec = param_run(1, Precision::bf16, nvme_param(d, largest_shard(1, Precision::bf16), 0));
  config::ConfigOptions copts;
  const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(spec)), copts);
  EngineOptions o;
  o.seed = 11;
  o.sequence_length = kT;
  const auto train = [&](Engine& e, int from, int to) {
    std::vector<float> losses;
    for (int step = from; step < to; ++step) {
      for (int m = 0; m < spec.gas; ++m) {
        Tokens t = slot_batch(step, m);
        e.forward(t.batch());
        e.backward();
        e.step();
      }
      losses.push_back(e.state().last_step_loss);
    }
    return losses;
  };
  std::vector<float> straight;
  {
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
    CheckpointManager e_checkpoints(e);
    (void)train(e, 0, 2);
    e_checkpoints.save(ckpt, "two");
    straight = train(e, 2, 4);
  }
  Engine resumed = initialize(make_gpt2_model(model_config(0.0f)), c, o);
  CheckpointManager resumed_checkpoints(resumed);
  (void)resumed_checkpoints.load(ckpt, "two");
  EXPECT_EQ(train(resumed, 2, 4), straight);
}

std::string engine_error(const std::string& zero_json) {
  try {
    (void)run_zero([&] {
      RunSpec s = param_run(1, Precision::bf16, zero_json);
      s.steps = 1;
      return s;
    }());
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Below stage 3 DeepSpeed ignores offload_param (only its stage-3 coordinator reads it; builders such
// as DeepSpeed-Chat's set it at stage 2), and so does dstrain, with a warning from the config layer:
// the run is the run without the block, bit for bit, with the parameters on the device.
TEST(ParamOffloadConfig, BelowStageThreeTheBlockIsIgnoredAsDeepSpeedDoes) {
  for (const int stage : {0, 2}) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    RunSpec plain_spec = param_run(1, Precision::bf16, "");
    plain_spec.stage = stage;
    RunSpec off_spec = param_run(1, Precision::bf16, R"("offload_param": {"device": "cpu"})");
    off_spec.stage = stage;
    const RunResult plain = run_zero(plain_spec), off = run_zero(off_spec);
    expect_same_run(off, plain);
    EXPECT_GT(off.r0().memory[MemoryPurpose::params].current, 0u);
    EXPECT_EQ(off.r0().memory[MemoryPurpose::params].current, plain.r0().memory[MemoryPurpose::params].current);
    EXPECT_EQ(off.r0().host_memory[MemoryPurpose::params].current, 0u);
  }
}

TEST(ParamOffloadConfig, BadInputIsNamedBeforeStepOne) {
  const SwapDir d;
  // A buffer smaller than the largest swapped shard: DeepSpeed's "More elements ... than buffer size",
  // here before step 1 with the key and the size needed.
  const std::int64_t need = largest_shard(1, Precision::bf16);
  const std::string small = engine_error(nvme_param(d, need - 1, 0));
  EXPECT_NE(small.find("zero_optimization.offload_param.buffer_size"), std::string::npos) << small;
  EXPECT_NE(small.find("at least " + std::to_string(need)), std::string::npos) << small;
  // ... unless that shard stays in host memory (max_in_cpu covers everything: no file at all).
  EXPECT_EQ(engine_error(nvme_param(d, 1, 1'000'000'000)), "<no error>");
  const std::string missing = engine_error(R"("offload_param": {"device": "nvme", "nvme_path": "/tmp/dstrain-no-such-folder", "max_in_cpu": 0})");
  EXPECT_NE(missing.find("zero_optimization.offload_param.nvme_path"), std::string::npos) << missing;
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  if (std::filesystem::exists("/dev/shm")) {
    const std::string shm = engine_error(R"("offload_param": {"device": "nvme", "nvme_path": "/dev/shm", "max_in_cpu": 0})");
    EXPECT_NE(shm.find("zero_optimization.offload_param.nvme_path"), std::string::npos) << shm;
    EXPECT_NE(shm.find("tmpfs"), std::string::npos) << shm;
  }
  EXPECT_FALSE(std::filesystem::exists(d.dir / "dstrain_swap"));
}

// An injected read error (DSTRAIN_IO_FAULT, docs/offload.md §1.6) fails the run with an Error naming
// the parameter store and the I/O; the run ends (no hang) and the swap folder is removed.
TEST(ParamOffloadConfig, InjectedReadErrorIsANamedError) {
  const SwapDir d;
  for (const char* fault : {"eio:read@3", "short:read@5"}) {
    SCOPED_TRACE(fault);
    ::setenv("DSTRAIN_IO_FAULT", fault, 1);
    const std::string e = engine_error(nvme_param(d, largest_shard(1, Precision::bf16), 0));
    ::unsetenv("DSTRAIN_IO_FAULT");
    EXPECT_NE(e.find("offload_param"), std::string::npos) << e;
    EXPECT_NE(e.find("params.swp"), std::string::npos) << e;
  }
  EXPECT_FALSE(std::filesystem::exists(d.dir / "dstrain_swap")) << "swap files left behind";
}

}  // namespace
}  // namespace dstrain
