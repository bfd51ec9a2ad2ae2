// Causal attention over a rank's heads, whole (one sequence-parallel rank) or Ulysses-split across
// a sequence-parallel group (models/sequence_parallel.h): the blocks of every family call these
// instead of ops/kernels/attention.h directly, so that sequence parallelism is written once.
//
// Shapes (B micro-batch, Tl this rank's tokens, SP ranks, T = SP·Tl, W = the qkv row of this
// rank's q | k | v heads, Q = its q width):
//   qkv (B, Tl, W), atty (B, Tl, Q): this rank's tokens, as the block's GEMMs read and write them;
//   with SP > 1, saved too: qkv_heads (B, T, W/SP), atty_heads (B, T, Q/SP) — every token of this
//   rank's share of the heads — and lse (B, NH/SP, T); with SP = 1, lse (B, NH, Tl) and the
//   *_heads tensors unused (empty).
#pragma once

#include <cstdint>
#include <vector>

#include "models/sequence_parallel.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/dropout.h"
#include "ops/tensor.h"

namespace dstrain {

struct UlyssesAttention {
  SequenceParallelGroup* group = nullptr;  // null: one sequence-parallel rank
  AttentionHeads heads{0};                 // this rank's query and key/value heads (before the SP split)
  std::vector<std::int64_t> parts;         // the widths of q | k | v in a qkv row
  DropoutParams dropout{};
  std::int64_t window = 0;
  // SP > 1: the all-to-all buffers (B·Tl·W elements each, storage dtype).
  Tensor send, recv;

  // The heads each rank attends over: heads / SP.
  AttentionHeads local_heads() const;

  // atty, lse (and qkv_heads, atty_heads when SP > 1) from qkv.
  void forward(const Tensor& atty, const Tensor& lse, const Tensor& qkv, const Tensor& qkv_heads, const Tensor& atty_heads) const;
  // dqkv (written) from datty. With SP > 1, datty_heads (B, T, Q/SP) and dqkv_heads (B, T, W/SP)
  // are scratch. attention_scratch: attention_backward_scratch_elems(B, T, Q/SP, NH/SP).
  void backward(const Tensor& dqkv, const Tensor& datty, const Tensor& qkv, const Tensor& atty, const Tensor& qkv_heads, const Tensor& atty_heads,
                const Tensor& lse, const Tensor& attention_scratch, const Tensor& datty_heads, const Tensor& dqkv_heads) const;
};

}  // namespace dstrain
