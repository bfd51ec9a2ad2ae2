// `dstrain train` on a device mesh (docs/parallelism.md): tensor_parallel.autotp_size and
// sequence_parallel_size in the config, --num-ranks N threads. A TP 2 x SP 2 x DP 2 run on 8 ranks
// trains like the DP-only run on 2 ranks with the same global batch (the same losses within the
// mesh tolerance; the saved whole weights within it too), prints the mesh, and what does not
// compose is refused before step 1 with the key and the fix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

fs::path data_dir_path() { return fs::temp_directory_path() / ("dstrain_test_train_mesh_cli." + std::to_string(::getpid())); }

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

fs::path write_config(const std::string& name, int tp, int sp, const std::string& optimizer = "AdamW") {
  const fs::path p = data_dir() / ("config_" + name + ".json");
  std::ofstream(p) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
      "optimizer": {"type": ")"
                   << optimizer << R"(", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2},
      "tensor_parallel": {"autotp_size": )"
                   << tp << R"(}, "sequence_parallel_size": )" << sp << "}";
  return p;
}

std::string common(const fs::path& cfg, const std::string& model = "gpt2:L2-C32-H4-V256-T32") {
  const fs::path dir = data_dir();
  return "train --deepspeed_config " + shell_quote(cfg.string()) + " --model " + model + " --tokenizer bytes --data " +
         shell_quote((dir / "t_train.bin").string()) + " --seed 5 --sample-tokens 0";
}

TEST(TrainMeshCli, TensorAndSequenceParallelTrainLikeDataParallel) {
  const fs::path dir = data_dir();
  const fs::path s_mesh = dir / "mesh.json", s_dp = dir / "dp.json", w_mesh = dir / "mesh.safetensors", w_dp = dir / "dp.safetensors";
  const CliResult mesh = run_dstrain(common(write_config("tp2sp2", 2, 2)) + " --steps 3 --num-ranks 8 --summary-json " + shell_quote(s_mesh.string()) +
                                     " --save-weights " + shell_quote(w_mesh.string()));
  ASSERT_EQ(mesh.exit_code, 0) << mesh.err << mesh.out;
  EXPECT_NE(mesh.out.find("mesh: world 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2"), std::string::npos) << mesh.out;
  EXPECT_NE(mesh.out.find("x data-parallel size 2;"), std::string::npos) << mesh.out;
  const CliResult dp = run_dstrain(common(write_config("dp", 1, 1)) + " --steps 3 --num-ranks 2 --summary-json " + shell_quote(s_dp.string()) +
                                   " --save-weights " + shell_quote(w_dp.string()));
  ASSERT_EQ(dp.exit_code, 0) << dp.err << dp.out;
  const nlohmann::json a = nlohmann::json::parse(read_file_text(s_mesh)), b = nlohmann::json::parse(read_file_text(s_dp));
  ASSERT_EQ(a["train_losses"].size(), 3u);
  ASSERT_EQ(b["train_losses"].size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    const double x = a["train_losses"][k].get<double>(), y = b["train_losses"][k].get<double>();
    EXPECT_LE(std::abs(x - y), 1e-6 * std::abs(y)) << "step " << k + 1;
  }
  // The saved weights are whole Hugging Face tensors (the same file size as the DP run's).
  ASSERT_TRUE(fs::exists(w_mesh));
  EXPECT_EQ(fs::file_size(w_mesh), fs::file_size(w_dp));
}

