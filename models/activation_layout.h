// How drivers of the Layer interface (the engine, Gpt2Model, checkpointing, generation) lay a
// layer's activation tensors out in one buffer: packed in spec order, each start 64-byte aligned
// (a cache line, and the widest vector load), so that every view is aligned for the kernels.
#pragma once

#include <cstddef>
#include <vector>

#include "models/layer.h"

namespace dstrain {

inline constexpr std::size_t kActivationAlignBytes = 64;

constexpr std::size_t align_up(std::size_t v, std::size_t alignment = kActivationAlignBytes) { return (v + alignment - 1) / alignment * alignment; }

// Appends the byte offsets of `specs`, packed one after the other from `start`, to `offsets`;
// returns the end of the last one.
inline std::size_t pack_activation_specs(const std::vector<ActivationSpec>& specs, std::size_t start, std::vector<std::size_t>& offsets) {
  std::size_t off = start;
  for (const auto& s : specs) {
    off = align_up(off);
    offsets.push_back(off);
    off += s.nbytes();
  }
  return off;
}

}  // namespace dstrain
