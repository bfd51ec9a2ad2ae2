// matmul_gelu_forward / matmul_gelu_backward on the GPU (cuBLASLt's GELU_AUX_BIAS and DGELU
// epilogues where the shape allows, the separate kernels otherwise) against the naive double
// reference the CPU test uses (tests/unit/kernels/matmul_gelu_cases.h), with the same tolerances.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/matmul_gelu.h"
#include "ops/kernels/tensor_ops.h"
#include "tests/unit/kernels/matmul_gelu_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

TEST(MatmulGeluGpu, FusedEpiloguesMatchTheNaiveReference) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType t : kFloatDTypes) {
    for (const MatmulGeluCase& c : matmul_gelu_cases()) {
      const std::string what =
          std::string(dtype_name(t)) + " BT=" + std::to_string(c.BT) + " C=" + std::to_string(c.C) + " OC=" + std::to_string(c.OC);
      MatmulGeluData d = make_matmul_gelu_data(c, t, 17);
      DeviceTensors g;
      const Tensor pre = g.zeros(t, Shape{c.BT, c.OC}), out = g.zeros(t, Shape{c.BT, c.OC});
      const auto scratch_elems = static_cast<std::int64_t>(matmul_scratch_elems(t, std::max(c.C, c.OC)));
      const Tensor scr = scratch_elems > 0 ? g.zeros(DType::fp32, Shape{scratch_elems}) : Tensor{};
      matmul_gelu_forward(out, pre, g.put(d.inp, Shape{c.BT, c.C}), g.put(d.weight, Shape{c.OC, c.C}), c.bias ? g.put(d.bias, Shape{c.OC}) : Tensor{},
                          scr);
      Buf pre_h = DeviceTensors::get(pre), out_h = DeviceTensors::get(out);
      expect_close(pre_h, d.pre, matmul_gelu_tols().of(t), what + " pre");
      expect_close(out_h, d.out, matmul_gelu_tols().of(t), what + " out");

      matmul_gelu_backward_ref(c, d, pre_h.values(), out_h.values());
      Buf poison(t, c.BT * c.OC);
      poison.fill(123.0);  // dpre is written, not accumulated
      const Tensor dpre = g.put(poison, Shape{c.BT, c.OC});
      const Tensor dw = g.put(d.dweight0, Shape{c.C, c.OC}), db = g.put(d.dbias0, Shape{c.C});
      matmul_gelu_backward(dpre, dw, db, g.put(d.dy, Shape{c.BT, c.C}), out, pre, g.put(d.weight2, Shape{c.C, c.OC}), g.zeros(t, Shape{c.BT, c.OC}),
                           scr);
      expect_close(DeviceTensors::get(dpre), d.dpre, matmul_gelu_tols().of(t), what + " dpre");
      expect_close(DeviceTensors::get(dw), d.dweight, matmul_gelu_tols().of(t), what + " dweight");
      expect_close(DeviceTensors::get(db), d.dbias, matmul_gelu_tols().of(t), what + " dbias");
    }
  }
}

}  // namespace
