// fp16 / bf16 training through the engine (docs/precision.md), against independent expectations:
// the fp32 run's loss curve, a naive double AdamW applied to the engine's own (scaled) 16-bit
// gradients with DeepSpeed's un-scale/clip divisor written out by hand, and loss-scale sequences
// written by hand from the non-ZeRO rules of docs/precision.md §5 (halve on overflow, double after
// loss_scale_window clean steps counted from the last overflow).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "ops/dtype.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_model.h"

#include "engine_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace engine_testing;

// micro 2, GAS 2, AdamW; `precision` is a ds_config fragment such as "fp16": {...}.
std::string config_json(const std::string& precision, double lr = 1e-2, double clip = 0.0, const std::string& extra = "", double eps = 1e-8) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": {},
    "optimizer": {{"type": "AdamW", "params": {{"lr": {}, "betas": [0.9, 0.95], "eps": {}, "weight_decay": 0.1}}}}{}{}{}}})",
                     clip, lr, eps, precision.empty() ? "" : ", ", precision, extra);
}

// Every master parameter, concatenated.
std::vector<double> all_masters(const Engine& e) {
  std::vector<double> out;
  for (const std::string& n : e.param_names()) {
    const auto v = widen(e.master_param(n));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}
std::vector<double> all_params(const Engine& e) {
  std::vector<double> out;
  for (const std::string& n : e.param_names()) {
    const auto v = widen(e.param(n));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// One optimizer step (GAS micro-batches, a fixed batch per micro-step index).
void train_step(Engine& e, std::vector<Tokens>& data) {
  for (std::int64_t m = 0; m < e.config().gradient_accumulation_steps; ++m) {
    e.forward(data[static_cast<std::size_t>(m)].batch());
    e.backward();
    e.step();
  }
}

std::vector<Tokens> fixed_data() { return {random_tokens(2, 8, 61, 1), random_tokens(2, 8, 61, 2)}; }

// The mean step loss of 30 optimizer steps (memorising two fixed batches), per step.
std::vector<float> loss_curve(const std::string& precision) {
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(precision)), {.seed = 7, .sequence_length = 8});
  auto data = fixed_data();
  std::vector<float> losses;
  for (int s = 0; s < 30; ++s) {
    train_step(e, data);
    losses.push_back(e.state().last_step_loss);
  }
  EXPECT_EQ(e.state().skipped_steps, 0);  // scale 2^8 never overflows this model's gradients
  return losses;
}

TEST(EnginePrecision, Fp16AndBf16FollowTheFp32LossCurve) {
  const auto f32 = loss_curve("");
  const auto f16 = loss_curve(R"("fp16": {"enabled": true, "initial_scale_power": 8})");
  const auto b16 = loss_curve(R"("bf16": {"enabled": true})");
  // The run learns (the comparison below would be vacuous on a flat curve)...
  ASSERT_LT(f32.back(), f32.front() - 1.0f);
  // ...and 16-bit storage follows it: same initial weights up to rounding, the same data, the
  // update in fp32 masters. Tolerances: fp16 keeps 11 significant bits, bf16 8; the gap stays
  // well below the ~1+ nats the loss drops (a missing un-scaling or a wrong master would not).
  double d16 = 0.0, db16 = 0.0;
  for (std::size_t s = 0; s < f32.size(); ++s) {
    d16 = std::max(d16, std::fabs(double(f16[s]) - f32[s]));
    db16 = std::max(db16, std::fabs(double(b16[s]) - f32[s]));
    EXPECT_NEAR(f16[s], f32[s], 0.03) << "fp16 step " << s + 1;
    EXPECT_NEAR(b16[s], f32[s], 0.05) << "bf16 step " << s + 1;
  }
  std::printf("loss %.4f -> %.4f; max |fp16 - fp32| %.4f, max |bf16 - fp32| %.4f\n", f32.front(), f32.back(), d16, db16);
}

// Step 1's update against a naive double AdamW (torch.optim.AdamW docs) on the engine's own 16-bit
// gradients, which carry loss_scale / GAS per micro-batch; DeepSpeed divides them by clip·S when
// the un-scaled norm exceeds gradient_clipping, else by S. A large eps makes the AdamW update
// depend on the gradient's magnitude, so a wrong un-scaling or clipping shows.
void check_first_step_against_naive(const std::string& precision, double clip) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-3, wd = 0.1;
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(precision, lr, clip, "", eps)), {.seed = 3, .sequence_length = 8});
  auto data = fixed_data();
  e.forward(data[0].batch());
  e.backward();
  e.step();
  e.forward(data[1].batch());
  e.backward();
  const double S = e.state().loss_scale;  // step 1 (window 1000): the scale does not change
  const auto names = e.param_names();
  std::vector<std::vector<double>> theta, grads;
  double norm_sq = 0.0;
  for (const auto& n : names) {
    theta.push_back(widen(e.master_param(n)));
    grads.push_back(widen(e.grad(n)));
    for (double g : grads.back()) norm_sq += g * g;
  }
  e.step();
  ASSERT_EQ(e.state().global_steps, 1);
  ASSERT_EQ(e.state().skipped_steps, 0);
  double divisor = S;
  const double c = (std::sqrt(norm_sq) / S + 1e-6) / clip;
  if (clip > 0.0 && c > 1.0) divisor = c * S;
  if (clip > 0.0) {
    EXPECT_GT(c, 1.0) << "the test means to clip";
  }
  for (std::size_t k = 0; k < names.size(); ++k) {
    const auto got = widen(e.master_param(names[k]));
    const auto lowp = widen(e.param(names[k]));
    const double w = decays(names[k]) ? wd : 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = grads[k][i] / divisor;
      double th = theta[k][i] * (1.0 - lr * w);
      const double m = (1 - b1) * g / (1 - b1), v = (1 - b2) * g * g / (1 - b2);
      th -= lr * m / (std::sqrt(v) + eps);
      ASSERT_NEAR(got[i], th, 1e-7 + 1e-6 * std::fabs(th)) << names[k] << "[" << i << "]";
      // The 16-bit params the next forward reads are the master rounded (same-pass copy).
      const double tol = std::fabs(th) * (e.param(names[k]).dtype == DType::fp16 ? 1.0 / 2048 : 1.0 / 256) + 1e-7;
      ASSERT_NEAR(lowp[i], got[i], tol) << names[k] << "[" << i << "]";
    }
  }
}

