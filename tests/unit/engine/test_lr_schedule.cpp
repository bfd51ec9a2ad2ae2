// LrSchedule against the formulas of docs/lr_schedules.md, written out again here from the
// text (naive, no shared code with engine/lr_schedule.cpp), plus hand-computed values.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "engine/lr_schedule.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using config::SchedulerConfig;
using config::SchedulerKind;

constexpr double kRel = 1e-13;  // the formulas are evaluated in double in a different order

#define EXPECT_CLOSE(a, b) EXPECT_NEAR((a), (b), kRel* std::max(1.0, std::fabs(b)))

SchedulerConfig make(SchedulerKind kind, const std::string& type) {
  SchedulerConfig c;
  c.kind = kind;
  c.type = type;
  return c;
}

// ---- the formulas of docs/lr_schedules.md, evaluated naively --------------------------------------

double ref_warmup_gamma(std::int64_t it, std::int64_t warmup_num_steps, const std::string& type) {
  const double W = static_cast<double>(std::max<std::int64_t>(2, warmup_num_steps));
  return type == "linear" ? static_cast<double>(it) / W : std::log(static_cast<double>(it) + 1.0) / std::log(W);
}

// docs/lr_schedules.md §2 (WarmupLR)
double ref_warmup_lr(std::int64_t it, double mn, double mx, std::int64_t n, const std::string& type) {
  const std::int64_t W = std::max<std::int64_t>(2, n);
  if (it < 0) return mn;
  if (it < W) return mn + (mx - mn) * ref_warmup_gamma(it, n, type);
  return mx;
}

// docs/lr_schedules.md §3 (WarmupDecayLR)
double ref_warmup_decay_lr(std::int64_t it, std::int64_t T, double mn, double mx, std::int64_t n, const std::string& type) {
  const std::int64_t W = std::max<std::int64_t>(2, n);
  if (it < W) return ref_warmup_lr(it, mn, mx, n, type);
  const double g = std::max(0.0, static_cast<double>(T - it) / static_cast<double>(std::max<std::int64_t>(1, T - W)));
  return mn + (mx - mn) * g;
}

// docs/lr_schedules.md §4 (WarmupCosineLR)
double ref_cosine_lr(std::int64_t it, double org_lr, std::int64_t T, double warmup_min_ratio, std::int64_t n, double cos_min_ratio,
                     const std::string& type) {
  const std::int64_t W = std::max<std::int64_t>(2, n);
  if (it < 0) return 0.0;
  double ratio;
  if (it < W) {
    ratio = warmup_min_ratio + ref_warmup_gamma(it, n, type) * (1.0 - warmup_min_ratio);
  } else {
    const double p = std::min(1.0, static_cast<double>(it - W + 1) / static_cast<double>(std::max<std::int64_t>(1, T - W)));
    ratio = std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0);
  }
  return org_lr * ratio;
}

// docs/lr_schedules.md §5 (OneCycle), cycle phase: the scale s (0 at min lr / max momentum, 1 at max lr / min momentum).
double ref_one_cycle_s(std::int64_t it, std::int64_t F, std::int64_t S, std::int64_t k1, std::int64_t k2) {
  const std::int64_t N = F + S;
  const std::int64_t b = it + 1;
  const double rho = static_cast<double>(F) / static_cast<double>(N);
  const double c = std::floor(1.0 + static_cast<double>(b) / static_cast<double>(N));
  const double x = 1.0 + static_cast<double>(b) / static_cast<double>(N) - c;
  double s = x <= rho ? x / rho : (x - 1.0) / (rho - 1.0);
  const std::int64_t i = b % N;
  const bool first_half = i <= F;
  const std::int64_t k = first_half ? k1 : k2;
  if (k > 0) {
    const double position =
        first_half ? static_cast<double>(i * k) / static_cast<double>(F) : static_cast<double>((N - i) * k) / static_cast<double>(S);
    s = std::floor(position) / static_cast<double>(k);
  }
  return s;
}

struct OneCycleRef {
  double min_lr, max_lr, decay_lr_rate;
  std::int64_t F, S, k1, k2, decay_step_size;
  double min_mom, max_mom, decay_mom_rate;

