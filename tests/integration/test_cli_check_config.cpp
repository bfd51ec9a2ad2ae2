// `dstrain check-config` as a user runs it: exit codes, stdout/stderr separation, --json, help.
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;
using ::testing::HasSubstr;

namespace {

std::string example(const std::string& name) { return std::string(DSTRAIN_SOURCE_DIR) + "/examples/ds_configs/" + name; }

std::string write_temp(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST(CliCheckConfig, HelpWorksForProgramAndSubcommand) {
  auto top = run_dstrain("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("check-config"));
  auto sub = run_dstrain("check-config --help");
  EXPECT_EQ(sub.exit_code, 0);
  EXPECT_THAT(sub.out, HasSubstr("--world-size"));
  EXPECT_THAT(sub.out, HasSubstr("--json"));
}

TEST(CliCheckConfig, ValidConfigPrintsResolvedJsonOnStdout) {
  // zero2_fp16_offload_cpu.json as it is: optimizer offload to host memory at stage 2 trains, so
  // check-config (which refuses what train refuses) accepts it: train_batch_size 32, GAS 4; on 2
  // ranks DeepSpeed infers MBS = (32 // 2) // 4 = 4.
  const std::string text = dstrain::testing::read_file_text(example("zero2_fp16_offload_cpu.json"));
  auto r = run_dstrain("check-config " + shell_quote(text) + " --world-size 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);  // stdout is pure JSON
  EXPECT_EQ(j.at("train_batch_size"), 32);
  EXPECT_EQ(j.at("train_micro_batch_size_per_gpu"), 4);
  EXPECT_EQ(j.at("gradient_accumulation_steps"), 4);
  EXPECT_EQ(j.at("zero_optimization").at("stage"), 2);
  EXPECT_EQ(j.at("zero_optimization").at("offload_optimizer").at("device"), "cpu");
  EXPECT_EQ(j.at("fp16").at("enabled"), true);
  // Defaults filled in, as DeepSpeed 0.19 has them.
  EXPECT_EQ(j.at("zero_optimization").at("offload_optimizer").at("buffer_count"), 4);
  EXPECT_EQ(j.at("zero_optimization").at("load_from_fp32_weights"), true);
}

TEST(CliCheckConfig, ReadableSummaryByDefault) {
  auto r = run_dstrain("check-config " + shell_quote(example("zero1_bf16.json")) + " --world-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("valid"));
  EXPECT_THAT(r.out, HasSubstr("bf16"));
}

// The 3D example (pipeline.stages 2 x tensor_parallel 2) on 8 ranks: data-parallel 2, so the batch
// is 2 x 8 x 2 = 32 sequences (DeepSpeed's PipelineEngine counts data-parallel ranks alike).
TEST(CliCheckConfig, PipelineExampleCountsDataParallelRanks) {
  auto r = run_dstrain("check-config " + shell_quote(example("pipeline_3d_cpu.json")) + " --world-size 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("valid"));
  EXPECT_THAT(r.out, HasSubstr("pipeline 2"));
  EXPECT_THAT(r.out, HasSubstr("32"));
  auto bad = run_dstrain("check-config " + shell_quote(example("pipeline_3d_cpu.json")) + " --world-size 6");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
}

// The expert-parallel example (autoep_size 4): the EP split of the data-parallel ranks; a world
// whose data-parallel size 4 does not divide is refused naming the key and the sizes that would.
TEST(CliCheckConfig, ExpertParallelExampleSplitsTheDataParallelRanks) {
  auto r = run_dstrain("check-config " + shell_quote(example("expert_parallel_cpu.json")) + " --world-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("data-parallel 4 (expert-parallel 4 x expert-data-parallel 1)"));
  EXPECT_THAT(r.out, HasSubstr("expert parallelism: autoep_size 4, preset_model mixtral"));
  auto bad = run_dstrain("check-config " + shell_quote(example("expert_parallel_cpu.json")) + " --world-size 6");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.err, HasSubstr("expert_parallel.autoep_size 4 does not divide the data-parallel size 6"));
}

// ZeRO++ / MiCS (docs/zero.md §10): what they change is summarised; the combinations DeepSpeed or
// dstrain refuse are refused by check-config as by train, naming the keys.
TEST(CliCheckConfig, ZeroPlusPlusSummaryAndRefusals) {
  const std::string zeropp = write_temp("dstrain_zeropp.json", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "zero_quantized_weights": true, "zero_hpz_partition_size": 16, "zero_quantized_gradients": true}})");
  const auto ok = run_dstrain("check-config " + zeropp + " --world-size 8");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("ZeRO++ / MiCS: qwZ: int8 parameter all-gathers; hpZ: a pass's later gathers within 16 ranks"));
  const std::pair<const char*, const char*> bad[] = {
      {R"("mics_shard_size": 3)", "mics_shard_size 3: the 8 data-parallel ranks do not split"},
      {R"("zero_hpz_partition_size": 3)", "zero_hpz_partition_size 3"},
      {R"("zero_quantized_gradients": true, "reduce_scatter": false)", "zero_quantized_gradients with reduce_scatter: false"},
      {R"("mics_shard_size": 4, "offload_optimizer": {"device": "cpu"})", "Local sharding has no support for CPU offloading"},
      {R"("zero_quantized_gradients": true, "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 1024})", "zeropp_loco_param"},
  };
  for (const auto& [keys, message] : bad) {
    const std::string path =
        write_temp("dstrain_zeropp_bad.json", std::string(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, )") + keys + "}}");
    const auto r = run_dstrain("check-config " + path + " --world-size 8");
    EXPECT_EQ(r.exit_code, 2) << keys;
    EXPECT_THAT(r.err, HasSubstr(message)) << keys;
  }
  const std::string ep = write_temp("dstrain_zeropp_ep.json", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "zero_quantized_gradients": true}, "expert_parallel": {"enabled": true, "autoep_size": 2, "preset_model": "mixtral"}})");
  const auto r = run_dstrain("check-config " + ep + " --world-size 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("expert_parallel.autoep_size 2"));
}

