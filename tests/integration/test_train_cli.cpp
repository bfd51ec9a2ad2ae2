// `dstrain train` end to end through the built binary, as a user runs it: prepare-data (bytes
// tokenizer) on a small text, train, read the summary JSON; determinism run after run; weights
// saved and loaded back give the same val loss; bad inputs exit 2 naming the key or file.
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

class TrainCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_train_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    std::ofstream(dir_ / "ds.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 5,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}})";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  static std::string train_args(const std::string& config = "ds.json") {
    return "train --deepspeed_config " + q(dir_ / config) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           " --val-data " + q(dir_ / "t_val.bin") + " --val-batches 4";
  }
  static nlohmann::json summary(const fs::path& p) { return nlohmann::json::parse(read_file_text(p)); }

  static fs::path dir_;
};
fs::path TrainCli::dir_;

TEST_F(TrainCli, TrainsSavesAndReloads) {
  const CliResult a = run_dstrain(train_args() + " --steps 20 --val-interval 10 --seed 3 --summary-json " + q(dir_ / "a.json") + " --save-weights " +
                                  q(dir_ / "w.safetensors"));
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  EXPECT_NE(a.out.find("GPT-2: 2 layers"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("train_batch_size 8 = micro-batch 4 x gradient_accumulation_steps 2"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("step 5/20 | loss"), std::string::npos) << a.out;  // steps_per_print 5
  EXPECT_NE(a.out.find("step 20/20 | val loss"), std::string::npos) << a.out;
  const nlohmann::json s = summary(dir_ / "a.json");
  EXPECT_EQ(s["steps"], 20);
  EXPECT_EQ(s["tokens"], 20 * 8 * 32);
  const auto losses = s["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(s["final_train_loss"].get<double>(), losses.front() - 1.0);
  ASSERT_TRUE(s["final_val_loss"].is_number());
  EXPECT_LT(s["final_val_loss"].get<double>(), losses.front() - 1.0);
  EXPECT_EQ(s["val_losses"].size(), 2u);  // after step 10 and at the end
  EXPECT_GT(s["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(s["peak_memory_bytes"]["params"].get<double>(), 0.0);

  // Same seed, same data: the same losses.
  const CliResult b = run_dstrain(train_args() + " --steps 20 --val-interval 10 --seed 3 --summary-json " + q(dir_ / "b.json"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(summary(dir_ / "b.json")["train_losses"], s["train_losses"]);

  // The saved weights, loaded into a fresh run that only evaluates: the same val loss.
  const CliResult c = run_dstrain(train_args() + " --steps 0 --init-from " + q(dir_ / "w.safetensors") + " --summary-json " + q(dir_ / "c.json"));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(summary(dir_ / "c.json")["final_val_loss"], s["final_val_loss"]);
}

// The Llama family through the CLI (docs/models.md): a llama: descriptor trains with activation
// checkpointing, --save-weights writes the Hugging Face layout, --init-from reads it back (the
// same val loss); a Qwen2 config.json trains; so does a Mistral config whose window is shorter than T.
TEST_F(TrainCli, LlamaFamilyTrainsSavesAndReloads) {
  const std::string base = "train --deepspeed_config " + q(dir_ / "ds.json") + " --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
                           " --val-data " + q(dir_ / "t_val.bin") + " --val-batches 4 --sample-tokens 0";
  const std::string llama = base + " --model llama:L2-C32-H4-KV2-I64-V256-T32";
  fs::create_directories(dir_ / "llama_w");
  const CliResult a = run_dstrain(llama + " --steps 20 --checkpoint-activations --seed 3 --summary-json " + q(dir_ / "l.json") + " --save-weights " +
                                  q(dir_ / "llama_w" / "model.safetensors"));
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  EXPECT_NE(a.out.find("llama: 2 layers, 4 heads (2 KV heads, head size 8)"), std::string::npos) << a.out;
  const nlohmann::json s = summary(dir_ / "l.json");
  const auto losses = s["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(s["final_train_loss"].get<double>(), losses.front() - 1.0);
  ASSERT_TRUE(fs::exists(dir_ / "llama_w" / "model.safetensors"));
  const std::string header = read_file_text(dir_ / "llama_w" / "model.safetensors").substr(8, 4000);
  EXPECT_NE(header.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos);
  const CliResult c =
      run_dstrain(llama + " --steps 0 --init-from " + q(dir_ / "llama_w" / "model.safetensors") + " --summary-json " + q(dir_ / "lc.json"));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(summary(dir_ / "lc.json")["final_val_loss"], s["final_val_loss"]);

  std::ofstream(dir_ / "qwen2.json") << R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 256,
    "max_position_embeddings": 64, "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": false, "torch_dtype": "bfloat16"})";
  const CliResult q2 = run_dstrain(base + " --model " + q(dir_ / "qwen2.json") + " --steps 2 --sequence-length 32");
  ASSERT_EQ(q2.exit_code, 0) << q2.err << q2.out;
  EXPECT_NE(q2.out.find("qwen2: 2 layers, 4 heads (1 KV heads"), std::string::npos) << q2.out;
  EXPECT_NE(q2.out.find("q/k/v bias"), std::string::npos) << q2.out;

  std::ofstream(dir_ / "mistral.json") << R"({"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "sliding_window": 16})";
  // A window shorter than the sequence is computed on the CPU (the windowed mask of the attention kernel).
  const CliResult m = run_dstrain(base + " --model " + q(dir_ / "mistral.json") + " --steps 2 --sequence-length 32");
  ASSERT_EQ(m.exit_code, 0) << m.err << m.out;
  EXPECT_NE(m.out.find("sliding window 16"), std::string::npos) << m.out;
}

TEST_F(TrainCli, BadInputsExit2NamingTheCause) {
  const CliResult missing = run_dstrain("train --deepspeed_config " + q(dir_ / "ds.json") + " --model gpt2:tiny --data " + q(dir_ / "nope.bin"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("nope.bin"), std::string::npos) << missing.err;

  const CliResult model = run_dstrain("train --deepspeed " + q(dir_ / "ds.json") + " --model gpt2:bogus --data " + q(dir_ / "t_train.bin"));
  EXPECT_EQ(model.exit_code, 2);
  EXPECT_NE(model.err.find("gpt2:bogus"), std::string::npos) << model.err;

  std::ofstream(dir_ / "both16.json") << R"({"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": true}, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  const CliResult both16 = run_dstrain(train_args("both16.json") + " --steps 1");
  EXPECT_EQ(both16.exit_code, 2);
  EXPECT_NE(both16.err.find("bf16"), std::string::npos) << both16.err;

  // --inject-overflow in fp32 (no overflow check there) is refused, naming the fix.
  const CliResult inject32 = run_dstrain(train_args() + " --steps 1 --inject-overflow 1");
  EXPECT_EQ(inject32.exit_code, 2);
  EXPECT_NE(inject32.err.find("fp16"), std::string::npos) << inject32.err;

  // A torch.optim name dstrain does not provide (LBFGS needs a closure DeepSpeed never passes).
  std::ofstream(dir_ / "lbfgs.json") << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "LBFGS", "params": {"lr": 0.1}}})";
  const CliResult lbfgs = run_dstrain(train_args("lbfgs.json") + " --steps 1");
  EXPECT_EQ(lbfgs.exit_code, 2);
  EXPECT_NE(lbfgs.err.find("optimizer.type"), std::string::npos) << lbfgs.err;
  EXPECT_NE(lbfgs.err.find("closure"), std::string::npos) << lbfgs.err;

  std::ofstream(dir_ / "foo.json") << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "FooBar", "params": {"lr": 0.1}}})";
  const CliResult foo = run_dstrain(train_args("foo.json") + " --steps 1");
  EXPECT_EQ(foo.exit_code, 2);
  EXPECT_NE(foo.err.find("FooBar"), std::string::npos) << foo.err;

  // The vocabulary of --tokenizer gpt2 does not fit a 256-token model.
  const CliResult vocab = run_dstrain("train --deepspeed-config " + q(dir_ / "ds.json") +
                                      " --model gpt2:L2-C32-H2-V256-T32 --tokenizer gpt2 --data " + q(dir_ / "t_train.bin"));
  EXPECT_EQ(vocab.exit_code, 2);
  EXPECT_NE(vocab.err.find("--tokenizer gpt2"), std::string::npos) << vocab.err;

  // ...nor does a tokenizer.json of 300 tokens, whose size is read from the file; an unknown name is refused.
  nlohmann::json tokens = nlohmann::json::object();
  for (int i = 0; i < 299; ++i) tokens[std::string("t").append(std::to_string(i))] = i;  // not "t" + ...: a false GCC 12 -Wrestrict
  tokens["</s>"] = 299;
  fs::create_directories(dir_ / "tok300");
  std::ofstream(dir_ / "tok300" / "tokenizer.json")
      << nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", tokens}, {"merges", nlohmann::json::array()}}}}.dump();
  std::ofstream(dir_ / "tok300" / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  const CliResult hf = run_dstrain("train --deepspeed-config " + q(dir_ / "ds.json") + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer " +
                                   q(dir_ / "tok300" / "tokenizer.json") + " --data " + q(dir_ / "t_train.bin"));
  EXPECT_EQ(hf.exit_code, 2);
  EXPECT_NE(hf.err.find("has 300 tokens but the model"), std::string::npos) << hf.err;
  const CliResult unknown = run_dstrain("train --deepspeed-config " + q(dir_ / "ds.json") +
                                        " --model gpt2:L2-C32-H2-V256-T32 --tokenizer words --data " + q(dir_ / "t_train.bin"));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("'words' is not one of gpt2, bytes"), std::string::npos) << unknown.err;
}