  double lr(std::int64_t it) const {
    if (it < F + S) return min_lr + (max_lr - min_lr) * ref_one_cycle_s(it, F, S, k1, k2);
    if (decay_step_size == 0 || decay_lr_rate == 0.0) return min_lr;
    const double d = static_cast<double>(it - (F + S) + 1);
    return min_lr / (1.0 + decay_lr_rate * d / static_cast<double>(decay_step_size));
  }
  double beta1(std::int64_t it) const {
    if (it == -1) return min_mom;  // the constructor writes (min_mom, 0.99)
    if (it < F + S) return max_mom - (max_mom - min_mom) * ref_one_cycle_s(it, F, S, k1, k2);
    if (decay_step_size == 0 || decay_mom_rate == 0.0) return max_mom;
    const double d = static_cast<double>(it - (F + S) + 1);
    return max_mom * (1.0 + decay_mom_rate * d / static_cast<double>(decay_step_size));
  }
};

// docs/lr_schedules.md §6 (LRRangeTest)
double ref_range_test_lr(std::int64_t it, double mn, std::int64_t size, double rate, bool staircase) {
  const double q = static_cast<double>(it + 1) / static_cast<double>(size);
  return mn * (1.0 + rate * (staircase ? std::floor(q) : q));
}

// ---- WarmupLR --------------------------------------------------------------------------------

TEST(LrSchedule, WarmupLrLogHandValues) {
  auto c = make(SchedulerKind::warmup_lr, "WarmupLR");
  c.params.warmup_min_lr = 0.0;
  c.params.warmup_max_lr = 1.0;
  c.params.warmup_num_steps = 1000;
  LrSchedule s(c, 0.5, std::nullopt);
  EXPECT_EQ(s.last_batch_iteration(), -1);
  EXPECT_EQ(s.lr(), 0.0);                      // it = -1: min
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);           // ln(1) = 0
  EXPECT_NEAR(s.lr_at(9), 1.0 / 3.0, 1e-15);   // ln(10) / ln(1000)
  EXPECT_NEAR(s.lr_at(99), 2.0 / 3.0, 1e-15);  // ln(100) / ln(1000)
  EXPECT_NEAR(s.lr_at(999), 1.0, 1e-15);       // it = W - 1: ln(1000) / ln(1000)
  EXPECT_EQ(s.lr_at(1000), 1.0);               // it = W: max
  EXPECT_EQ(s.lr_at(123456), 1.0);
  EXPECT_EQ(s.betas(), std::nullopt);
}

TEST(LrSchedule, WarmupLrAgainstFormula) {
  for (const std::string type : {"log", "linear"}) {
    for (const std::int64_t n : {1, 2, 7, 50}) {
      auto c = make(SchedulerKind::warmup_lr, "WarmupLR");
      c.params.warmup_min_lr = 1e-5;
      c.params.warmup_max_lr = 3e-4;
      c.params.warmup_num_steps = n;
      c.params.warmup_type = type;
      const std::int64_t W = std::max<std::int64_t>(2, n);
      LrSchedule s(c, 1.0, std::nullopt);
      for (const std::int64_t it : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, W - 1, W, W + 1, 3 * W + 5}) {
        SCOPED_TRACE(type + " n=" + std::to_string(n) + " it=" + std::to_string(it));
        EXPECT_CLOSE(s.lr_at(it), ref_warmup_lr(it, 1e-5, 3e-4, n, type));
      }
    }
  }
}

TEST(LrSchedule, WarmupNumStepsBelowTwoUsesTwo) {
  auto c = make(SchedulerKind::warmup_lr, "WarmupLR");
  c.params.warmup_min_lr = 0.1;
  c.params.warmup_max_lr = 0.9;
  c.params.warmup_num_steps = 1;  // W = max(2, 1) = 2
  LrSchedule s(c, 1.0, std::nullopt);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);  // ln 1 / ln 2 = 0
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.9);  // ln 2 / ln 2 = 1
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.9);
  c.params.warmup_type = "linear";
  LrSchedule l(c, 1.0, std::nullopt);
  EXPECT_DOUBLE_EQ(l.lr_at(1), 0.1 + 0.8 * 0.5);  // 1 / W with W = 2, not 1 / 1
}