TEST(CliCheckConfig, BatchMismatchExitsTwoWithDeepSpeedsNumbers) {
  // TBS 32, MBS 3 on 2 ranks: GAS = (32 // 3) // 2 = 5, and 32 != 3 * 5 * 2 (docs/batch.md §2).
  const std::string cfg = write_temp("dstrain_cli_batch.json", R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 3})");
  auto r = run_dstrain("check-config " + shell_quote(cfg) + " --world-size 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_THAT(r.err, HasSubstr("32 != 3 * 5 * 2"));
}

TEST(CliCheckConfig, UnknownTopLevelKeyWarnsWithSuggestionOnStderr) {
  const std::string cfg = write_temp("dstrain_cli_typo.json", R"({"train_batch_size": 8, "gradient_accumulation_step": 2})");
  auto r = run_dstrain("check-config " + shell_quote(cfg) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("gradient_accumulation_step"));
  EXPECT_THAT(r.err, HasSubstr("did you mean \"gradient_accumulation_steps\""));
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;
}

// The device mesh: 8 ranks = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2, and the
// batch keys count the 2 data-parallel ranks (train_batch_size = 3 x 1 x 2).
TEST(CliCheckConfig, PrintsTheDeviceMesh) {
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 3, "sequence_parallel_size": 2,
                              "tensor_parallel": {"autotp_size": 2, "preset_model": "llama"}})";
  auto r = run_dstrain("check-config " + shell_quote(cfg) + " --world-size 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("world size 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2"));
  EXPECT_THAT(r.out, HasSubstr("train_batch_size 6 = micro batch 3 x gradient accumulation 1 x data-parallel 2"));
  EXPECT_THAT(r.out, HasSubstr("tensor parallelism: autotp_size 2, preset_model llama"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("tensor_parallel` section is ignored")));
  auto bad = run_dstrain("check-config " + shell_quote(cfg) + " --world-size 6");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("sequence_parallel_size is 2 and tensor_parallel.autotp_size is 2 (product 4) but the world size 6"));
  auto help = run_dstrain("check-config --help");
  EXPECT_THAT(help.out, HasSubstr("data-parallel x sequence-parallel"));
}

