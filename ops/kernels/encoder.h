// Encoder: token + position embedding, the first layer of GPT-2.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

// Tensor parallelism's vocabulary-parallel embedding (docs/parallelism.md): the table passed is
// rows [first, first + rows) of a table of `vocab` rows. Tokens must be in [0, vocab); a token
// outside the shard's rows looks up zeros (forward) and adds to no row (backward): the group's sum
// over ranks completes the lookup. vocab == 0: the table is whole (tokens in [0, rows)).
struct VocabShard {
  std::int64_t first = 0;
  std::int64_t vocab = 0;
};

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
//   out:    (B, T, C)  storage dtype S (fp32 / fp16 / bf16)
//   tokens: (B, T)     int32, each in [0, V)
//   wte:    (V, C)     S     (V may be the padded vocabulary Vp)
//   wpe:    (maxT, C)  S,    maxT >= T
// Scratch: none. Throws Error for a token outside [0, V) (shard: [0, shard.vocab)).
void encoder_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, VocabShard shard = {});

// Scratch for encoder_backward, in int32 elements: B*T + V + 1.
std::size_t encoder_backward_scratch_elems(std::int64_t B, std::int64_t T, std::int64_t V);

// dwte[v, :] += sum over (b, t) with tokens[b, t] == v of dout[b, t, :]
// dwpe[t, :] += sum over b of dout[b, t, :]
//   dout (B, T, C), dwte (V, C), dwpe (maxT, C): storage dtype S; tokens (B, T) int32.
//   scratch: int32, at least encoder_backward_scratch_elems(B, T, V) elements: the positions
//   bucketed by token (a counting sort), so that each row of dwte is summed by one thread in a
//   fixed order, in fp32, and rounded into S once: deterministic, no atomics, no races.
//   shard: as in forward; positions whose token is outside the shard add to no row of dwte.
void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor scratch, VocabShard shard = {});

}  // namespace dstrain