TEST(LrSchedule, WarmupLrLinearHand) {
  auto c = make(SchedulerKind::warmup_lr, "WarmupLR");
  c.params.warmup_min_lr = 0.0;
  c.params.warmup_max_lr = 0.002;
  c.params.warmup_num_steps = 10;
  c.params.warmup_type = "linear";
  LrSchedule s(c, 1.0, std::nullopt);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.0018);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.002);
}

TEST(LrSchedule, WarmupLrMaxDefaultsToOptimizerLrThroughTheConfig) {
  // docs/lr_schedules.md §2-§3: WarmupLR's max defaults to the optimizer lr, WarmupDecayLR's to 0.001.
  const auto cfg = config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.0006}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_type": "linear"}}})"),
                                           {});
  LrSchedule s(cfg.scheduler, cfg.optimizer.params.lr, cfg.optimizer.params.betas);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.0006);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.0003);
  const auto dcfg = config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.0006}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}}})"),
                                            {});
  LrSchedule d(dcfg.scheduler, dcfg.optimizer.params.lr, dcfg.optimizer.params.betas);
  EXPECT_DOUBLE_EQ(d.lr_at(10), 0.001);
}

// ---- WarmupDecayLR -----------------------------------------------------------------------------

TEST(LrSchedule, WarmupDecayLrHandValues) {
  auto c = make(SchedulerKind::warmup_decay_lr, "WarmupDecayLR");
  c.params.warmup_min_lr = 0.0;
  c.params.warmup_max_lr = 0.01;
  c.params.warmup_num_steps = 10;
  c.params.warmup_type = "linear";
  c.params.total_num_steps = 110;
  LrSchedule s(c, 1.0, std::nullopt);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.009);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.01);   // (110 - 10) / 100
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.005);  // (110 - 60) / 100
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.0);   // reaches min at T
  EXPECT_DOUBLE_EQ(s.lr_at(500), 0.0);   // and stays there
}

TEST(LrSchedule, WarmupDecayLrAgainstFormula) {
  for (const std::string type : {"log", "linear"}) {
    for (const std::int64_t T : {5, 20, 1000}) {  // 5 < W: DeepSpeed warns, max(1, T - W) guards
      auto c = make(SchedulerKind::warmup_decay_lr, "WarmupDecayLR");
      c.params.warmup_min_lr = 2e-5;
      c.params.warmup_max_lr = 6e-4;
      c.params.warmup_num_steps = 8;
      c.params.warmup_type = type;
      c.params.total_num_steps = T;
      LrSchedule s(c, 1.0, std::nullopt);
      for (const std::int64_t it :
           {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{8}, (8 + T) / 2, T - 1, T, T + 1, 2 * T + 9}) {
        SCOPED_TRACE(type + " T=" + std::to_string(T) + " it=" + std::to_string(it));
        EXPECT_CLOSE(s.lr_at(it), ref_warmup_decay_lr(it, T, 2e-5, 6e-4, 8, type));
      }
    }
  }
}

// ---- WarmupCosineLR ----------------------------------------------------------------------------

TEST(LrSchedule, WarmupCosineLrHandValues) {
  auto c = make(SchedulerKind::warmup_cosine_lr, "WarmupCosineLR");
  c.params.warmup_num_steps = 10;
  c.params.warmup_type = "linear";
  c.params.total_num_steps = 110;
  c.params.warmup_min_ratio = 0.0;
  c.params.cos_min_ratio = 0.0001;
  LrSchedule s(c, 0.1, std::nullopt);
  EXPECT_EQ(s.lr(), 0.0);  // starts at 0: the first optimizer step runs at lr 0
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.05);
  // it = 59: p = (59 - 10 + 1) / 100 = 0.5, cos(pi/2) = 0: ratio = 0.0001 + 0.9999 / 2
  EXPECT_NEAR(s.lr_at(59), 0.1 * (0.0001 + 0.9999 * 0.5), 1e-16);
  EXPECT_NEAR(s.lr_at(109), 0.1 * 0.0001, 1e-17);  // p = 1: cos_min_ratio
  EXPECT_NEAR(s.lr_at(110), 0.1 * 0.0001, 1e-17);  // clamped after T (v0.19.3+), no rise
  EXPECT_NEAR(s.lr_at(250), 0.1 * 0.0001, 1e-17);
}

