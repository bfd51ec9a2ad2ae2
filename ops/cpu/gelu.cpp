// GELU, CPU: elementwise, split over threads; the loops (ops/cpu/gelu_isa.cpp) have no branches
// and vectorise, compiled per ISA and chosen at run time (tanh goes through cpu::fast_tanh:
// libm's tanhf would be a scalar call per element).
#include "ops/kernels/gelu.h"

#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/gelu_isa.h"
#include "ops/cpu/isa_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

}  // namespace

void gelu_forward(Tensor out, Tensor inp) {
  const char* op = "gelu_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"inp", inp}});
  require_present(op, {"inp", inp});
  require_shape(op, {"out", out}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"out", out}});
  DSTRAIN_RETURN_ON_CUDA(gpu, gelu_forward(out, inp));
  const std::int64_t n = inp.numel();
  const auto range = cpu::isa_select(cpu::scalar::gelu_forward_range, cpu::avx2::gelu_forward_range, cpu::avx512::gelu_forward_range);
  cpu::for_each_block(n, [&](std::int64_t b, std::int64_t e) { range(inp.dtype, out.data, inp.data, b, e); });
}

void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "gelu_backward";
  const bool gpu = cpu::on_cuda(op, {{"dinp", dinp}, {"inp", inp}, {"dout", dout}});
  require_present(op, {"inp", inp});
  require_shape(op, {"dout", dout}, inp.shape, "(the shape of inp)");
  require_shape(op, {"dinp", dinp}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"dout", dout}, {"dinp", dinp}});
  if (dinp.data == inp.data || dinp.data == dout.data) fail("{}: dinp must not alias inp or dout (dinp accumulates)", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, gelu_backward(dinp, inp, dout));
  const std::int64_t n = inp.numel();
  const auto range = cpu::isa_select(cpu::scalar::gelu_backward_range, cpu::avx2::gelu_backward_range, cpu::avx512::gelu_backward_range);
  cpu::for_each_block(n, [&](std::int64_t b, std::int64_t e) { range(inp.dtype, dinp.data, inp.data, dout.data, b, e); });
}

}  // namespace dstrain
