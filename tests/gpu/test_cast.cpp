// cuda_convert against the CPU reference convert() (itself pinned by tests/unit/ops/test_dtype.cpp
// against independent references), bit for bit: every fp16 and bf16 pattern as input, and for
// fp32 input every 16-bit value, every midpoint between neighbours and its fp32 neighbours,
// NaNs of every payload class, and a large random sample.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu_test.h"
#include "ops/cuda/cast.h"
#include "ops/cuda/cuda_check.h"
#include "ops/dtype.h"

using namespace dstrain;

namespace {

// Runs cuda_convert on a copy of `src` (n elements of src_type) and returns dst_type bytes.
std::vector<std::uint8_t> gpu_convert(const std::vector<std::uint8_t>& src, DType src_type, DType dst_type, std::size_t n) {
  void* d_src = nullptr;
  void* d_dst = nullptr;
  cudaStream_t stream = nullptr;
  DSTRAIN_CUDA_CHECK(cudaStreamCreate(&stream));
  DSTRAIN_CUDA_CHECK(cudaMalloc(&d_src, src.size()));
  DSTRAIN_CUDA_CHECK(cudaMalloc(&d_dst, n * dtype_size(dst_type)));
  DSTRAIN_CUDA_CHECK(cudaMemset(d_dst, 0xAB, n * dtype_size(dst_type)));  // no stale zeros to pass by luck
  DSTRAIN_CUDA_CHECK(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
  cuda_convert(d_src, src_type, d_dst, dst_type, n, stream);
  DSTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::uint8_t> out(n * dtype_size(dst_type));
  DSTRAIN_CUDA_CHECK(cudaMemcpy(out.data(), d_dst, out.size(), cudaMemcpyDeviceToHost));
  DSTRAIN_CUDA_CHECK(cudaFree(d_src));
  DSTRAIN_CUDA_CHECK(cudaFree(d_dst));
  DSTRAIN_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

void expect_same_as_cpu(const std::vector<std::uint8_t>& src, DType src_type, std::size_t n) {
  for (DType dst_type : {DType::fp32, DType::fp16, DType::bf16}) {
    std::vector<std::uint8_t> cpu(n * dtype_size(dst_type));
    convert(src.data(), src_type, cpu.data(), dst_type, n);
    const std::vector<std::uint8_t> gpu = gpu_convert(src, src_type, dst_type, n);
    const std::size_t w = dtype_size(dst_type);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n && mismatches < 10; ++i) {
      if (std::memcmp(&cpu[i * w], &gpu[i * w], w) != 0) {
        ++mismatches;
        std::uint32_t in = 0, c = 0, g = 0;
        std::memcpy(&in, &src[i * dtype_size(src_type)], dtype_size(src_type));
        std::memcpy(&c, &cpu[i * w], w);
        std::memcpy(&g, &gpu[i * w], w);
        ADD_FAILURE() << dtype_name(src_type) << " -> " << dtype_name(dst_type) << " input bits 0x" << std::hex << in << ": cpu 0x" << c << ", gpu 0x"
                      << g;
      }
    }
  }
}

std::vector<std::uint8_t> as_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST(CudaCast, All16BitPatterns) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::vector<std::uint8_t> src(65536 * 2);
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto v = static_cast<std::uint16_t>(p);
    std::memcpy(&src[p * 2], &v, 2);
  }
  expect_same_as_cpu(src, DType::fp16, 65536);
  expect_same_as_cpu(src, DType::bf16, 65536);
}

TEST(CudaCast, Fp32BoundariesAndNaNs) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::vector<float> v;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    for (float x : {fp16_bits_to_fp32(static_cast<std::uint16_t>(p)), bf16_bits_to_fp32(static_cast<std::uint16_t>(p))}) {
      v.push_back(x);
      if (std::isfinite(x)) {
        v.push_back(std::nextafter(x, INFINITY));
        v.push_back(std::nextafter(x, -INFINITY));
      }
    }
    // Midpoints to the next pattern (ties) and their neighbours.
    for (const bool is_fp16 : {true, false}) {
      const auto q = static_cast<std::uint16_t>(p + 1);
      const float a = is_fp16 ? fp16_bits_to_fp32(static_cast<std::uint16_t>(p)) : bf16_bits_to_fp32(static_cast<std::uint16_t>(p));
      const float b = is_fp16 ? fp16_bits_to_fp32(q) : bf16_bits_to_fp32(q);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
      v.insert(v.end(), {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)});
    }
  }
  v.insert(v.end(), {65520.0f, -65520.0f, std::nextafter(65520.0f, 0.0f), 3.4028235e38f, INFINITY, -INFINITY, 0.0f, -0.0f});
  // NaNs: every payload in the top 10 bits and the low 13, both signs, quiet and signalling.
  for (std::uint32_t m = 1; m < (1u << 23); m += (m < 8192 ? 1 : 8192)) {
    v.push_back(std::bit_cast<float>(0x7f800000u | m));
    v.push_back(std::bit_cast<float>(0xff800000u | m));
  }
  // fp32 subnormals.
  for (std::uint32_t m = 1; m < (1u << 23); m += 997) v.push_back(std::bit_cast<float>(m));
  expect_same_as_cpu(as_bytes(v), DType::fp32, v.size());
}

TEST(CudaCast, Fp32RandomSample) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12345);
  std::vector<float> v(16'000'003);  // not a multiple of the block size: the tail is covered
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u = static_cast<std::uint32_t>(rng());
    if (i % 2 == 1) u = (u & 0x807fffffu) | ((100u + static_cast<std::uint32_t>(rng() % 45)) << 23);  // fp16 range
    v[i] = std::bit_cast<float>(u);
  }
  expect_same_as_cpu(as_bytes(v), DType::fp32, v.size());
}
