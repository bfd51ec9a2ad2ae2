#include "models/sequence_parallel.h"

#include <cstring>
#include <vector>

#include "ops/error.h"

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
    if (!t->device.is_cpu()) fail("{}: sequence parallelism moves host memory in this build; {} is on {}", op, t->str(), t->device.str());
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
  const std::int64_t Wr = l.W / l.SP, chunk = l.B * l.Tl * Wr;
  const auto* src = static_cast<const char*>(x.data);
  auto* s = static_cast<char*>(send.data);
  // Chunk j: rank j's heads of each part, for every token of this rank: [b][t][part slices].
  for (std::int64_t j = 0; j < l.SP; ++j) {
    for (std::int64_t bt = 0; bt < l.B * l.Tl; ++bt) {
      char* dst = s + static_cast<std::size_t>(j * chunk + bt * Wr) * l.es;
      std::int64_t at = 0;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const std::int64_t w = parts[p] / l.SP;
        std::memcpy(dst + static_cast<std::size_t>(at) * l.es, src + static_cast<std::size_t>(bt * l.W + l.part_offset[p] + j * w) * l.es,
                    static_cast<std::size_t>(w) * l.es);
        at += w;
      }
    }
  }
  group.all_to_all(Tensor(send.data, send.dtype, Shape{l.SP * chunk}, send.device), Tensor(recv.data, recv.dtype, Shape{l.SP * chunk}, recv.device));
  // Chunk i came from rank i: its tokens [i·Tl, (i+1)·Tl) of this rank's heads.
  const auto* r = static_cast<const char*>(recv.data);
  auto* o = static_cast<char*>(out.data);
  const std::int64_t T = l.Tl * l.SP;
  for (std::int64_t i = 0; i < l.SP; ++i)
    for (std::int64_t b = 0; b < l.B; ++b)
      std::memcpy(o + static_cast<std::size_t>((b * T + i * l.Tl) * Wr) * l.es, r + static_cast<std::size_t>(i * chunk + b * l.Tl * Wr) * l.es,
                  static_cast<std::size_t>(l.Tl * Wr) * l.es);
}

void heads_to_sequence(SequenceParallelGroup& group, const Tensor& x, const Tensor& out, std::span<const std::int64_t> parts, const Tensor& send,
                       const Tensor& recv) {
  const Layout l = check_layout("heads_to_sequence", group, out, x, parts, send, recv);
  const std::int64_t Wr = l.W / l.SP, chunk = l.B * l.Tl * Wr, T = l.Tl * l.SP;
  const auto* src = static_cast<const char*>(x.data);
  auto* s = static_cast<char*>(send.data);
  // Chunk j: rank j's tokens of this rank's heads.
  for (std::int64_t j = 0; j < l.SP; ++j)
    for (std::int64_t b = 0; b < l.B; ++b)
      std::memcpy(s + static_cast<std::size_t>(j * chunk + b * l.Tl * Wr) * l.es, src + static_cast<std::size_t>((b * T + j * l.Tl) * Wr) * l.es,
                  static_cast<std::size_t>(l.Tl * Wr) * l.es);
  group.all_to_all(Tensor(send.data, send.dtype, Shape{l.SP * chunk}, send.device), Tensor(recv.data, recv.dtype, Shape{l.SP * chunk}, recv.device));
  // Chunk i came from rank i: its heads of each part, for this rank's tokens.
  const auto* r = static_cast<const char*>(recv.data);
  auto* o = static_cast<char*>(out.data);
  for (std::int64_t i = 0; i < l.SP; ++i) {
    for (std::int64_t bt = 0; bt < l.B * l.Tl; ++bt) {
      const char* from = r + static_cast<std::size_t>(i * chunk + bt * Wr) * l.es;
      std::int64_t at = 0;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const std::int64_t w = parts[p] / l.SP;
        std::memcpy(o + static_cast<std::size_t>(bt * l.W + l.part_offset[p] + i * w) * l.es, from + static_cast<std::size_t>(at) * l.es,
                    static_cast<std::size_t>(w) * l.es);
        at += w;
      }
    }
  }
}

}  // namespace dstrain