TEST(LrSchedule, WarmupCosineLrAgainstFormula) {
  for (const std::string type : {"log", "linear"}) {
    for (const std::int64_t T : {3, 50, 400}) {
      auto c = make(SchedulerKind::warmup_cosine_lr, "WarmupCosineLR");
      c.params.warmup_num_steps = 20;
      c.params.warmup_type = type;
      c.params.total_num_steps = T;
      c.params.warmup_min_ratio = 0.1;
      c.params.cos_min_ratio = 0.05;
      LrSchedule s(c, 3e-4, std::nullopt);
      for (const std::int64_t it : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, std::int64_t{19}, std::int64_t{20}, std::int64_t{21},
                                    (20 + T) / 2, T - 1, T, T + 1, 3 * T}) {
        SCOPED_TRACE(type + " T=" + std::to_string(T) + " it=" + std::to_string(it));
        EXPECT_CLOSE(s.lr_at(it), ref_cosine_lr(it, 3e-4, T, 0.1, 20, 0.05, type));
      }
    }
  }
}

TEST(LrSchedule, WarmupCosineLrTotalEqualToWarmupDoesNotDivideByZero) {
  auto c = make(SchedulerKind::warmup_cosine_lr, "WarmupCosineLR");
  c.params.warmup_num_steps = 10;
  c.params.total_num_steps = 10;  // T = W: no decay window; every post-warmup step at the floor
  c.params.cos_min_ratio = 0.01;
  LrSchedule s(c, 1.0, std::nullopt);
  EXPECT_NEAR(s.lr_at(10), 0.01, 1e-15);
  EXPECT_NEAR(s.lr_at(11), 0.01, 1e-15);
}

// ---- OneCycle ----------------------------------------------------------------------------------

SchedulerConfig one_cycle(const OneCycleRef& r) {
  auto c = make(SchedulerKind::one_cycle, "OneCycle");
  c.params.cycle_min_lr = r.min_lr;
  c.params.cycle_max_lr = r.max_lr;
  c.params.decay_lr_rate = r.decay_lr_rate;
  c.params.cycle_first_step_size = r.F;
  c.params.cycle_second_step_size = r.S;
  c.params.cycle_first_stair_count = r.k1;
  c.params.cycle_second_stair_count = r.k2;
  c.params.decay_step_size = r.decay_step_size;
  c.params.cycle_min_mom = r.min_mom;
  c.params.cycle_max_mom = r.max_mom;
  c.params.decay_mom_rate = r.decay_mom_rate;
  return c;
}

const LrSchedule::Betas kAdamBetas{0.9, 0.999};

TEST(LrSchedule, OneCycleHandValues) {
  const OneCycleRef r{0.1, 1.0, 0.5, 10, 10, 0, 0, 2, 0.8, 0.9, 0.1};
  LrSchedule s(one_cycle(r), 0.01, kAdamBetas);
  // Construction: lr = min_lr, betas = (min_mom, 0.99) with beta2 forced from 0.999 to 0.99.
  EXPECT_EQ(s.lr(), 0.1);
  ASSERT_TRUE(s.betas());
  EXPECT_EQ(s.betas()->first, 0.8);
  EXPECT_EQ(s.betas()->second, 0.99);
  EXPECT_NEAR(s.lr_at(4), 0.55, 1e-15);  // b = 5: s = 0.5 (rising)
  EXPECT_NEAR(s.betas_at(4)->first, 0.85, 1e-15);
  EXPECT_NEAR(s.lr_at(9), 1.0, 1e-15);  // b = 10 = F: the peak
  EXPECT_NEAR(s.betas_at(9)->first, 0.8, 1e-15);
  EXPECT_NEAR(s.lr_at(14), 0.55, 1e-15);  // b = 15: s = (0.75 - 1) / (0.5 - 1) = 0.5 (falling)
  EXPECT_NEAR(s.lr_at(19), 0.1, 1e-15);   // b = 20 = N: back at min
  EXPECT_NEAR(s.betas_at(19)->first, 0.9, 1e-15);
  // Decay, d = it - N + 1: lr = 0.1 / (1 + 0.5 d / 2), beta1 = 0.9 (1 + 0.1 d / 2)
  EXPECT_NEAR(s.lr_at(20), 0.08, 1e-15);
  EXPECT_NEAR(s.betas_at(20)->first, 0.945, 1e-15);
  EXPECT_NEAR(s.lr_at(23), 0.1 / 2.0, 1e-15);  // d = 4
  EXPECT_EQ(s.betas_at(23)->second, 0.99);
}

