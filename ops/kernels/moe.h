// Mixture-of-experts routing and token movement (models/moe_mlp.h puts them together with the
// experts' GEMMs). N tokens, E experts, k = top_k choices per token; an "assignment" is a
// (token t, choice j) pair, numbered a = t·k + j; a "slot" is a row of the experts' packed input,
// the kept assignments grouped by expert (ascending) and, within an expert, by (choice j, token t):
// every token's first choice before any second choice, as DeepSpeed's top-2 gating fills capacity.
//
//   moe_route_forward    logits -> scores (softmax / sigmoid), the chosen experts and their weights
//   moe_route_backward   d(weights) (+ the aux loss's d(softmax)) -> d(logits)
//   moe_aux_stats        Hugging Face's load-balancing statistics of one layer
//   moe_dispatch_plan    the chosen experts -> slots (who goes where, what is dropped)
//   moe_gather_rows      tokens -> slots (the experts' packed input)
//   moe_combine          slots -> tokens, weighted (forward), or summed (the input's gradient)
//   moe_combine_backward d(out) -> d(slots), d(weights)
//   moe_gated_add_*      out += sigmoid(g)·y per token: Qwen2-MoE's gated shared expert
//
// Routing is fp32 (Hugging Face computes the router's softmax in float32 whatever the model
// dtype); rows of tokens are in the storage dtype. Deterministic: per-token work is independent,
// the plan is a stable counting sort, and sums run in a fixed order. Ties in the scores go to the
// lower expert index (and the lower group index).
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

struct MoeRouting {
  std::int64_t top_k = 2;
  bool sigmoid = false;     // scores = sigmoid(logits) (DeepSeek-V3); softmax over the E experts otherwise
  bool renormalize = true;  // the chosen scores divided by their sum (+ 1e-20 with sigmoid scores)
  float scale = 1.0f;       // routed_scaling_factor, after renormalising
  std::int64_t n_group = 1;     // group-limited routing: E / n_group consecutive experts per group
  std::int64_t topk_group = 1;  // groups eligible per token (group score: sum of its top 2 (sigmoid) or its max)
};

// logits (N, E) fp32 -> scores (N, E) fp32, expert (N, k) int32 (the chosen experts, best first),
// weight (N, k) fp32.
void moe_route_forward(Tensor scores, Tensor expert, Tensor weight, Tensor logits, const MoeRouting& r);

// dlogits (N, E) fp32, WRITTEN: the gradient through the scores of Σ dweight·weight, plus, when
// aux_grad (E fp32) is given, of Σ_e aux_grad[e]·softmax(logits)[e] (the load-balancing loss's
// term, which Hugging Face forms from the softmax whatever the routing scores are).
void moe_route_backward(Tensor dlogits, Tensor dweight, Tensor scores, Tensor expert, Tensor weight, Tensor logits, Tensor aux_grad,
                        const MoeRouting& r);

// transformers' load_balancing_loss_func statistics of one layer's logits (N, E) fp32, written:
// assigned[e] = how many of the top_k choices by softmax(logits) (plain top-k, no groups) are e;
// prob_sum[e] = Σ_t softmax(logits)[t, e]. Both (E) fp64.
void moe_aux_stats(Tensor assigned, Tensor prob_sum, Tensor logits, std::int64_t top_k);

// expert (N, k) int32 -> slot_assignment (N·k) int32 (the assignment in each slot; the kept ones
// first, -1 in the unused tail), slot_of (N·k) int32 (each assignment's slot, -1 when dropped),
// counts (E) int32 (slots per expert). capacity < 0: dropless; else an expert keeps its first
// `capacity` assignments in slot order.
void moe_dispatch_plan(Tensor slot_assignment, Tensor slot_of, Tensor counts, Tensor expert, std::int64_t capacity);

// rows[s] = x[slot_assignment[s] / k] for the first `slots` slots.  rows (>= slots, C), x (N, C).
void moe_gather_rows(Tensor rows, Tensor x, Tensor slot_assignment, std::int64_t k, std::int64_t slots);

// out[t] += Σ_j weight[t, j]·rows[slot_of[t·k + j]] over the token's kept assignments, in j order,
// summed in fp32 and rounded once; weight empty: a plain sum (the gradient of moe_gather_rows).
// out (N, C), rows (>= max slot + 1, C), slot_of (N·k), weight (N, k) fp32.
void moe_combine(Tensor out, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k);

// For out = moe_combine(rows, weight): drows[slot] = weight[t, j]·dout[t] (WRITTEN, kept slots),
// dweight[t, j] = <dout[t], rows[slot]> (WRITTEN; 0 when dropped).
void moe_combine_backward(Tensor drows, Tensor dweight, Tensor dout, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k);

// out[t] += sigmoid(logit[t])·y[t]: out, y (N, C) storage dtype; logit (N) storage dtype.
void moe_gated_add_forward(Tensor out, Tensor y, Tensor logit);
// dy[t] = sigmoid(logit[t])·dout[t] (WRITTEN); dlogit[t] = σ'(logit[t])·<dout[t], y[t]> (WRITTEN).
void moe_gated_add_backward(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit);

}  // namespace dstrain
