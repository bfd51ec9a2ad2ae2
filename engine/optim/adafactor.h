// Adafactor as torch.optim.Adafactor computes it (torch >= 2.5, torch/optim/_adafactor.py
// _single_tensor_adafactor), which DeepSpeed builds for "type": "Adafactor" (docs/optimizers.md
// §10). Per parameter tensor θ with gradient g = grad · grad_scale (negated with maximize), step t:
//
//   β̂ = t^beta2_decay  (the weight of the new term: 1 − β2_t)
//   ρ = min(lr, 1/√t);  α = max(eps2, RMS(θ)) · ρ                  (θ before the decay)
//   θ ← θ · (1 − lr·λ)                                             (when λ ≠ 0)
//   matrix (R x C):  r ← lerp(r, mean_j g², β̂)  (R values),  c ← lerp(c, mean_i g², β̂)  (C values)
//                    V = r·cᵀ / max(mean_i r, eps1)
//   vector:          v ← lerp(v, g², β̂);  V = v
//   U = g / √max(V, eps1²);  θ ← θ − α / max(1, RMS(U)/d) · U
//
// eps1 unset is the fp32 machine epsilon (torch.finfo(float32).eps); λ is weight_decay for the
// parameters the engine decays (docs/optimizers.md §2). RMS(θ), RMS(U), the row and column means
// are over the whole tensor: with ZeRO's cuts they are partial sums all-reduced across the ranks
// (OptimizerPartition::all_reduce_sum, fp64), so a sharded step equals the unsharded one.
//
// Tensor parallelism: a rank holds a piece of a cut matrix (some of its rows, or some of its
// columns; engine/optim/tensor_cut.h). Every quantity above is kept in the whole matrix's
// coordinates — each piece element adds its g² to its whole row's and whole column's sums — and the
// sums of a cut tensor are summed over the tensor-parallel group after the data-parallel sum (one
// fp64 all-reduce of ‖θ‖², R + C sums and R + C held factors per cut matrix, and one of ‖U‖²). So
// for a rows-split matrix the row sums come from one rank and the column sums add up over the
// group (the other way round for a columns split), and the step is exactly one rank's. A
// replicated parameter's sums are the same on every rank of the group and are not added again.
//
// States, per element like every optimizer's (checkpoints reshard them as parameter space): state 0
// "row_var" holds a vector's variance v, and a matrix's row factor r_i at element (i, 0); state 1
// "col_var" holds a matrix's column factor c_j at element (0, j) (elsewhere zero). Each step reads
// the factors from wherever they are held (the same all-reduce) and writes them back there. (i, 0)
// and (0, j) are the whole matrix's elements: under tensor parallelism the rank whose piece holds
// that element keeps the factor, so the pieces' states together are one rank's.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "engine/optim/tensor_cut.h"
#include "models/layer.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

struct AdafactorTensor {
  bool matrix = false;              // two or more dimensions: factored over the last two
  std::int64_t rows = 1, cols = 0;  // the whole tensor's, as stored (rows = the product of the leading dimensions)
  std::int64_t logical_rows = 1;    // rows without the padded vocabulary rows of wte (ParamInit::rows)
  TensorCut cut{};                  // tensor parallelism: this rank's piece (cut.cut false: the tensor is whole here)
  std::int64_t logical_numel() const { return logical_rows * cols; }
};

// A tensor-parallel piece (ParamSpec::piece) is described by its whole parameter and its cut.
AdafactorTensor adafactor_tensor_of(const ParamSpec& spec);

struct AdafactorStepConfig {
  double lr = 1e-2;
  double beta2_decay = -0.8;
  std::optional<double> eps1{};
  double eps2 = 1e-3;
  double d = 1.0;
  double weight_decay = 0.0;
  bool maximize = false;
  std::int64_t step = 1;
  float grad_scale = 1.0f;
};

// One step over the rank's partition; `tensors` is indexed by TensorPiece::tensor. Collective:
// every rank of the partition (and of its tensor-parallel group) calls it.
void adafactor_step(OptimizerPartition& partition, std::span<const AdafactorTensor> tensors, const AdafactorStepConfig& config);

}  // namespace dstrain