TEST(EnginePrecision, Fp16StepUnscalesAndClipsLikeDeepSpeed) {
  check_first_step_against_naive(R"("fp16": {"enabled": true, "initial_scale_power": 10})", 0.0);
  check_first_step_against_naive(R"("fp16": {"enabled": true, "initial_scale_power": 10})", 0.05);
}

TEST(EnginePrecision, Bf16StepMatchesNaiveAdamW) {
  check_first_step_against_naive(R"("bf16": {"enabled": true})", 0.0);
  check_first_step_against_naive(R"("bf16": {"enabled": true})", 0.05);
}

// Overflow injected at optimizer step 3 (docs/precision.md §6: the step is skipped — no parameter,
// optimizer or LR-schedule change; skipped_steps += 1; global_steps += 1; non-ZeRO dynamic fp16
// halves the scale).
TEST(EnginePrecision, InjectedOverflowSkipsExactlyThatStep) {
  const std::string sched =
      R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}})";
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(R"("fp16": {"enabled": true, "initial_scale_power": 8})", 1e-2, 1.0, sched)),
                        {.seed = 5, .sequence_length = 8, .inject_overflow_steps = {3}});
  auto data = fixed_data();
  train_step(e, data);
  train_step(e, data);
  const auto master2 = all_masters(e);
  const auto params2 = all_params(e);
  const double lr2 = e.state().lr;
  const double last_lr2 = e.state().last_step_lr;
  EXPECT_EQ(e.state().loss_scale, 256.0);
  train_step(e, data);  // step 3: overflow
  EXPECT_EQ(e.state().global_steps, 3);
  EXPECT_EQ(e.state().skipped_steps, 1);
  EXPECT_EQ(e.state().loss_scale, 128.0);
  EXPECT_EQ(all_masters(e), master2);
  EXPECT_EQ(all_params(e), params2);
  EXPECT_EQ(e.state().lr, lr2);  // the schedule did not advance
  EXPECT_EQ(e.state().last_step_lr, last_lr2);
  for (const auto& n : e.param_names())
    for (double g : widen(e.grad(n))) ASSERT_EQ(g, 0.0) << n;  // the overflowing grads are cleared
  train_step(e, data);                                         // step 4 applies, at the LR step 3 would have used
  EXPECT_EQ(e.state().skipped_steps, 1);
  EXPECT_EQ(e.state().last_step_lr, lr2);
  EXPECT_NE(all_masters(e), master2);
}

