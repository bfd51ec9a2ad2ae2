#include "models/sequence_parallel.h"

#include <vector>

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

namespace {

struct Layout {
  std::int64_t B = 0, Tl = 0, W = 0, SP = 1;
  std::size_t es = 0;
  std::vector<std::int64_t> part_offset;  // where each part starts in a row of W
};

Layout check_layout(const char* op, SequenceParallelGroup& group, const Tensor& local, const Tensor& global, std::span<const std::int64_t> parts,
                    const Tensor& send, const Tensor& recv) {
  Layout l;
  l.SP = group.size();
  if (local.shape.rank != 3 || global.shape.rank != 3) fail("{}: (B, T, W) tensors are expected, got {} and {}", op, local.str(), global.str());
  l.B = local.shape[0];
  l.Tl = local.shape[1];
  l.W = local.shape[2];
  std::int64_t sum = 0;
  for (const std::int64_t p : parts) {
    if (p % l.SP != 0) fail("{}: a part of width {} does not split across {} sequence-parallel ranks", op, p, l.SP);
    l.part_offset.push_back(sum);
    sum += p;
  }
  if (sum != l.W) fail("{}: the parts add up to {} but the rows are {} wide", op, sum, l.W);
  if (!(global.shape == Shape{l.B, l.Tl * l.SP, l.W / l.SP})) {
    fail("{}: the whole-sequence tensor is {} but ({}, {}, {}) is expected", op, global.str(), l.B, l.Tl * l.SP, l.W / l.SP);
  }
  for (const Tensor* t : {&local, &global, &send, &recv}) {
    if (t->device != local.device) fail("{}: every buffer must be on the activations' device ({}), got {}", op, local.device.str(), t->str());
    if (t->dtype != local.dtype) fail("{}: every buffer must have the dtype of the activations ({}), got {}", op, dtype_name(local.dtype), t->str());
  }
  if (send.numel() < l.B * l.Tl * l.W || recv.numel() < l.B * l.Tl * l.W) {
    fail("{}: the send and receive buffers need {} elements each, got {} and {}", op, l.B * l.Tl * l.W, send.numel(), recv.numel());
  }
  l.es = dtype_size(local.dtype);
  return l;
}

}  // namespace

SequenceParallelGroup& layer_group(SequenceParallelGroup* group, SequenceParallelRank sp, const std::string& layer) {
  if (group == nullptr) {
    fail("layer '{}' was built for sequence-parallel rank {} of {} but runs without its group; pass ForwardArgs/BackwardArgs::sequence_parallel",
         layer, sp.rank, sp.ranks);
  }
  if (group->rank() != sp.rank || group->size() != sp.ranks) {
    fail("layer '{}' was built for sequence-parallel rank {} of {} but runs in a group as rank {} of {}", layer, sp.rank, sp.ranks, group->rank(),
         group->size());
  }
  return *group;
}

void sequence_to_heads(SequenceParallelGroup& group, const Tensor& x, const Tensor& out, std::span<const std::int64_t> parts, const Tensor& send,
                       const Tensor& recv) {
  const Layout l = check_layout("sequence_to_heads", group, x, out, parts, send, recv);
  const std::int64_t Wr = l.W / l.SP, chunk = l.B * l.Tl * Wr, T = l.Tl * l.SP;
  // Chunk j: rank j's heads of each part, for every token of this rank: [b][t][part slices] — one
  // strided copy per (chunk, part), on the activations' device (ops/kernels/tensor_ops.h copy_rows).
  for (std::int64_t j = 0; j < l.SP; ++j) {
    std::int64_t at = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const std::int64_t w = parts[p] / l.SP;
      copy_rows(send, j * chunk + at, Wr, x, l.part_offset[p] + j * w, l.W, l.B * l.Tl, w);
      at += w;
    }
  }
  group.all_to_all(Tensor(send.data, send.dtype, Shape{l.SP * chunk}, send.device), Tensor(recv.data, recv.dtype, Shape{l.SP * chunk}, recv.device));
  // Chunk i came from rank i: its tokens [i·Tl, (i+1)·Tl) of this rank's heads, a run of Tl·Wr per sequence.
  for (std::int64_t i = 0; i < l.SP; ++i) copy_rows(out, i * l.Tl * Wr, T * Wr, recv, i * chunk, l.Tl * Wr, l.B, l.Tl * Wr);
}

void heads_to_sequence(SequenceParallelGroup& group, const Tensor& x, const Tensor& out, std::span<const std::int64_t> parts, const Tensor& send,
                       const Tensor& recv) {
  const Layout l = check_layout("heads_to_sequence", group, out, x, parts, send, recv);
  const std::int64_t Wr = l.W / l.SP, chunk = l.B * l.Tl * Wr, T = l.Tl * l.SP;
  // Chunk j: rank j's tokens of this rank's heads.
  for (std::int64_t j = 0; j < l.SP; ++j) copy_rows(send, j * chunk, l.Tl * Wr, x, j * l.Tl * Wr, T * Wr, l.B, l.Tl * Wr);
  group.all_to_all(Tensor(send.data, send.dtype, Shape{l.SP * chunk}, send.device), Tensor(recv.data, recv.dtype, Shape{l.SP * chunk}, recv.device));
  // Chunk i came from rank i: its heads of each part, for this rank's tokens.
  for (std::int64_t i = 0; i < l.SP; ++i) {
    std::int64_t at = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const std::int64_t w = parts[p] / l.SP;
      copy_rows(out, l.part_offset[p] + i * w, l.W, recv, i * chunk + at, Wr, l.B * l.Tl, w);
      at += w;
    }
  }
}

}  // namespace dstrain
