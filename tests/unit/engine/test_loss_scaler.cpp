// LossScaler against sequences worked out by hand from the pseudo-code of docs/precision.md §4-§5
// (ZeRO DynamicLossScaler, non-ZeRO FP16 optimizers, static scale) and §8 (bf16). Every
// expected scale / hysteresis / skip below was written from the text, step by step, not by
// running the code.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/precision_config.h"
#include "engine/loss_scaler.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using config::Bf16Config;
using config::Fp16Config;

Fp16Config fp16(std::int64_t power, std::int64_t window, std::int64_t hysteresis, std::int64_t min_scale = 1, bool consecutive = false) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_scale;
  c.consecutive_hysteresis = consecutive;
  return c;
}

// One expected update: the overflow fed in, then what must come out.
struct Step {
  bool overflow;
  double new_scale;
  std::int64_t hysteresis_left;
  ScaleEvent event;
};

constexpr auto kNone = ScaleEvent::none;
constexpr auto kHyst = ScaleEvent::hysteresis_consumed;
constexpr auto kDown = ScaleEvent::scale_reduced;
constexpr auto kUp = ScaleEvent::scale_increased;

void run_script(LossScaler& s, const std::vector<Step>& script, bool check_hysteresis = true) {
  for (std::size_t i = 0; i < script.size(); ++i) {
    SCOPED_TRACE("update " + std::to_string(i));
    const double before = s.scale();
    const LossScaleUpdate r = s.update(script[i].overflow);
    EXPECT_EQ(r.old_scale, before);
    EXPECT_EQ(r.skipped, script[i].overflow);
    EXPECT_EQ(r.count_skipped, script[i].overflow);
    EXPECT_EQ(r.new_scale, script[i].new_scale);
    EXPECT_EQ(s.scale(), script[i].new_scale);
    if (check_hysteresis) {
      EXPECT_EQ(r.hysteresis_left, script[i].hysteresis_left);
    }
    EXPECT_EQ(r.event, script[i].event) << scale_event_name(r.event) << " vs " << scale_event_name(script[i].event);
  }
}

// ---- ZeRO DynamicLossScaler -------------------------------------------------------------------

// docs/precision.md §4 worked example: defaults 2^16, window 1000, hysteresis 2; updates 0-2 overflow, then clean.
TEST(LossScalerZero, ReferenceWorkedExample) {
  Fp16Config c;
  c.enabled = true;  // documented defaults: power 16, window 1000, hysteresis 2, min 1
  LossScaler s = LossScaler::fp16(c, /*zero=*/true);
  EXPECT_EQ(s.kind(), LossScalerKind::dynamic_zero);
  EXPECT_EQ(s.scale(), 65536.0);

  auto r = s.update(true);  // update 0: hysteresis 2 -> 1, scale kept
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.event, kHyst);
  EXPECT_EQ(r.new_scale, 65536.0);
  EXPECT_EQ(r.hysteresis_left, 1);
  EXPECT_EQ(s.overflow_log_line(r),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1");

  r = s.update(true);  // update 1: 65536 -> 32768
  EXPECT_EQ(r.event, kDown);
  EXPECT_EQ(r.new_scale, 32768.0);
  EXPECT_EQ(r.hysteresis_left, 1);
  EXPECT_EQ(s.overflow_log_line(r), "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768");

  r = s.update(true);  // update 2: 32768 -> 16384 (a reduction does not refill hysteresis)
  EXPECT_EQ(r.new_scale, 16384.0);
  EXPECT_EQ(r.hysteresis_left, 1);

  for (int u = 3; u <= 1002; ++u) {  // stable = u - 2 - 1 = 0 .. 999: nothing happens
    r = s.update(false);
    ASSERT_FALSE(r.skipped) << u;
    ASSERT_EQ(r.event, kNone) << u;
    ASSERT_EQ(r.new_scale, 16384.0) << u;
    ASSERT_EQ(r.hysteresis_left, 1) << u;
    ASSERT_EQ(s.overflow_log_line(r), "") << u;
  }
  r = s.update(false);  // update 1003: stable = 1000 -> double, refill hysteresis
  EXPECT_EQ(r.event, kUp);
  EXPECT_EQ(r.old_scale, 16384.0);
  EXPECT_EQ(r.new_scale, 32768.0);
  EXPECT_EQ(r.hysteresis_left, 2);
  EXPECT_EQ(s.state().cur_iter, 1004);
  EXPECT_EQ(s.state().last_overflow_iter, 2);

  for (int u = 1004; u <= 2002; ++u) ASSERT_EQ(s.update(false).event, kNone) << u;
  r = s.update(false);  // update 2003: stable = 2000 -> double again
  EXPECT_EQ(r.event, kUp);
  EXPECT_EQ(r.new_scale, 65536.0);
}

