// bench_convert: CPU throughput of convert() between fp32, fp16 and bf16, over 64 MiB of fp32
// (16 Mi elements). Prints GB/s counting bytes read + bytes written (what the memory system moves);
// never asserts. Usage: bench_convert [repetitions, default 10]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/dtype.h"

using namespace dstrain;

namespace {

constexpr std::size_t kElements = std::size_t{64} << 20 >> 2;  // 64 MiB of fp32

void run(const Buffer& src, DType src_type, Buffer& dst, DType dst_type, int reps) {
  std::vector<double> seconds;
  convert(src.data(), src_type, dst.data(), dst_type, kElements);  // warm-up: faults the pages in
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    convert(src.data(), src_type, dst.data(), dst_type, kElements);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double bytes = static_cast<double>(kElements * (dtype_size(src_type) + dtype_size(dst_type)));
  std::printf("%-6s -> %-6s %10.2f GB/s best %10.2f GB/s median %8.2f ms best\n", dtype_name(src_type).data(), dtype_name(dst_type).data(),
              bytes / seconds.front() / 1e9, bytes / seconds[seconds.size() / 2] / 1e9, seconds.front() * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  Allocator& a = cpu_allocator();
  Buffer f32(a, kElements * 4, MemoryPurpose::buffers);
  Buffer f32_back(a, kElements * 4, MemoryPurpose::buffers);
  Buffer f16(a, kElements * 2, MemoryPurpose::buffers);
  Buffer b16(a, kElements * 2, MemoryPurpose::buffers);
  // Values spread over the range training sees (normal in fp16 and bf16, both signs).
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  float* x = static_cast<float*>(f32.data());
  for (std::size_t i = 0; i < kElements; ++i) x[i] = normal(rng);

  std::printf("convert() over %zu elements (64 MiB fp32), %d repetitions, 1 thread\n", kElements, reps);
  run(f32, DType::fp32, b16, DType::bf16, reps);
  run(f32, DType::fp32, f16, DType::fp16, reps);
  run(b16, DType::bf16, f32_back, DType::fp32, reps);
  run(f16, DType::fp16, f32_back, DType::fp32, reps);
  run(f16, DType::fp16, b16, DType::bf16, reps);
  return 0;
}
