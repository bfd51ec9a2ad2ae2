// Cases and the naive double reference of matmul_gelu_forward / matmul_gelu_backward
// (ops/kernels/matmul_gelu.h), shared by the CPU test and the GPU test (tests/gpu), which run the
// same inputs through the op on their backend and compare with this reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/unit/kernels/kernel_test_util.h"

namespace dstrain::test {

struct MatmulGeluCase {
  std::int64_t BT, C, OC;
  bool bias;
};

// OC a multiple of 8 (the GPU's GELU epilogue) and one that is not (its fallback); with and
// without bias; BT not a multiple of any tile.
inline const std::vector<MatmulGeluCase>& matmul_gelu_cases() {
  static const std::vector<MatmulGeluCase> cases{{37, 24, 64, true}, {130, 48, 192, true}, {64, 32, 72, false}, {17, 8, 20, true}};
  return cases;
}

// |got - ref| <= atol + rtol·|ref|: fp32 sums in another order; 16-bit: one rounding of pre, of
// the output and of d(out) (CPU) — a few 16-bit ulps of the inputs' scale.
inline DTypeTols matmul_gelu_tols() { return {{2e-5, 2e-4}, {4e-3, 1.5e-2}, {3e-2, 6e-2}}; }

// The inputs of one case in storage dtype t, and the reference results in double.
struct MatmulGeluData {
  Buf inp, weight, bias;                     // forward: pre = inp · weightᵀ + bias, (BT, C) -> (BT, OC)
  Buf weight2, dy, dweight0, dbias0;         // backward: y = out · weight2ᵀ + b2 (C, OC), dy (BT, C); the gradients before the call
  std::vector<double> pre, out;              // forward reference
  std::vector<double> dpre, dweight, dbias;  // backward reference (from the reference pre / out)
};

inline MatmulGeluData make_matmul_gelu_data(const MatmulGeluCase& c, DType t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  MatmulGeluData d{Buf(t, c.BT * c.C),
                   Buf(t, c.OC * c.C),
                   Buf(t, c.OC),
                   Buf(t, c.C * c.OC),
                   Buf(t, c.BT * c.C),
                   Buf(t, c.C * c.OC),
                   Buf(t, c.C),
                   {},
                   {},
                   {},
                   {},
                   {}};
  // The forward op maps inp (BT, C) -> pre (BT, OC); its backward is exercised as the MLP uses it,
  // with the output feeding a second matmul (OC -> C): dy (BT, C), weight2 (C, OC).
  d.inp.fill_uniform(rng, -1.5, 1.5);
  d.weight.fill_uniform(rng, -0.5, 0.5);
  d.bias.fill_uniform(rng, -0.5, 0.5);
  d.weight2.fill_uniform(rng, -0.5, 0.5);
  d.dy.fill_uniform(rng, -1, 1);
  d.dweight0.fill_uniform(rng, -0.1, 0.1);
  d.dbias0.fill_uniform(rng, -0.1, 0.1);
  const auto x = d.inp.values(), w = d.weight.values(), b = d.bias.values();
  d.pre.assign(static_cast<std::size_t>(c.BT * c.OC), 0.0);
  d.out.assign(d.pre.size(), 0.0);
  for (std::int64_t r = 0; r < c.BT; ++r)
    for (std::int64_t o = 0; o < c.OC; ++o) {
      double s = c.bias ? b[static_cast<std::size_t>(o)] : 0.0;
      for (std::int64_t k = 0; k < c.C; ++k) s += x[static_cast<std::size_t>(r * c.C + k)] * w[static_cast<std::size_t>(o * c.C + k)];
      d.pre[static_cast<std::size_t>(r * c.OC + o)] = s;
      d.out[static_cast<std::size_t>(r * c.OC + o)] = gelu_ref(s);
    }
  return d;
}

// Backward reference for the second matmul y = out · weight2ᵀ + b2 with dy (BT, C):
// dpre = gelu'(pre) ⊙ (dy · weight2), dweight2 += dyᵀ · out, dbias2 += Σ dy. pre / out are what
// the op reads (the stored, rounded values).
inline void matmul_gelu_backward_ref(const MatmulGeluCase& c, MatmulGeluData& d, const std::vector<double>& pre, const std::vector<double>& out) {
  const auto dy = d.dy.values(), dw0 = d.dweight0.values(), db0 = d.dbias0.values(), weight2 = d.weight2.values();
  d.dpre.assign(static_cast<std::size_t>(c.BT * c.OC), 0.0);
  for (std::int64_t r = 0; r < c.BT; ++r)
    for (std::int64_t o = 0; o < c.OC; ++o) {
      double s = 0;
      for (std::int64_t k = 0; k < c.C; ++k) s += dy[static_cast<std::size_t>(r * c.C + k)] * weight2[static_cast<std::size_t>(k * c.OC + o)];
      d.dpre[static_cast<std::size_t>(r * c.OC + o)] = gelu_grad_ref(pre[static_cast<std::size_t>(r * c.OC + o)]) * s;
    }
  d.dweight = dw0;
  for (std::int64_t k = 0; k < c.C; ++k)
    for (std::int64_t o = 0; o < c.OC; ++o)
      for (std::int64_t r = 0; r < c.BT; ++r)
        d.dweight[static_cast<std::size_t>(k * c.OC + o)] += dy[static_cast<std::size_t>(r * c.C + k)] * out[static_cast<std::size_t>(r * c.OC + o)];
  d.dbias = db0;
  for (std::int64_t r = 0; r < c.BT; ++r)
    for (std::int64_t k = 0; k < c.C; ++k) d.dbias[static_cast<std::size_t>(k)] += dy[static_cast<std::size_t>(r * c.C + k)];
}

}  // namespace dstrain::test
