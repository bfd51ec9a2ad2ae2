// How long a process took from its start to its first training step, in parts — what an elastic
// relaunch costs besides noticing the failure (docs/elastic.md "Recovery time"): joining the group
// (the rendezvous of the launcher's processes), reading the checkpoint, and the first step (which
// warms caches and allocates what the steps reuse).
#pragma once

namespace dstrain {

struct StartupTimes {
  double join_seconds = 0.0;  // joining the process group (0 for ranks as threads)
  double load_seconds = 0.0;  // reading the checkpoint it resumes from (0 for a fresh run)
};

// Seconds since this process started: since the kernel started it (/proc/self/stat), so the
// dynamic loader's and static constructors' time counts too; since this library was loaded where
// /proc cannot be read.
double seconds_since_process_start();

}  // namespace dstrain
