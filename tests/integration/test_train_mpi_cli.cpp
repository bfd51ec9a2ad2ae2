// `mpiexec -n N dstrain train` (the MPI backend, one process per rank) against `dstrain train
// --num-ranks N` (the local backend, N threads of one process), through the built binary: for ZeRO
// stages 0-3 x fp32 / bf16 / fp16 x gradient accumulation 1 / 2, the train and val losses, the
// saved weights (bytes) and every rank's ZeroReport (memory, traffic) are identical, and the MPI
// run prints once (rank 0) and reports its real world size.
//
// The matrix: with 2 processes all 24 cells; with 4 processes (oversubscribed on CI's 2 cores) the
// 12 stage x precision cells, gradient accumulation alternating 1 and 2, to stay fast.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

// Both layouts run OpenBLAS with one thread per rank. dstrain's own kernels give the same bits for
// any thread count (test_determinism), but OpenBLAS's GEMMs split their sums by its thread count on
// some CPUs (measured on an AMD EPYC with AVX-512: 1 and 2 threads differ in the last bits), and
// the two layouts would give each rank a different share of the cores (docs/mpi.md §1). Set before
// any run: every dstrain (and mpiexec's children) inherits it.
[[maybe_unused]] const bool kOneBlasThreadPerRank = [] { return ::setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0; }();

fs::path data_dir_path() { return fs::temp_directory_path() / ("dstrain_test_train_mpi_cli." + std::to_string(::getpid())); }

// The token files, made once per test process and removed at its end.
fs::path data_dir() {
  static const fs::path dir = [] {
    const fs::path d = data_dir_path();
    fs::remove_all(d);
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(d);
    EXPECT_EQ(prep.exit_code, 0) << prep.err;
    return d;
  }();
  return dir;
}

class RemoveDataDir : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(data_dir_path()); }
};
const auto* const kRemoveDataDir = ::testing::AddGlobalTestEnvironment(new RemoveDataDir);

struct Cell {
  int processes;
  int stage;
  std::string precision;  // fp32, bf16, fp16
  int gas;
};

std::string cell_name(const Cell& c) {
  return "np" + std::to_string(c.processes) + "_zero" + std::to_string(c.stage) + "_" + c.precision + "_gas" + std::to_string(c.gas);
}
void PrintTo(const Cell& c, std::ostream* os) { *os << cell_name(c); }

fs::path write_config(const Cell& c) {
  const fs::path p = data_dir() / (cell_name(c) + ".json");
  const std::string precision = c.precision == "bf16"   ? R"("bf16": {"enabled": true},)"
                                : c.precision == "fp16" ? R"("fp16": {"enabled": true, "initial_scale_power": 12},)"
                                                        : "";
  std::ofstream(p) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" << c.gas << R"(, "steps_per_print": 1, )"
                   << precision << R"( "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
      "zero_optimization": {"stage": )"
                   << c.stage << R"(, "stage3_param_persistence_threshold": 0, "stage3_gather_16bit_weights_on_model_save": true,
      "reduce_bucket_size": 5000, "allgather_bucket_size": 5000}})";
  return p;
}

class TrainMpiCli : public ::testing::TestWithParam<Cell> {};