// --checkpoint-activations switches checkpointing on (the section only configures it): the same
// losses as without; without the flag a configured section gets a note saying how to switch it on;
// a bad number_checkpoints exits 2 naming the key.
// Muon and Adafactor (docs/optimizers.md §9, §10.1) train from the CLI: check-config accepts what
// train trains, and the loss falls; stage 3 with reduce_scatter is refused by both, with DeepSpeed's
// message.
TEST_F(TrainCli, MuonAndAdafactorTrain) {
  std::ofstream(dir_ / "muon.json") << R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 5,
    "optimizer": {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.01}}})";
  std::ofstream(dir_ / "adafactor.json") << R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 5,
    "optimizer": {"type": "Adafactor", "params": {"lr": 0.05}}})";
  for (const char* config : {"muon.json", "adafactor.json"}) {
    SCOPED_TRACE(config);
    const CliResult check = run_dstrain("check-config " + q(dir_ / config));
    EXPECT_EQ(check.exit_code, 0) << check.err << check.out;
    const CliResult r = run_dstrain(train_args(config) + " --steps 10 --seed 3 --summary-json " + q(dir_ / (std::string(config) + ".out")));
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    const auto losses = summary(dir_ / (std::string(config) + ".out"))["train_losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), 10u);
    EXPECT_LT(losses.back(), losses.front() - 0.5);
  }
  std::ofstream(dir_ / "muon3.json") << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 3}})";
  const CliResult check3 = run_dstrain("check-config " + q(dir_ / "muon3.json"));
  EXPECT_NE(check3.exit_code, 0);
  EXPECT_NE((check3.err + check3.out).find("Muon and reduce scatter cannot be used together"), std::string::npos) << check3.err << check3.out;
  const CliResult train3 = run_dstrain(train_args("muon3.json") + " --steps 1");
  EXPECT_EQ(train3.exit_code, 2);
  EXPECT_NE(train3.err.find("Muon and reduce scatter cannot be used together"), std::string::npos) << train3.err;
}