// Without any overflow the first doubling is at cur_iter = window (stable = cur_iter - (-1) - 1).
TEST(LossScalerZero, FirstGrowthAtCurIterEqualToWindow) {
  LossScaler s = LossScaler::fp16(fp16(4, 3, 2), true);  // scale 16, window 3
  run_script(s, {
                    {false, 16, 2, kNone},  // 0: stable 0
                    {false, 16, 2, kNone},  // 1
                    {false, 16, 2, kNone},  // 2
                    {false, 32, 2, kUp},    // 3: stable 3
                    {false, 32, 2, kNone},  // 4
                    {false, 32, 2, kNone},  // 5
                    {false, 64, 2, kUp},    // 6: stable 6
                });
}

// After an overflow at update k, growth at k + window + 1; hysteresis is refilled only there.
TEST(LossScalerZero, HysteresisRefilledOnlyAtGrowth) {
  LossScaler s = LossScaler::fp16(fp16(4, 3, 2), true);
  run_script(s, {
                    {true, 16, 1, kHyst},   // 0: consume
                    {false, 16, 1, kNone},  // 1: stable 0
                    {false, 16, 1, kNone},  // 2: stable 1
                    {false, 16, 1, kNone},  // 3: stable 2
                    {false, 32, 2, kUp},    // 4 = 0 + 3 + 1: grow, refill
                    {true, 32, 1, kHyst},   // 5: consume again
                    {false, 32, 1, kNone},  // 6: clean steps do not refill
                    {true, 16, 1, kDown},   // 7: hysteresis already 1: halve
                    {true, 8, 1, kDown},    // 8
                    {false, 8, 1, kNone},   // 9: stable 0
                    {false, 8, 1, kNone},   // 10
                    {false, 8, 1, kNone},   // 11
                    {false, 16, 2, kUp},    // 12 = 8 + 3 + 1
                });
}

TEST(LossScalerZero, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  LossScaler s = LossScaler::fp16(fp16(4, 3, 2, 1, /*consecutive=*/true), true);
  run_script(s, {
                    {true, 16, 1, kHyst},   // 0
                    {false, 16, 2, kNone},  // 1: refilled, stable 0
                    {true, 16, 1, kHyst},   // 2: consume the refill
                    {true, 8, 1, kDown},    // 3
                    {false, 8, 2, kNone},   // 4: refilled, stable 0
                    {false, 8, 2, kNone},   // 5
                    {false, 8, 2, kNone},   // 6
                    {false, 16, 2, kUp},    // 7 = 3 + 3 + 1
                });
}