TEST_P(TrainMpiCli, ProcessesTrainBitIdenticallyToLocalRanks) {
  const Cell c = GetParam();
  const fs::path dir = data_dir();
  const fs::path cfg = write_config(c);
  const std::string name = cell_name(c);
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string common = "train --deepspeed_config " + q(cfg) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
                             q(dir / "t_train.bin") + " --val-data " + q(dir / "t_val.bin") +
                             " --val-batches 4 --val-interval 2 --seed 5 --sample-tokens 4 --steps 3";
  const fs::path w_mpi = dir / (name + "_mpi.safetensors"), w_local = dir / (name + "_local.safetensors");
  const fs::path s_mpi = dir / (name + "_mpi.json"), s_local = dir / (name + "_local.json");

  const CliResult local =
      run_dstrain(common + " --num-ranks " + std::to_string(c.processes) + " --save-weights " + q(w_local) + " --summary-json " + q(s_local));
  ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
  const CliResult mpi = run_dstrain(common + " --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi),
                                    std::string(DSTRAIN_MPIEXEC) + " " + std::to_string(c.processes));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;

  // The backend is said at the start, by rank 0 alone (one copy of each line).
  EXPECT_NE(mpi.out.find("comm: mpi, " + std::to_string(c.processes) + " processes of MPI_COMM_WORLD"), std::string::npos) << mpi.out;
  EXPECT_EQ(mpi.out.find("comm: mpi"), mpi.out.rfind("comm: mpi")) << mpi.out;
  EXPECT_EQ(mpi.out.find("step 1/3 | loss"), mpi.out.rfind("step 1/3 | loss")) << mpi.out;

  // Bit-identical training: the same bytes of weights, the same losses to the last bit.
  ASSERT_TRUE(fs::exists(w_mpi));
  EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << name << ": the saved weights differ";
  const nlohmann::json a = nlohmann::json::parse(read_file_text(s_mpi));
  const nlohmann::json b = nlohmann::json::parse(read_file_text(s_local));
  EXPECT_EQ(a["train_losses"], b["train_losses"]) << name;
  EXPECT_EQ(a["val_losses"], b["val_losses"]) << name;
  EXPECT_EQ(a["train_losses"].size(), 3u);
  // The real world size, and every rank's memory and traffic gathered into rank 0's summary.
  EXPECT_EQ(a["zero"]["world_size"], c.processes);
  ASSERT_EQ(a["zero"]["ranks"].size(), static_cast<std::size_t>(c.processes));
  for (int r = 0; r < c.processes; ++r) EXPECT_EQ(a["zero"]["ranks"][r]["rank"], r);
  // Everything but the allocator's peak, which with overlap_comm (stage 3) depends on when the
  // comm thread finishes a prefetch relative to compute, in either backend.
  nlohmann::json za = a["zero"], zb = b["zero"];
  for (int r = 0; r < c.processes; ++r) {
    EXPECT_GT(za["ranks"][r]["peak_bytes"].get<double>(), 0.0);
    za["ranks"][r].erase("peak_bytes");
    zb["ranks"][r].erase("peak_bytes");
  }
  EXPECT_EQ(za, zb) << name << ": the ZeroReports differ";
}

std::vector<Cell> cells() {
  std::vector<Cell> v;
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* p : {"fp32", "bf16", "fp16"})
      for (int gas : {1, 2}) v.push_back({2, stage, p, gas});
  int k = 0;
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* p : {"fp32", "bf16", "fp16"}) v.push_back({4, stage, p, 1 + (k++ % 2)});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Matrix, TrainMpiCli, ::testing::ValuesIn(cells()),
                         [](const ::testing::TestParamInfo<Cell>& p) { return cell_name(p.param); });

