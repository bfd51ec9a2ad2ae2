// `dstrain train` and the optimizer a run uses when the config names none (docs/optimizers.md):
// AdamW with the Hugging Face Trainer's defaults (lr 5e-5, betas (0.9, 0.999), eps 1e-8,
// weight_decay 0), the flags --lr, --adam-beta1/2, --adam-eps, --weight-decay replacing them.
//
// The reference is AdamW's first step, independent of the gradients: with bias correction,
// m̂ = g and v̂ = g², so θ1 = θ0·(1 − lr·wd) − lr·g / (|g| + eps), which is θ0·(1 − lr·wd) ∓ lr
// wherever |g| ≫ eps and θ0·(1 − lr·wd) where g = 0 (e.g. embeddings of bytes the batch lacks).
// The weights before (--steps 0) and after one step (--steps 1), from the same seed, are compared
// element by element through --save-weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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

// The F32 tensors of a safetensors file by name (format: u64 header length, JSON header, data).
std::map<std::string, std::vector<float>> read_safetensors_f32(const fs::path& p) {
  const std::string bytes = read_file_text(p);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t["dtype"], "F32") << name;
    const auto b = t["data_offsets"][0].get<std::size_t>(), e = t["data_offsets"][1].get<std::size_t>();
    std::vector<float> v((e - b) / 4);
    std::memcpy(v.data(), bytes.data() + 8 + n + b, e - b);
    out[name] = std::move(v);
  }
  return out;
}

class TrainOptimizerCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_train_optimizer_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    // No optimizer block; no clipping, so the step is the optimizer's alone.
    std::ofstream(dir_ / "noopt.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0})";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  static std::string train_args(const std::string& config) {
    return "train --deepspeed_config " + q(dir_ / config) + " --model gpt2:L1-C32-H2-V256-T16 --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           " --val-interval 0 --sample-tokens 0 --seed 5";
  }
  // The weights after `steps` steps with these extra flags; the run's stdout in `out`.
  static std::map<std::string, std::vector<float>> weights_after(int steps, const std::string& flags, std::string* out = nullptr,
                                                                 const std::string& config = "noopt.json") {
    const fs::path w = dir_ / ("w" + std::to_string(counter_++) + ".safetensors");
    const CliResult r = run_dstrain(train_args(config) + " --steps " + std::to_string(steps) + " " + flags + " --save-weights " + q(w));
    EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
    if (out) *out = r.out;
    return read_safetensors_f32(w);
  }

  // Checks θ1 = θ0·(1 − lr·wd_t) − lr·g/(|g| + eps) for every element, where wd_t is `wd` for the
  // decayed tensors (matrices and embeddings) and 0 for biases and LayerNorm weights: the step is
  // at most lr, and exactly lr (relative 1e-3) where |g| ≫ eps. Returns the fraction of elements
  // that stepped by lr (not g = 0, nor the few gradients near eps, e.g. the key biases').
  static double check_first_adamw_step(const std::map<std::string, std::vector<float>>& w0, const std::map<std::string, std::vector<float>>& w1,
                                       double lr, double wd) {
    std::size_t at_lr = 0, total = 0;
    for (const auto& [name, a] : w0) {
      const std::vector<float>& b = w1.at(name);
      const bool decayed = !(name.ends_with(".bias") || name.find("ln_") != std::string::npos);
      const double decay = 1.0 - lr * (decayed ? wd : 0.0);
      for (std::size_t i = 0; i < a.size(); ++i) {
        // fp32 rounding of θ (|θ| <= ~1.1) is below 1.2e-7.
        const double step = std::abs(static_cast<double>(b[i]) - static_cast<double>(a[i]) * decay);
        ++total;
        EXPECT_LE(step, lr * (1 + 1e-3) + 2e-7) << name << "[" << i << "]";
        if (::testing::Test::HasFailure()) return 0.0;
        at_lr += std::abs(step - lr) <= lr * 1e-3 + 2e-7;
      }
    }
    return static_cast<double>(at_lr) / static_cast<double>(total);
  }

  static fs::path dir_;
  static int counter_;
};
fs::path TrainOptimizerCli::dir_;
int TrainOptimizerCli::counter_ = 0;

TEST_F(TrainOptimizerCli, NoOptimizerBlockTrainsWithTheHfTrainerAdamW) {
  std::string out;
  const auto w0 = weights_after(0, "");
  const auto w1 = weights_after(1, "", &out);
  EXPECT_NE(out.find("optimizer: the config has no \"optimizer\" block, so AdamW with the Hugging Face Trainer's defaults: lr 5e-05 betas (0.9, "
                     "0.999) eps 1e-08 weight_decay 0"),
            std::string::npos)
      << out;
  EXPECT_GT(check_first_adamw_step(w0, w1, 5e-5, 0.0), 0.5);
}