// Pipeline parallelism through the CLI (docs/parallelism.md §7): `pipeline.stages` in the config (or
// --pipeline-stages), 3D on 8 ranks (PP 2 x DP 2 x TP 2) and the interleaved schedule, against the
// DP-only run on 2 ranks with the same global batch; the partition is printed at the start.
fs::path write_pipeline_config(const std::string& name, int stages, int tp, int stage, int gas) {
  const fs::path p = data_dir() / ("config_" + name + ".json");
  std::ofstream(p) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" << gas << R"(, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": )"
                   << stage << R"(}, "tensor_parallel": {"autotp_size": )" << tp << R"(}, "pipeline": {"stages": )" << stages
                   << R"(, "partition": "uniform"}})";
  return p;
}

TEST(TrainMeshCli, PipelineTrainsLikeDataParallel) {
  const fs::path dir = data_dir();
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const fs::path s_dp = dir / "pp_dp.json", s_3d = dir / "pp_3d.json", s_int = dir / "pp_int.json";
  const fs::path w_dp = dir / "pp_dp.safetensors", w_3d = dir / "pp_3d.safetensors";
  const CliResult dp = run_dstrain(common(write_pipeline_config("pp_dp", 1, 1, 1, 2)) + " --steps 3 --num-ranks 2 --summary-json " + q(s_dp) +
                                   " --save-weights " + q(w_dp));
  ASSERT_EQ(dp.exit_code, 0) << dp.err << dp.out;
  const CliResult three = run_dstrain(common(write_pipeline_config("pp_3d", 2, 2, 1, 2)) + " --steps 3 --num-ranks 8 --summary-json " + q(s_3d) +
                                      " --save-weights " + q(w_3d));
  ASSERT_EQ(three.exit_code, 0) << three.err << three.out;
  EXPECT_NE(three.out.find("mesh: world 8 = pipeline 2 x data-parallel 2 x tensor-parallel 2"), std::string::npos) << three.out;
  EXPECT_NE(three.out.find("stage 1:"), std::string::npos) << "the partition is printed\n" << three.out;
  // Interleaved: 2 stages x 2 virtual stages over the model's 4 layers, --pipeline-stages overriding the config.
  const CliResult inter = run_dstrain(common(write_pipeline_config("pp_int", 1, 1, 0, 2)) +
                                      " --steps 3 --num-ranks 4 --pipeline-stages 2 --pipeline-virtual-stages 2 --summary-json " + q(s_int));
  ASSERT_EQ(inter.exit_code, 0) << inter.err << inter.out;
  const nlohmann::json ref = nlohmann::json::parse(read_file_text(s_dp));
  for (const fs::path& s : {s_3d, s_int}) {
    const nlohmann::json a = nlohmann::json::parse(read_file_text(s));
    ASSERT_EQ(a["train_losses"].size(), 3u) << s;
    for (std::size_t k = 0; k < 3; ++k) {
      const double x = a["train_losses"][k].get<double>(), y = ref["train_losses"][k].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-6 * std::abs(y)) << s << " step " << k + 1;
    }
  }
  // Every stage's weights reach the one file (mesh rank 0 writes it): the DP run's size.
  ASSERT_TRUE(fs::exists(w_3d));
  EXPECT_EQ(fs::file_size(w_3d), fs::file_size(w_dp));
}

// A mixture of experts with its load-balancing loss (Mixtral-shaped, 4 experts, top-2, coefficient
// 0.05) through 2 pipeline stages (--pipeline-stages 2, 4 micro-batches per step): it trains, the
// progress line prints the aux loss and the per-expert counts, and it matches the run without a
// pipeline — the losses within 1e-5 (fp32; the router statistics travel between the stages and are
// summed in one rank's order), and step 1's aux and counts (every token routed by the initial
// weights) as printed. Stage 0 prints the line: its counts are the whole model's (both stages'
// summed) and its aux the whole model's, which came back with the gradients.
TEST(TrainMeshCli, MixtureOfExpertsWithTheLoadBalancingLossTrainsThroughAPipeline) {
  const fs::path dir = data_dir();
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const std::string model = "moe:L2-C32-H4-KV2-E4-K2-I24-V256-T32-aux0.05";
  const fs::path s_pp = dir / "moe_pp.json", s_one = dir / "moe_one.json";
  const fs::path cfg = write_pipeline_config("moe_pp", 1, 1, 1, 4);
  const CliResult pp = run_dstrain(common(cfg, model) + " --steps 3 --num-ranks 2 --pipeline-stages 2 --summary-json " + q(s_pp));
  ASSERT_EQ(pp.exit_code, 0) << pp.err << pp.out;
  EXPECT_NE(pp.out.find("mesh: world 2 = pipeline 2"), std::string::npos) << pp.out;
  const CliResult one = run_dstrain(common(cfg, model) + " --steps 3 --num-ranks 1 --summary-json " + q(s_one));
  ASSERT_EQ(one.exit_code, 0) << one.err << one.out;
  const auto step1_moe = [](const std::string& out) {
    const std::size_t line = out.find("step 1/3 | loss");
    if (line == std::string::npos) return std::string("no step 1 line");
    const std::size_t aux = out.find(" | aux ", line), end = out.find(')', aux);
    if (aux == std::string::npos || end == std::string::npos || out.find('\n', line) < end) return std::string("no aux on step 1's line");
    return out.substr(aux, end + 1 - aux);  // " | aux 2.0123 | experts 91-165 (x1.31)"
  };
  const std::string want = step1_moe(one.out);
  EXPECT_NE(want.find(" | experts "), std::string::npos) << one.out;
  EXPECT_EQ(step1_moe(pp.out), want) << pp.out;
  const nlohmann::json a = nlohmann::json::parse(read_file_text(s_pp)), b = nlohmann::json::parse(read_file_text(s_one));
  ASSERT_EQ(a["train_losses"].size(), 3u);
  ASSERT_EQ(b["train_losses"].size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    const double x = a["train_losses"][k].get<double>(), y = b["train_losses"][k].get<double>();
    EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(y)) << "step " << k + 1 << ": " << x << " through the pipeline, " << y << " without";
  }
}