// The device mesh over MPI processes (docs/parallelism.md): TP 2 x SP 2 on 4 processes — the
// tensor- and sequence-parallel groups are MPI_Comm_split children — trains bit-identically to the
// same mesh on --num-ranks 4 (losses and saved whole weights).
TEST(TrainMpiCliMesh, TensorAndSequenceParallelProcessesMatchLocalRanks) {
  const fs::path dir = data_dir();
  const fs::path cfg = dir / "mesh.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2})";
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string common = "train --deepspeed_config " + q(cfg) + " --model gpt2:L2-C32-H4-V256-T32 --tokenizer bytes --data " +
                             q(dir / "t_train.bin") + " --seed 5 --sample-tokens 0 --steps 3";
  const fs::path w_mpi = dir / "mesh_mpi.safetensors", w_local = dir / "mesh_local.safetensors";
  const fs::path s_mpi = dir / "mesh_mpi.json", s_local = dir / "mesh_local.json";
  const CliResult local = run_dstrain(common + " --num-ranks 4 --save-weights " + q(w_local) + " --summary-json " + q(s_local));
  ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
  const CliResult mpi = run_dstrain(common + " --comm mpi --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi), std::string(DSTRAIN_MPIEXEC) + " 4");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;
  EXPECT_NE(mpi.out.find("mesh: world 4 = data-parallel 1 x sequence-parallel 2 x tensor-parallel 2"), std::string::npos) << mpi.out;
  EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << "the saved weights differ";
  EXPECT_EQ(nlohmann::json::parse(read_file_text(s_mpi))["train_losses"], nlohmann::json::parse(read_file_text(s_local))["train_losses"]);
}

// ZeRO++ and MiCS over MPI processes (docs/zero.md §10): 4 processes as 2 nodes of 2 (--ranks-per-node
// over what MPI's shared-memory split finds) — the node groups, hpZ's and MiCS's groups are
// MPI_Comm_split children, qgZ's all-to-alls and qwZ's int8 gathers run over them — train
// bit-identically to --num-ranks 4 with the same nodes, and every rank's traffic, across the nodes
// too, is the same count (the local run's is checked against the formulas in test_zeropp).
TEST(TrainMpiCliMesh, ZeroPlusPlusAndMicsProcessesMatchLocalRanks) {
  const fs::path dir = data_dir();
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::pair<const char*, const char*> variants[] = {
      {"zeropp", R"("zero_quantized_weights": true, "zero_hpz_partition_size": 2, "zero_quantized_gradients": true)"},
      {"mics", R"("mics_shard_size": 4, "mics_hierarchical_params_gather": true)"}};
  for (const auto& [name, keys] : variants) {
    SCOPED_TRACE(name);
    const fs::path cfg = dir / (std::string(name) + ".json");
    std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
          "stage3_gather_16bit_weights_on_model_save": true, )" << keys << "}}";
    const std::string common = "train --deepspeed_config " + q(cfg) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
                               q(dir / "t_train.bin") + " --seed 5 --sample-tokens 0 --steps 3 --ranks-per-node 2";
    const fs::path w_mpi = dir / (std::string(name) + "_mpi.safetensors"), w_local = dir / (std::string(name) + "_local.safetensors");
    const fs::path s_mpi = dir / (std::string(name) + "_mpi.json"), s_local = dir / (std::string(name) + "_local.json");
    const CliResult local = run_dstrain(common + " --num-ranks 4 --save-weights " + q(w_local) + " --summary-json " + q(s_local));
    ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
    const CliResult mpi = run_dstrain(common + " --comm mpi --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi),
                                      std::string(DSTRAIN_MPIEXEC) + " 4");
    ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;
    EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << "the saved weights differ";
    const nlohmann::json a = nlohmann::json::parse(read_file_text(s_mpi)), b = nlohmann::json::parse(read_file_text(s_local));
    EXPECT_EQ(a["train_losses"], b["train_losses"]);
    nlohmann::json za = a["zero"], zb = b["zero"];
    for (int r = 0; r < 4; ++r) {
      EXPECT_GT(za["ranks"][r]["step_comm"]["total"]["cross_node_bytes"].get<double>(), 0.0);
      za["ranks"][r].erase("peak_bytes");
      zb["ranks"][r].erase("peak_bytes");
    }
    EXPECT_EQ(za, zb) << "the ZeroReports differ";
  }
}

