// `dstrain train` with bad inputs, through the built binary (issue 14, sections 1-3, 5): every
// mistake that can be found before step 1 is an exit 2 naming the option, key or file before any
// progress line; no input is ever overwritten; nothing crashes, hangs or leaves a temporary behind;
// a NaN loss ends the run with the step and writes no weights; DeepSpeed launchers' conventions and
// "auto" configs work. Each check fails without its fix: before it, the run trained first and failed
// at the end (a progress line in stdout), crashed (exit -1: a signal), exited 3, or trained when it
// should not have.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "tests/sanitizers/asan_build.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

class TrainPreflightCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_train_preflight_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    std::ofstream(dir_ / "ds.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}})";
    std::ofstream(dir_ / "a_file") << "not a folder";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  // 3 steps, no samples, unless `extra` says otherwise.
  static std::string train(const std::string& extra, const std::string& config = "ds.json") {
    std::string defaults;
    if (extra.find("--steps") == std::string::npos) defaults += " --steps 3";
    if (extra.find("--sample-tokens") == std::string::npos) defaults += " --sample-tokens 0";
    return "train --deepspeed_config " + q(dir_ / config) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           defaults + " " + extra;
  }
  // Refused before step 1: exit 2, `what` in the message, no progress line printed.
  static void expect_refused_before_training(const CliResult& r, const std::string& what) {
    EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("| loss"), std::string::npos) << "trained before refusing:\n" << r.out;
  }
  static std::vector<std::string> temp_files(const fs::path& folder) {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(folder))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(e.path().filename().string());
    return found;
  }

  static fs::path dir_;
};
fs::path TrainPreflightCli::dir_;

// ---- section 1: checked before step 1 ----

TEST_F(TrainPreflightCli, OutputLocationsAreCreatedOrRefusedBeforeStep1) {
  // A folder that does not exist yet is created (as --summary-json's always was) and the run saves.
  const fs::path nested = dir_ / "new" / "sub" / "w.safetensors";
  const CliResult ok = run_dstrain(train("--save-weights " + q(nested)));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::is_regular_file(nested));
  // A folder that cannot be made (a file stands where it would be): refused before training.
  expect_refused_before_training(run_dstrain(train("--save-weights " + q(dir_ / "a_file" / "w.safetensors"))), "--save-weights");
  // --summary-json there was "internal error" (exit 3) after the last step.
  expect_refused_before_training(run_dstrain(train("--summary-json " + q(dir_ / "a_file" / "s.json"))), "--summary-json");
  // A folder given as the file.
  expect_refused_before_training(run_dstrain(train("--save-weights " + q(dir_))), "is a folder");
}

TEST_F(TrainPreflightCli, ValDataIsCheckedWholeBeforeStep1) {
  // A val file holding a token beyond the model's vocabulary (256): found at the first evaluation,
  // after the steps, before; now by the pre-flight's scan.
  const std::string val = read_file_text(dir_ / "t_val.bin");
  std::string bad = val;
  bad[1024 + 2 * 100] = static_cast<char>(0x2C);  // token 100 := 300 (0x012C, little-endian)
  bad[1024 + 2 * 100 + 1] = 0x01;
  std::ofstream(dir_ / "bad_val.bin", std::ios::binary) << bad;
  const CliResult r = run_dstrain(train("--val-data " + q(dir_ / "bad_val.bin")));
  expect_refused_before_training(r, "bad_val.bin");
  EXPECT_NE(r.err.find("token 300 at position 100"), std::string::npos) << r.err;
}

TEST_F(TrainPreflightCli, SampleTemperatureMustBeAFiniteFloat) {
  for (const char* t : {"nan", "inf", "1e308", "-1"}) {
    SCOPED_TRACE(t);
    expect_refused_before_training(run_dstrain(train(std::string("--sample-tokens 4 --sample-temperature ") + t)), "--sample-temperature");
  }
  const CliResult zero = run_dstrain(train("--sample-tokens 4 --sample-temperature 0 --steps 1"));
  EXPECT_EQ(zero.exit_code, 0) << zero.err;  // greedy
}

