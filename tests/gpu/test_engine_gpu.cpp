// The whole training step on the GPU against the CPU backend (docs/design.md "Correctness contract"):
// the same model, seed and global batches through Engine on cuda:0 and on the CPU, comparing the
// loss of every optimizer step and the fp32 master parameters afterwards; ZeRO stages 1-3 on two
// local ranks sharing the GPU against stage 0; greedy sampling from the same weights; and a short
// GPT-2 124M (d12) run on the GPU whose loss falls.
//
// Tolerances: the backends share the kernels' semantics but not their summation orders (cuBLASLt
// vs OpenBLAS tiles, row reductions, FMA contraction), so fp32 differs at the level of rounding in
// every matmul, and Adam's normalised first steps turn near-cancelling gradient elements into
// sign flips of ±lr (the same effect test_zero_equivalence measures for 16-bit ranks). The bounds
// below were set before a GPU run; DSTRAIN_GPU_VERBOSE=1 prints the measured figures so they can
// be tightened to the measured maximum with a margin.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "gpu_test.h"
#include "zero/device_mesh.h"
#include "ops/kernels/device_backend.h"
#include "tests/unit/engine/zero_test_util.h"
#include "models/gpt2/gpt2_family.h"

using namespace dstrain;
using namespace dstrain::zero_testing;

namespace {

constexpr Device kGpu = Device::cuda(0);

bool verbose() { return std::getenv("DSTRAIN_GPU_VERBOSE") != nullptr; }

// GPU against CPU: fp32 loses the bit-exactness of a reduction-order-only comparison (every matmul
// and row reduction sums in another order), 16-bit runs the sign flips test_zero_equivalence bounds.
Tolerance gpu_tolerance(Precision p) {
  switch (p) {
    case Precision::fp32:
      return {1e-4, 0.035, 0.0, 0.2, 0.02, 0.07};
    case Precision::bf16:
      return {2e-3, 0.07, 0.0, 0.4, 0.1, 0.07};
    case Precision::fp16:
      return {1e-3, 0.05, 0.0, 0.3, 0.06, 0.07};
  }
  return {};
}

void expect_close(const RunResult& got, const RunResult& ref, const std::map<std::string, std::vector<float>>& init, const Tolerance& tol,
                  const std::string& what) {
  ASSERT_EQ(got.r0().losses.size(), ref.r0().losses.size()) << what;
  double worst_loss = 0;
  for (std::size_t k = 0; k < ref.r0().losses.size(); ++k) {
    const double a = got.r0().losses[k], b = ref.r0().losses[k];
    ASSERT_TRUE(std::isfinite(a)) << what << ": step " << k + 1 << " loss " << a;
    worst_loss = std::max(worst_loss, std::abs(a - b) / std::abs(b));
    EXPECT_LE(std::abs(a - b), tol.loss_rtol * std::abs(b)) << what << ": step " << k + 1 << " loss " << a << " vs " << b;
  }
  const ParamDiff d = compare_params(got.r0().params, ref.r0().params, init, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite) << what;
  EXPECT_LE(d.max_abs, tol.atol) << what << ": worst element " << d.worst_element;
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << what << ": worst tensor " << d.worst_tensor;
  EXPECT_LE(d.update_rel, tol.update_rel) << what;
  EXPECT_LE(d.key_bias_max_abs, tol.key_bias_abs) << what;
  if (verbose()) {
    std::printf("[gpu-vs-cpu] %-40s loss rel %.2e | params max abs %.2e, tensor update rel %.2e, update rel %.2e, key bias %.2e\n", what.c_str(),
                worst_loss, d.max_abs, d.max_update_rel, d.update_rel, d.key_bias_max_abs);
  }
}

std::map<std::string, std::vector<float>> initial_params(RunSpec s) {
  s.steps = 0;
  s.device = Device::cpu();
  return run_zero(s).r0().params;
}

// One rank, stage 0: forward, backward and the optimizer (AdamW, clipping) of GAS 2 micro-steps,
// 3 optimizer steps, in each precision, with and without activation checkpointing.
TEST(EngineGpu, TrainingStepsMatchTheCpuBackend) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    for (const bool ckpt : {false, true}) {
      RunSpec s;
      s.precision = p;
      s.gas = 2;
      s.ckpt = ckpt;
      s.dropout = 0.1f;  // the same Philox masks on both backends
      const auto init = initial_params(s);
      const RunResult cpu = run_zero(s);
      s.device = kGpu;
      const RunResult gpu = run_zero(s);
      expect_close(gpu, cpu, init, gpu_tolerance(p), fmt::format("{} ckpt={}", precision_name(p), ckpt));
      EXPECT_EQ(gpu.r0().skipped_steps, cpu.r0().skipped_steps);
    }
  }
}