TEST_F(TrainCli, CheckpointActivationsFlag) {
  std::ofstream(dir_ / "ckpt.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 5,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
    "activation_checkpointing": {"number_checkpoints": 1, "cpu_checkpointing": true}})";
  const CliResult off = run_dstrain(train_args("ckpt.json") + " --steps 3 --seed 4 --summary-json " + q(dir_ / "off.json"));
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(off.err.find("--checkpoint-activations"), std::string::npos) << off.err;
  const CliResult on = run_dstrain(train_args("ckpt.json") + " --steps 3 --seed 4 --checkpoint-activations --summary-json " + q(dir_ / "on.json"));
  ASSERT_EQ(on.exit_code, 0) << on.err;
  EXPECT_NE(on.err.find("activation checkpointing: 1 segment of 2 blocks"), std::string::npos) << on.err;
  EXPECT_EQ(summary(dir_ / "on.json")["train_losses"], summary(dir_ / "off.json")["train_losses"]);
  EXPECT_LT(summary(dir_ / "on.json")["peak_memory_bytes"]["activations"].get<double>(),
            summary(dir_ / "off.json")["peak_memory_bytes"]["activations"].get<double>());

  std::ofstream(dir_ / "ckpt_bad.json") << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "activation_checkpointing": {"number_checkpoints": 9}})";
  const CliResult bad = run_dstrain(train_args("ckpt_bad.json") + " --steps 1 --checkpoint-activations");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("activation_checkpointing.number_checkpoints"), std::string::npos) << bad.err;
}

// ---- the config's scheduler, monitors, timers and samples, through `dstrain train` ----