// Scripted overflows at steps 2, 3 and 9 with loss_scale_window 2, non-ZeRO dynamic fp16
// (FP16_Optimizer's _update_scale, docs/precision.md §5). By hand, with i = step - 1 the update's
// iteration and L the last overflow's iteration (initially -1):
//   overflow: scale /= 2, L = i;  else: stable = i - L - 1, and scale *= 2 when stable > 0 and
//   stable % 2 == 0.
//   step 1 (i=0): stable 0            -> 256
//   step 2 (i=1): overflow            -> 128, L = 1
//   step 3 (i=2): overflow            -> 64,  L = 2
//   step 4 (i=3): stable 0            -> 64
//   step 5 (i=4): stable 1            -> 64
//   step 6 (i=5): stable 2            -> 128
//   step 7 (i=6): stable 3            -> 128
//   step 8 (i=7): stable 4            -> 256
//   step 9 (i=8): overflow            -> 128, L = 8
//   step 10 (i=9): stable 0           -> 128
//   step 11 (i=10): stable 1          -> 128
//   step 12 (i=11): stable 2          -> 256
TEST(EnginePrecision, LossScaleSequenceFollowsDeepSpeed) {
  Engine e =
      initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(R"("fp16": {"enabled": true, "initial_scale_power": 8, "loss_scale_window": 2})")),
                 {.seed = 5, .sequence_length = 8, .inject_overflow_steps = {2, 3, 9}});
  auto data = fixed_data();
  const std::vector<double> expected{256, 128, 64, 64, 64, 128, 128, 256, 128, 128, 128, 256};
  std::vector<double> got;
  for (std::size_t s = 0; s < expected.size(); ++s) {
    train_step(e, data);
    got.push_back(e.state().loss_scale);
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(e.state().skipped_steps, 3);
  EXPECT_EQ(e.state().global_steps, 12);
}

// Weights are saved from the fp32 masters and loaded into them: an fp32 engine reads exactly the
// fp16 run's masters, and a fresh fp16 engine gets the same masters and 16-bit params back.
TEST(EnginePrecision, WeightsRoundTripThroughTheMasters) {
  const std::string f16 = R"("fp16": {"enabled": true, "initial_scale_power": 8})";
  Engine a = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(f16)), {.seed = 9, .sequence_length = 8});
  auto data = fixed_data();
  for (int s = 0; s < 3; ++s) train_step(a, data);
  const auto path = std::filesystem::temp_directory_path() / ("dstrain_precision_w." + std::to_string(::getpid()) + ".safetensors");
  a.save_weights(path);
  Engine f = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json("")), {.sequence_length = 8, .init_params = false});
  f.load_weights(path);
  EXPECT_EQ(all_masters(f), all_masters(a));
  Engine b = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(f16)), {.sequence_length = 8, .init_params = false});
  b.load_weights(path);
  EXPECT_EQ(all_masters(b), all_masters(a));
  EXPECT_EQ(all_params(b), all_params(a));
  EXPECT_EQ(b.evaluate(data[0].batch()), a.evaluate(data[0].batch()));
  std::filesystem::remove(path);
}