TEST(TrainMeshCli, PipelineMistakesAreRefusedBeforeStepOne) {
  // ZeRO-3 with a pipeline: the cost named, and the fix.
  const CliResult z3 = run_dstrain(common(write_pipeline_config("pp_z3", 2, 1, 3, 2)) + " --steps 1 --num-ranks 2");
  EXPECT_EQ(z3.exit_code, 2) << z3.err << z3.out;
  EXPECT_NE(z3.err.find("zero_optimization.stage"), std::string::npos) << z3.err;
  EXPECT_EQ(z3.out.find("step 1/"), std::string::npos) << z3.out;
  // More stages than layers (the model has 4).
  const CliResult many = run_dstrain(common(write_pipeline_config("pp_many", 8, 1, 0, 8)) + " --steps 1 --num-ranks 8");
  EXPECT_EQ(many.exit_code, 2) << many.err << many.out;
  EXPECT_NE(many.err.find("layers"), std::string::npos) << many.err;
}

// Refused before step 1 (exit 2, no step printed), naming the key and the fix; and the one case that
// looks like it but trains.
TEST(TrainMeshCli, WhatDoesNotComposeIsRefusedBeforeStepOne) {
  struct Case {
    std::string name, config_model_args, want;
  };
  const auto run = [&](const fs::path& cfg, const std::string& model, const std::string& extra) {
    return run_dstrain(common(cfg, model) + " --steps 3 " + extra);
  };
  {  // more tensor-parallel ranks than GPT-2 heads trains, as AutoTP allows: the surplus ranks hold no heads
    const CliResult r = run(write_config("tp8", 8, 1), "gpt2:L2-C32-H4-V256-T32", "--num-ranks 8");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("step 3/3 | loss"), std::string::npos) << r.out;
  }
  {  // heads that do not divide by the sequence-parallel size
    const CliResult r = run(write_config("sp4", 1, 4), "gpt2:L2-C48-H6-V256-T32", "--num-ranks 4");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.err.find("sequence_parallel_size 4"), std::string::npos) << r.err;
  }
  {  // a sequence length that does not divide by the sequence-parallel size
    const CliResult r = run(write_config("sp2", 1, 2), "gpt2:L2-C32-H4-V256-T32", "--num-ranks 2 --sequence-length 31");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.err.find("--sequence-length 30"), std::string::npos) << r.err;
  }
  {  // a world the mesh does not divide
    const CliResult r = run(write_config("tp2b", 2, 1), "gpt2:L2-C32-H4-V256-T32", "--num-ranks 3");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.err.find("tensor_parallel.autotp_size"), std::string::npos) << r.err;
  }
}

// A checkpoint saved by a TP 2 x SP 2 x DP 2 run resumes on 2 data-parallel ranks (and on the same
// mesh): it ends where the uninterrupted run ends (the same losses within the mesh tolerance).
TEST(TrainMeshCli, CheckpointsResumeOnAnotherMesh) {
  const fs::path dir = data_dir();
  const fs::path ck = dir / "ck", s_full = dir / "full.json", s_resumed = dir / "resumed.json";
  fs::remove_all(ck);
  const CliResult full = run_dstrain(common(write_config("tp2sp2c", 2, 2)) + " --num-ranks 8 --steps 4 --save-dir " + shell_quote(ck.string()) +
                                     " --save-interval 2 --summary-json " + shell_quote(s_full.string()));
  ASSERT_EQ(full.exit_code, 0) << full.err << full.out;
  const CliResult resumed = run_dstrain(common(write_config("dpc", 1, 1)) + " --num-ranks 2 --steps 4 --resume " + shell_quote(ck.string()) +
                                        " --load-tag global_step2 --summary-json " + shell_quote(s_resumed.string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err << resumed.out;
  const nlohmann::json a = nlohmann::json::parse(read_file_text(s_full)), b = nlohmann::json::parse(read_file_text(s_resumed));
  ASSERT_EQ(a["train_losses"].size(), 4u);
  ASSERT_GE(b["train_losses"].size(), 2u);
  const auto& la = a["train_losses"];
  const auto& lb = b["train_losses"];
  // The resumed run's last two steps are the full run's steps 3 and 4.
  for (std::size_t k = 0; k < 2; ++k) {
    const double x = la[la.size() - 2 + k].get<double>(), y = lb[lb.size() - 2 + k].get<double>();
    EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(x)) << "step " << 3 + k;
  }
}

}  // namespace