TEST(LrSchedule, OneCycleAgainstFormula) {
  const OneCycleRef cases[] = {
      {1e-4, 1e-3, 0.0, 2000, 2000, 0, 0, 0, 0.85, 0.95, 0.0},  // defaults-like, no decay
      {0.01, 0.1, 0.3, 7, 3, 0, 0, 5, 0.8, 0.9, 0.2},           // asymmetric halves, decay
      {0.01, 0.1, 0.3, 12, 8, 4, 2, 3, 0.8, 0.9, 0.2},          // staircase, different stairs per half
      {0.01, 0.1, 0.0, 10, 10, 3, 0, 0, 0.8, 0.9, 0.0},         // stairs in the first half only
      {0.01, 0.1, 0.0, 5, 0, 0, 0, 0, 0.8, 0.9, 0.0},           // no second half
  };
  for (const OneCycleRef& r : cases) {
    LrSchedule s(one_cycle(r), 1.0, kAdamBetas);
    const std::int64_t N = r.F + r.S;
    for (std::int64_t it = -1; it < N + 12; ++it) {
      SCOPED_TRACE("F=" + std::to_string(r.F) + " S=" + std::to_string(r.S) + " k=" + std::to_string(r.k1) + "/" + std::to_string(r.k2) +
                   " it=" + std::to_string(it));
      EXPECT_CLOSE(s.lr_at(it), r.lr(it));
      ASSERT_TRUE(s.betas_at(it));
      EXPECT_CLOSE(s.betas_at(it)->first, r.beta1(it));
      EXPECT_EQ(s.betas_at(it)->second, 0.99);
      if (N >= 4000 && it > 30) it += 397;  // sample the long cycle sparsely
    }
    EXPECT_CLOSE(s.lr_at(N - 1), r.min_lr);  // b = N closes the cycle at min
  }
}

TEST(LrSchedule, OneCycleStaircaseHoldsEachStair) {
  // F = 10 with 4 stairs: position = b * 4 / 10, s = floor(position) / 4.
  const OneCycleRef r{0.0, 1.0, 0.0, 10, 10, 4, 4, 0, 0.8, 0.9, 0.0};
  LrSchedule s(one_cycle(r), 1.0, kAdamBetas);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0);    // b = 2: 0.8
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.25);   // b = 3: 1.2
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);    // b = 5: 2.0
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5);    // b = 6: 2.4
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.5);    // b = 7: 2.8
  EXPECT_DOUBLE_EQ(s.lr_at(7), 0.75);   // b = 8: 3.2
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);    // b = 10: the peak is a stair
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.75);  // b = 11: (20 - 11) * 4 / 10 = 3.6
  EXPECT_DOUBLE_EQ(s.betas_at(10)->first, 0.9 - 0.1 * 0.75);
}

TEST(LrSchedule, OneCycleMomentumDisabled) {
  const OneCycleRef r{0.1, 1.0, 0.0, 10, 10, 0, 0, 0, 0.8, 0.9, 0.0};
  LrSchedule no_betas(one_cycle(r), 1.0, std::nullopt);  // SGD: no betas, momentum cycling off
  EXPECT_FALSE(no_betas.cycles_momentum());
  EXPECT_EQ(no_betas.betas(), std::nullopt);
  no_betas.step();
  EXPECT_EQ(no_betas.betas(), std::nullopt);
  EXPECT_NEAR(no_betas.lr(), r.lr(0), 1e-15);
  auto c = one_cycle(r);
  c.params.cycle_momentum = false;
  LrSchedule off(c, 1.0, kAdamBetas);
  EXPECT_EQ(off.betas(), std::nullopt);
}

// ---- LRRangeTest -------------------------------------------------------------------------------