// Optimizer offload next to a GPU (offload_optimizer.device "cpu", docs/training_state.md §3):
// forward and backward on cuda:0, the optimizer partition in page-locked host memory, the grads
// staged to the host and the updated params copied back. Against the CPU run without offload (the
// same CPU optimizer kernel; only forward/backward sum in another order): the GPU-vs-CPU
// tolerances. The device allocator holds no optimizer bytes; the host holds the masters and both
// Adam moments of the rank's partition.
TEST(EngineGpu, OptimizerOffloadMatchesTheCpuAndLeavesNoOptimizerBytesOnTheDevice) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (const int stage : {1, 2, 3}) {
      RunSpec s;
      s.stage = stage;
      s.world = 2;
      s.precision = p;
      s.gas = 2;
      s.knobs.reduce_bucket_size = 3000;
      s.knobs.sub_group_size = 5000;
      const auto init = initial_params(s);
      const RunResult cpu = run_zero(s);
      s.knobs.zero_extra_json = R"("offload_optimizer": {"device": "cpu", "pin_memory": true})";
      s.device = kGpu;
      const RunResult gpu = run_zero(s);
      expect_close(gpu, cpu, init, gpu_tolerance(p), fmt::format("offload {} stage {}", precision_name(p), stage));
      for (std::size_t r = 0; r < gpu.ranks.size(); ++r) {
        EXPECT_EQ(gpu.ranks[r].report.optimizer_bytes, 0u);
        EXPECT_EQ(gpu.ranks[r].memory[MemoryPurpose::optimizer].peak, 0u);
        // The CPU run without offload keeps 2 (fp32: the params are the masters) or 3 fp32 copies.
        const std::uint64_t per_copy = cpu.ranks[r].report.optimizer_bytes / (p == Precision::fp32 ? 2 : 3);
        EXPECT_EQ(gpu.ranks[r].report.host_optimizer_bytes, 3 * per_copy);
      }
    }
  }
}

// Stage 3 offload next to a GPU (docs/offload.md §5-7): the optimizer's share in swap files
// ("nvme"), split with the device (ratio 0.5), and the parameter partition in host memory or swap
// files (offload_param), its shards copied to cuda:0 for each all-gather and the updated 16-bit
// params copied back. Each offloaded CUDA run against the CUDA run without offload and against the
// CPU run with the same offload (the same CPU optimizer kernel): the GPU-vs-CPU tolerances; the
// device allocator holds no optimizer bytes where everything is offloaded.
TEST(EngineGpu, Stage3OffloadMatchesTheGpuRunWithoutOffloadAndTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_gpu_offload_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = nlohmann::json(dir.string()).dump();
  const std::vector<std::pair<std::string, bool>> offloads = {
      // (zero json, the device holds no optimizer bytes)
      {R"("offload_optimizer": {"device": "nvme", "buffer_count": 2, "pipeline_read": true, "pipeline_write": true, "nvme_path": )" + path + "}",
       true},
      {R"("offload_optimizer": {"device": "cpu", "ratio": 0.5})", false},
      {R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu", "pin_memory": true})", true},
      {R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_count": 2, "nvme_path": )" + path +
           "}, \"stage3_param_persistence_threshold\": 0",
       true},
  };
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (const int world : {1, 2}) {
      RunSpec s;
      s.stage = 3;
      s.world = world;
      s.precision = p;
      s.gas = 2;
      s.knobs.reduce_bucket_size = 3000;
      s.knobs.sub_group_size = 5000;
      const auto init = initial_params(s);
      RunSpec g = s;
      g.device = kGpu;
      const RunResult gpu_plain = run_zero(g);
      for (const auto& [offload, no_device_optimizer] : offloads) {
        const std::string what = fmt::format("{} world {} {}", precision_name(p), world, offload);
        SCOPED_TRACE(what);
        RunSpec c = s;
        c.knobs.zero_extra_json = offload;
        const RunResult cpu = run_zero(c);
        c.device = kGpu;
        const RunResult gpu = run_zero(c);
        expect_close(gpu, cpu, init, gpu_tolerance(p), "vs cpu: " + what);
        expect_close(gpu, gpu_plain, init, gpu_tolerance(p), "vs gpu without offload: " + what);
        for (const RankResult& r : gpu.ranks) {
          if (no_device_optimizer) {
            EXPECT_EQ(r.report.optimizer_bytes, 0u);
          }
          EXPECT_GT(r.report.host_optimizer_bytes + r.report.nvme_bytes[static_cast<std::size_t>(MemoryPurpose::optimizer)], 0u);
        }
      }
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "dstrain_swap")) << "swap files left behind";
  std::filesystem::remove_all(dir);
}

