// FlatLayout: where one layer's owned parameters sit in its flat buffers, and how those buffers
// split across the ranks of a ZeRO group.
//
// Every per-layer buffer (16-bit or fp32 params, grads, fp32 masters, the optimizer's states) uses the same
// element layout, so one offset addresses a parameter in all of them:
//
//   [ decayed params ... | not-decayed params ... | zero padding ]
//   0                    decay_end               used          numel
//
// Each parameter starts 64-byte aligned in the storage dtype (ealign = 64 / element size
// elements). numel is `used` rounded up to a multiple of world · ealign, so the buffer splits into
// world equal shards whose every start is 64-byte aligned; the padding is only at the end.
//
// Collectives run on chunks: the buffer is cut into consecutive chunks of `chunk` elements (the
// last one shorter), each a multiple of world · ealign, and rank r owns piece r of every chunk:
//
//   chunk k = [k·chunk, min((k+1)·chunk, numel))          piece(k, r) = its r-th of `world` equal parts
//
// A reduce-scatter or all-gather of chunk k is then one in-place collective over that range (no
// pack / unpack copy), and a rank's shard (its optimizer partition) is its pieces of all chunks,
// stored back to back: piece k of the shard starts at chunk_begin(k) / world. Without a chunk
// limit there is one chunk and the shard is the buffer's r-th contiguous part.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/layer.h"

namespace dstrain {

struct FlatRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

// The intersection of two ranges (empty when they do not overlap).
FlatRange intersect(FlatRange a, FlatRange b);

struct FlatSlot {
  std::size_t spec = 0;     // index into the layer's params() list
  std::int64_t offset = 0;  // first element
  std::int64_t numel = 0;
  bool weight_decay = true;
};

struct FlatLayout {
  std::vector<FlatSlot> slots;  // owned (untied) params in buffer order: decayed first
  std::int64_t decay_end = 0;   // [0, decay_end): decayed params; [decay_end, numel): the rest
  std::int64_t used = 0;        // end of the last param, aligned to ealign
  std::int64_t numel = 0;       // padded length: a multiple of world · ealign
  std::int64_t chunk = 0;       // elements per chunk (a multiple of world · ealign; >= numel: one chunk)
  int world = 1;
  std::int64_t ealign = 1;

  std::int64_t chunk_count() const;
  FlatRange chunk_range(std::int64_t k) const;
  // Rank r's piece of chunk k, in buffer elements.
  FlatRange piece(std::int64_t k, int rank) const;
  // Where piece k of a rank sits in that rank's shard (shard_numel() elements, pieces back to back).
  std::int64_t shard_offset(std::int64_t k) const { return chunk_range(k).begin / world; }
  std::int64_t shard_numel() const { return numel / world; }
  // The slot of params() entry `spec`; nullptr when it is tied (not owned by this layer).
  const FlatSlot* slot_of(std::size_t spec) const;
};

// The layout of a layer with parameters `specs` (tied entries are skipped: their owner holds them)
// for `world` ranks, storage elements of `element_bytes` bytes (4: fp32, 2: fp16/bf16), and chunks
// of at most `max_chunk` elements (rounded up to a multiple of world · ealign; <= 0: one chunk).
FlatLayout make_flat_layout(std::span<const ParamSpec> specs, int world, std::size_t element_bytes, std::int64_t max_chunk);
// The same over the specs `owns` accepts only; the others are skipped as tied ones are, and
// FlatSlot::spec still indexes the whole list. A layer whose parameters split over two groups
// (ModelStates' expert unit, zero/model_states.h) lays each group's part out this way.
FlatLayout make_flat_layout(std::span<const ParamSpec> specs, int world, std::size_t element_bytes, std::int64_t max_chunk,
                            const std::function<bool(const ParamSpec&)>& owns);

}  // namespace dstrain