TEST(LrSchedule, LrRangeTestContinuousAndStaircase) {
  auto c = make(SchedulerKind::lr_range_test, "LRRangeTest");
  c.params.lr_range_test_min_lr = 0.001;
  c.params.lr_range_test_step_size = 10;
  c.params.lr_range_test_step_rate = 1.0;
  LrSchedule s(c, 0.5, std::nullopt);
  EXPECT_EQ(s.lr(), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.0015);   // (4 + 1) / 10 = 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(18), 0.0029);  // 1 + 1.9
  c.params.lr_range_test_staircase = true;
  LrSchedule st(c, 0.5, std::nullopt);
  EXPECT_EQ(st.lr(), 0.001);
  EXPECT_DOUBLE_EQ(st.lr_at(4), 0.001);   // floor(0.5) = 0
  EXPECT_DOUBLE_EQ(st.lr_at(9), 0.002);   // floor(1.0) = 1
  EXPECT_DOUBLE_EQ(st.lr_at(18), 0.002);  // floor(1.9) = 1
  EXPECT_DOUBLE_EQ(st.lr_at(19), 0.003);
  for (const bool stair : {false, true}) {
    c.params.lr_range_test_staircase = stair;
    c.params.lr_range_test_step_rate = 2.5;
    c.params.lr_range_test_step_size = 7;
    LrSchedule g(c, 0.5, std::nullopt);
    for (std::int64_t it = -1; it < 40; ++it)
      EXPECT_CLOSE(g.lr_at(it), ref_range_test_lr(it, 0.001, 7, 2.5, stair)) << "it=" << it << " stair=" << stair;
  }
}

// ---- stepping: which lr each optimizer step uses -----------------------------------------------

TEST(LrSchedule, OptimizerStepKUsesTheValueForItKMinus2) {
  auto c = make(SchedulerKind::warmup_decay_lr, "WarmupDecayLR");
  c.params.warmup_min_lr = 1e-5;
  c.params.warmup_max_lr = 1e-3;
  c.params.warmup_num_steps = 5;
  c.params.total_num_steps = 30;
  LrSchedule s(c, 1.0, std::nullopt);
  // A loop with fp16 overflows at micro-steps 3, 4 and 11: those steps are skipped and do not step
  // the schedule, so the k-th APPLIED step still uses the value for it = k - 2.
  std::int64_t k = 0;  // applied optimizer steps so far
  for (int step = 1; step <= 40; ++step) {
    const bool overflow = step == 3 || step == 4 || step == 11;
    if (overflow) continue;
    ++k;
    EXPECT_CLOSE(s.lr(), ref_warmup_decay_lr(k - 2, 30, 1e-5, 1e-3, 5, "log")) << "k=" << k;
    s.step();
    EXPECT_EQ(s.last_batch_iteration(), k - 1);
  }
  // k = 1 runs at the constructor's value, k = 2 at it = 0 (log warm-up: ln 1 = 0, still min).
  LrSchedule f(c, 1.0, std::nullopt);
  EXPECT_EQ(f.lr(), 1e-5);
  f.step();
  EXPECT_EQ(f.lr(), 1e-5);
  f.step();
  EXPECT_CLOSE(f.lr(), 1e-5 + (1e-3 - 1e-5) * std::log(2.0) / std::log(5.0));
}

TEST(LrSchedule, StepMatchesLrAtForEveryKind) {
  const double base = 2e-4;
  std::vector<SchedulerConfig> cs;
  cs.push_back(make(SchedulerKind::warmup_lr, "WarmupLR"));
  cs.back().params.warmup_num_steps = 6;
  cs.push_back(make(SchedulerKind::warmup_decay_lr, "WarmupDecayLR"));
  cs.back().params.warmup_num_steps = 6;
  cs.back().params.total_num_steps = 20;
  cs.push_back(make(SchedulerKind::warmup_cosine_lr, "WarmupCosineLR"));
  cs.back().params.warmup_num_steps = 6;
  cs.back().params.total_num_steps = 20;
  cs.push_back(one_cycle({0.01, 0.1, 0.3, 7, 5, 2, 3, 2, 0.8, 0.9, 0.1}));
  cs.push_back(make(SchedulerKind::lr_range_test, "LRRangeTest"));
  cs.back().params.lr_range_test_step_size = 4;
  for (const auto& c : cs) {
    LrSchedule s(c, base, kAdamBetas);
    for (std::int64_t it = 0; it < 30; ++it) {
      s.step();
      EXPECT_EQ(s.lr(), s.lr_at(it)) << c.type << " it=" << it;
      EXPECT_EQ(s.betas(), s.betas_at(it)) << c.type << " it=" << it;
    }
  }
}