// fp16's loss scaler on the GPU: an injected inf gradient is skipped at the same step and the
// scale halves, as on the CPU.
// The per-tensor optimizers with the partition on the GPU (docs/optimizers.md §9, §10.1): Muon
// (Newton-Schulz through cuBLASLt on the device copy of each whole matrix) and Adafactor, at stage 0
// on one rank and ZeRO 2 on two local ranks (reduce_scatter off, as DeepSpeed's Muon needs at
// stage 3), against the same runs on the CPU.
TEST(EngineGpu, MuonAndAdafactorMatchTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const char* opt : {R"({"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.1}})",
                          R"({"type": "Adafactor", "params": {"lr": 0.05, "weight_decay": 0.1}})"}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      for (const auto& [stage, world] : std::vector<std::pair<int, int>>{{0, 1}, {2, 2}}) {
        RunSpec s;
        s.precision = p;
        s.stage = stage;
        s.world = world;
        s.knobs.reduce_scatter = false;
        s.knobs.allow_untested_optimizer = true;
        s.knobs.optimizer_json = opt;
        const auto init = initial_params(s);
        const RunResult cpu = run_zero(s);
        s.device = kGpu;
        const RunResult gpu = run_zero(s);
        expect_close(gpu, cpu, init, gpu_tolerance(p), fmt::format("{} {} stage {} W {}", opt, precision_name(p), stage, world));
      }
    }
  }
}

TEST(EngineGpu, Fp16OverflowIsSkippedLikeTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  RunSpec s;
  s.precision = Precision::fp16;
  s.steps = 4;
  s.inject_overflow = {{2}};
  const RunResult cpu = run_zero(s);
  s.device = kGpu;
  const RunResult gpu = run_zero(s);
  EXPECT_EQ(gpu.r0().skipped_steps, 1);
  EXPECT_EQ(gpu.r0().loss_scales, cpu.r0().loss_scales);
}

// ZeRO stages 1-3 on two local ranks sharing the GPU (the local communicator on device memory)
// against stage 0 on one rank of the same GPU, as test_zero_equivalence checks on the CPU.
TEST(EngineGpu, ZeroStagesOnTwoLocalRanksMatchStageZero) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    RunSpec ref_spec;
    ref_spec.precision = p;
    ref_spec.gas = 4;
    ref_spec.device = kGpu;
    const auto init = initial_params(ref_spec);
    const RunResult ref = run_zero(ref_spec);
    for (const int stage : {0, 1, 2, 3}) {
      RunSpec s = ref_spec;
      s.stage = stage;
      s.world = 2;
      s.gas = 2;
      s.knobs.reduce_bucket_size = 4096;  // several chunks per layer
      s.knobs.persistence_threshold = 0;
      const RunResult got = run_zero(s);
      expect_close(got, ref, init, tolerance(p), fmt::format("{} stage {} x 2 ranks", precision_name(p), stage));
    }
  }
}

