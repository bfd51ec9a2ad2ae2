// HostSegment: an optimizer segment's values as host fp32 arrays, for optimizer steps written as
// host loops (the 1-bit family, Lamb with exact per-tensor norms across partitions): the memory
// itself when it is host fp32, otherwise a copy (device memory, 16-bit gradients) that commit()
// writes back, rounding the master into the 16-bit params the layers read.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/kernels/tensor_ops.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

class HostSegment {
 public:
  HostSegment(const OptimizerSegment& s, std::size_t n_states) : s_(s) {
    master_ = view(s.params, master_copy_);
    grads_ = view(s.grads, grads_copy_);
    states_.resize(n_states);
    state_copies_.resize(n_states);
    for (std::size_t k = 0; k < n_states; ++k) states_[k] = view(s.states[k], state_copies_[k]);
  }
  float* master() { return master_; }
  const float* grads() const { return grads_; }
  float* state(std::size_t k) { return states_[k]; }
  // Writes the copies back and rounds the master into the 16-bit params the layers read.
  void commit() {
    if (!master_copy_.empty()) copy_tensor(s_.params, Tensor(master_copy_.data(), DType::fp32, Shape{s_.params.numel()}));
    for (std::size_t k = 0; k < states_.size(); ++k)
      if (!state_copies_[k].empty()) copy_tensor(s_.states[k], Tensor(state_copies_[k].data(), DType::fp32, Shape{s_.states[k].numel()}));
    if (!s_.params_lowp.empty()) convert_tensor(s_.params_lowp, s_.params);
  }

 private:
  static float* view(const Tensor& t, std::vector<float>& copy) {
    if (t.device.is_cpu() && t.dtype == DType::fp32) return static_cast<float*>(t.data);
    copy.resize(static_cast<std::size_t>(t.numel()));
    const Tensor host(copy.data(), DType::fp32, Shape{t.numel()});
    if (t.dtype == DType::fp32) {
      copy_tensor(host, t);
    } else if (t.device.is_cpu()) {
      convert_tensor(host, t);
    } else {
      std::vector<std::uint16_t> raw(static_cast<std::size_t>(t.numel()));
      const Tensor host_raw(raw.data(), t.dtype, Shape{t.numel()});
      copy_tensor(host_raw, t);
      convert_tensor(host, host_raw);
    }
    return copy.data();
  }
  const OptimizerSegment& s_;
  float* master_ = nullptr;
  float* grads_ = nullptr;
  std::vector<float*> states_;
  std::vector<float> master_copy_, grads_copy_;
  std::vector<std::vector<float>> state_copies_;
};

}  // namespace dstrain
