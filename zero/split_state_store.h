// SplitStateStore: DeepSpeed's partial optimizer offload (offload_optimizer.ratio < 1, "ZeRO-Offload++"
// twin-flow; docs/offload.md §7): the optimizer partition's first sub-groups stay in the training
// device's memory and the rest live in the offload store (host memory or NVMe).
//
// DeepSpeed's stage3.py assigns sub-group i of N to the CPU when i >= int((1 - ratio) * N), else to
// the accelerator, and updates the device share there (a torch AdamW "backup optimizer") and the rest
// with DeepSpeedCPUAdam. Here the device share is a ResidentStateStore on the training allocator and
// the host share the store the offload factory makes for a layout of the remaining sub-groups (their
// ranges rebased to start at 0); both run the same optimizer kernel on the same values.
#pragma once

#include <cstddef>
#include <memory>

#include "ops/allocator.h"
#include "zero/state_store.h"

namespace dstrain {

class SplitStateStore final : public StateStore {
 public:
  // The sub-groups a ratio leaves on the device: int((1 - ratio) * groups), as DeepSpeed computes it.
  static std::size_t device_groups(double ratio, std::size_t groups);

  // Sub-groups [0, on_device) on `device` (purpose optimizer); the rest through `offloaded`, whose
  // store must live in `home` (host or nvme). With none left over, no offloaded store is made.
  SplitStateStore(StateStoreLayout layout, std::size_t on_device, Allocator& device, const StateStoreFactory& offloaded, StateHome home);

  StateHome home() const override { return home_; }
  Device view_device() const override;
  Device group_device(std::size_t g) const override;
  std::span<const Tensor> acquire(std::size_t g) override;
  void release(std::size_t g, bool modified) override;
  void prefetch(std::size_t g) override;
  void prefetch_step() override;  // the offloaded share's first sub-groups: visited right after the device's
  void flush() override;
  StateStoreBytes bytes() const override;

  std::size_t on_device() const { return on_device_; }
  const StateStore* offloaded() const { return offloaded_.get(); }

 private:
  std::size_t on_device_;
  StateHome home_;
  std::unique_ptr<StateStore> device_, offloaded_;
};

}  // namespace dstrain