TEST(CliCheckConfig, StrictSectionUnknownKeyExitsTwoNamingThePath) {
  const std::string cfg = write_temp("dstrain_cli_strict.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "grad_hooks": true}})");
  auto r = run_dstrain("check-config " + shell_quote(cfg));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("zero_optimization.grad_hooks"));
}

TEST(CliCheckConfig, MissingFileExitsTwoNamingIt) {
  auto r = run_dstrain("check-config /nonexistent/ds_config.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/ds_config.json"));
}

TEST(CliCheckConfig, JsonStringAndBase64AreAccepted) {
  auto r = run_dstrain("check-config " + shell_quote(R"({"train_micro_batch_size_per_gpu": 2})") + " --world-size 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("train_batch_size"), 6);
  // base64url of {"train_batch_size": 12} (RFC 4648 §5 alphabet), as the deepspeed launcher passes it.
  auto b = run_dstrain("check-config eyJ0cmFpbl9iYXRjaF9zaXplIjogMTJ9 --world-size 3 --json");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out).at("train_micro_batch_size_per_gpu"), 4);
}

TEST(CliCheckConfig, AutoValuesComeFromTheCommandLineAndAreReported) {
  auto missing = run_dstrain("check-config " + shell_quote(example("hf_trainer_auto.json")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("auto"));

  auto r = run_dstrain("check-config " + shell_quote(example("hf_trainer_auto.json")) +
                       " --world-size 2 --micro-batch-size 4 --gradient-accumulation-steps 2 --hidden-size 1024"
                       " --lr 3e-4 --adam-betas 0.9 0.95 --adam-eps 1e-8 --weight-decay 0.1 --gradient-clipping 1.0"
                       " --warmup-steps 100 --precision bf16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("train_batch_size"), 16);
  EXPECT_EQ(j.at("zero_optimization").at("reduce_bucket_size"), 1024 * 1024);
  EXPECT_EQ(j.at("zero_optimization").at("prefetch_bucket_size"), 943718);  // int(0.9 * 1024^2)
  EXPECT_EQ(j.at("zero_optimization").at("param_persistence_threshold"), 10240);
  EXPECT_EQ(j.at("bf16").at("enabled"), true);
  EXPECT_EQ(j.at("fp16").at("enabled"), false);
  EXPECT_THAT(r.err, HasSubstr("reduce_bucket_size"));  // each resolution is reported
}

// An nvme_path that does not exist here made check-config exit 2, though the config is valid: it is
// often checked on a login node for compute nodes that have the drive. It is reported as a finding
// about this machine, exit 0 (and, with --json, stdout stays pure JSON); `train` still refuses it
// before step 1 (test_train_nvme_cli.cpp). An nvme_path given empty is wrong everywhere: exit 2.
TEST(CliCheckConfig, AMissingNvmePathIsAFindingAboutThisMachine) {
  const std::string missing = (std::filesystem::temp_directory_path() / "dstrain_check_config_no_such_drive" / "swap").string();
  const auto config = [&](const std::string& path) {
    return R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": )" +
           nlohmann::json(path).dump() + "}}}";
  };
  const std::string file = write_temp("dstrain_check_config_nvme.json", config(missing));
  auto r = run_dstrain("check-config " + shell_quote(file));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("on this machine: zero_optimization.offload_optimizer.nvme_path \"" + missing + "\" does not exist"));
  EXPECT_THAT(r.out, HasSubstr("is valid"));
  EXPECT_THAT(r.out, HasSubstr("On this machine, 1 finding"));
  r = run_dstrain("check-config " + shell_quote(file) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("zero_optimization").at("offload_optimizer").at("nvme_path"), missing);
  EXPECT_THAT(r.err, HasSubstr("on this machine: "));

  r = run_dstrain("check-config " + shell_quote(write_temp("dstrain_check_config_nvme_empty.json", config(""))));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("zero_optimization.offload_optimizer.nvme_path is empty"));
}