// hysteresis 0 (accepted unvalidated by DeepSpeed): the counter goes 0, -1, ... and never equals
// 1, so the scale never drops; the steps are still skipped.
TEST(LossScalerZero, HysteresisZeroNeverReduces) {
  LossScaler s = LossScaler::fp16(fp16(4, 100, 0), true);
  run_script(s, {
                    {true, 16, -1, kHyst},
                    {true, 16, -2, kHyst},
                    {true, 16, -3, kHyst},
                });
  LossScaler t = LossScaler::fp16(fp16(4, 100, 0), true);
  const auto r = t.update(true);
  EXPECT_EQ(t.overflow_log_line(r),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16, but hysteresis is 0. Reducing hysteresis to -1");
}

TEST(LossScalerZero, HysteresisOneHalvesEveryOverflow) {
  LossScaler s = LossScaler::fp16(fp16(4, 100, 1), true);
  run_script(s, {
                    {true, 8, 1, kDown},
                    {true, 4, 1, kDown},
                    {false, 4, 1, kNone},
                    {true, 2, 1, kDown},
                });
}

TEST(LossScalerZero, OverflowAtMinimumRaisesWithDeepSpeedsMessageAndAdvice) {
  LossScaler s = LossScaler::fp16(fp16(2, 1000, 1), true);  // 4, min 1
  run_script(s, {{true, 2, 1, kDown}, {true, 1, 1, kDown}});
  try {
    s.update(true, "h.5.mlp.c_fc.weight");
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", 0), 0u) << m;
    for (const char* frag : {"bf16", "learning rate", "gradient_clipping", "h.5.mlp.c_fc.weight", "min_loss_scale"}) {
      EXPECT_NE(m.find(frag), std::string::npos) << "'" << m << "' lacks " << frag;
    }
  }
  // DeepSpeed raises before touching its state.
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.state().cur_iter, 2);
}

// The floor is reached through max(cur / 2, min) with a min that is not a power of two.
TEST(LossScalerZero, FloorAtNonPowerOfTwoMinimum) {
  LossScaler s = LossScaler::fp16(fp16(3, 1000, 1, 3), true);  // 8, min 3
  run_script(s, {{true, 4, 1, kDown}, {true, 3, 1, kDown}});
  EXPECT_THROW(s.update(true), Error);
}

// With hysteresis left at the floor, the overflow consumes it instead of raising.
TEST(LossScalerZero, HysteresisConsumedBeforeRaisingAtMinimum) {
  LossScaler s = LossScaler::fp16(fp16(0, 1000, 2), true);  // scale 1 = min
  run_script(s, {{true, 1, 1, kHyst}});
  EXPECT_THROW(s.update(true), Error);
}

TEST(LossScalerZero, LogLineNamesTheOverflowingLayerAndRank) {
  LossScaler s = LossScaler::fp16(fp16(70, 1000, 1), true);
  const auto r = s.update(true);
  // int() of 2^70 and 2^69, every digit, as Python prints them.
  EXPECT_EQ(s.overflow_log_line(r, 3, "h.3.attn.c_attn.weight"),
            "[deepspeed] OVERFLOW! Rank 3 Skipping step. Attempted loss scale: 1180591620717411303424, reducing to "
            "590295810358705651712 First non-finite gradient in: h.3.attn.c_attn.weight.");
}

// ---- non-ZeRO FP16 optimizers ------------------------------------------------------------------

TEST(LossScalerNonZero, NoHysteresisNoAbortSticksAtMinimum) {
  LossScaler s = LossScaler::fp16(fp16(4, 3, /*hysteresis ignored*/ 2, 4), /*zero=*/false);
  EXPECT_EQ(s.kind(), LossScalerKind::dynamic_non_zero);
  run_script(s,
             {
                 {true, 8, 0, kDown},   // 0: halves at once despite hysteresis 2
                 {true, 4, 0, kDown},   // 1
                 {true, 4, 0, kDown},   // 2: max(2, 4): stuck at the floor, no Error
                 {true, 4, 0, kDown},   // 3
                 {false, 4, 0, kNone},  // 4: stable 0
                 {false, 4, 0, kNone},  // 5
                 {false, 4, 0, kNone},  // 6
                 {false, 8, 0, kUp},    // 7 = 3 + 3 + 1
             },
             /*check_hysteresis=*/false);
}

