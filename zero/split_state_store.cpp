#include "zero/split_state_store.h"

#include "ops/error.h"

namespace dstrain {

std::size_t SplitStateStore::device_groups(double ratio, std::size_t groups) {
  // Python's int() truncates toward zero; (1 - ratio) * N is >= 0 for ratio in [0, 1].
  const double share = (1.0 - ratio) * static_cast<double>(groups);
  const auto n = static_cast<std::size_t>(share > 0.0 ? share : 0.0);
  return n < groups ? n : groups;
}

SplitStateStore::SplitStateStore(StateStoreLayout layout, std::size_t on_device, Allocator& device, const StateStoreFactory& offloaded,
                                 StateHome home)
    : StateStore(std::move(layout)), on_device_(on_device), home_(home) {
  const StateStoreLayout& lo = this->layout();
  if (on_device_ > lo.groups.size()) fail("SplitStateStore: {} sub-groups on the device of {}", on_device_, lo.groups.size());
  StateStoreLayout dev{0, lo.names, {}}, off{0, lo.names, {}};
  for (std::size_t g = 0; g < on_device_; ++g) dev.groups.push_back(lo.groups[g]);
  dev.numel = on_device_ > 0 ? lo.groups[on_device_ - 1].end : 0;
  const std::int64_t base = dev.numel;
  for (std::size_t g = on_device_; g < lo.groups.size(); ++g) off.groups.push_back({lo.groups[g].begin - base, lo.groups[g].end - base});
  off.numel = lo.numel - base;
  device_ = std::make_unique<ResidentStateStore>(std::move(dev), device, StateHome::device);
  if (on_device_ < lo.groups.size()) {
    offloaded_ = offloaded(std::move(off));
    if (!offloaded_) fail("SplitStateStore: the offload store factory returned no store");
    if (offloaded_->home() != home_) {
      fail("SplitStateStore: the offloaded share lives in {} memory but the settings ask for {}", state_home_name(offloaded_->home()),
           state_home_name(home_));
    }
  }
}

Device SplitStateStore::view_device() const { return offloaded_ ? offloaded_->view_device() : device_->view_device(); }

Device SplitStateStore::group_device(std::size_t g) const {
  check_group(g, "group_device");
  return g < on_device_ ? device_->view_device() : offloaded_->group_device(g - on_device_);
}

std::span<const Tensor> SplitStateStore::acquire(std::size_t g) {
  check_group(g, "acquire");
  return g < on_device_ ? device_->acquire(g) : offloaded_->acquire(g - on_device_);
}

void SplitStateStore::release(std::size_t g, bool modified) {
  check_group(g, "release");
  if (g < on_device_) {
    device_->release(g, modified);
  } else {
    offloaded_->release(g - on_device_, modified);
  }
}

void SplitStateStore::prefetch(std::size_t g) {
  check_group(g, "prefetch");
  if (g >= on_device_) offloaded_->prefetch(g - on_device_);
}

void SplitStateStore::prefetch_step() {
  if (offloaded_) offloaded_->prefetch_step();
}

void SplitStateStore::flush() {
  if (offloaded_) offloaded_->flush();
}

StateStoreBytes SplitStateStore::bytes() const {
  StateStoreBytes b = device_->bytes();
  if (offloaded_) {
    const StateStoreBytes o = offloaded_->bytes();
    b.device += o.device;
    b.host += o.host;
    b.nvme += o.nvme;
  }
  return b;
}

}  // namespace dstrain
