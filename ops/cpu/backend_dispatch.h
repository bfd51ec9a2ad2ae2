// Backend selection for the ops/kernels entry points (private to ops/cpu, which holds them).
//
// Every entry point runs the shared argument checks (kernel_check.h) first, for both backends,
// and then asks on_cuda(): true when its tensors live on a cuda device and the CUDA backend is
// compiled in (DSTRAIN_CUDA=ON defines DSTRAIN_HAS_CUDA_KERNELS for this library), in which case
// it calls the function of the same name in dstrain::cuda (ops/cuda/kernels.h) and returns:
//
//   const bool gpu = cpu::on_cuda(op, {{"out", out}, {"inp", inp}});  // first: devices
//   ... shape / dtype checks ...
//   DSTRAIN_RETURN_ON_CUDA(gpu, gelu_forward(out, inp));  // before touching data on the host
//
// All non-empty tensors of a call must be on one device (no implicit copies). Without the CUDA
// backend a cuda tensor is the same Error as before (kernel_check::require_cpu).
#pragma once

#include <initializer_list>
#include <string_view>

#include "ops/error.h"
#include "ops/kernels/kernel_check.h"

#if DSTRAIN_HAS_CUDA_KERNELS
#include "ops/cuda/kernels.h"
// `call` is the op's dstrain::cuda function applied to the entry point's arguments.
#define DSTRAIN_RETURN_ON_CUDA(gpu, call) \
  if (gpu) return ::dstrain::cuda::call
#else
// No CUDA backend: on_cuda() never returns true (it throws for a cuda tensor).
#define DSTRAIN_RETURN_ON_CUDA(gpu, call) static_cast<void>(gpu)
#endif

namespace dstrain::cpu {

inline bool on_cuda(std::string_view op, std::initializer_list<kernel_check::Arg> args) {
  const kernel_check::Arg* first = nullptr;
  for (const kernel_check::Arg& a : args) {
    if (a.t.empty()) continue;
    if (!first) {
      first = &a;
    } else if (!(a.t.device == first->t.device)) {
      fail("{}: tensor '{}' ({}) and tensor '{}' ({}) are on different devices; every tensor of a kernel call must be on one device", op, a.name,
           a.t.str(), first->name, first->t.str());
    }
  }
  if (!first || first->t.device.is_cpu()) return false;
#if DSTRAIN_HAS_CUDA_KERNELS
  if (first->t.device.is_cuda()) return true;
#endif
  kernel_check::require_cpu(op, args);  // throws: a device this build has no kernels for
  return false;
}

}  // namespace dstrain::cpu