// Pipeline parallelism over MPI processes (docs/parallelism.md §7): PP 2 x TP 2 on 4 processes — the
// activations and gradients between stages go point to point (MPI_Isend / MPI_Irecv batches), the
// tied embedding's gradient over its two stages — trains bit-identically to --num-ranks 4, and the
// saved weights (gathered from both stages) are the same file.
TEST(TrainMpiCliMesh, PipelineProcessesMatchLocalRanks) {
  const fs::path dir = data_dir();
  const fs::path cfg = dir / "pipe.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "steps_per_print": 1, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "tensor_parallel": {"autotp_size": 2}, "pipeline": {"stages": 2}})";
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string common = "train --deepspeed_config " + q(cfg) + " --model gpt2:L2-C32-H4-V256-T32 --tokenizer bytes --data " +
                             q(dir / "t_train.bin") + " --seed 5 --sample-tokens 0 --steps 3";
  const fs::path w_mpi = dir / "pipe_mpi.safetensors", w_local = dir / "pipe_local.safetensors";
  const fs::path s_mpi = dir / "pipe_mpi.json", s_local = dir / "pipe_local.json";
  const CliResult local = run_dstrain(common + " --num-ranks 4 --save-weights " + q(w_local) + " --summary-json " + q(s_local));
  ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
  const CliResult mpi = run_dstrain(common + " --comm mpi --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi), std::string(DSTRAIN_MPIEXEC) + " 4");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;
  EXPECT_NE(mpi.out.find("mesh: world 4 = pipeline 2 x data-parallel 1 x tensor-parallel 2"), std::string::npos) << mpi.out;
  EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << "the saved weights differ";
  EXPECT_EQ(nlohmann::json::parse(read_file_text(s_mpi))["train_losses"], nlohmann::json::parse(read_file_text(s_local))["train_losses"]);
}

// A mixture of experts' load-balancing loss through a pipeline over MPI processes (docs/parallelism.md
// §7.2): PP 2 x DP 2 with expert_parallel.autoep_size 2 on 4 processes, 4 micro-batches per step —
// the router statistics of each micro-batch go between the stages as a second message of each
// activation and gradient transfer (MPI_Isend / MPI_Irecv batches) — trains bit-identically to
// --num-ranks 4, prints the same aux loss and per-expert counts, and saves the same weights.
TEST(TrainMpiCliMesh, PipelineWithTheLoadBalancingLossProcessesMatchLocalRanks) {
  const fs::path dir = data_dir();
  const fs::path cfg = dir / "pipe_moe.json";
  std::ofstream(cfg)
      << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "steps_per_print": 1, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "pipeline": {"stages": 2}, "expert_parallel": {"enabled": true, "autoep_size": 2}})";
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string common = "train --deepspeed_config " + q(cfg) +
                             " --model moe:L2-C32-H4-KV2-E4-K2-I24-V256-T32-aux0.05 --tokenizer bytes --data " + q(dir / "t_train.bin") +
                             " --seed 5 --sample-tokens 0 --val-interval 0 --steps 3";
  const fs::path w_mpi = dir / "pipe_moe_mpi.safetensors", w_local = dir / "pipe_moe_local.safetensors";
  const fs::path s_mpi = dir / "pipe_moe_mpi.json", s_local = dir / "pipe_moe_local.json";
  const CliResult local = run_dstrain(common + " --num-ranks 4 --save-weights " + q(w_local) + " --summary-json " + q(s_local));
  ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
  const CliResult mpi =
      run_dstrain(common + " --comm mpi --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi), std::string(DSTRAIN_MPIEXEC) + " 4");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;
  EXPECT_NE(mpi.out.find("pipeline 2 x data-parallel 2"), std::string::npos) << mpi.out;
  EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << "the saved weights differ";
  EXPECT_EQ(nlohmann::json::parse(read_file_text(s_mpi))["train_losses"], nlohmann::json::parse(read_file_text(s_local))["train_losses"]);
  // The progress lines' aux loss and per-expert counts (the whole model's on stage 0, which prints).
  const auto moe_parts = [](const std::string& out) {
    std::string parts;
    for (std::size_t at = out.find(" | aux "); at != std::string::npos; at = out.find(" | aux ", at + 1))
      parts += out.substr(at, out.find(')', at) + 1 - at) + "\n";
    return parts;
  };
  EXPECT_NE(moe_parts(local.out).find(" | experts "), std::string::npos) << local.out;
  EXPECT_EQ(moe_parts(mpi.out), moe_parts(local.out)) << mpi.out;
}

