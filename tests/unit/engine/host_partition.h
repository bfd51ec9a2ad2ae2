// HostPartition: an OptimizerPartition (zero/optimizer_partition.h) of one rank over host vectors,
// for optimizer tests that need tensor pieces (Muon, Adafactor): tensors packed one after another,
// cut into sub-groups at given flat offsets (some inside a tensor), each sub-group's segments split
// where the decay flag changes, as ModelStates makes them. Two fp32 states per element.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "models/layer.h"
#include "zero/optimizer_partition.h"

namespace dstrain::testing_partition {

class HostPartition : public OptimizerPartition {
 public:
  HostPartition(std::vector<ParamSpec> specs, std::vector<std::int64_t> cuts) : specs_(std::move(specs)) {
    for (const ParamSpec& s : specs_) {
      offsets_.push_back(n_);
      n_ += s.shape.numel();
    }
    params.assign(static_cast<std::size_t>(n_), 0.0f);
    grads.assign(static_cast<std::size_t>(n_), 0.0f);
    m.assign(static_cast<std::size_t>(n_), 0.0f);
    v.assign(static_cast<std::size_t>(n_), 0.0f);
    std::vector<std::int64_t> bounds{0};
    for (std::int64_t c : cuts) bounds.push_back(c);
    bounds.push_back(n_);
    for (std::size_t g = 0; g + 1 < bounds.size(); ++g) {
      std::vector<std::pair<std::int64_t, std::int64_t>> segs;
      std::int64_t b = bounds[g];
      while (b < bounds[g + 1]) {
        const bool decay = specs_[tensor_at(b)].weight_decay;
        std::int64_t e = b;
        while (e < bounds[g + 1] && specs_[tensor_at(e)].weight_decay == decay) e = std::min(bounds[g + 1], end_of(tensor_at(e)));
        segs.emplace_back(b, e);
        b = e;
      }
      groups_.push_back(std::move(segs));
    }
  }
  std::int64_t offset(std::size_t k) const { return offsets_[k]; }
  std::int64_t numel() const { return n_; }

  void for_each_subgroup(const std::function<void(std::span<const OptimizerSegment>)>& fn) override {
    for (const auto& segs : groups_) {
      std::vector<OptimizerSegment> out;
      for (const auto& [b, e] : segs) {
        OptimizerSegment s;
        s.params = view(params, b, e);
        s.grads = view(grads, b, e);
        s.states = {view(m, b, e), view(v, b, e)};
        s.weight_decay = specs_[tensor_at(b)].weight_decay;
        for (std::int64_t x = b; x < e; x = std::min(e, end_of(tensor_at(x)))) {
          const std::size_t k = tensor_at(x);
          const std::int64_t piece_end = std::min(e, end_of(k));
          s.pieces.push_back({static_cast<std::int32_t>(k), x - b, piece_end - x, x - offsets_[k], specs_[k].shape.numel()});
        }
        out.push_back(std::move(s));
      }
      fn(out);
    }
  }
  using OptimizerPartition::all_reduce_sum;
  void all_reduce_sum(std::span<double>) override {}
  std::int32_t tensor_count() const override { return static_cast<std::int32_t>(specs_.size()); }

  std::vector<float> params, grads, m, v;

 private:
  static Tensor view(std::vector<float>& x, std::int64_t b, std::int64_t e) { return Tensor(x.data() + b, DType::fp32, Shape{e - b}); }
  std::size_t tensor_at(std::int64_t x) const {
    std::size_t k = 0;
    while (k + 1 < offsets_.size() && offsets_[k + 1] <= x) ++k;
    return k;
  }
  std::int64_t end_of(std::size_t k) const { return offsets_[k] + specs_[k].shape.numel(); }
  std::vector<ParamSpec> specs_;
  std::vector<std::int64_t> offsets_;
  std::int64_t n_ = 0;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> groups_;
};

}  // namespace dstrain::testing_partition