TEST(LossScalerNonZero, LogLinesPrintNumbersAsPython) {
  LossScaler s = LossScaler::fp16(fp16(4, 1000, 2, 4), false);
  auto r = s.update(true);  // int 16 -> float 8.0
  EXPECT_EQ(s.overflow_log_line(r), "Overflow detected. Skipping step. Attempted loss scale: 16, reducing to 8.0");
  r = s.update(true);  // 8.0 -> 4.0 (== min, the float comes first in max)
  EXPECT_EQ(s.overflow_log_line(r), "Overflow detected. Skipping step. Attempted loss scale: 8.0, reducing to 4.0");
  r = s.update(true);  // max(2.0, 4) is the int 4
  EXPECT_EQ(s.overflow_log_line(r, 0, "wte"),
            "Overflow detected. Skipping step. Attempted loss scale: 4.0, reducing to 4 First non-finite gradient in: wte.");
}

// ---- static scale ---------------------------------------------------------------------------------

TEST(LossScalerStatic, ScaleFixedOverflowStillSkips) {
  for (bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "zero" : "non-zero");
    Fp16Config c = fp16(16, 1000, 2);
    c.loss_scale = 128.0;
    LossScaler s = LossScaler::fp16(c, zero);
    EXPECT_EQ(s.kind(), LossScalerKind::static_scale);
    EXPECT_FALSE(s.dynamic());
    run_script(s,
               {
                   {true, 128, 0, kNone},
                   {false, 128, 0, kNone},
                   {true, 128, 0, kNone},
               },
               false);
    LossScaler t = LossScaler::fp16(c, zero);
    t.update(false);
    const auto r = t.update(true);
    EXPECT_EQ(t.overflow_log_line(r), "Grad overflow on iteration: 1\nUsing static loss scale of: 128.0");
  }
}

// A static run needs no valid window / floor (DeepSpeed validates them only when dynamic).
TEST(LossScalerStatic, DynamicOnlyFieldsNotValidated) {
  Fp16Config c = fp16(16, 0, 2, 0);
  c.loss_scale = 1024.0;
  EXPECT_NO_THROW(LossScaler::fp16(c, true));
}

// ---- bf16 / fp32 ----------------------------------------------------------------------------------

TEST(LossScalerUnscaled, Policies) {
  LossScaler skip = LossScaler::unscaled(OverflowPolicy::skip);
  auto r = skip.update(true);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(r.count_skipped);
  EXPECT_EQ(r.new_scale, 1.0);
  EXPECT_EQ(skip.overflow_log_line(r), "[deepspeed] OVERFLOW! Rank 0 Skipping step.");
  r = skip.update(false);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(skip.overflow_log_line(r), "");

  LossScaler ignore = LossScaler::unscaled(OverflowPolicy::ignore);
  r = ignore.update(true);
  EXPECT_FALSE(r.skipped);
  EXPECT_FALSE(r.count_skipped);
  EXPECT_EQ(r.new_scale, 1.0);

  // Non-ZeRO bf16 quirk (docs/precision.md §8): applied, yet counted as skipped.
  LossScaler count = LossScaler::unscaled(OverflowPolicy::apply_but_count);
  r = count.update(true);
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(r.count_skipped);
}

TEST(LossScalerUnscaled, Bf16PolicyByStageAndWrapper) {
  Bf16Config b;
  b.enabled = true;  // check_grad_overflow defaults to true (v0.19.3)
  EXPECT_EQ(LossScaler::bf16_policy(b, 0, false), OverflowPolicy::apply_but_count);
  EXPECT_EQ(LossScaler::bf16_policy(b, 1, false), OverflowPolicy::skip);
  EXPECT_EQ(LossScaler::bf16_policy(b, 2, false), OverflowPolicy::skip);
  EXPECT_EQ(LossScaler::bf16_policy(b, 3, false), OverflowPolicy::ignore);
  EXPECT_EQ(LossScaler::bf16_policy(b, 1, true), OverflowPolicy::ignore);  // BF16_Optimizer
  b.check_grad_overflow = false;
  EXPECT_EQ(LossScaler::bf16_policy(b, 2, false), OverflowPolicy::ignore);
}

