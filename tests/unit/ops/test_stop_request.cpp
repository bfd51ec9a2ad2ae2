// ops/stop_request: how long a stop request waits for a step boundary before swap I/O gives up.
#include <gtest/gtest.h>

#include <csignal>
#include <chrono>
#include <thread>

#include "ops/stop_request.h"

namespace dstrain {
namespace {

using std::chrono::milliseconds;

// The grace is max(3 s, 2 x the longest finished step): a run whose steps take a minute (a large
// model on NVMe) keeps two minutes to finish the step and save; before any step, 3 s.
TEST(StopRequest, GraceIsTwiceTheLongestStepAndAtLeastThreeSeconds) {
  clear_stop_request();
  EXPECT_EQ(stop_grace(), milliseconds(3000));
  note_step_seconds(0.5);
  EXPECT_EQ(stop_grace(), milliseconds(3000));
  note_step_seconds(60.0);
  note_step_seconds(10.0);  // a shorter step does not shorten it
  EXPECT_EQ(stop_grace(), milliseconds(120000));
  clear_stop_request();
  EXPECT_EQ(stop_grace(), milliseconds(3000));
}

TEST(StopRequest, OverdueOnlyAfterTheGrace) {
  clear_stop_request();
  EXPECT_FALSE(stop_overdue());
  request_stop(SIGTERM);
  EXPECT_EQ(stop_signal(), SIGTERM);
  EXPECT_FALSE(stop_overdue());  // just requested
  note_step_seconds(0.0);
  clear_stop_request();
  EXPECT_EQ(stop_signal(), 0);
  EXPECT_THROW(
      {
        request_stop(SIGINT);
        // A request older than the grace: stop_overdue() compares monotonic times, so wait it out
        // only when the grace is the 3 s floor (no step noted).
        std::this_thread::sleep_for(milliseconds(3050));
        throw_if_stop_overdue("testing");
      },
      StopRequested);
  clear_stop_request();
}

}  // namespace
}  // namespace dstrain
