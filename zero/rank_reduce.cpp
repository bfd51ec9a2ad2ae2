#include "zero/rank_reduce.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/error.h"

namespace dstrain {
namespace {

// Accumulation type and conversions: 16-bit floats accumulate in fp32 and round once at the end;
// int32 sums wrap (computed in uint32: signed overflow would be undefined behaviour).
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<std::int32_t> {
  using type = std::int32_t;
};
template <>
struct Acc<double> {
  using type = double;
};

template <typename T>
typename Acc<T>::type load(T v) {
  return static_cast<typename Acc<T>::type>(v);
}
template <typename T>
T store(typename Acc<T>::type v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t>) {
    return v;
  } else {
    return T(v);
  }
}

template <typename A>
A add(A a, A b) {
  if constexpr (std::is_same_v<A, std::int32_t>) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
  } else {
    return a + b;
  }
}

// NaN wins, as in a sum: a max that hid a NaN gradient would hide an overflow.
template <typename A>
A max_of(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b > a ? b : a;
}

// out[k][i] = op over r of in[r][i] for every output k, i in [0, n). Blocks of kBlock elements
// keep the accumulator on the stack; inputs of a block are all read before any output is written,
// so an output may alias an input (all-reduce in place).
template <typename T>
void reduce_into(const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t n, ReduceOp op) {
  using A = typename Acc<T>::type;
  constexpr std::int64_t kBlock = 1024;
  A acc[kBlock];
  const auto world = static_cast<int>(in.size());
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t m = std::min(kBlock, n - b);
    const T* first = static_cast<const T*>(in[0]) + b;
    for (std::int64_t i = 0; i < m; ++i) acc[i] = load(first[i]);
    for (int r = 1; r < world; ++r) {
      const T* src = static_cast<const T*>(in[static_cast<std::size_t>(r)]) + b;
      if (op == ReduceOp::max) {
        for (std::int64_t i = 0; i < m; ++i) acc[i] = max_of<A>(acc[i], load(src[i]));
      } else {
        for (std::int64_t i = 0; i < m; ++i) acc[i] = add<A>(acc[i], load(src[i]));
      }
    }
    if (op == ReduceOp::avg) {
      if constexpr (std::is_floating_point_v<A>) {
        const A w = static_cast<A>(world);
        for (std::int64_t i = 0; i < m; ++i) acc[i] = acc[i] / w;
      }
    }
    for (void* o : out) {
      T* dst = static_cast<T*>(o) + b;
      for (std::int64_t i = 0; i < m; ++i) dst[i] = store<T>(acc[i]);
    }
  }
}

}  // namespace

void reduce_over_ranks(DType dtype, const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t n, ReduceOp op) {
  switch (dtype) {
    case DType::fp32:
      return reduce_into<float>(in, out, n, op);
    case DType::fp16:
      return reduce_into<fp16_t>(in, out, n, op);
    case DType::bf16:
      return reduce_into<bf16_t>(in, out, n, op);
    case DType::int32:
      return reduce_into<std::int32_t>(in, out, n, op);
    case DType::fp64:
      return reduce_into<double>(in, out, n, op);
    case DType::uint16:
      break;
  }
  fail("collective: dtype {} cannot be reduced", dtype_name(dtype));
}

}  // namespace dstrain