// Expert parallelism over MPI processes (docs/parallelism.md §8): a Mixtral-shaped model (4 experts,
// top-2, the load-balancing loss) on 4 processes with expert_parallel.autoep_size 2 and 4, ZeRO 0-3,
// fp32 and bf16 (six cells) — the tokens travel to their experts' processes by MPI_Alltoallv, ZeRO
// shards the experts over the expert-data-parallel communicator — trains bit-identically to
// --num-ranks 4 (the local backend), and within a reduction-order bound of the same 4 ranks without
// expert parallelism (every rank holding every expert): the same model trained the same way.
struct EpCell {
  int ep;
  int stage;
  std::string precision;
};

TEST(TrainMpiCliMesh, ExpertParallelProcessesMatchLocalRanksAndNoExpertParallelism) {
  const fs::path dir = data_dir();
  // Every stage at EP 2, the precision alternating (the full stage x precision cross runs on local
  // ranks in test_mesh_moe; here the MPI transport is what is new), and EP 4 at stages 1 and 3.
  const std::vector<EpCell> cells = {{2, 0, "fp32"}, {2, 1, "bf16"}, {2, 2, "fp32"}, {2, 3, "bf16"}, {4, 1, "fp32"}, {4, 3, "bf16"}};
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  for (const EpCell& c : cells) {
    const std::string name = "ep" + std::to_string(c.ep) + "_zero" + std::to_string(c.stage) + "_" + c.precision;
    SCOPED_TRACE(name);
    const auto config = [&](int ep) {
      const fs::path p = dir / (name + (ep > 1 ? "" : "_noep") + ".json");
      std::ofstream(p) << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, )"
                       << (c.precision == "bf16" ? R"("bf16": {"enabled": true}, )" : "")
                       << R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
          "zero_optimization": {"stage": )"
                       << c.stage << R"(, "stage3_param_persistence_threshold": 0, "stage3_gather_16bit_weights_on_model_save": true}, )"
                       << R"("expert_parallel": {"enabled": )" << (ep > 1 ? "true" : "false") << R"(, "autoep_size": )" << ep << "}}";
      return p;
    };
    const auto common = [&](const fs::path& cfg) {
      return "train --deepspeed_config " + q(cfg) + " --model moe:L2-C32-H4-KV2-E4-K2-I24-V256-T32-aux0.05 --tokenizer bytes --data " +
             q(dir / "t_train.bin") + " --seed 5 --sample-tokens 0 --val-interval 0 --steps 3";
    };
    const fs::path w_mpi = dir / (name + "_mpi.safetensors"), w_local = dir / (name + "_local.safetensors");
    const fs::path s_mpi = dir / (name + "_mpi.json"), s_local = dir / (name + "_local.json"), s_noep = dir / (name + "_noep_summary.json");
    const CliResult mpi = run_dstrain(common(config(c.ep)) + " --comm mpi --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi),
                                      std::string(DSTRAIN_MPIEXEC) + " 4");
    ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;
    EXPECT_NE(mpi.out.find("expert-parallel " + std::to_string(c.ep)), std::string::npos) << mpi.out;
    const CliResult local = run_dstrain(common(config(c.ep)) + " --num-ranks 4 --save-weights " + q(w_local) + " --summary-json " + q(s_local));
    ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
    EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << "the saved weights differ";
    const nlohmann::json a = nlohmann::json::parse(read_file_text(s_mpi));
    EXPECT_EQ(a["train_losses"], nlohmann::json::parse(read_file_text(s_local))["train_losses"]);
    // Without expert parallelism: the same losses up to the order of the gradient sums (the expert
    // gradients summed over their senders, then averaged over the expert-data group, instead of
    // averaged over all 4 ranks at once): fp32 1e-5, bf16 (each partial sum rounded) 2e-2 relative,
    // as test_mesh_moe's bounds; a wrong expert average or all-to-all moves step 2's loss by more.
    const CliResult noep = run_dstrain(common(config(1)) + " --num-ranks 4 --summary-json " + q(s_noep));
    ASSERT_EQ(noep.exit_code, 0) << noep.err << noep.out;
    const nlohmann::json b = nlohmann::json::parse(read_file_text(s_noep));
    ASSERT_EQ(a["train_losses"].size(), 3u);
    ASSERT_EQ(b["train_losses"].size(), 3u);
    const double rtol = c.precision == "fp32" ? 1e-5 : 2e-2;
    for (std::size_t k = 0; k < 3; ++k) {
      const double x = a["train_losses"][k].get<double>(), y = b["train_losses"][k].get<double>();
      EXPECT_LE(std::abs(x - y), rtol * std::abs(y)) << "step " << k + 1 << ": " << x << " with expert parallelism, " << y << " without";
    }
  }
}

