// swiglu_forward / swiglu_backward on the GPU against the double reference the CPU test uses
// (tests/unit/kernels/swiglu_cases.h), with the same tolerances.
#include <random>
#include <vector>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/swiglu.h"
#include "tests/unit/kernels/swiglu_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

TEST(SwigluGpu, MatchesTheReferenceOnTheCaseTable) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kFloatDTypes) {
    const Tol tol = kSwigluTols.of(dt);
    std::mt19937_64 rng(9);
    for (const SwigluCase& c : kSwigluCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
      const std::int64_t n = c.B * c.T * c.I;
      const Shape s{c.B, c.T, c.I};
      Buf gate(dt, n), up(dt, n), dout(dt, n), dgate(dt, n), dup(dt, n);
      gate.fill_uniform(rng, -12, 12);
      up.fill_uniform(rng, -2, 2);
      for (Buf* p : {&dout, &dgate, &dup}) p->fill_uniform(rng, -1, 1);
      std::vector<double> want_out(static_cast<std::size_t>(n));
      auto want_dg = dgate.values(), want_du = dup.values();
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const double x = gate.get(i), u = up.get(i), d = dout.get(i);
        want_out[k] = silu_ref(x) * u;
        want_dg[k] += d * u * silu_grad_ref(x);
        want_du[k] += d * silu_ref(x);
      }
      DeviceTensors g;
      const Tensor d_gate = g.put(gate, s), d_up = g.put(up, s), d_dout = g.put(dout, s), d_dg = g.put(dgate, s), d_du = g.put(dup, s);
      const Tensor d_out = g.zeros(dt, s);
      swiglu_forward(d_out, d_gate, d_up);
      swiglu_backward(d_dg, d_du, d_dout, d_gate, d_up);
      expect_close(DeviceTensors::get(d_out), want_out, tol, "swiglu out");
      expect_close(DeviceTensors::get(d_dg), want_dg, tol, "swiglu dgate");
      expect_close(DeviceTensors::get(d_du), want_du, tol, "swiglu dup");
    }
  }
}

}  // namespace
