// Vocabulary-parallel cross-entropy (Megatron-LM's vocab_parallel_cross_entropy): each rank of a
// tensor-parallel group holds the logits of its rows of the vocabulary, (BT, Vr), and the loss is
// computed without gathering them — three phases, with two collectives over the group between
// them (docs/parallelism.md):
//   1. vocab_shard_max            rowmax_i = max over the rank's real columns   -> all-reduce max
//   2. vocab_shard_sum_exp        stats_i = (Σ exp(x - rowmax_i), x[target])    -> all-reduce sum
//   3. vocab_parallel_losses      lse_i = rowmax_i + log stats_i,0; loss_i = lse_i - stats_i,1
// and the backward, local to each rank:
//   vocab_shard_cross_entropy_backward   dlogits = (softmax - onehot) · dloss on the rank's columns
// The shard: the rank's logits are columns [first, first + Vr) of the whole (padded) vocabulary;
// the first `valid` of them are real tokens (the padding rows of the table contribute nothing and
// get zero gradient, as in softmax_cross_entropy.h). Targets are whole-vocabulary ids or -1.
// The sums of phase 2 are per-rank partial sums in fp32 (accumulated in double), so the loss
// equals the one-rank kernel's up to the order of that sum.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

// rowmax[i] = max over v < valid of logits[i, v]; -inf when valid == 0.
//   logits: (BT, Vr) or (B, T, Vr), storage dtype S;  rowmax: (BT) fp32 (any shape of BT elements)
void vocab_shard_max(Tensor rowmax, Tensor logits, std::int64_t valid);

// stats[i] = { Σ_{v < valid} exp(logits[i, v] - rowmax[i]),  logits[i, targets[i] - first] when
// first <= targets[i] < first + valid, else 0 }.   stats: (BT, 2) fp32; rowmax: the group's max.
void vocab_shard_sum_exp(Tensor stats, Tensor logits, Tensor rowmax, Tensor targets, std::int64_t first, std::int64_t valid);

// From the group's rowmax and stats: lse[i] = rowmax[i] + log(stats[i, 0]); losses[i] =
// lse[i] - stats[i, 1] (0 for a target of -1). Returns the mean over the non-ignored positions
// (0 if all are ignored), summed in double in position order. losses, lse: BT fp32.
float vocab_parallel_losses(Tensor losses, Tensor lse, Tensor rowmax, Tensor stats, Tensor targets);

// dlogits[i, v] = (exp(logits[i, v] - lse[i]) - [first + v == targets[i]]) · dloss for v < valid;
// 0 for v >= valid and for ignored rows. dlogits may be the memory of logits (in place).
void vocab_shard_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t first,
                                        std::int64_t valid);

}  // namespace dstrain
