// The mesh matrix under `mpirun -np 4` (docs/parallelism.md "Correctness"): every 4-rank mesh
// (TP, SP, DP) ∈ {(2,1,2), (4,1,1), (1,2,2), (1,4,1), (2,2,1)} × ZeRO 0–3 × fp32 / bf16 × GPT-2 and a
// GQA Llama, trained by `dstrain train` as 4 MPI processes (the groups MPI_Comm_split children) and
// as 4 local ranks: the same losses and bit-identical saved whole weights (the same reductions in
// the same order). 80 cells, several minutes: behind the `matrix` label (DSTRAIN_MATRIX=1 bash
// scripts/test.sh), not in CI, which runs one such cell (TrainMpiCliMesh).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

// One OpenBLAS thread per rank in both layouts, as test_train_mpi_cli.cpp says why.
[[maybe_unused]] const bool kOneBlasThreadPerRank = [] { return ::setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0; }();

fs::path data_dir_path() { return fs::temp_directory_path() / ("dstrain_test_train_mpi_mesh_matrix." + std::to_string(::getpid())); }

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

using Mesh = std::tuple<int, int, int>;  // tp, sp, dp
using Cell = std::tuple<Mesh, int, std::string, std::string>;

class TrainMpiMeshMatrix : public ::testing::TestWithParam<Cell> {};

TEST_P(TrainMpiMeshMatrix, ProcessesMatchLocalRanks) {
  const auto& [mesh, stage, precision, model] = GetParam();
  const auto [tp, sp, dp] = mesh;
  const fs::path dir = data_dir();
  const std::string tag = fmt::format("m{}{}{}_{}_{}_{}", tp, sp, dp, stage, precision, model.substr(0, model.find(':')));
  const fs::path cfg = dir / (tag + ".json");
  const std::string dtype = precision == "bf16" ? R"(, "bf16": {"enabled": true})" : "";
  std::ofstream(cfg) << fmt::format(
      R"({{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "zero_optimization": {{"stage": {}, "stage3_gather_16bit_weights_on_model_save": true}}, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2}}}}, "tensor_parallel": {{"autotp_size": {}}}, "sequence_parallel_size": {}{}}})",
      stage, tp, sp, dtype);
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string common = "train --deepspeed_config " + q(cfg) + " --model " + model + " --tokenizer bytes --data " + q(dir / "t_train.bin") +
                             " --seed 5 --sample-tokens 0 --steps 2";
  const fs::path w_mpi = dir / (tag + "_mpi.safetensors"), w_local = dir / (tag + "_local.safetensors");
  const fs::path s_mpi = dir / (tag + "_mpi.json"), s_local = dir / (tag + "_local.json");
  const CliResult local = run_dstrain(common + " --num-ranks 4 --save-weights " + q(w_local) + " --summary-json " + q(s_local));
  ASSERT_EQ(local.exit_code, 0) << local.err << local.out;
  const CliResult mpi = run_dstrain(common + " --comm mpi --save-weights " + q(w_mpi) + " --summary-json " + q(s_mpi), std::string(DSTRAIN_MPIEXEC) + " 4");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err << mpi.out;
  EXPECT_EQ(read_file_text(w_mpi), read_file_text(w_local)) << "the saved weights differ";
  EXPECT_EQ(nlohmann::json::parse(read_file_text(s_mpi))["train_losses"], nlohmann::json::parse(read_file_text(s_local))["train_losses"]);
}

std::string cell_name(const ::testing::TestParamInfo<Cell>& info) {
  const Mesh& mesh = std::get<0>(info.param);
  const std::string& model = std::get<3>(info.param);
  return fmt::format("tp{}_sp{}_dp{}_stage{}_{}_{}", std::get<0>(mesh), std::get<1>(mesh), std::get<2>(mesh), std::get<1>(info.param),
                     std::get<2>(info.param), model.substr(0, model.find(':')));
}

INSTANTIATE_TEST_SUITE_P(All, TrainMpiMeshMatrix,
                         ::testing::Combine(::testing::Values(Mesh{2, 1, 2}, Mesh{4, 1, 1}, Mesh{1, 2, 2}, Mesh{1, 4, 1}, Mesh{2, 2, 1}),
                                            ::testing::Values(0, 1, 2, 3), ::testing::Values(std::string("fp32"), std::string("bf16")),
                                            ::testing::Values(std::string("gpt2:L2-C32-H4-V256-T32"), std::string("llama:L2-C32-H8-KV4-I48-V256-T32"))),
                         cell_name);

}  // namespace
