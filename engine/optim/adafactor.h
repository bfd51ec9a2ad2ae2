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
// States, per element like every optimizer's (checkpoints reshard them as parameter space): state 0
// "row_var" holds a vector's variance v, and a matrix's row factor r_i at element (i, 0); state 1
// "col_var" holds a matrix's column factor c_j at element (0, j) (elsewhere zero). Each step reads
// the factors from wherever they are held (the same all-reduce) and writes them back there.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "models/layer.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

struct AdafactorTensor {
  bool matrix = false;              // two or more dimensions: factored over the last two
  std::int64_t rows = 1, cols = 0;  // as stored (rows = the product of the leading dimensions)
  std::int64_t logical_rows = 1;    // rows without the padded vocabulary rows of wte (ParamInit::rows)
  std::int64_t logical_numel() const { return logical_rows * cols; }
};

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
// every rank of the partition calls it.
void adafactor_step(OptimizerPartition& partition, std::span<const AdafactorTensor> tensors, const AdafactorStepConfig& config);

}  // namespace dstrain
