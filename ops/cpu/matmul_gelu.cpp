#include "ops/kernels/matmul_gelu.h"

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/matmul_check.h"
#include "ops/kernels/gelu.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

using namespace kernel_check;

void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, Tensor scratch) {
  const char* op = "matmul_gelu_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"pre", pre}, {"inp", inp}, {"weight", weight}, {"bias", bias}, {"scratch", scratch}});
  cpu::check_matmul_forward_args(op, pre, inp, weight, bias, scratch);
  require_shape(op, {"out", out}, pre.shape, "(the shape of pre)");
  require_same_dtype(op, {{"pre", pre}, {"out", out}});
  if (out.data == pre.data) fail("{}: out and pre must be different tensors (backward reads pre)", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, matmul_gelu_forward(out, pre, inp, weight, bias, scratch));
  matmul_forward(pre, inp, weight, bias, scratch);
  gelu_forward(out, pre);
}

void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dy, Tensor out, Tensor pre, Tensor weight, Tensor dout_scratch,
                          Tensor scratch) {
  const char* op = "matmul_gelu_backward";
  const bool gpu = cpu::on_cuda(op, {{"dpre", dpre},
                                     {"dweight", dweight},
                                     {"dbias", dbias},
                                     {"dy", dy},
                                     {"out", out},
                                     {"pre", pre},
                                     {"weight", weight},
                                     {"dout_scratch", dout_scratch},
                                     {"scratch", scratch}});
  cpu::check_matmul_backward_args(op, dout_scratch, dweight, dbias, dy, out, weight, scratch);
  require_present(op, {"pre", pre});
  for (const Arg& a : {Arg{"dpre", dpre}, Arg{"out", out}, Arg{"dout_scratch", dout_scratch}}) require_shape(op, a, pre.shape, "(the shape of pre)");
  require_same_dtype(op, {{"pre", pre}, {"dpre", dpre}, {"out", out}, {"dout_scratch", dout_scratch}});
  if (dout_scratch.data == dpre.data || dout_scratch.data == pre.data || dout_scratch.data == out.data) {
    fail("{}: dout_scratch must be a buffer of its own (it must not alias dpre, pre or out)", op);
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, matmul_gelu_backward(dpre, dweight, dbias, dy, out, pre, weight, dout_scratch, scratch));
  zero_tensor(dout_scratch);
  matmul_backward(dout_scratch, dweight, dbias, dy, out, weight, scratch);
  zero_tensor(dpre);
  gelu_backward(dpre, pre, dout_scratch);
}

}  // namespace dstrain
