#include "zero/param_store.h"

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

void ParamStore::check_unit(std::size_t u, const char* call) const {
  if (u >= layout_.numel.size()) fail("ParamStore::{}: unit {} of {}", call, u, layout_.numel.size());
}

ResidentParamStore::ResidentParamStore(ParamStoreLayout layout, Allocator& allocator, StateHome home) : ParamStore(std::move(layout)), home_(home) {
  const ParamStoreLayout& lo = this->layout();
  std::int64_t total = 0;
  for (std::int64_t n : lo.numel) total += n;
  buffer_ = Buffer(allocator, static_cast<std::size_t>(total) * dtype_size(lo.dtype), MemoryPurpose::params);
  if (total > 0) zero_tensor(buffer_.tensor(lo.dtype, Shape{total}));
  std::int64_t at = 0;
  for (std::int64_t n : lo.numel) {
    views_.push_back(buffer_.tensor(lo.dtype, Shape{n}, static_cast<std::size_t>(at) * dtype_size(lo.dtype)));
    at += n;
  }
}

Tensor ResidentParamStore::in_place(std::size_t u) const {
  check_unit(u, "in_place");
  return views_[u];
}

StateStoreBytes ResidentParamStore::bytes() const {
  StateStoreBytes b;
  (home_ == StateHome::device ? b.device : b.host) = buffer_.bytes();
  return b;
}

}  // namespace dstrain
