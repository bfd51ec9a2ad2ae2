// matmul_gelu_forward / matmul_gelu_backward on the CPU against the naive double reference of
// matmul_gelu_cases.h (the GPU runs the same cases in tests/gpu/test_matmul_gelu_gpu.cpp), and
// the argument errors.
#include <gtest/gtest.h>

#include <string>

#include "ops/error.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/matmul_gelu.h"
#include "tests/unit/kernels/matmul_gelu_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

TEST(MatmulGelu, ForwardAndBackwardMatchTheNaiveReference) {
  for (const DType t : kFloatDTypes) {
    for (const MatmulGeluCase& c : matmul_gelu_cases()) {
      const std::string what =
          std::string(dtype_name(t)) + " BT=" + std::to_string(c.BT) + " C=" + std::to_string(c.C) + " OC=" + std::to_string(c.OC);
      MatmulGeluData d = make_matmul_gelu_data(c, t, 17);
      Buf pre(t, c.BT * c.OC), out(t, c.BT * c.OC), scratch(DType::fp32, static_cast<std::int64_t>(matmul_scratch_elems(t, std::max(c.C, c.OC))));
      const Tensor scr = scratch.size() > 0 ? scratch.tensor(Shape{scratch.size()}) : Tensor{};
      matmul_gelu_forward(out.tensor(Shape{c.BT, c.OC}), pre.tensor(Shape{c.BT, c.OC}), d.inp.tensor(Shape{c.BT, c.C}),
                          d.weight.tensor(Shape{c.OC, c.C}), c.bias ? d.bias.tensor(Shape{c.OC}) : Tensor{}, scr);
      expect_close(pre, d.pre, matmul_gelu_tols().of(t), what + " pre");
      expect_close(out, d.out, matmul_gelu_tols().of(t), what + " out");

      matmul_gelu_backward_ref(c, d, pre.values(), out.values());
      Buf dpre(t, c.BT * c.OC), dout_scratch(t, c.BT * c.OC);
      dpre.fill(123.0);  // written, not accumulated
      matmul_gelu_backward(dpre.tensor(Shape{c.BT, c.OC}), d.dweight0.tensor(Shape{c.C, c.OC}), d.dbias0.tensor(Shape{c.C}),
                           d.dy.tensor(Shape{c.BT, c.C}), out.tensor(Shape{c.BT, c.OC}), pre.tensor(Shape{c.BT, c.OC}),
                           d.weight2.tensor(Shape{c.C, c.OC}), dout_scratch.tensor(Shape{c.BT, c.OC}), scr);
      expect_close(dpre, d.dpre, matmul_gelu_tols().of(t), what + " dpre");
      expect_close(d.dweight0, d.dweight, matmul_gelu_tols().of(t), what + " dweight");
      expect_close(d.dbias0, d.dbias, matmul_gelu_tols().of(t), what + " dbias");
    }
  }
}

TEST(MatmulGelu, BadArgumentsAreErrors) {
  const MatmulGeluCase c{4, 8, 16, true};
  MatmulGeluData d = make_matmul_gelu_data(c, DType::fp32, 1);
  Buf pre(DType::fp32, c.BT * c.OC), out(DType::fp32, c.BT * c.OC), small(DType::fp32, c.BT * c.C);
  const Tensor inp = d.inp.tensor(Shape{c.BT, c.C}), w = d.weight.tensor(Shape{c.OC, c.C}), b = d.bias.tensor(Shape{c.OC});
  // out the wrong shape; out aliasing pre; inp and weight widths that disagree.
  EXPECT_THROW(matmul_gelu_forward(small.tensor(Shape{c.BT, c.C}), pre.tensor(Shape{c.BT, c.OC}), inp, w, b, Tensor{}), Error);
  EXPECT_THROW(matmul_gelu_forward(pre.tensor(Shape{c.BT, c.OC}), pre.tensor(Shape{c.BT, c.OC}), inp, w, b, Tensor{}), Error);
  EXPECT_THROW(matmul_gelu_forward(out.tensor(Shape{c.BT, c.OC}), pre.tensor(Shape{c.BT, c.OC}), inp, d.weight.tensor(Shape{c.C, c.OC}), b, Tensor{}),
               Error);
  // The backward's dout_scratch must be its own buffer.
  Buf dpre(DType::fp32, c.BT * c.OC);
  EXPECT_THROW(matmul_gelu_backward(dpre.tensor(Shape{c.BT, c.OC}), d.dweight0.tensor(Shape{c.C, c.OC}), d.dbias0.tensor(Shape{c.C}),
                                    d.dy.tensor(Shape{c.BT, c.C}), out.tensor(Shape{c.BT, c.OC}), pre.tensor(Shape{c.BT, c.OC}),
                                    d.weight2.tensor(Shape{c.C, c.OC}), dpre.tensor(Shape{c.BT, c.OC}), Tensor{}),
               Error);
}

}  // namespace