// CRC-32C (Castagnoli, reflected 0x82F63B78), bit by bit, masked as TFRecord masks it: written
// here from the TFRecord format, independently of ops/crc32c.cpp and train/monitor/tfrecord_crc.cpp.
std::uint32_t masked_crc32c(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  c ^= 0xFFFFFFFFu;
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// The records of a TFRecord file; every length and data CRC must verify.
std::vector<std::string> tfrecords(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  const auto u = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto le32 = [&](std::size_t i) {
    return std::uint32_t(u[i]) | std::uint32_t(u[i + 1]) << 8 | std::uint32_t(u[i + 2]) << 16 | std::uint32_t(u[i + 3]) << 24;
  };
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size());
    if (at + 12 > bytes.size()) break;
    std::uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = len << 8 | u[at + static_cast<std::size_t>(i)];
    EXPECT_EQ(le32(at + 8), masked_crc32c(u + at, 8)) << "length crc of record " << out.size();
    EXPECT_LE(at + 12 + len + 4, bytes.size());
    if (at + 12 + len + 4 > bytes.size()) break;
    EXPECT_EQ(le32(at + 12 + len), masked_crc32c(u + at + 12, len)) << "data crc of record " << out.size();
    out.push_back(bytes.substr(at + 12, len));
    at += 12 + len + 4;
  }
  return out;
}

// "step,value\r\n" rows of a csv_monitor file after its header.
std::vector<std::pair<std::int64_t, double>> csv_rows(const fs::path& file, const std::string& header) {
  const std::string text = read_file_text(file);
  EXPECT_EQ(text.substr(0, header.size() + 2), header + "\r\n") << file;
  std::vector<std::pair<std::int64_t, double>> rows;
  std::istringstream in(text.substr(std::min(text.size(), header.size() + 2)));
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_TRUE(!line.empty() && line.back() == '\r') << file << ": " << line;
    const auto comma = line.find(',');
    rows.emplace_back(std::stoll(line.substr(0, comma)), std::stod(line.substr(comma + 1)));
  }
  return rows;
}

std::vector<std::string> sample_blocks(const std::string& out) {
  std::vector<std::string> blocks;
  for (std::size_t at = out.find("| sample ("); at != std::string::npos; at = out.find("| sample (", at + 1)) {
    const std::size_t open = out.find("\n---\n", at), close = out.find("\n---\n", open + 5);
    if (open == std::string::npos || close == std::string::npos) break;
    blocks.push_back(out.substr(at, close - at));
  }
  return blocks;
}

// WarmupDecayLR with "auto" total_num_steps / warmup_num_steps from --steps / --warmup-steps: the
// lr of every step (summary "lrs") against docs/lr_schedules.md §3 with optimizer step k at it = k - 2;
// csv_monitor rows at global_samples = k · 8 with the summary's losses and the next step's lr;
// a TensorBoard file whose records verify; the wall_clock_breakdown line; samples, the same
// for the same seed.
// fp16 with overflows injected at steps 3 and 4 (non-ZeRO dynamic scaling, window 1000,
// docs/precision.md §5): the scale halves at each, 256 -> 128 -> 64, and stays; both steps are skipped and logged
// with DeepSpeed's line; csv_monitor's Train/Samples/loss_scale row after each step holds the
// scale the next step uses. bf16 trains too (no loss scale, no loss_scale file).
TEST_F(TrainCli, Fp16InjectedOverflowsAreSkippedAndMonitored) {
  const fs::path runs = dir_ / "runs16";
  fs::remove_all(runs);
  std::ofstream(dir_ / "fp16.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 1,
      "fp16": {"enabled": true, "initial_scale_power": 8},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
      "csv_monitor": {"enabled": true, "output_path": ")" +
                                           runs.string() + R"(", "job_name": "job"}})";
  const CliResult a = run_dstrain(train_args("fp16.json") + " --steps 6 --seed 3 --inject-overflow 3,4 --summary-json " + q(dir_ / "fp16.out"));
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  const std::string all = a.out + a.err;
  EXPECT_NE(all.find("Overflow detected. Skipping step. Attempted loss scale: 256, reducing to 128.0"), std::string::npos) << all;
  EXPECT_NE(all.find("Attempted loss scale: 128.0, reducing to 64.0"), std::string::npos) << all;
  EXPECT_NE(a.out.find("step 2/6 | loss"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("| loss scale 256 |"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("| loss scale 64 | skipped 2 |"), std::string::npos) << a.out;
  const nlohmann::json s = summary(dir_ / "fp16.out");
  EXPECT_EQ(s["steps"], 6);
  EXPECT_EQ(s["skipped_steps"], 2);
  EXPECT_EQ(s["loss_scale"], 64.0);
  const auto losses = s["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front());
  const auto rows = csv_rows(runs / "job" / "Train_Samples_loss_scale.csv", "step,loss_scale");
  const std::vector<double> expected{256, 256, 128, 64, 64, 64};
  ASSERT_EQ(rows.size(), expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].first, 8 * static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(rows[i].second, expected[i]) << "after step " << i + 1;
  }

  fs::remove_all(runs);
  std::ofstream(dir_ / "bf16.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 5,
      "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
      "csv_monitor": {"enabled": true, "output_path": ")" +
                                           runs.string() + R"(", "job_name": "job"}})";
  const CliResult b = run_dstrain(train_args("bf16.json") + " --steps 10 --seed 3 --summary-json " + q(dir_ / "bf16.out"));
  ASSERT_EQ(b.exit_code, 0) << b.err << b.out;
  const nlohmann::json sb = summary(dir_ / "bf16.out");
  EXPECT_EQ(sb["skipped_steps"], 0);
  EXPECT_TRUE(sb["loss_scale"].is_null());
  const auto bl = sb["train_losses"].get<std::vector<double>>();
  EXPECT_LT(bl.back(), bl.front() - 0.5);
  EXPECT_FALSE(fs::exists(runs / "job" / "Train_Samples_loss_scale.csv"));
}