// Static fp16 scale (fp16.loss_scale > 0): an overflow still skips the step, the scale stays
// (docs/precision.md §2, §6); the gradients carry exactly that scale.
TEST(EnginePrecision, StaticScaleSkipsWithoutChangingTheScale) {
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(R"("fp16": {"enabled": true, "loss_scale": 64})")),
                        {.seed = 5, .sequence_length = 8, .inject_overflow_steps = {2}});
  auto data = fixed_data();
  train_step(e, data);
  const auto master1 = all_masters(e);
  train_step(e, data);
  EXPECT_EQ(e.state().loss_scale, 64.0);
  EXPECT_EQ(e.state().skipped_steps, 1);
  EXPECT_EQ(all_masters(e), master1);
  train_step(e, data);
  EXPECT_EQ(e.state().loss_scale, 64.0);
  EXPECT_NE(all_masters(e), master1);
}

// bf16 without ZeRO (DeepSpeed's FP16_Optimizer in bf16 mode, docs/precision.md §8): a non-finite
// gradient does not skip the update, but the step counts as skipped and the LR schedule does not
// step; the scale stays 1. "Applied" is checked element by element against the same run without
// the injected inf: Adam is elementwise and clipping is off, so every other master takes exactly
// the same update, and only the one element whose gradient is +inf becomes NaN (m = inf, v = inf,
// m / sqrt(v) = NaN) — a weight anywhere else turning NaN or keeping its old value is a failure.
// (warmup_min_lr > 0: the first steps' LR is not 0, so the update moves the weights.)
TEST(EnginePrecision, Bf16NonZeroAppliesButCountsTheOverflowStep) {
  const std::string sched =
      R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.005, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}})";
  const auto run = [&](std::vector<std::int64_t> inject, std::vector<double>* after1, double* lr1, std::int64_t* skipped, double* lr2) {
    Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(R"("bf16": {"enabled": true})", 1e-2, 0.0, sched)),
                          {.seed = 5, .sequence_length = 8, .inject_overflow_steps = std::move(inject)});
    auto data = fixed_data();
    train_step(e, data);
    *lr1 = e.state().lr;
    *after1 = all_masters(e);
    train_step(e, data);
    EXPECT_EQ(e.state().loss_scale, 1.0);
    *skipped = e.state().skipped_steps;
    *lr2 = e.state().lr;
    return all_masters(e);
  };
  std::vector<double> inj1, clean1;
  double inj_lr1 = 0, inj_lr2 = 0, clean_lr1 = 0, clean_lr2 = 0;
  std::int64_t inj_skipped = 0, clean_skipped = 0;
  const auto injected = run({2}, &inj1, &inj_lr1, &inj_skipped, &inj_lr2);
  const auto clean = run({}, &clean1, &clean_lr1, &clean_skipped, &clean_lr2);
  EXPECT_EQ(inj_skipped, 1);
  EXPECT_EQ(clean_skipped, 0);
  EXPECT_EQ(inj_lr2, inj_lr1);      // the schedule did not step
  EXPECT_GT(clean_lr2, clean_lr1);  // ... where the clean run's warm-up did
  ASSERT_EQ(inj1, clean1);          // identical up to the injected step
  ASSERT_EQ(injected.size(), clean.size());
  std::size_t nan_count = 0, moved = 0;
  for (std::size_t i = 0; i < injected.size(); ++i) {
    if (std::isnan(injected[i])) {
      ++nan_count;
      continue;
    }
    ASSERT_TRUE(std::isfinite(injected[i])) << "master " << i;
    ASSERT_EQ(injected[i], clean[i]) << "master " << i << ": the update applied differs from the run without the overflow";
    if (injected[i] != inj1[i]) ++moved;
  }
  EXPECT_EQ(nan_count, 1u);  // only the element whose gradient was +inf
  std::size_t clean_moved = 0;
  for (std::size_t i = 0; i < clean.size(); ++i) clean_moved += clean[i] != clean1[i];
  EXPECT_GT(moved, injected.size() / 2) << "lr " << inj_lr1 << " -> " << inj_lr2 << ", clean lr " << clean_lr1 << " -> " << clean_lr2
                                        << ", clean run moved " << clean_moved;  // the update was applied, not skipped
}