TEST_F(TrainOptimizerCli, FlagsReplaceTheDefaults) {
  const auto w0 = weights_after(0, "");
  std::string out;
  // --lr and --weight-decay: θ0·(1 − lr·wd) ∓ lr on the decayed tensors.
  const auto w1 = weights_after(1, "--lr 1e-3 --weight-decay 10 --adam-beta1 0.8 --adam-beta2 0.99", &out);
  EXPECT_NE(out.find("lr 0.001 betas (0.8, 0.99) eps 1e-08 weight_decay 10"), std::string::npos) << out;
  EXPECT_GT(check_first_adamw_step(w0, w1, 1e-3, 10.0), 0.5);
  // The decay is there: c_attn's weights (|θ| ~ 0.02) do not step by lr alone.
  const std::vector<float>&a = w0.at("h.0.attn.c_attn.weight"), &b = w1.at("h.0.attn.c_attn.weight");
  std::size_t off = 0;
  for (std::size_t i = 0; i < a.size(); ++i) off += std::abs(std::abs(b[i] - a[i]) - 1e-3) > 1e-5;
  EXPECT_GT(off, a.size() / 2);

  // --adam-eps 1: the step is lr·g / (|g| + 1), below lr everywhere and almost nowhere near it
  // for these gradients (|g| < 1).
  const auto w2 = weights_after(1, "--adam-eps 1", &out);
  EXPECT_NE(out.find("eps 1 weight_decay 0"), std::string::npos) << out;
  EXPECT_LT(check_first_adamw_step(w0, w2, 5e-5, 0.0), 0.01);

  // --adam-betas and --adam-beta1 together, and a beta >= 1: exit 2 naming them.
  const CliResult both = run_dstrain(train_args("noopt.json") + " --steps 1 --adam-betas 0.9 0.99 --adam-beta1 0.8");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--adam-beta1"), std::string::npos) << both.err;
  const CliResult bad = run_dstrain(train_args("noopt.json") + " --steps 1 --adam-beta2 1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--adam-beta2"), std::string::npos) << bad.err;
}

// A config with a scheduler and no optimizer trains: DeepSpeed builds the config's scheduler on
// the optimizer it has (here the default AdamW), so WarmupLR starts from warmup_min_lr.
TEST_F(TrainOptimizerCli, SchedulerWithoutOptimizerBlock) {
  std::ofstream(dir_ / "sched.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3, "warmup_num_steps": 10, "warmup_type": "linear"}}})";
  const CliResult r = run_dstrain(train_args("sched.json") + " --steps 3 --summary-json " + q(dir_ / "sched_summary.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("AdamW with the Hugging Face Trainer's defaults"), std::string::npos) << r.out;
  const nlohmann::json s = nlohmann::json::parse(read_file_text(dir_ / "sched_summary.json"));
  ASSERT_TRUE(s.contains("lrs")) << s.dump();
  const auto lrs = s["lrs"].get<std::vector<double>>();
  ASSERT_EQ(lrs.size(), 3u);
  // WarmupLR linear: step k (it = k - 2, the constructor's value for k = 1) = min + (max - min)·it/10.
  EXPECT_DOUBLE_EQ(lrs[0], 0.0);
  EXPECT_NEAR(lrs[1], 0.0, 1e-12);
  EXPECT_NEAR(lrs[2], 2e-3 * 1.0 / 10.0, 1e-9);
}

// The element-wise types train through `train` (docs/optimizers.md §8): Lion's loss falls over 12
// steps; RMSprop at ZeRO 2 on 2 local ranks needs zero_allow_untested_optimizer (DeepSpeed's
// message without it) and with it gives the losses of one rank with the same global batch.
TEST_F(TrainOptimizerCli, ElementwiseTypesTrain) {
  std::ofstream(dir_ / "lion.json") << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Lion", "params": {"lr": 3e-3}}})";
  const CliResult lion = run_dstrain(train_args("lion.json") + " --steps 12 --summary-json " + q(dir_ / "lion_summary.json"));
  ASSERT_EQ(lion.exit_code, 0) << lion.err << lion.out;
  const auto losses = nlohmann::json::parse(read_file_text(dir_ / "lion_summary.json"))["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front() - 0.5);

  const std::string rms = R"("optimizer": {"type": "RMSprop", "params": {"lr": 1e-3, "momentum": 0.5}}, "zero_optimization": {"stage": 2})";
  std::ofstream(dir_ / "rms_untested.json") << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, )" << rms << "}";
  const CliResult refused = run_dstrain(train_args("rms_untested.json") + " --steps 2 --num-ranks 2");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("You are using an untested ZeRO Optimizer"), std::string::npos) << refused.err;
  std::ofstream(dir_ / "rms2.json") << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": true, )"
                                    << rms << "}";
  std::ofstream(dir_ / "rms1.json") << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, )"
                                    << R"("optimizer": {"type": "RMSprop", "params": {"lr": 1e-3, "momentum": 0.5}}})";
  const CliResult two = run_dstrain(train_args("rms2.json") + " --steps 3 --num-ranks 2 --summary-json " + q(dir_ / "rms2_summary.json"));
  ASSERT_EQ(two.exit_code, 0) << two.err << two.out;
  const CliResult one = run_dstrain(train_args("rms1.json") + " --steps 3 --summary-json " + q(dir_ / "rms1_summary.json"));
  ASSERT_EQ(one.exit_code, 0) << one.err << one.out;
  const auto l2 = nlohmann::json::parse(read_file_text(dir_ / "rms2_summary.json"))["train_losses"].get<std::vector<double>>();
  const auto l1 = nlohmann::json::parse(read_file_text(dir_ / "rms1_summary.json"))["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(l2.size(), l1.size());
  for (std::size_t k = 0; k < l1.size(); ++k) EXPECT_NEAR(l2[k], l1[k], 1e-5 * std::abs(l1[k])) << "step " << k + 1;
}

}  // namespace
