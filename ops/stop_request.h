// The process's stop request: SIGTERM / SIGINT (a scheduler's preemption notice, Ctrl-C), recorded
// by the trainer's signal handler (train/trainer_checkpoints.h) or by request_stop(). The training
// loop honours it at the next step boundary (it saves a checkpoint and exits 75); work that can run
// far longer than a step's tail — NVMe swap I/O: preallocation, the swap-in / swap-out loops — asks
// stop_overdue() and gives up with StopRequested once the request has waited kStopGrace for that
// boundary (docs/offload.md §4-5). Here, below offload/ and train/, so that both read one flag.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "ops/error.h"

namespace dstrain {

// The signal recorded (SIGTERM, SIGINT), or 0.
int stop_signal();
// Records a stop request as a signal would; async-signal-safe (the handler calls it).
void request_stop(int signal_number);
// Forgets it (a new run in the same process).
void clear_stop_request();

// How long a stop request waits for the step boundary before long offload I/O gives up: the
// longer of kStopGrace and twice the longest step the run has finished. A step that ends in its
// usual time is still saved (a large model swapping to NVMe may take minutes a step, and a
// scheduler's notice gives it that long); a step stuck in swap I/O — no step finished yet, or one
// running far past the others — ends within seconds of that.
inline constexpr std::chrono::milliseconds kStopGrace{3000};
// Records a finished step's duration (the trainer, after each step; any thread).
void note_step_seconds(double seconds);
// The grace now: max(kStopGrace, 2 x the longest step noted).
std::chrono::milliseconds stop_grace();
// A stop was requested at least stop_grace() ago.
bool stop_overdue();

// A stop honoured in the middle of work: the step in progress is lost (nothing was saved since the
// last checkpoint). The trainer ends the run as for a stop at a step boundary (exit 75).
class StopRequested : public Error {
 public:
  StopRequested(int signal_number, std::string_view during);
  int signal_number() const { return signal_; }

 private:
  int signal_;
};

// Throws StopRequested when stop_overdue(); `during` says what was interrupted ("reading optimizer
// sub-group 5 from NVMe").
void throw_if_stop_overdue(std::string_view during);

}  // namespace dstrain