// Activation checkpointing under fp16: the recompute regenerates the 16-bit activations bit for
// bit, so the losses equal the run that keeps every activation.
TEST(EnginePrecision, Fp16WithCheckpointingMatchesWithout) {
  const std::string f16 = config_json(R"("fp16": {"enabled": true, "initial_scale_power": 8})");
  std::vector<float> losses[2];
  for (int ck = 0; ck < 2; ++ck) {
    Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(f16), {.seed = 4, .sequence_length = 8, .checkpoint_activations = ck == 1});
    auto data = fixed_data();
    for (int s = 0; s < 5; ++s) {
      train_step(e, data);
      losses[ck].push_back(e.state().last_step_loss);
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(EnginePrecision, InjectOverflowNeeds16BitTraining) {
  EXPECT_THROW(initialize(make_gpt2_model("gpt2:tiny"), ds(config_json("")), {.sequence_length = 8, .inject_overflow_steps = {1}}), Error);
}

// --bf16-stochastic-rounding: every bf16 weight is one of the two bf16 neighbours of its fp32
// master (and not always the nearer one: the rounding is stochastic), training still follows the
// round-to-nearest run's loss curve, and a config it cannot apply to is refused naming the fix.
TEST(EnginePrecision, Bf16StochasticRoundingKeepsWeightsNextToTheMasters) {
  const std::string bf16 = R"("bf16": {"enabled": true})";
  EngineOptions o{.seed = 7, .sequence_length = 8, .bf16_stochastic_rounding = true};
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_json(bf16)), o);
  auto data = fixed_data();
  std::vector<float> losses;
  for (int s = 0; s < 30; ++s) {
    train_step(e, data);
    losses.push_back(e.state().last_step_loss);
  }
  const auto masters = all_masters(e), params = all_params(e);
  ASSERT_EQ(masters.size(), params.size());
  std::int64_t not_nearest = 0;
  for (std::size_t i = 0; i < masters.size(); ++i) {
    // The two bf16 values around the master: its bits truncated (toward zero), and one step away.
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(static_cast<float>(masters[i]));
    const auto toward = static_cast<float>(bf16_t::from_bits(static_cast<std::uint16_t>(bits >> 16)));
    const auto away = static_cast<float>(bf16_t::from_bits(static_cast<std::uint16_t>((bits >> 16) + 1)));
    ASSERT_TRUE(params[i] == toward || params[i] == away) << "element " << i << ": bf16 " << params[i] << ", master " << masters[i];
    not_nearest += params[i] != static_cast<float>(bf16_t(static_cast<float>(masters[i])));
  }
  EXPECT_GT(not_nearest, 0) << "every weight rounded to nearest: the rounding is not stochastic";
  const auto rne = loss_curve(bf16);
  EXPECT_LT(losses.back(), 0.5f * losses.front());
  EXPECT_NEAR(losses.back(), rne.back(), 0.25 * rne.back());

  EXPECT_THROW(initialize(make_gpt2_model("gpt2:tiny"), ds(config_json("")), o), Error);  // fp32: nothing to round
  const std::string sgd = R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})";
  try {
    (void)initialize(make_gpt2_model("gpt2:tiny"), ds(sgd), o);
    ADD_FAILURE() << "SGD with stochastic rounding accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("Adam"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace dstrain