TEST_F(TrainPreflightCli, Stage3SaveWithoutGatherIsRefusedBeforeStep1) {
  std::ofstream(dir_ / "z3.json") << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})";
  const CliResult r = run_dstrain(train("--num-ranks 2 --save-weights " + q(dir_ / "z3.safetensors"), "z3.json"));
  expect_refused_before_training(r, "stage3_gather_16bit_weights_on_model_save");
  EXPECT_FALSE(fs::exists(dir_ / "z3.safetensors"));
}

// tensor_parallel.partition_config against the model (docs/parallelism.md §2): a rule that asks for
// another cut than the layer's (row for GPT-2's column-parallel c_fc) and a preset written for
// another architecture are refused before step 1, naming the rule, the parameter and the fix; a
// rule that agrees is honoured, said in a line, and the run trains. check-config refuses what
// tensor parallelism refuses of the optimizer, as train does. Before: the rules were not read.
TEST_F(TrainPreflightCli, TensorParallelPartitionRulesAreCheckedAgainstTheModelBeforeStep1) {
  const auto tp_config = [&](const std::string& name, const std::string& section, const std::string& optimizer = "AdamW") {
    std::ofstream(dir_ / name) << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "optimizer": {"type": ")" << optimizer
                               << R"(", "params": {"lr": 1e-2}}, "tensor_parallel": )" << section << "}";
  };
  tp_config("tp_row.json", R"({"autotp_size": 2, "partition_config": {"layer_specs": [
      {"patterns": [".*\\.mlp\\.c_fc\\.weight$"], "partition_type": "row"}]}})");
  CliResult r = run_dstrain(train("--num-ranks 2", "tp_row.json"));
  expect_refused_before_training(r, "tensor_parallel.partition_config.layer_specs[0] (partition_type \"row\") names transformer.h.0.mlp.c_fc.weight");
  EXPECT_NE(r.err.find("Fix: make it \"partition_type\": \"column\""), std::string::npos) << r.err;

  tp_config("tp_preset.json", R"({"autotp_size": 2, "preset_model": "llama"})");
  r = run_dstrain(train("--num-ranks 2", "tp_preset.json"));
  expect_refused_before_training(r, "tensor_parallel.preset_model \"llama\" (its layer spec 0) pattern");
  EXPECT_NE(r.err.find("names no parameter of this gpt2 model"), std::string::npos) << r.err;

  tp_config("tp_column.json", R"({"autotp_size": 2, "partition_config": {"layer_specs": [
      {"patterns": [".*\\.mlp\\.c_fc\\.weight$"], "partition_type": "column"}]}})");
  r = run_dstrain(train("--num-ranks 2 --steps 1", "tp_column.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("autotp: tensor_parallel.partition_config.layer_specs[0] (partition_type \"column\") honoured: 2 parameters"),
            std::string::npos)
      << r.out;

  // The 1-bit family trains tensor-parallel as DeepSpeed runs it with a model-parallel unit:
  // compressed over the data-parallel group, on each rank's pieces; check-config accepts it too.
  tp_config("tp_onebit.json", R"({"autotp_size": 2})", "OneBitAdam");
  r = run_dstrain(train("--num-ranks 2 --steps 1", "tp_onebit.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const CliResult c = run_dstrain("check-config " + q(dir_ / "tp_onebit.json") + " --world-size 2");
  EXPECT_EQ(c.exit_code, 0) << c.err;
}

// ---- section 2: never overwrite an input; no crash, hang or leftover ----

TEST_F(TrainPreflightCli, OutputsNeverOverwriteInputs) {
  const std::string data = read_file_text(dir_ / "t_train.bin"), config = read_file_text(dir_ / "ds.json");
  expect_refused_before_training(run_dstrain(train("--save-weights " + q(dir_ / "t_train.bin"))), "--data");
  expect_refused_before_training(run_dstrain(train("--summary-json " + q(dir_ / "ds.json"))), "the config file");
  expect_refused_before_training(run_dstrain(train("--val-data " + q(dir_ / "t_val.bin") + " --summary-json " + q(dir_ / "t_val.bin"))),
                                 "--val-data");
  expect_refused_before_training(run_dstrain(train("--save-weights " + q(dir_ / "x.out") + " --summary-json " + q(dir_ / "x.out"))),
                                 "--save-weights");
  // The same file through another path (a symbolic link) is the same file.
  fs::create_symlink(dir_ / "t_train.bin", dir_ / "link.bin");
  expect_refused_before_training(run_dstrain(train("--save-weights " + q(dir_ / "link.bin"))), "--data");
  EXPECT_EQ(read_file_text(dir_ / "t_train.bin"), data);
  EXPECT_EQ(read_file_text(dir_ / "ds.json"), config);
  // --init-from onto --save-weights: the weights a run starts from are an input too.
  ASSERT_EQ(run_dstrain(train("--steps 1 --save-weights " + q(dir_ / "w0.safetensors"))).exit_code, 0);
  expect_refused_before_training(run_dstrain(train("--init-from " + q(dir_ / "w0.safetensors") + " --save-weights " + q(dir_ / "w0.safetensors"))),
                                 "--init-from");
}

TEST_F(TrainPreflightCli, HugeModelsAreRefusedWithTheFigures) {
  // Before: std::bad_alloc after building layers for seconds (exit 3), or a hang; 4294967296^2
  // overflowed the parameter count. `timeout` turns a hang into a failure here.
  for (const char* spec : {"gpt2:L100000-C768-H12", "gpt2:L4294967296-C4294967296-H2"}) {
    SCOPED_TRACE(spec);
    const CliResult r =
        run_dstrain("train --deepspeed_config " + q(dir_ / "ds.json") + " --model " + spec + " --data " + q(dir_ / "t_train.bin") + " --steps 1",
                    "timeout 60");
    expect_refused_before_training(r, "does not fit");
    EXPECT_NE(r.err.find("parameters"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("optimizer"), std::string::npos) << r.err;
  }
}

// offload_optimizer "nvme" at stage 3 keeps buffer_count sub-groups of fp32 masters + Adam moments
// (12 B per element) in host memory: with DeepSpeed's default sub_group_size (1e9) and 4 buffers,
// 48 GB for GPT-2 XL. The pre-flight counts them and names sub_group_size and buffer_count with a
// value that fits (docs/offload.md §10.2, §11); before, the refusal named only a smaller model, a
// smaller batch or a higher stage. ulimit -v (32 GiB) makes the figure this machine's on any host.
TEST_F(TrainPreflightCli, NvmeOptimizerBuffersOfTheDefaultSubGroupSizeAreRefusedNamingIt) {
  const fs::path swap = dir_ / "nvme";
  fs::create_directories(swap);
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": " + nlohmann::json(swap.string()).dump();
  std::ofstream(dir_ / "nvme.json") << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 3, "offload_optimizer": )"
                                    << nvme << R"(, "buffer_count": 4},
      "offload_param": )" << nvme << R"(, "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e8}}})";
  // AddressSanitizer's shadow memory cannot be reserved under ulimit -v: the host's memory decides
  // (48 GB of buffers fit no CI machine either), and the bound on the proposal below is not checked.
  constexpr bool kLimited = !dstrain::testing::kAddressSanitizer;
  const char* limit = kLimited ? "ulimit -v 33554432; timeout 120" : "timeout 120";
  const CliResult r = run_dstrain("train --deepspeed_config " + q(dir_ / "nvme.json") + " --model gpt2:d48 --tokenizer bytes --data " +
                                      q(dir_ / "t_train.bin") + " --steps 1 --sample-tokens 0 --sequence-length 128",
                                  limit);
  expect_refused_before_training(r, "does not fit");
  for (const char* part : {"zero_optimization.sub_group_size 1000000000", "zero_optimization.offload_optimizer.buffer_count 4",
                           "lower zero_optimization.sub_group_size", "12 B"}) {
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " not in: " << r.err;
  }
  // The value it proposes, times 4 buffers of 12 B, fits in the 32 GiB less the rest (> 2.9 GiB of grads).
  const auto at = r.err.find("(to ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const double proposed = std::stod(r.err.substr(at + 4));
  EXPECT_GT(proposed, 0.0);
  if (kLimited) {
    EXPECT_LE(proposed * 12.0 * 4.0, 32.0 * (1ull << 30) - 2.9 * (1ull << 30)) << r.err;
  }
}

TEST_F(TrainPreflightCli, HfConfigKeysAreHonouredOrRefused) {
  const auto hf = [&](const std::string& name, const std::string& extra) {
    std::ofstream(dir_ / name) << R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "n_positions": 32)" << extra
                               << "}";
    return run_dstrain("train --deepspeed_config " + q(dir_ / "ds.json") + " --model " + q(dir_ / name) + " --data " + q(dir_ / "t_train.bin") +
                       " --steps 1 --sample-tokens 0");
  };
  const CliResult ok = hf("ok.json", R"(, "tie_word_embeddings": true, "scale_attn_weights": true, "initializer_range": 0.02)");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  expect_refused_before_training(hf("untied.json", R"(, "tie_word_embeddings": false)"), "tie_word_embeddings");
  expect_refused_before_training(hf("inv.json", R"(, "scale_attn_by_inverse_layer_idx": true)"), "scale_attn_by_inverse_layer_idx");
  expect_refused_before_training(hf("noscale.json", R"(, "scale_attn_weights": false)"), "scale_attn_weights");
  expect_refused_before_training(hf("upcast.json", R"(, "reorder_and_upcast_attn": true)"), "reorder_and_upcast_attn");
  expect_refused_before_training(hf("cross.json", R"(, "add_cross_attention": true)"), "add_cross_attention");
  expect_refused_before_training(hf("init.json", R"(, "initializer_range": 0.1)"), "initializer_range");
  expect_refused_before_training(hf("dup.json", R"(, "n_layer": 3)"), "'n_layer' is given twice");
  // "n_layer": 1e400 was exit 3 (a JSON library exception); 2^64 - 1 wrapped to -1.
  std::ofstream(dir_ / "inf.json") << R"({"n_layer": 1e400, "n_head": 2, "n_embd": 32, "vocab_size": 256, "n_positions": 32})";
  expect_refused_before_training(run_dstrain("train --deepspeed_config " + q(dir_ / "ds.json") + " --model " + q(dir_ / "inf.json") + " --data " +
                                             q(dir_ / "t_train.bin") + " --steps 1"),
                                 "1e400");
  std::ofstream(dir_ / "u64.json") << R"({"n_layer": 18446744073709551615, "n_head": 2, "n_embd": 32, "vocab_size": 256, "n_positions": 32})";
  expect_refused_before_training(run_dstrain("train --deepspeed_config " + q(dir_ / "ds.json") + " --model " + q(dir_ / "u64.json") + " --data " +
                                             q(dir_ / "t_train.bin") + " --steps 1"),
                                 "18446744073709551615");
  // A field repeated in a descriptor was silently the last one.
  expect_refused_before_training(run_dstrain("train --deepspeed_config " + q(dir_ / "ds.json") + " --model gpt2:L2-C32-H2-V256-L4 --data " +
                                             q(dir_ / "t_train.bin")),
                                 "L is given twice");
}

TEST_F(TrainPreflightCli, NanLossStopsWithTheStepAndWritesNoWeights) {
  // fp32 has no overflow check: lr 1e20 without clipping makes the weights non-finite at once.
  std::ofstream(dir_ / "nan.json") << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "gradient_clipping": 0,
      "optimizer": {"type": "SGD", "params": {"lr": 1e20}}})";
  std::string first_error;
  for (const char* sampling : {"--sample-tokens 0", "--sample-tokens 8 --val-interval 1"}) {
    SCOPED_TRACE(sampling);
    const fs::path weights = dir_ / "nan.safetensors";
    const CliResult r = run_dstrain("train --deepspeed_config " + q(dir_ / "nan.json") + " --model gpt2:L2-C32-H2-V256-T32 --data " +
                                    q(dir_ / "t_train.bin") + " --steps 6 --save-weights " + q(weights) + " " + sampling);
    EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
    const std::size_t at = r.err.find("step ");
    ASSERT_NE(at, std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the training loss is nan"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(weights));
    EXPECT_EQ(r.out.find("| sample ("), std::string::npos) << r.out;  // never sampled from NaN weights
    const std::string error = r.err.substr(r.err.find("dstrain: error"));
    if (first_error.empty())
      first_error = error;
    else
      EXPECT_EQ(error, first_error);  // the same with and without sampling
  }
}

TEST_F(TrainPreflightCli, FileSizeLimitIsAnErrorWithoutLeftovers) {
  // ulimit -f: SIGXFSZ killed the process in the middle of the write and left the temporary; then
  // (hardening 3 §4) the run trained every step before the write failed. The sizes are known at
  // the start: refused before step 1, naming the output, its size and the limit (20 blocks: 10 or
  // 20 KiB as the shell counts them; the weights' largest tensor alone, wte 256 x 32 in fp32, is
  // 32768 bytes, a checkpoint's one rank file 34688 parameters x 12 bytes = 416256).
  const fs::path out = dir_ / "limited";
  fs::create_directories(out);
  const CliResult r = run_dstrain(train("--steps 1 --save-weights " + q(out / "w.safetensors")), "ulimit -f 20;");
  expect_refused_before_training(r, "ulimit -f");
  EXPECT_NE(r.err.find("--save-weights"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at least 32768 bytes"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out / "w.safetensors"));
  EXPECT_TRUE(temp_files(out).empty());
  const CliResult ck = run_dstrain(train("--steps 1 --save-dir " + q(out / "ck")), "ulimit -f 20;");
  expect_refused_before_training(ck, "ulimit -f");
  EXPECT_NE(ck.err.find("--save-dir"), std::string::npos) << ck.err;
  EXPECT_NE(ck.err.find("416256 bytes"), std::string::npos) << ck.err;
  EXPECT_FALSE(fs::exists(out / "ck" / "latest"));
}

TEST_F(TrainPreflightCli, StaleTemporariesAreRemovedLiveOnesKept) {
  const fs::path out = dir_ / "stale";
  fs::create_directories(out);
  // pid 2147483646 runs nowhere (above any pid_max); this test's own pid runs.
  std::ofstream(out / "w.safetensors.tmp.2147483646") << "half a file";
  std::ofstream(out / "s.json.tmp.2147483646.3") << "{";
  const std::string live = "w.safetensors.tmp." + std::to_string(::getpid()) + ".0";
  std::ofstream(out / live) << "being written";
  const CliResult r = run_dstrain(train("--steps 1 --save-weights " + q(out / "w.safetensors") + " --summary-json " + q(out / "s.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(temp_files(out), std::vector<std::string>{live});
}

TEST_F(TrainPreflightCli, NumRanksBeyondTheThreadLimitIsAnError) {
  // 1000 rank threads' stacks do not fit 4 GB of address space: a thread cannot start, which was
  // std::terminate (a signal); now an Error naming --num-ranks.
  if (dstrain::testing::kAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space for its shadow memory at start, so a process under "
                    "`ulimit -v` cannot start at all; this test runs in the plain build (DSTRAIN_GATES=0 bash scripts/test.sh)";
  }
  std::ofstream(dir_ / "many.json") << R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})";
  const CliResult r = run_dstrain("train --deepspeed_config " + q(dir_ / "many.json") + " --model gpt2:L1-C16-H2-V256-T8 --data " +
                                      q(dir_ / "t_train.bin") + " --steps 1 --sample-tokens 0 --num-ranks 1000",
                                  "ulimit -v 4000000;");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--num-ranks"), std::string::npos) << r.err;
}

// The CPU's bf16 path switches (docs/precision.md §12): a value other than 0 or 1 is refused naming
// the variable, before step 1, also when no peak is measured at start (--peak-flops given).
TEST_F(TrainPreflightCli, Bf16PathSwitchesTakeZeroOrOne) {
  std::ofstream(dir_ / "bf16.json") << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  const std::string cmd = train("--steps 1 --peak-flops 1e11", "bf16.json");
  expect_refused_before_training(run_dstrain(cmd, "DSTRAIN_CPU_BF16_GEMM=2"), "DSTRAIN_CPU_BF16_GEMM=2");
  expect_refused_before_training(run_dstrain(cmd, "DSTRAIN_CPU_BF16_ATTENTION=yes"), "DSTRAIN_CPU_BF16_ATTENTION=yes");
  const CliResult widened = run_dstrain(cmd, "DSTRAIN_CPU_BF16_GEMM=0 DSTRAIN_CPU_BF16_ATTENTION=0");
  EXPECT_EQ(widened.exit_code, 0) << widened.err;
  EXPECT_NE(widened.out.find("GEMMs widened fp32 sgemm (DSTRAIN_CPU_BF16_GEMM=0), attention fp32 tiles"), std::string::npos) << widened.out;
}

// ---- section 3: launchers and "auto" configs ----

TEST_F(TrainPreflightCli, LocalRankArgumentOfDeepSpeedsLauncher) {
  const std::string env = "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0";
  EXPECT_EQ(run_dstrain(train("--steps 1 --local_rank=0"), env).exit_code, 0);
  EXPECT_EQ(run_dstrain(train("--steps 1 --local-rank 0"), env).exit_code, 0);
  expect_refused_before_training(run_dstrain(train("--steps 1 --local_rank=1"), env), "--local_rank=1");
}

TEST_F(TrainPreflightCli, MpichAndPmixLaunchersAreNotRankZeroOfOne) {
  // Each process trained alone as rank 0 of 1.
  const CliResult mpich = run_dstrain(train("--steps 1"), "PMI_RANK=1 PMI_SIZE=2 MPI_LOCALRANKID=1");
  expect_refused_before_training(mpich, "via mpiexec");
  EXPECT_NE(mpich.err.find("--num-ranks 2"), std::string::npos) << mpich.err;
  expect_refused_before_training(run_dstrain(train("--steps 1"), "PMIX_RANK=1"), "PMIX_RANK=1");
}

TEST_F(TrainPreflightCli, HfTrainerAutoConfigTrainsWithTheSameFlagsAsCheckConfig) {
  const std::string config = shell_quote(std::string(DSTRAIN_SOURCE_DIR) + "/examples/ds_configs/hf_trainer_auto.json");
  const std::string autos =
      " --micro-batch-size 2 --gradient-accumulation-steps 1 --lr 1e-3 --adam-betas 0.9 0.999 --adam-eps 1e-8"
      " --weight-decay 0.0 --gradient-clipping 1.0 --precision bf16 --warmup-steps 2";
  const CliResult r = run_dstrain("train --deepspeed_config " + config + " --model gpt2:L2-C32-H2-V256-T32 --data " + q(dir_ / "t_train.bin") +
                                  " --steps 3 --num-ranks 2 --sample-tokens 0" + autos);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("train_batch_size 4 = micro-batch 2 x gradient_accumulation_steps 1 x world size 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zero: stage 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("precision bf16"), std::string::npos) << r.out;
  // The hidden size comes from the model (n_embd 32): reduce_bucket_size = 32^2.
  EXPECT_NE(r.out.find("reduce_bucket_size: auto -> 1024"), std::string::npos) << r.out;
  // Without the flags: the error names the flag train has.
  const CliResult missing = run_dstrain("train --deepspeed_config " + config + " --model gpt2:L2-C32-H2-V256-T32 --data " + q(dir_ / "t_train.bin"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("--micro-batch-size"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.err.find("AutoValues::"), std::string::npos) << missing.err;
}

// Every shipped example trains (a tiny model, 1 step, 2 ranks), or check-config refuses it too,
// with the same message — or, for what this machine lacks (the nvme example's nvme_path), reports
// it as a finding about this machine with exit 0, in the words train refuses it with.
TEST_F(TrainPreflightCli, EveryExampleConfigTrainsOrCheckConfigRefusesItAlike) {
  const fs::path examples = fs::path(DSTRAIN_SOURCE_DIR) / "examples" / "ds_configs";
  const std::string autos =
      " --micro-batch-size 2 --gradient-accumulation-steps 1 --lr 1e-3 --adam-betas 0.9 0.999 --adam-eps 1e-8"
      " --weight-decay 0.0 --gradient-clipping 1.0 --precision bf16 --warmup-steps 2 --hidden-size 32";
  const fs::path cwd = dir_ / "examples_cwd";  // monitoring.json writes under runs/
  fs::create_directories(cwd);
  int trained = 0;
  for (const auto& e : fs::directory_iterator(examples)) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().filename().string());
    const std::string cfg = q(e.path());
    const CliResult t = run_dstrain("train --deepspeed_config " + cfg + " --model gpt2:L2-C32-H2-V256-T32 --data " + q(dir_ / "t_train.bin") +
                                        " --steps 1 --num-ranks 2 --sample-tokens 0 --summary-json " + q(cwd / "s.json") + autos,
                                    "cd " + q(cwd) + " &&");
    const CliResult c = run_dstrain("check-config " + cfg + " --world-size 2 --steps 1" + autos, "cd " + q(cwd) + " &&");
    if (t.exit_code == 0) {
      ++trained;
      EXPECT_EQ(c.exit_code, 0) << c.err;
      continue;
    }
    EXPECT_EQ(t.exit_code, 2) << t.err;
    if (const std::size_t at = c.err.find("on this machine: "); c.exit_code == 0 && at != std::string::npos) {
      const std::string finding = c.err.substr(at + 17, c.err.find('\n', at) - at - 17);
      EXPECT_NE(t.err.find("dstrain: error: " + finding), std::string::npos) << "check-config found:\n" << finding << "\ntrain:\n" << t.err;
      continue;
    }
    EXPECT_EQ(c.exit_code, 2) << "train refused it but check-config did not:\n" << t.err;
    const auto error_line = [](const std::string& err) { return err.substr(err.find("dstrain: error")); };
    ASSERT_NE(c.err.find("dstrain: error"), std::string::npos) << c.err;
    EXPECT_EQ(error_line(c.err), error_line(t.err));
  }
  EXPECT_GE(trained, 6);
}

// ---- section 5: the loop ----

TEST_F(TrainPreflightCli, ValLossDoesNotDependOnTheWorldSize) {
  // --val-batches 5 on 3 ranks evaluated ceil(5 / 3) = 2 batches each, 6 in all; now exactly the 5
  // one rank evaluates. --steps 0: the same initial weights on both.
  std::ofstream(dir_ / "w1.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  std::ofstream(dir_ / "w3.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  const auto run = [&](const char* cfg, const char* ranks, const char* json) {
    const CliResult r = run_dstrain("train --deepspeed_config " + q(dir_ / cfg) + " --model gpt2:L2-C32-H2-V256-T32 --data " +
                                    q(dir_ / "t_train.bin") + " --val-data " + q(dir_ / "t_val.bin") +
                                    " --val-batches 5 --steps 0 --sample-tokens 0 --num-ranks " + ranks + " --summary-json " + q(dir_ / json));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(5 batches per evaluation)"), std::string::npos) << r.out;
    return nlohmann::json::parse(read_file_text(dir_ / json));
  };
  const nlohmann::json one = run("w1.json", "1", "v1.json"), three = run("w3.json", "3", "v3.json");
  EXPECT_NEAR(three["final_val_loss"].get<double>(), one["final_val_loss"].get<double>(), 2e-6);
  EXPECT_EQ(three["zero"]["world_size"], 3);
}

// The pipeline flags reach the pre-flight (train/pipeline_plan.h, docs/cli.md "Pipeline
// parallelism"): what a pipeline cannot train is refused before step 1 naming the flag or key, and the
// partition is printed at the start of the run.
TEST_F(TrainPreflightCli, PipelineFlagsAreCheckedBeforeStep1) {
  expect_refused_before_training(run_dstrain(train("--num-ranks 2 --pipeline-stages 3")), "--pipeline-stages 3 does not divide the world size 2");
  expect_refused_before_training(run_dstrain(train("--num-ranks 2 --pipeline-stages 4")), "--pipeline-stages 4 does not divide the world size 2");
  expect_refused_before_training(run_dstrain(train("--num-ranks 2 --pipeline-stages 2 --pipeline-virtual-stages 2 --pipeline-schedule gpipe")),
                                 "--pipeline-schedule gpipe with --pipeline-virtual-stages 2");
  // gpt2:L2 has 4 layers: embedding, h.0, h.1, head.
  std::ofstream(dir_ / "pp_gas4.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  expect_refused_before_training(run_dstrain(train("--num-ranks 4 --pipeline-stages 4 --pipeline-virtual-stages 2", "pp_gas4.json")),
                                 "= 8 pieces of the model, but gpt2:L2-C32-H2-V256-T32 has 4 layers");
  std::ofstream(dir_ / "pp_z3.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  expect_refused_before_training(run_dstrain(train("--num-ranks 2 --pipeline-stages 2", "pp_z3.json")),
                                 "zero_optimization.stage 3 with 2 pipeline stages");
  std::ofstream(dir_ / "pp_type.json") << R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"partition": "type:LlamaDecoderLayer"},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  expect_refused_before_training(run_dstrain(train("--num-ranks 2 --pipeline-stages 2", "pp_type.json")),
                                 "pipeline.partition \"type:LlamaDecoderLayer\"");
  // The partition, printed by rank 0 before the run starts (whatever the engine then does with it).
  const CliResult r = run_dstrain(train("--num-ranks 2 --pipeline-stages 2 --steps 1"));
  EXPECT_NE(r.out.find("pipeline: 2 stages (1F1B), partition \"parameters\" over 4 layers"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("stage 0: layers 0-1 (embedding, h.0; 21,920 parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("the bubble dominates"), std::string::npos) << r.err;  // 1 micro-batch for 2 stages
}


// ---- expert parallelism (docs/config.md §8.8): the expert_parallel section against the mesh, the
// model and the optimizer, refused before step 1 naming the key and the value ----

// `dstrain train` on --num-ranks 4 (local ranks) of a 4-expert mixture (or `model`) with the
// config's expert_parallel section `section`, 2 steps over `data`.
std::string train_moe(const fs::path& data, const std::string& section, const std::string& model = "moe:L2-C32-H4-KV2-E4-K2-I24-V256-T32",
                      const std::string& optimizer = "AdamW") {
  const std::string config = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
      "optimizer": {"type": ")" + optimizer + R"(", "params": {"lr": 1e-2}}, "expert_parallel": )" + section + "}";
  return "train --deepspeed_config " + shell_quote(config) + " --model " + model + " --tokenizer bytes --data " +
         shell_quote(data.string()) + " --steps 2 --sample-tokens 0 --num-ranks 4";
}

// Refused before any step: exit 2, each of `what` in the message, no progress line.
void expect_ep_refused(const CliResult& r, const std::vector<std::string>& what) {
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  for (const std::string& w : what) EXPECT_NE(r.err.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.err;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "trained before refusing:\n" << r.out;
  EXPECT_EQ(r.out.find("| loss"), std::string::npos) << "trained before refusing:\n" << r.out;
}

TEST_F(TrainPreflightCli, ExpertParallelMistakesAreRefusedBeforeStep1) {
  // autoep_size must divide the data-parallel size (4).
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 3})")),
                    {"expert_parallel.autoep_size 3", "data-parallel size 4", "1, 2, 4"});
  // ... and the experts: 6 do not split over 4 ranks (DeepSpeed's "num_experts=6 ... is not divisible by autoep_size=4").
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 4})", "moe:L2-C32-H4-KV2-E6-K2-I24-V256-T32")),
                    {"expert_parallel.autoep_size 4", "6 experts", "1, 2, 3, 6"});
  // An unknown preset: DeepSpeed's own message.
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 2, "preset_model": "gpt2"})")),
                    {"expert_parallel.preset_model", "\"gpt2\"", "Unknown preset_model 'gpt2'"});
  // top_k beyond the model's experts.
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 2, "top_k": 8})")),
                    {"expert_parallel.top_k 8", "4 experts"});
  // An optimizer that reads each tensor whole: each rank holds only its experts of every stack.
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 2})", "moe:L2-C32-H4-KV2-E4-K2-I24-V256-T32", "Lamb")),
                    {"\"Lamb\"", "expert_parallel.autoep_size 2"});
  // A dense model: AutoEP would find no MoE layer.
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true})", "gpt2:L2-C32-H2-V256-T32")),
                    {"expert_parallel.enabled is true", "GPT-2", "no MoE layers detected"});
  // Expert-internal tensor parallelism: reserved in DeepSpeed, refused by both.
  expect_ep_refused(run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 2, "expert_tensor_parallel_size": 2})")),
                    {"expert_parallel.expert_tensor_parallel_size is 2"});
}

TEST_F(TrainPreflightCli, ExpertParallelTrainsOnTheMeshWithTheSectionsRouting) {
  const CliResult r = run_dstrain(train_moe(dir_ / "t_train.bin", R"({"enabled": true, "autoep_size": 2, "top_k": 1})"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("mesh: world 4 = data-parallel 4 (expert-parallel 2 x expert-data-parallel 2)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expert_parallel: routing as the section asks: top_k 1 (the model's 2)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-1 softmax"), std::string::npos) << r.out;  // the model trained is the one with the section's routing
  EXPECT_NE(r.out.find("step 2/2"), std::string::npos) << r.out;
  // The routing line comes before the first step.
  EXPECT_LT(r.out.find("expert_parallel: routing"), r.out.find("step 1/2")) << r.out;
}

}  // namespace