// Bad combinations are refused before step 1, naming the option and the fix.
TEST(TrainMpiCliErrors, NumRanksWithMpiAndMpiOnAGpuAreRefused) {
  const fs::path dir = data_dir();
  const fs::path cfg = write_config({1, 0, "fp32", 1});
  const std::string common = "train --deepspeed_config " + shell_quote(cfg.string()) + " --model gpt2:L2-C32-H2-V256-T32 --data " +
                             shell_quote((dir / "t_train.bin").string()) + " --steps 1 --comm mpi";
  const CliResult threads = run_dstrain(common + " --num-ranks 2");
  EXPECT_EQ(threads.exit_code, 2);
  EXPECT_NE(threads.err.find("--comm mpi with --num-ranks 2"), std::string::npos) << threads.err;
  const CliResult bad = run_dstrain(common.substr(0, common.size() - 3) + "fast");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--comm"), std::string::npos) << bad.err;
  const CliResult nccl = run_dstrain(common.substr(0, common.size() - 3) + "nccl");
  EXPECT_EQ(nccl.exit_code, 2);
  EXPECT_NE(nccl.err.find("--comm nccl with --device cpu"), std::string::npos) << nccl.err;
  // Threads under an MPI launcher's world of 2: each process would train alone.
  const CliResult local = run_dstrain(common.substr(0, common.size() - 3) + "local", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2");
  EXPECT_EQ(local.exit_code, 2);
  EXPECT_NE(local.err.find("one of 2 ranks"), std::string::npos) << local.err;
  EXPECT_EQ(local.out.find("| loss"), std::string::npos) << local.out;
}

// --comm mpi without a launcher: an MPI job of one process, said at the start, trains like 1 rank.
TEST(TrainMpiCliErrors, MpiWithoutALauncherIsAJobOfOne) {
  const fs::path dir = data_dir();
  const fs::path cfg = write_config({1, 0, "fp32", 1});
  const std::string common = "train --deepspeed_config " + shell_quote(cfg.string()) + " --model gpt2:L2-C32-H2-V256-T32 --data " +
                             shell_quote((dir / "t_train.bin").string()) + " --steps 2 --sample-tokens 0 --seed 3";
  const CliResult mpi = run_dstrain(common + " --comm mpi");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err;
  EXPECT_NE(mpi.out.find("comm: mpi, 1 process of MPI_COMM_WORLD, this one rank 0 (--comm mpi"), std::string::npos) << mpi.out;
  const CliResult one = run_dstrain(common);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find("comm: none (1 rank)"), std::string::npos) << one.out;
  const auto losses = [](const std::string& out) {
    std::string l;
    for (auto at = out.find("| loss"); at != std::string::npos; at = out.find("| loss", at + 1)) l += out.substr(at, 14);
    return l;
  };
  EXPECT_EQ(losses(mpi.out), losses(one.out));
  EXPECT_FALSE(losses(one.out).empty());
}

