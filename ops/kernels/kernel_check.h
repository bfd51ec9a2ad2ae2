// Argument checks shared by every kernel backend: device, dtype and shape validation that turns a
// caller's mistake into an Error naming the op, the tensor, its shape and the expected one.
//
// Header-only on purpose: the future CUDA implementation of ops/kernels/*.h runs the same checks,
// so both backends reject the same calls with the same messages.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "ops/error.h"
#include "ops/tensor.h"

namespace dstrain::kernel_check {

// A tensor argument with the name the op's header gives it ("inp", "dweight", ...).
struct Arg {
  const char* name;
  const Tensor& t;
};

// Every non-empty tensor must be on the CPU: this binary has no other backend yet.
inline void require_cpu(std::string_view op, std::initializer_list<Arg> args) {
  for (const Arg& a : args) {
    if (!a.t.empty() && !a.t.device.is_cpu()) {
      fail(
          "{}: tensor '{}' ({}) is on device {}, but only the cpu kernels are built; move the tensor to the cpu or build "
          "with DSTRAIN_CUDA=ON once the op has a CUDA implementation",
          op, a.name, a.t.str(), a.t.device.str());
    }
  }
}

inline void require_present(std::string_view op, const Arg& a) {
  if (a.t.empty()) fail("{}: tensor '{}' is required but has no data (null pointer); pass a buffer of the documented shape", op, a.name);
}

inline void require_shape(std::string_view op, const Arg& a, const Shape& expected, std::string_view meaning = {}) {
  require_present(op, a);
  if (!(a.t.shape == expected)) {
    fail("{}: tensor '{}' has shape {} but {} is expected{}{}; fix the caller's shapes", op, a.name, a.t.shape.str(), expected.str(),
         meaning.empty() ? "" : " ", meaning);
  }
}

inline void require_rank(std::string_view op, const Arg& a, int rank, std::string_view meaning) {
  require_present(op, a);
  if (a.t.shape.rank != rank) {
    fail("{}: tensor '{}' has shape {} (rank {}) but rank {} {} is expected", op, a.name, a.t.shape.str(), a.t.shape.rank, rank, meaning);
  }
}

inline void require_dtype(std::string_view op, const Arg& a, DType expected) {
  if (a.t.dtype != expected) {
    fail("{}: tensor '{}' ({}) must have dtype {}", op, a.name, a.t.str(), dtype_name(expected));
  }
}

inline void require_floating(std::string_view op, const Arg& a) {
  if (!is_floating(a.t.dtype)) fail("{}: tensor '{}' ({}) must be fp32, fp16 or bf16", op, a.name, a.t.str());
}

// All tensors share the storage dtype of the first one (the op's "storage type").
inline void require_same_dtype(std::string_view op, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (a.t.empty()) continue;
    if (!first) {
      first = &a;
      require_floating(op, a);
      continue;
    }
    if (a.t.dtype != first->t.dtype) {
      fail("{}: tensor '{}' ({}) and tensor '{}' ({}) must have the same storage dtype; convert one of them", op, a.name, a.t.str(), first->name,
           first->t.str());
    }
  }
}

}  // namespace dstrain::kernel_check
