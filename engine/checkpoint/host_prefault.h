// Fresh host memory faulted in by a background thread ahead of the code that fills it, so that a
// checkpoint load (or the decoupled save's snapshot) does not pay the kernel's first-touch page
// faults on its own critical path (docs/checkpoints.md "Host memory").
//
// On the CI VM, faulting in fresh anonymous memory runs at 1.5-2.5 GB/s: as slow as the disk a
// load reads, so a load that faults in its destination as it copies into it runs at half the
// disk's rate. A second thread faulting the memory in front to back (the order the load fills it)
// takes that off the reading thread. The pages are populated with MADV_POPULATE_WRITE, which maps
// them writable without changing a byte, so the filling thread may overtake it at any time (it
// then faults its pages itself, as without the prefault). Kernels older than 5.14 refuse the
// advice: nothing is prefaulted and the filling thread faults the pages in as it writes.
#pragma once

#include <atomic>
#include <cstddef>
#include <thread>

namespace dstrain {

class BackgroundPrefault {
 public:
  // Starts faulting in [p, p + bytes); p page-aligned, and the allocation extends to a whole page.
  BackgroundPrefault(std::byte* p, std::size_t bytes);
  ~BackgroundPrefault();  // stops at the next chunk and joins: the memory may be freed after it
  BackgroundPrefault(const BackgroundPrefault&) = delete;
  BackgroundPrefault& operator=(const BackgroundPrefault&) = delete;
  // Until every page is faulted in (or the kernel refused the advice).
  void wait();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dstrain