TEST_F(TrainCli, SchedulerMonitorsTimersAndSamples) {
  const fs::path runs = dir_ / "runs";
  fs::remove_all(runs);
  std::ofstream(dir_ / "mon.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 5,
      "wall_clock_breakdown": true,
      "flops_profiler": {"enabled": true, "profile_step": 3, "output_file": ")" +
                                          (dir_ / "profile.txt").string() + R"("},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": "auto",
                    "warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_type": "linear"}},
      "csv_monitor": {"enabled": true, "output_path": ")" +
                                          runs.string() + R"(", "job_name": "job"},
      "tensorboard": {"enabled": true, "output_path": ")" +
                                          runs.string() + R"(", "job_name": "job"}})";
  const std::string args =
      train_args("mon.json") + " --steps 12 --warmup-steps 4 --val-interval 6 --sample-tokens 16 --seed 3 --peak-flops 2e9 --summary-json ";
  const CliResult a = run_dstrain(args + q(dir_ / "mon.json.out"));
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  const auto expected_lr = [](int k) {  // T = 12, W = 4, min 0, max 1e-2
    const int it = k - 2;
    if (it < 0) return 0.0;
    if (it < 4) return 1e-2 * it / 4.0;
    return 1e-2 * std::max(0.0, (12.0 - it) / 8.0);
  };
  const nlohmann::json s = summary(dir_ / "mon.json.out");
  const auto lrs = s["lrs"].get<std::vector<double>>();
  const auto losses = s["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(lrs.size(), 12u);
  for (int k = 1; k <= 12; ++k) EXPECT_NEAR(lrs[static_cast<std::size_t>(k - 1)], expected_lr(k), 1e-15) << "step " << k;
  EXPECT_EQ(lrs[5], 1e-2);  // it = 4 = W: the peak, by hand

  // csv_monitor: one row per optimizer step at global_samples.
  const fs::path job = runs / "job";
  const auto loss_rows = csv_rows(job / "Train_Samples_train_loss.csv", "step,train_loss");
  ASSERT_EQ(loss_rows.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(loss_rows[i].first, 8 * static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(loss_rows[i].second, losses[i]) << "step " << i + 1;
  }
  const auto lr_rows = csv_rows(job / "Train_Samples_lr.csv", "step,lr");
  ASSERT_EQ(lr_rows.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(lr_rows[i].first, 8 * static_cast<std::int64_t>(i + 1));
    EXPECT_NEAR(lr_rows[i].second, expected_lr(static_cast<int>(i) + 2), 1e-15) << "after step " << i + 1;  // DeepSpeed: get_lr() after the step
  }
  const auto fwd_rows = csv_rows(job / "Train_Samples_elapsed_time_ms_forward.csv", "step,elapsed_time_ms_forward");
  ASSERT_EQ(fwd_rows.size(), 12u);
  for (const auto& [step, ms] : fwd_rows) EXPECT_GT(ms, 0.0) << step;
  EXPECT_FALSE(fs::exists(job / "Train_Samples_loss_scale.csv"));  // fp32: no loss scale

  // TensorBoard: the file_version record, then per step train_loss, lr and 5 elapsed times.
  std::vector<fs::path> event_files;
  for (const auto& e : fs::directory_iterator(job))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) event_files.push_back(e.path());
  ASSERT_EQ(event_files.size(), 1u);
  const auto records = tfrecords(read_file_text(event_files[0]));
  ASSERT_EQ(records.size(), 1u + 12u * 7u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_EQ(std::count_if(records.begin(), records.end(),
                          [](const std::string& r) { return r.find("Train/Samples/train_loss") != std::string::npos; }),
            12);

  // wall_clock_breakdown: DeepSpeed's timer line at each progress line.
  EXPECT_NE(a.out.find("time (ms) | fwd: "), std::string::npos) << a.out;
  EXPECT_NE(a.out.find(" | bwd: "), std::string::npos) << a.out;
  EXPECT_NE(a.out.find(" | step: "), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("scheduler WarmupDecayLR"), std::string::npos) << a.out;

  // flops_profiler with output_file: the profile of step 3 in the file, with MFU against 2 GFLOPS.
  const std::string profile = read_file_text(dir_ / "profile.txt");
  EXPECT_NE(profile.find("Profile Summary at step 3"), std::string::npos) << profile;
  EXPECT_NE(profile.find("fwd latency:"), std::string::npos) << profile;
  EXPECT_NE(profile.find("against a peak of 2 GFLOPS from --peak-flops"), std::string::npos) << profile;
  EXPECT_NE(a.out.find("flops profile of step 3 written to"), std::string::npos) << a.out;

  // Samples after step 6 and at the end, deterministic for the seed.
  const auto blocks = sample_blocks(a.out);
  ASSERT_EQ(blocks.size(), 2u) << a.out;
  EXPECT_NE(blocks[0].find("| sample (16 tokens, top-k 40, temperature 1"), std::string::npos) << blocks[0];
  fs::remove_all(runs);
  const CliResult b = run_dstrain(args + q(dir_ / "mon2.json.out"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(sample_blocks(b.out), blocks);
  // --sample-tokens 0: no sample.
  fs::remove_all(runs);
  const CliResult c = run_dstrain(train_args("mon.json") + " --steps 2 --warmup-steps 1 --sample-tokens 0");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out.find("| sample ("), std::string::npos) << c.out;
  fs::remove_all(runs);
}

// comms_logger and wall_clock_breakdown on 2 ranks at ZeRO stage 0 (docs/monitoring.md §3, §6).
// Each optimizer step issues three all-reduces: the gradients (one bucket: the 4·Ψ bytes of the
// padded fp32 parameters), the step's global sums (norm², non-finite count, loss: 3 fp64 = 24 B)
// and the agreement after the step (the ranks' step seconds, the stop-signal count and the timed save
// decision: 2 + 2 fp64 = 32 B). The summary JSON counts 4 of each over 4 steps; the table at step 4
// and the monitors' comms/all_reduce/count at each progress line (steps 1, 2, 4: after that step's
// agreement) count 3k + 1 with the hosts' exchange before step 1; verbose prints rank 0's 13 calls. bwd_inner and
// bwd_allreduce are measured (> 0) and lie within bwd.
TEST_F(TrainCli, CommsLoggerAndBackwardSplitOnTwoRanks) {
  const fs::path runs = dir_ / "runs_comms";
  fs::remove_all(runs);
  std::ofstream(dir_ / "comms.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 2,
      "wall_clock_breakdown": true, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
      "comms_logger": {"enabled": true, "verbose": true, "prof_ops": ["allreduce"]},
      "csv_monitor": {"enabled": true, "output_path": ")" +
                                            runs.string() + R"(", "job_name": "job"}})";
  const CliResult a =
      run_dstrain("train --deepspeed_config " + q(dir_ / "comms.json") + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
                  q(dir_ / "t_train.bin") + " --num-ranks 2 --steps 4 --seed 3 --sample-tokens 0 --summary-json " + q(dir_ / "comms.out"));
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  EXPECT_NE(a.err.find("comms_logger.prof_ops names \"allreduce\", which no collective of dstrain records"), std::string::npos) << a.err;

  const nlohmann::json s = summary(dir_ / "comms.out");
  const std::int64_t psi = s["zero"]["ranks"][0]["padded_param_elements"].get<std::int64_t>();
  ASSERT_EQ(psi, 34688);
  const nlohmann::json& c = s["comms"];
  EXPECT_EQ(c["world_size"], 2);
  EXPECT_EQ(c["rank"], 0);
  ASSERT_EQ(c["summary"].size(), 1u) << c.dump();
  const nlohmann::json& ar = c["summary"]["all_reduce"];
  // Besides the three per step, the exchange of the ranks' hosts and local rank before step 1 (for
  // the straggler warnings: 2 ranks x 65 fp64 = 1040 B), once.
  ASSERT_EQ(ar.size(), 4u) << ar.dump();
  EXPECT_EQ(ar["1040"]["count"], 1) << ar.dump();
  for (const std::int64_t bytes : {4 * psi, std::int64_t{24}, std::int64_t{32}}) {
    const nlohmann::json& row = ar[std::to_string(bytes)];
    EXPECT_EQ(row["count"], 4) << bytes;
    EXPECT_EQ(row["msg_size_bytes"], bytes);
    EXPECT_GT(row["total_latency_ms"].get<double>(), 0.0) << bytes;
    // all_reduce at n = 2: busbw = S/t · 2(n−1)/n = algbw (2S/t) / 2, call by call.
    EXPECT_NEAR(row["busbw_avg_gbps"].get<double>(), row["tput_avg_gbps"].get<double>() / 2, 1e-12) << bytes;
  }
  EXPECT_EQ(ar[std::to_string(4 * psi)]["msg_size_str"], "135.5 KB");

  // The table at each progress line; the last one (step 4) has 3·4 calls: 4 of each size.
  const std::size_t last = a.out.rfind("Comm. Op            Message Size        Count               Total Latency(ms)");
  ASSERT_NE(last, std::string::npos) << a.out;
  const std::string table = a.out.substr(last);
  EXPECT_NE(table.find("\nall_reduce\n"), std::string::npos) << table;
  EXPECT_NE(table.find("\n                    32.0 B              4                   "), std::string::npos) << table;
  EXPECT_NE(table.find("\n                    24.0 B              4                   "), std::string::npos) << table;
  EXPECT_NE(table.find("\n                    135.5 KB            4                   "), std::string::npos) << table;
  std::size_t verbose = 0;
  for (std::size_t at = a.err.find("comm op: all_reduce | time (ms): "); at != std::string::npos; at = a.err.find("comm op: all_reduce", at + 1))
    ++verbose;
  EXPECT_EQ(verbose, 13u) << a.err;

  const fs::path job = runs / "job";
  const auto counts = csv_rows(job / "comms_all_reduce_count.csv", "step,count");
  const std::vector<std::pair<std::int64_t, double>> want_counts{{16, 4.0}, {32, 7.0}, {64, 13.0}};
  EXPECT_EQ(counts, want_counts);
  EXPECT_TRUE(fs::exists(job / "comms_all_reduce_busbw_gbps.csv"));

  // wall_clock_breakdown: both parts of every step's backward measured, within it.
  EXPECT_NE(a.out.find(" | bwd_inner: "), std::string::npos) << a.out;
  EXPECT_NE(a.out.find(" | bwd_allreduce: "), std::string::npos) << a.out;
  const auto bwd = csv_rows(job / "Train_Samples_elapsed_time_ms_backward.csv", "step,elapsed_time_ms_backward");
  const auto inner = csv_rows(job / "Train_Samples_elapsed_time_ms_backward_inner.csv", "step,elapsed_time_ms_backward_inner");
  const auto reduce = csv_rows(job / "Train_Samples_elapsed_time_ms_backward_allreduce.csv", "step,elapsed_time_ms_backward_allreduce");
  ASSERT_EQ(bwd.size(), 4u);
  ASSERT_EQ(inner.size(), 4u);
  ASSERT_EQ(reduce.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_GT(inner[i].second, 0.0) << "step " << i + 1;
    EXPECT_GT(reduce[i].second, 0.0) << "step " << i + 1;
    EXPECT_LE(inner[i].second + reduce[i].second, bwd[i].second + 1e-6) << "step " << i + 1;
  }
  fs::remove_all(runs);
}

// On one rank there is no communicator and no collective: comms_logger says so instead of printing
// nothing without a word.
TEST_F(TrainCli, CommsLoggerOnOneRankSaysThereIsNothingToLog) {
  std::ofstream(dir_ / "comms1.json") << R"({"train_micro_batch_size_per_gpu": 4, "comms_logger": {"enabled": true}})";
  const CliResult a =
      run_dstrain("train --deepspeed_config " + q(dir_ / "comms1.json") + " --model gpt2:L1-C32-H2-V256-T32 --tokenizer bytes --data " +
                  q(dir_ / "t_train.bin") + " --steps 1 --sample-tokens 0");
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  EXPECT_NE(a.err.find("comms_logger is enabled, but this run has one rank and no communicator"), std::string::npos) << a.err;
}

// MFU's peak on the CPU is one rank's thread team measured at start; local ranks run their teams
// side by side, so a job of 2 ranks of 1 thread each counts the cores both occupy — min(2, the
// cores this process may use) times the one team's — and its MFU stays a fraction of that. Before,
// the peak stayed one team's while the tokens were both ranks': 82% where one rank ran at 58%.
TEST_F(TrainCli, LocalRanksCountEveryTeamsCoresInThePeak) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int busy = std::min(2, CPU_COUNT(&set));
  std::ofstream(dir_ / "mfu2.json") << R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1})";
  const CliResult r = run_dstrain(train_args("mfu2.json") + " --steps 2 --sample-tokens 0 --num-ranks 2", "OMP_NUM_THREADS=1");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string want = "measured at start, x " + std::to_string(busy) + ": 2 ranks of 1 thread on " + std::to_string(busy) + (busy == 1 ? " core" : " cores");
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
}