// Tensor parallelism on the GPU (docs/parallelism.md): a DP x TP mesh of local ranks sharing cuda:0
// — the local backend on device memory, so the layers' sums and maxes, the vocabulary-parallel
// embedding and cross-entropy kernels, and the step's norm² and whole-parameter gathers through
// device buffers (the path NCCL takes) all run — against one rank at stage 0 on the same GPU with
// the same global batch, as tests/unit/engine/test_tensor_parallel.cpp checks on the CPU. Rank
// (dp, tp) feeds slot m·DP + dp at micro-step m. Every rank of the mesh must report the same losses
// and gather the same whole parameters.
RunResult run_tensor_parallel_mesh(const char* model, int tp, int dp, int stage, int gas, Precision p, int steps = 3, bool shard_residual = false) {
  RunSpec s;
  s.stage = stage;
  s.world = dp;
  s.gas = gas;
  s.precision = p;
  const std::string json = zero_config_json(s);
  std::vector<std::unique_ptr<LocalGroup>> tp_groups, dp_groups;
  for (int d = 0; d < dp; ++d) tp_groups.push_back(std::make_unique<LocalGroup>(tp));
  for (int t = 0; t < tp; ++t) dp_groups.push_back(std::make_unique<LocalGroup>(dp));
  RunResult out;
  out.ranks.resize(static_cast<std::size_t>(tp * dp));
  run_local_ranks(tp * dp, [&](Communicator& comm) {
    const int r = comm.rank(), t = r % tp, d = r / tp;
    LocalCommunicator tp_comm(*tp_groups[static_cast<std::size_t>(d)], t);
    LocalCommunicator dp_comm(*dp_groups[static_cast<std::size_t>(t)], d);
    RankResult& me = out.ranks[static_cast<std::size_t>(r)];
    config::ConfigOptions copts;
    copts.world_size = dp;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = &dp_comm;
    o.tensor_parallel = &tp_comm;
    o.sequence_length = kT;
    o.device = kGpu;
    const std::shared_ptr<const Architecture> arch =
        std::string_view(model).starts_with("llama:") ? llama_family().from_spec(model) : gpt2_family().from_spec(model);
    Engine e = initialize(make_model(arch, {t, tp, shard_residual}), c, o);
    for (int step = 0; step < steps; ++step) {
      for (int g = 0; g < gas; ++g) {
        Tokens b = slot_batch(step, g * dp + d);
        e.forward(b.batch());
        e.backward();
        e.step();
      }
      me.losses.push_back(e.state().last_step_loss);
    }
    e.gather_master_params([&](const std::string& n, const Tensor& v) { me.params[n] = values(v); });
  });
  return out;
}

TEST(EngineGpu, TensorParallelMeshMatchesOneRank) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  // GPT-2 with 4 heads over 2 ranks and a vocabulary of 100 padded to 128 (the last rank's rows
  // partly padding); the Llama model with grouped KV heads and tied embeddings.
  for (const char* model : {"gpt2:L2-C32-H4-V100-T16", kLlamaModel}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      // (tp, dp, stage, cut): TP alone; TP with ZeRO-2 along two data-parallel ranks; Megatron's
      // sequence parallelism (the residual stream cut: the layers' all-gathers and reduce-scatters
      // on device memory, models/residual_shards.h).
      for (const auto& [tp, dp, stage, cut] : {std::tuple{2, 1, 0, false}, std::tuple{2, 2, 2, false}, std::tuple{2, 2, 2, true}}) {
        const std::string what = fmt::format("{} {} tp {} dp {} stage {}{}", model, precision_name(p), tp, dp, stage, cut ? " cut" : "");
        const RunResult init = run_tensor_parallel_mesh(model, 1, 1, 0, 1, p, 0);
        const RunResult ref = run_tensor_parallel_mesh(model, 1, 1, 0, dp, p);
        const RunResult got = run_tensor_parallel_mesh(model, tp, dp, stage, 1, p, 3, cut);
        for (std::size_t r = 1; r < got.ranks.size(); ++r) {
          EXPECT_EQ(got.ranks[r].losses, got.r0().losses) << what << ": rank " << r;
          for (const auto& [name, v] : got.r0().params) EXPECT_EQ(got.ranks[r].params.at(name), v) << what << ": rank " << r << " " << name;
        }
        // The row-parallel sums round differently from one GEMM's (as on the CPU), and cuBLASLt
        // picks its tiles per shape: the GPU-vs-CPU bounds.
        expect_close(got, ref, init.r0().params, gpu_tolerance(p), what);
      }
    }
  }
}

