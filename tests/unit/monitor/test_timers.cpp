// Timers on a fake clock, so every figure is exact and worked out by hand.
#include <gtest/gtest.h>

#include <memory>

#include "train/monitor/timers.h"
#include "ops/error.h"

namespace dstrain {
namespace {

struct FakeClock {
  std::shared_ptr<double> now = std::make_shared<double>(0.0);
  TimerClock clock() const {
    return [n = now] { return *n; };
  }
  void advance(double ms) { *now += ms; }
};

TEST(WallClockTimer, SumsRecordsAndResets) {
  FakeClock c;
  WallClockTimer t("t", c.clock());
  t.start();
  c.advance(10);
  t.stop();
  c.advance(100);  // not timed
  t.start();
  c.advance(5.5);
  t.stop();
  EXPECT_EQ(t.records(), 2u);
  EXPECT_DOUBLE_EQ(t.elapsed_ms(/*reset=*/false), 15.5);
  EXPECT_DOUBLE_EQ(t.elapsed_ms(), 15.5);
  EXPECT_DOUBLE_EQ(t.elapsed_ms(), 0.0);  // reset by the previous call
}

// bwd_inner / bwd_allreduce: records the engine measured, summed and averaged like timed ones.
TEST(WallClockTimer, AddedRecordsCountLikeTimedOnes) {
  FakeClock c;
  WallClockTimer t("bwd_inner", c.clock());
  t.add(2.5);
  t.start();
  c.advance(1);
  t.stop();
  t.add(0.0);
  EXPECT_EQ(t.records(), 3u);
  EXPECT_DOUBLE_EQ(t.elapsed_ms(), 3.5);
  EXPECT_THROW(t.add(-1.0), Error);
}

TEST(WallClockTimer, ElapsedOfARunningTimerCountsSoFarAndKeepsRunning) {
  FakeClock c;
  WallClockTimer t("t", c.clock());
  t.start();
  c.advance(3);
  EXPECT_DOUBLE_EQ(t.elapsed_ms(/*reset=*/false), 3.0);
  EXPECT_TRUE(t.running());
  c.advance(2);
  t.stop();
  EXPECT_DOUBLE_EQ(t.elapsed_ms(), 5.0);  // 3 + 2, as two records
}

TEST(WallClockTimer, MisuseIsAnErrorNamingTheTimer) {
  Timers timers;
  timers("fwd").start();
  try {
    timers("fwd").start();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fwd'"), std::string::npos);
  }
  EXPECT_THROW(timers("bwd").stop(), Error);
}

TEST(WallClockTimer, TrimmedMeanDropsTenPercentEachEnd) {
  FakeClock c;
  WallClockTimer t("t", c.clock());
  // 10 records 1..9 and 100: round(10 * 0.1) = 1 dropped each end -> mean(2..9) = 5.5.
  for (double ms : {100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0}) {
    t.start();
    c.advance(ms);
    t.stop();
  }
  EXPECT_DOUBLE_EQ(t.mean_ms(), 5.5);
  // 5 records: round(0.5) = 0 (half to even) -> plain mean.
  WallClockTimer u("u", c.clock());
  for (double ms : {1.0, 2.0, 3.0, 4.0, 100.0}) {
    u.start();
    c.advance(ms);
    u.stop();
  }
  EXPECT_DOUBLE_EQ(u.mean_ms(), 22.0);
  EXPECT_DOUBLE_EQ(WallClockTimer("empty", c.clock()).mean_ms(), 0.0);
}

TEST(WallClockTimer, SynchronizeRunsAtStartAndStop) {
  int syncs = 0;
  WallClockTimer t("synced", steady_clock_ms, [&] { ++syncs; });
  t.start();
  t.stop();
  EXPECT_EQ(syncs, 2);
}

TEST(Timers, LogLineInDeepSpeedsFormat) {
  FakeClock c;
  Timers timers(c.clock());
  for (std::string_view n : kGlobalTimerNames) timers(n).start();
  c.advance(12.346);  // not 12.345: x.xx5 ties round by their binary value
  timers(kForwardGlobalTimer).stop();
  c.advance(20);
  timers(kBackwardInnerGlobalTimer).stop();
  c.advance(1);
  timers(kBackwardReduceGlobalTimer).stop();
  timers(kBackwardGlobalTimer).stop();
  c.advance(4.004);
  timers(kStepGlobalTimer).stop();
  EXPECT_EQ(timers.log_line(kGlobalTimerNames), "time (ms) | fwd: 12.35 | bwd: 33.35 | bwd_inner: 32.35 | bwd_allreduce: 33.35 | step: 37.35");
  // reset by the line above
  EXPECT_EQ(timers.log_line(kGlobalTimerNames), "time (ms) | fwd: 0.00 | bwd: 0.00 | bwd_inner: 0.00 | bwd_allreduce: 0.00 | step: 0.00");
  // Only timers that exist are printed; a normalizer divides.
  Timers only_fwd(c.clock());
  only_fwd(kForwardMicroTimer).start();
  c.advance(9);
  only_fwd(kForwardMicroTimer).stop();
  EXPECT_EQ(only_fwd.log_line(kMicroTimerNames, 3.0), "time (ms) | fwd_microstep: 3.00");
  EXPECT_THROW(only_fwd.log_line(kMicroTimerNames, 0.0), Error);
}

TEST(Timers, ElapsedTimeEventsAsDeepSpeedWritesThem) {
  FakeClock c;
  Timers timers(c.clock());
  timers(kForwardGlobalTimer).start();
  c.advance(7);
  timers(kForwardGlobalTimer).stop();
  timers(kStepGlobalTimer).start();
  c.advance(2);
  timers(kStepGlobalTimer).stop();
  const auto events = elapsed_time_events(timers, 4096);
  ASSERT_EQ(events.size(), 5u);
  const char* names[] = {"Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
                         "Train/Samples/elapsed_time_ms_backward_inner", "Train/Samples/elapsed_time_ms_backward_allreduce",
                         "Train/Samples/elapsed_time_ms_step"};
  const double values[] = {7, 0, 0, 0, 2};
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(events[i].name, names[i]);
    EXPECT_DOUBLE_EQ(events[i].value, values[i]);
    EXPECT_EQ(events[i].step, 4096);
  }
  // Read without reset: the log line afterwards still sees them.
  EXPECT_EQ(timers.log_line(kGlobalTimerNames), "time (ms) | fwd: 7.00 | step: 2.00");
}

}  // namespace
}  // namespace dstrain
