// rope_forward / rope_backward on the GPU against the double reference the CPU test uses
// (tests/unit/kernels/rope_cases.h), with the same tolerances, plus in-place use.
#include <random>
#include <vector>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/rope.h"
#include "tests/unit/kernels/rope_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

TEST(RopeGpu, MatchesTheReferenceOnTheCaseTable) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kFloatDTypes) {
    const Tol tol = kRopeTols.of(dt);
    std::mt19937_64 rng(11);
    for (const RopeCase& c : kRopeCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
      const std::int64_t n = c.B * c.T * c.H * c.D;
      const Shape s{c.B, c.T, c.H, c.D};
      std::vector<float> freq = rope_inv_freq(c.D, c.theta, c.scaling);
      Buf x(dt, n), g(dt, n), fq(DType::fp32, c.D / 2);
      x.fill_uniform(rng, -2, 2);
      g.fill_uniform(rng, -1, 1);
      for (std::int64_t j = 0; j < c.D / 2; ++j) fq.set(j, freq[static_cast<std::size_t>(j)]);
      DeviceTensors d;
      const Tensor d_x = d.put(x, s), d_g = d.put(g, s), d_f = d.put(fq, Shape{c.D / 2});
      const Tensor d_y = d.zeros(dt, s), d_dx = d.zeros(dt, s);
      rope_forward(d_y, d_x, d_f, c.rotate_heads, c.pos_offset);
      rope_backward(d_dx, d_g, d_f, c.rotate_heads, c.pos_offset);
      const Buf y = DeviceTensors::get(d_y);
      expect_close(y, rope_ref(x.values(), freq, c, 1.0), tol, "rope out");
      expect_close(DeviceTensors::get(d_dx), rope_ref(g.values(), freq, c, -1.0), tol, "rope dinp");
      rope_forward(d_x, d_x, d_f, c.rotate_heads, c.pos_offset);  // in place
      const Buf z = DeviceTensors::get(d_x);
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(z.get(i), y.get(i)) << "in place " << i;
      }
    }
  }
}

}  // namespace
