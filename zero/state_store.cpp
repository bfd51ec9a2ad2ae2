#include "zero/state_store.h"

#include <algorithm>

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

std::vector<FlatRange> StateStoreLayout::cut(std::int64_t numel, std::int64_t sub_group_size, std::int64_t align) {
  std::vector<FlatRange> groups;
  if (numel <= 0) return groups;
  std::int64_t step = sub_group_size > 0 ? sub_group_size : numel;
  if (align > 1 && step > align) step -= step % align;  // boundaries stay vector- and sector-friendly
  for (std::int64_t b = 0; b < numel; b += step) groups.push_back({b, std::min(numel, b + step)});
  return groups;
}

void StateStore::check_group(std::size_t g, const char* call) const {
  if (g >= layout_.groups.size()) fail("StateStore::{}: sub-group {} of {}", call, g, layout_.groups.size());
}

ResidentStateStore::ResidentStateStore(StateStoreLayout layout, Allocator& allocator, StateHome home)
    : StateStore(std::move(layout)), alloc_(allocator), home_(home) {
  const std::int64_t n = this->layout().numel;
  for (std::size_t b = 0; b < this->layout().buffer_count(); ++b) {
    Buffer buf(alloc_, static_cast<std::size_t>(n) * sizeof(float), MemoryPurpose::optimizer);
    if (n > 0) zero_tensor(buf.tensor(DType::fp32, Shape{n}));
    buffers_.push_back(std::move(buf));
  }
  for (const FlatRange& r : this->layout().groups) {
    std::vector<Tensor>& v = views_.emplace_back();
    for (const Buffer& buf : buffers_) v.push_back(buf.tensor(DType::fp32, Shape{r.size()}, static_cast<std::size_t>(r.begin) * sizeof(float)));
  }
}

std::span<const Tensor> ResidentStateStore::acquire(std::size_t g) {
  check_group(g, "acquire");
  return views_[g];
}

void ResidentStateStore::release(std::size_t g, bool /*modified*/) { check_group(g, "release"); }

StateStoreBytes ResidentStateStore::bytes() const {
  StateStoreBytes b;
  std::uint64_t total = 0;
  for (const Buffer& buf : buffers_) total += buf.bytes();
  (home_ == StateHome::device ? b.device : b.host) = total;
  return b;
}

}  // namespace dstrain
