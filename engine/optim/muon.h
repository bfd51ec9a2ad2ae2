// Muon as DeepSpeed builds it for "type": "Muon" (MuonWithAuxAdam, deepspeed/runtime/zero/muon/;
// docs/optimizers.md §9): the model's hidden weight matrices take Muon's update, every other
// parameter Adam.
//
// Per Muon matrix W (rows x cols), with g = grad · grad_scale and momentum buffer M:
//   M ← lerp(M, g, 1 − momentum)                  (= momentum·M + (1 − momentum)·g)
//   U ← lerp(g, M, momentum)                       (Nesterov, always on in DeepSpeed)
//   O ← newton_schulz(U) · max(1, rows/cols)^½     (ops/kernels/newton_schulz.h; rows/cols as the
//                                                   Hugging Face module holds W)
//   W ← W · (1 − lr·weight_decay) − lr · O
// Per other parameter (DeepSpeed's adam_update), step t:
//   m ← lerp(m, g, 1 − β1);  v ← lerp(v, g², 1 − β2)
//   θ ← θ · (1 − adam_lr·λ) − adam_lr · (m / (1 − β1^t)) / (√(v / (1 − β2^t)) + eps)
// λ is weight_decay for parameters the engine decays (matrices, embeddings), 0 for biases and
// norm weights (docs/optimizers.md §2).
//
// Newton–Schulz needs the whole matrix U. ZeRO 1–3 cut matrices across ranks, so each rank writes
// the pieces it holds into a zeroed copy of the whole matrix and OptimizerPartition::all_reduce_sum
// adds the copies (fp32; a sum of one value and zeros: exact); the rank holding the matrix's first element
// orthogonalises it and a second sum hands the result to the others. A sharded step equals the
// unsharded one.
// Tensor parallelism cuts matrices too (a rank holds a piece: rows or columns of it, engine/optim/
// tensor_cut.h): once ZeRO's sum has made the piece whole on a rank, the tensor-parallel group
// all-gathers the pieces into the whole matrix, the rank orthogonalises that and keeps its piece
// of the result — the same matrix one rank orthogonalises, scaled by the whole matrix's shape.
// The momentum buffer is the optimizer's first state ("exp_avg" slot) on Muon matrices.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "engine/optim/tensor_cut.h"
#include "models/layer.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

// What the optimizer needs to know of one owned parameter tensor.
struct MuonTensor {
  bool muon = false;                // Muon's update (else Adam)
  std::int64_t rows = 0, cols = 0;  // the whole tensor's shape in the engine (a matrix: NS treats W and Wᵀ alike)
  double scale = 1.0;               // max(1, rows/cols)^½, rows/cols as DeepSpeed sees the whole tensor
  TensorCut cut{};                  // tensor parallelism: this rank's piece of the matrix (cut.cut false: whole here)
  std::int64_t piece_numel() const { return cut.cut ? cut.piece.numel() : rows * cols; }
};

// deepspeed.initialize's set_optimizer_flags: a parameter is Muon's when it has two or more
// dimensions and its name, lower-cased, contains neither "embed" nor "lm_head". Names are the
// Hugging Face names (ParamSpec::name), so GPT-2's wte/wpe ("transformer.wte.weight" in HF) are
// Muon matrices, as they are in DeepSpeed. The scale uses the HF orientation: Conv1D weights
// (GPT-2's attention and MLP) are (in, out) there, the transpose of ours; wte's rows are the real
// vocabulary (ParamInit::rows), not the padded one. A tensor-parallel piece (ParamSpec::piece) is
// described by its whole parameter's shape, and its cut.
MuonTensor muon_tensor_of(const ParamSpec& spec);

struct MuonStepConfig {
  double lr = 0.02;       // the Muon matrices' lr
  double adam_lr = 3e-4;  // the other parameters'
  double momentum = 0.95;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-10;
  std::int64_t step = 1;  // t (1-based) for Adam's bias corrections
  float grad_scale = 1.0f;
  bool partitioned = false;  // tensors may be cut across the data-parallel ranks (ZeRO 1-3): gather each Muon matrix
};

// One optimizer step over the rank's partition; `tensors` is indexed by TensorPiece::tensor.
// Collective when partitioned (every rank of the partition calls it) and when a matrix is cut by
// tensor parallelism (every rank of the tensor-parallel group).
void muon_step(OptimizerPartition& partition, std::span<const MuonTensor> tensors, const MuonStepConfig& config);

}  // namespace dstrain