// Checkpoints across the backends' world sizes: saved by 2 MPI processes and resumed by 4 (and the
// reverse) ends exactly where the same save and resume on --num-ranks 2 / 4 ends: the same losses
// and the same weights, bit for bit. (bf16, ZeRO 2, a schedule: what a resume restores; the global
// batch of 8 is GAS 2 on 2 ranks, GAS 1 on 4.)
TEST(TrainMpiCliCheckpoints, SaveOnOneWorldSizeResumeOnAnotherMatchesLocalRanks) {
  const fs::path dir = data_dir();
  const fs::path cfg = dir / "ckpt.json";
  std::ofstream(cfg) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 12}}})";
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string common = "train --deepspeed_config " + q(cfg) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
                             q(dir / "t_train.bin") + " --sample-tokens 0 --val-interval 0 --seed 9";
  for (const auto& [saving, resuming] : std::vector<std::pair<int, int>>{{2, 4}, {4, 2}}) {
    const std::string name = "ck" + std::to_string(saving) + "to" + std::to_string(resuming);
    SCOPED_TRACE(name);
    const auto run = [&](bool mpi, int world, const std::string& args) {
      return mpi ? run_dstrain(common + args, std::string(DSTRAIN_MPIEXEC) + " " + std::to_string(world))
                 : run_dstrain(common + " --num-ranks " + std::to_string(world) + args);
    };
    for (bool mpi : {false, true}) {
      const std::string tag = name + (mpi ? "_mpi" : "_local");
      const CliResult save = run(mpi, saving, " --steps 3 --save-dir " + q(dir / tag));
      ASSERT_EQ(save.exit_code, 0) << save.err << save.out;
      const CliResult resume = run(mpi, resuming,
                                   " --steps 6 --resume " + q(dir / tag) + " --summary-json " + q(dir / (tag + ".json")) + " --save-weights " +
                                       q(dir / (tag + ".safetensors")));
      ASSERT_EQ(resume.exit_code, 0) << resume.err << resume.out;
      EXPECT_NE(resume.out.find("resumed from checkpoint"), std::string::npos) << resume.out;
    }
    const nlohmann::json a = nlohmann::json::parse(read_file_text(dir / (name + "_mpi.json")));
    const nlohmann::json b = nlohmann::json::parse(read_file_text(dir / (name + "_local.json")));
    EXPECT_EQ(a["train_losses"].size(), 3u);
    EXPECT_EQ(a["train_losses"], b["train_losses"]);
    EXPECT_EQ(a["zero"]["world_size"], resuming);
    EXPECT_EQ(read_file_text(dir / (name + "_mpi.safetensors")), read_file_text(dir / (name + "_local.safetensors"))) << "the weights differ";
  }
}

// Stragglers over MPI processes (docs/monitoring.md §7): the step times travel in the step's
// agreement over MPI_COMM_WORLD; rank 2, sleeping 300 ms in every step, is named once with its host
// and the launcher's local rank, no other rank is, and the progress line shows it as the slowest.
TEST(TrainMpiCliStragglers, ASlowProcessIsNamed) {
  const fs::path dir = data_dir();
  const fs::path cfg = dir / "stragglers.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  const CliResult r = run_dstrain("train --deepspeed_config " + shell_quote(cfg.string()) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
                                      shell_quote((dir / "t_train.bin").string()) + " --seed 5 --sample-tokens 0 --steps 6 --comm mpi --inject-slow-rank 2:300",
                                  std::string(DSTRAIN_MPIEXEC) + " 4");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::size_t named = 0;
  for (auto at = r.err.find("straggler: rank"); at != std::string::npos; at = r.err.find("straggler: rank", at + 1)) ++named;
  EXPECT_EQ(named, 1u) << r.err;
  EXPECT_NE(r.err.find("straggler: rank 2 (host "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", local rank 2) took 0."), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("| slowest rank 2: 0."), std::string::npos) << r.out;
}

}  // namespace