TEST(LossScalerFactory, PicksByPrecisionAndStage) {
  Fp16Config f;
  Bf16Config b;
  EXPECT_EQ(LossScaler::create(f, b, 2).kind(), LossScalerKind::unscaled);  // fp32
  EXPECT_EQ(LossScaler::create(f, b, 2).unscaled_policy(), OverflowPolicy::ignore);
  b.enabled = true;
  EXPECT_EQ(LossScaler::create(f, b, 2).unscaled_policy(), OverflowPolicy::skip);
  f.enabled = true;
  EXPECT_THROW(LossScaler::create(f, b, 2), Error);
  b.enabled = false;
  EXPECT_EQ(LossScaler::create(f, b, 0).kind(), LossScalerKind::dynamic_non_zero);
  EXPECT_EQ(LossScaler::create(f, b, 1).kind(), LossScalerKind::dynamic_zero);
  EXPECT_EQ(LossScaler::create(f, b, 3).kind(), LossScalerKind::dynamic_zero);
  EXPECT_EQ(LossScaler::create(f, b, 3).scale(), 65536.0);
}

TEST(LossScalerFactory, RejectsInvalidDynamicSettings) {
  auto msg_of = [](const Fp16Config& c) {
    try {
      LossScaler::fp16(c, true);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg_of(fp16(16, 0, 2)).find("loss_scale_window"), std::string::npos);
  EXPECT_NE(msg_of(fp16(16, 1000, 2, 0)).find("min_loss_scale"), std::string::npos);
  Fp16Config neg = fp16(16, 1000, 2);
  neg.loss_scale = -1.0;
  EXPECT_NE(msg_of(neg).find("loss_scale"), std::string::npos);
  EXPECT_NE(msg_of(fp16(5000, 1000, 2)).find("initial_scale_power"), std::string::npos);
}

// ---- checkpoint state --------------------------------------------------------------------------

TEST(LossScalerState, ResumeContinuesIdentically) {
  const std::vector<bool> pattern = {true, false, false, true, true, false, false, false, false, true, false, false, false, false, false};
  LossScaler a = LossScaler::fp16(fp16(10, 3, 2), true);
  for (std::size_t i = 0; i < 7; ++i) a.update(pattern[i]);
  const LossScalerState saved = a.state();
  LossScaler b = LossScaler::fp16(fp16(10, 3, 2), true);
  b.set_state(saved);
  for (std::size_t i = 7; i < pattern.size(); ++i) {
    const auto ra = a.update(pattern[i]);
    const auto rb = b.update(pattern[i]);
    EXPECT_EQ(ra.new_scale, rb.new_scale) << i;
    EXPECT_EQ(ra.hysteresis_left, rb.hysteresis_left) << i;
    EXPECT_EQ(ra.event, rb.event) << i;
  }
  EXPECT_EQ(a.state().cur_iter, b.state().cur_iter);
  EXPECT_EQ(a.state().last_overflow_iter, b.state().last_overflow_iter);
}

TEST(LossScalerState, RejectsCorruptState) {
  LossScaler s = LossScaler::fp16(fp16(16, 1000, 2), true);
  EXPECT_THROW(s.set_state({0.0, 5, 2, 1}), Error);
  EXPECT_THROW(s.set_state({1024.0, 5, 5, 1}), Error);
  EXPECT_THROW(s.set_state({1024.0, -1, -1, 1}), Error);
  EXPECT_NO_THROW(s.set_state({1024.0, 5, -1, 2}));
  EXPECT_EQ(s.scale(), 1024.0);
  LossScaler st = LossScaler::unscaled(OverflowPolicy::skip);
  EXPECT_THROW(st.set_state({1024.0, 5, -1, 0}), Error);
}

}  // namespace
}  // namespace dstrain