// Sequence parallelism (DeepSpeed-Ulysses) on the GPU: SP ranks of the local backend sharing cuda:0,
// each on its T/SP tokens — the all-to-alls' packing as strided device copies (copy_rows), the
// group's target count and loss through device buffers — against one rank on the same GPU with the
// same global batch; with ALST's tiled loss and MLP (tiles of 5 positions) as train runs SP.
RunResult run_sequence_parallel_mesh(const char* model, int sp, Precision p, bool tiles, int steps = 3) {
  RunSpec s;
  s.world = 1;
  s.gas = 1;
  s.precision = p;
  std::string json = zero_config_json(s);
  json.pop_back();
  json += fmt::format(R"(, "sequence_parallel_size": {}}})", sp);
  RunResult out;
  out.ranks.resize(static_cast<std::size_t>(sp));
  run_local_ranks(sp, [&](Communicator& comm) {
    const int r = comm.rank();
    MeshGroups mesh = make_mesh_groups(comm, make_mesh_shape(sp, 1, sp));
    config::ConfigOptions copts;
    copts.world_size = sp;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = mesh.data.get();
    o.sequence_parallel = sp > 1 ? mesh.sp.get() : nullptr;
    o.sequence_length = kT / sp;
    o.device = kGpu;
    const std::shared_ptr<const Architecture> arch =
        std::string_view(model).starts_with("llama:") ? llama_family().from_spec(model) : gpt2_family().from_spec(model);
    const std::int64_t tile = tiles && sp > 1 ? 5 : 0;
    Engine e = initialize(make_model(arch, {}, {mesh.coord.sp, sp, tile, tile}), c, o);
    RankResult& me = out.ranks[static_cast<std::size_t>(r)];
    for (int step = 0; step < steps; ++step) {
      const Tokens whole = slot_batch(step, 0);
      const std::int64_t Tl = whole.T / sp;
      Tokens mine{{}, {}, whole.B, Tl};
      for (std::int64_t b = 0; b < whole.B; ++b) {
        for (std::int64_t k = 0; k < Tl; ++k) {
          mine.tokens.push_back(whole.tokens[static_cast<std::size_t>(b * whole.T + mesh.coord.sp * Tl + k)]);
          mine.targets.push_back(whole.targets[static_cast<std::size_t>(b * whole.T + mesh.coord.sp * Tl + k)]);
        }
      }
      e.forward(mine.batch());
      e.backward();
      e.step();
      me.losses.push_back(e.state().last_step_loss);
    }
    e.gather_master_params([&](const std::string& n, const Tensor& v) { me.params[n] = values(v); });
  });
  return out;
}

TEST(EngineGpu, SequenceParallelMeshMatchesOneRank) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const char* model : {"gpt2:L2-C32-H4-V100-T16", kLlamaModel}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      for (const bool tiles : {false, true}) {
        const std::string what = fmt::format("{} {} sp 2{}", model, precision_name(p), tiles ? " tiled" : "");
        const RunResult init = run_sequence_parallel_mesh(model, 1, p, false, 0);
        const RunResult ref = run_sequence_parallel_mesh(model, 1, p, false);
        const RunResult got = run_sequence_parallel_mesh(model, 2, p, tiles);
        EXPECT_EQ(got.ranks[1].losses, got.r0().losses) << what;
        expect_close(got, ref, init.r0().params, gpu_tolerance(p), what);
      }
    }
  }
}

// Greedy sampling reads the logits back from the GPU: the same weights give the same tokens.
TEST(EngineGpu, GreedySamplingMatchesTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::vector<std::vector<std::int32_t>> out;
  for (const Device d : {Device::cpu(), kGpu}) {
    EngineOptions o;
    o.seed = 3;
    o.sequence_length = kT;
    o.device = d;
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), engine_testing::ds(zero_config_json(RunSpec{})), o);
    const std::unique_ptr<Allocator> alloc = make_device_allocator(d);
    Generator g(e.generation_model(), kT, *alloc);
    SamplingOptions so;
    so.max_new_tokens = 12;
    so.temperature = 0.0f;
    const std::vector<std::int32_t> prompt{1, 2, 3};
    out.push_back(g.generate(prompt, so));
  }
  EXPECT_EQ(out[1], out[0]);
}

// GPT-2 124M (d12) in bf16 on the GPU, T = 256, micro-batch 4: 40 AdamW steps on text that repeats
// a 64-token phrase (next tokens predictable from the context): the loss starts near
// ln(50257) = 10.8, falls by more than half, and stays finite throughout.
TEST(EngineGpu, Gpt2D12LossFalls) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const config::DsConfig c = engine_testing::ds(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}})");
  EngineOptions o;
  o.seed = 1;
  o.sequence_length = 256;
  o.device = kGpu;
  Engine e = initialize(make_gpt2_model("gpt2:d12"), c, o);
  const engine_testing::Tokens phrase = engine_testing::random_tokens(1, 64, 50257, 7);
  engine_testing::Tokens t{{}, {}, 4, 256};
  for (std::size_t i = 0; i < 4 * 256; ++i) {
    t.tokens.push_back(phrase.tokens[i % 64]);
    t.targets.push_back(phrase.tokens[(i + 1) % 64]);
  }
  std::vector<float> losses;
  for (int step = 0; step < 40; ++step) {
    losses.push_back(e.forward(t.batch()));
    e.backward();
    e.step();
  }
  for (float l : losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_NEAR(losses.front(), std::log(50257.0), 0.5);
  EXPECT_LT(losses.back(), 0.5f * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  if (verbose()) std::printf("[d12] loss %.3f -> %.3f over 40 steps\n", losses.front(), losses.back());
}

}  // namespace