// examples/ds_configs/monitoring.json as shipped (its output_path pointed into the temp folder):
// memory lines, the timer line, and the flops profile with MFU at profile_step 2.
TEST_F(TrainCli, MonitoringExampleConfigRuns) {
  std::string text = read_file_text(fs::path(DSTRAIN_SOURCE_DIR) / "examples/ds_configs/monitoring.json");
  const fs::path runs = dir_ / "example_runs";
  std::string replacement = "\"";
  replacement.append(runs.string()).append("/\"");
  for (std::size_t at; (at = text.find("\"runs/\"")) != std::string::npos;) text.replace(at, 7, replacement);
  std::ofstream(dir_ / "monitoring.json") << text;
  const CliResult r = run_dstrain(train_args("monitoring.json") + " --steps 3 --sample-tokens 8 --peak-flops 1e11");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("MA "), std::string::npos) << r.out;  // memory_breakdown
  EXPECT_NE(r.out.find("Max_MA "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("time (ms) | fwd: "), std::string::npos) << r.out;  // wall_clock_breakdown
  // flops_profiler: logged (stderr, as DeepSpeed's logger) at profile_step 2.
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("Aggregated Profile per GPU"), std::string::npos) << all;
  EXPECT_NE(all.find("MFU ("), std::string::npos) << all;
  EXPECT_NE(all.find("from --peak-flops"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(runs / "gpt2_d6" / "Train_Samples_train_loss.csv"));
  fs::remove_all(runs);
}

