// SwiGLU, CPU: elementwise, split over threads; sigmoid through cpu::fast_exp so the loops
// (ops/cpu/swiglu_isa.cpp, compiled per ISA and chosen at run time) have no libm call and
// vectorise (as gelu.cpp).
#include "ops/kernels/swiglu.h"

#include <cstdint>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/isa_dispatch.h"
#include "ops/cpu/swiglu_isa.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;


}  // namespace

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  const char* op = "swiglu_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"gate", gate}, {"up", up}});
  require_present(op, {"gate", gate});
  require_shape(op, {"up", up}, gate.shape, "(the shape of gate)");
  require_shape(op, {"out", out}, gate.shape, "(the shape of gate)");
  require_same_dtype(op, {{"gate", gate}, {"up", up}, {"out", out}});
  DSTRAIN_RETURN_ON_CUDA(gpu, swiglu_forward(out, gate, up));
  const std::int64_t n = gate.numel();
  const auto range = cpu::isa_select(cpu::scalar::swiglu_forward_range, cpu::avx2::swiglu_forward_range, cpu::avx512::swiglu_forward_range);
  cpu::for_each_block(n, [&](std::int64_t b, std::int64_t e) { range(gate.dtype, out.data, gate.data, up.data, b, e); });
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  const char* op = "swiglu_backward";
  const bool gpu = cpu::on_cuda(op, {{"dgate", dgate}, {"dup", dup}, {"dout", dout}, {"gate", gate}, {"up", up}});
  require_present(op, {"gate", gate});
  for (const Arg& a : {Arg{"up", up}, Arg{"dout", dout}, Arg{"dgate", dgate}, Arg{"dup", dup}})
    require_shape(op, a, gate.shape, "(the shape of gate)");
  require_same_dtype(op, {{"gate", gate}, {"up", up}, {"dout", dout}, {"dgate", dgate}, {"dup", dup}});
  if (gate.numel() > 0) {
    for (const void* p : {gate.data, up.data, dout.data}) {
      if (dgate.data == p || dup.data == p) fail("{}: dgate and dup must not alias gate, up or dout (they accumulate)", op);
    }
    if (dgate.data == dup.data) fail("{}: dgate and dup must be different tensors", op);
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, swiglu_backward(dgate, dup, dout, gate, up));
  const std::int64_t n = gate.numel();
  const auto range = cpu::isa_select(cpu::scalar::swiglu_backward_range, cpu::avx2::swiglu_backward_range, cpu::avx512::swiglu_backward_range);
  cpu::for_each_block(n, [&](std::int64_t b, std::int64_t e) { range(gate.dtype, dgate.data, dup.data, dout.data, gate.data, up.data, b, e); });
}

}  // namespace dstrain