TEST(LrSchedule, ResumeFromLastBatchIteration) {
  const auto c = one_cycle({0.01, 0.1, 0.3, 7, 5, 2, 3, 2, 0.8, 0.9, 0.1});
  LrSchedule a(c, 1.0, kAdamBetas);
  for (int i = 0; i < 9; ++i) a.step();
  // A fresh schedule, then load_state_dict({last_batch_iteration: 8}).
  LrSchedule b(c, 1.0, kAdamBetas);
  b.set_last_batch_iteration(a.last_batch_iteration());
  EXPECT_EQ(b.last_batch_iteration(), 8);
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(a.lr(), b.lr());
    EXPECT_EQ(a.betas(), b.betas());
    a.step();
    b.step();
  }
}

TEST(LrSchedule, ConstructedPastStartKeepsOptimizerValuesUntilFirstStep) {
  // DeepSpeed writes the initial value only when last_batch_iteration == -1.
  auto c = make(SchedulerKind::warmup_lr, "WarmupLR");
  c.params.warmup_min_lr = 0.0;
  c.params.warmup_max_lr = 1.0;
  c.params.warmup_num_steps = 10;
  c.params.warmup_type = "linear";
  c.params.last_batch_iteration = 4;
  LrSchedule s(c, 0.123, std::nullopt);
  EXPECT_EQ(s.last_batch_iteration(), 4);
  EXPECT_EQ(s.lr(), 0.123);
  s.step();
  EXPECT_DOUBLE_EQ(s.lr(), 0.5);  // it = 5
  auto o = one_cycle({0.1, 1.0, 0.0, 10, 10, 0, 0, 0, 0.8, 0.9, 0.0});
  o.params.last_batch_iteration = 3;
  LrSchedule t(o, 0.123, kAdamBetas);
  EXPECT_EQ(t.lr(), 0.123);
  EXPECT_EQ(t.betas(), std::nullopt);  // the optimizer keeps its own betas
  t.step();
  EXPECT_NEAR(t.lr(), 0.1 + 0.9 * 0.5, 1e-15);  // it = 4: b = 5, s = 0.5
  EXPECT_NEAR(t.betas()->first, 0.85, 1e-15);
}

TEST(LrSchedule, NoneAndUnsupportedAreConstant) {
  const SchedulerConfig absent;
  LrSchedule none(absent, 3e-4, kAdamBetas);
  LrSchedule plain(3e-4);
  auto u = make(SchedulerKind::unsupported, "StepLR");
  LrSchedule unsupported(u, 3e-4, kAdamBetas);
  for (LrSchedule* s : {&none, &plain, &unsupported}) {
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(s->lr(), 3e-4);
      EXPECT_EQ(s->betas(), std::nullopt);
      s->step();
    }
  }
}

TEST(LrSchedule, RejectsWhatDeepSpeedRejects) {
  auto w = make(SchedulerKind::warmup_lr, "WarmupLR");
  w.params.warmup_num_steps = 0;
  EXPECT_THROW(LrSchedule(w, 1.0, std::nullopt), Error);
  w.params.warmup_num_steps = 10;
  w.params.warmup_type = "cosine";
  try {
    LrSchedule s(w, 1.0, std::nullopt);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("warmup_type"), std::string::npos);
  }
  auto d = make(SchedulerKind::warmup_decay_lr, "WarmupDecayLR");
  EXPECT_THROW(LrSchedule(d, 1.0, std::nullopt), Error);  // total_num_steps missing
  auto cos = make(SchedulerKind::warmup_cosine_lr, "WarmupCosineLR");
  EXPECT_THROW(LrSchedule(cos, 1.0, std::nullopt), Error);
  auto o = one_cycle({0.1, 1.0, 0.0, 0, 10, 0, 0, 0, 0.8, 0.9, 0.0});
  EXPECT_THROW(LrSchedule(o, 1.0, kAdamBetas), Error);
  auto r = make(SchedulerKind::lr_range_test, "LRRangeTest");
  r.params.lr_range_test_step_size = 0;
  EXPECT_THROW(LrSchedule(r, 1.0, std::nullopt), Error);
}

}  // namespace
}  // namespace dstrain