// Optimizer offload (zero_optimization.offload_optimizer, docs/training_state.md §3): train and
// check-config agree — what check-config calls valid trains, with the optimizer partition in host
// memory and the same losses as without offload; what train refuses, check-config refuses with the
// same key, both exit 2.
TEST_F(TrainCli, OptimizerOffloadTrainsWhatCheckConfigAccepts) {
  const std::string head = R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}, "zero_optimization": )";
  std::ofstream(dir_ / "z2.json") << head + R"({"stage": 2}})";
  std::ofstream(dir_ / "z2_off.json") << head + R"({"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})";
  std::ofstream(dir_ / "z0_off.json") << head + R"({"stage": 0, "offload_optimizer": {"device": "cpu"}}})";

  EXPECT_EQ(run_dstrain("check-config " + q(dir_ / "z2_off.json")).exit_code, 0);
  const CliResult plain = run_dstrain(train_args("z2.json") + " --steps 3 --seed 5 --summary-json " + q(dir_ / "z2.out.json"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const CliResult off = run_dstrain(train_args("z2_off.json") + " --steps 3 --seed 5 --summary-json " + q(dir_ / "z2_off.out.json"));
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const nlohmann::json a = summary(dir_ / "z2_off.out.json");
  const nlohmann::json b = summary(dir_ / "z2.out.json");
  EXPECT_EQ(a["train_losses"], b["train_losses"]);
  const nlohmann::json& ra = a["zero"]["ranks"][0];
  const nlohmann::json& rb = b["zero"]["ranks"][0];
  EXPECT_EQ(ra["optimizer_bytes"], 0);
  // Adam's two moments plus the masters that offload keeps apart: 3/2 of the device's share without offload.
  EXPECT_EQ(ra["host_optimizer_bytes"].get<std::uint64_t>() * 2, rb["optimizer_bytes"].get<std::uint64_t>() * 3);
  EXPECT_EQ(rb["host_optimizer_bytes"], 0);

  // At stage 0 DeepSpeed ignores the block, and so do both commands: a warning naming it, and the
  // optimizer state stays on the device.
  const CliResult check0 = run_dstrain("check-config " + q(dir_ / "z0_off.json"));
  const CliResult train0 = run_dstrain(train_args("z0_off.json") + " --steps 1 --summary-json " + q(dir_ / "z0_off.out.json"));
  EXPECT_EQ(check0.exit_code, 0) << check0.err;
  ASSERT_EQ(train0.exit_code, 0) << train0.err;
  EXPECT_NE((check0.out + check0.err).find("zero_optimization.offload_optimizer"), std::string::npos) << check0.out << check0.err;
  EXPECT_NE(train0.err.find("zero_optimization.offload_optimizer"), std::string::npos) << train0.err;
  const nlohmann::json s0 = summary(dir_ / "z0_off.out.json");
  const nlohmann::json& r0 = s0["zero"]["ranks"][0];
  EXPECT_GT(r0["optimizer_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r0["host_optimizer_bytes"], 0);
}

}  // namespace
