// Helpers for the communicator tests: host buffers of any dtype, and expected values computed by
// the test from the known per-rank inputs (never by the communicator).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/dtype.h"
#include "ops/tensor.h"
#include "zero/communicator.h"

namespace dstrain::testing_comm {

// A host buffer of n elements of one dtype, values set and read as float (int32 as integers).
struct HostBuf {
  DType dtype = DType::fp32;
  std::int64_t n = 0;
  std::vector<std::uint32_t> mem;  // 4-byte storage: aligned for every dtype

  HostBuf() = default;
  HostBuf(DType d, std::int64_t count)
      : dtype(d), n(count), mem(static_cast<std::size_t>((count * static_cast<std::int64_t>(dtype_size(d)) + 3) / 4 + 2)) {}

  Tensor tensor() { return Tensor(mem.data(), dtype, Shape{n}); }
  void* at(std::int64_t i) { return reinterpret_cast<char*>(mem.data()) + static_cast<std::size_t>(i) * dtype_size(dtype); }
  const void* at(std::int64_t i) const { return reinterpret_cast<const char*>(mem.data()) + static_cast<std::size_t>(i) * dtype_size(dtype); }

  void set(std::int64_t i, double v) {
    switch (dtype) {
      case DType::fp32: {
        const float f = static_cast<float>(v);
        std::memcpy(at(i), &f, 4);
        break;
      }
      case DType::fp16: {
        const std::uint16_t b = fp32_to_fp16_bits(static_cast<float>(v));
        std::memcpy(at(i), &b, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t b = fp32_to_bf16_bits(static_cast<float>(v));
        std::memcpy(at(i), &b, 2);
        break;
      }
      case DType::int32: {
        const auto k = static_cast<std::int32_t>(v);
        std::memcpy(at(i), &k, 4);
        break;
      }
      case DType::uint16: {
        const auto k = static_cast<std::uint16_t>(v);
        std::memcpy(at(i), &k, 2);
        break;
      }
      case DType::fp64:
        std::memcpy(at(i), &v, 8);
        break;
    }
  }
  double get(std::int64_t i) const {
    switch (dtype) {
      case DType::fp32: {
        float f;
        std::memcpy(&f, at(i), 4);
        return f;
      }
      case DType::fp16: {
        std::uint16_t b;
        std::memcpy(&b, at(i), 2);
        return fp16_bits_to_fp32(b);
      }
      case DType::bf16: {
        std::uint16_t b;
        std::memcpy(&b, at(i), 2);
        return bf16_bits_to_fp32(b);
      }
      case DType::int32: {
        std::int32_t k;
        std::memcpy(&k, at(i), 4);
        return k;
      }
      case DType::uint16: {
        std::uint16_t k;
        std::memcpy(&k, at(i), 2);
        return k;
      }
      case DType::fp64: {
        double d;
        std::memcpy(&d, at(i), 8);
        return d;
      }
    }
    return 0;
  }
  // The raw bits of element i, for bit-exact comparisons.
  std::uint64_t bits(std::int64_t i) const {
    std::uint64_t b = 0;
    std::memcpy(&b, at(i), dtype_size(dtype));
    return b;
  }
};

// Rank r's input element i: multiples of 1/4 in [-2.75, 2.75], different on every rank, so sums
// over up to 4 ranks are exact in bf16 (8 significant bits) and fp16; the order of summation
// cannot matter, and a wrong rank, offset or missing term changes the result.
inline double input_value(int rank, std::int64_t i) { return static_cast<double>(((i * 7 + rank * 13 + 3) % 23) - 11) * 0.25; }

// What `op` over ranks 0..W-1 of input_value(r, i) must give, in fp32 then rounded once to dtype.
inline double expected_reduce(ReduceOp op, DType dtype, int world, std::int64_t i) {
  double sum = 0;
  double mx = -1e30;
  for (int r = 0; r < world; ++r) {
    sum += input_value(r, i);  // exact: quarter-integers of small magnitude
    mx = std::max(mx, input_value(r, i));
  }
  double v = op == ReduceOp::max ? mx : sum;
  if (op == ReduceOp::avg) {
    // fp64 accumulates (and divides) in double; the others in fp32.
    v = dtype == DType::fp64 ? sum / world : static_cast<double>(static_cast<float>(sum) / static_cast<float>(world));
  }
  HostBuf one(dtype, 1);
  one.set(0, v);  // the single rounding to the storage type
  return one.get(0);
}

inline std::uint64_t expected_bits(ReduceOp op, DType dtype, int world, std::int64_t i) {
  HostBuf one(dtype, 1);
  one.set(0, expected_reduce(op, dtype, world, i));
  return one.bits(0);
}

}  // namespace dstrain::testing_comm
