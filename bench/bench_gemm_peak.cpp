// bench_gemm_peak: what this GPU reaches on large bf16 GEMMs (fp32 accumulation, tensor cores),
// through the same cuBLASLt entry the matmul kernels use (ops/cuda/cublaslt.h, heuristic
// algorithm, 32 MiB workspace): the practical peak to read MFU against, next to the datasheet's
// (H100 SXM dense bf16: 989 TFLOP/s). Shapes: a square 8192^3 and GPT-2 124M's (d12) layer GEMMs
// at BT = B·T rows — forward qkv / attention projection / fc / fc projection / LM head, and the
// weight gradients of qkv and fc (k = BT). Times `--iters` calls after `--warmup` with CUDA
// events on the legacy default stream; random data (all-zero inputs run the tensor cores cooler
// and faster than training does).
//
//   build/bench/bench_gemm_peak [--iters 20] [--warmup 5] [--bt 16384] [--only square|d12] [--device 0]
//
// Prints a table and, last, one JSON line {"device": ..., "results": [{"name", "m", "n", "k",
// "ms", "tflops"}, ...], "best_tflops": ...}. Never asserts; exits 1 with a message where no GPU
// can be used.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "ops/cuda/cublaslt.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_runtime_info.h"
#include "ops/dtype.h"
#include "ops/error.h"

using namespace dstrain;

namespace {

struct Options {
  int iters = 20, warmup = 5, device = 0;
  std::int64_t bt = 16384;
  std::string only;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "bench_gemm_peak: %s\nusage: bench_gemm_peak [--iters N] [--warmup N] [--bt ROWS] [--only square|d12] [--device N]\n",
               problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) usage(fmt::format("{} needs a value", a));
    const char* v = argv[++i];
    if (a == "--iters")
      o.iters = std::atoi(v);
    else if (a == "--warmup")
      o.warmup = std::atoi(v);
    else if (a == "--bt")
      o.bt = std::atoll(v);
    else if (a == "--device")
      o.device = std::atoi(v);
    else if (a == "--only")
      o.only = v;
    else
      usage(fmt::format("unknown option {}", a));
  }
  if (o.iters < 1 || o.warmup < 0 || o.bt < 1) usage("--iters and --bt must be >= 1, --warmup >= 0");
  if (!o.only.empty() && o.only != "square" && o.only != "d12") usage("--only takes square or d12");
  return o;
}

// A GEMM in the engine's row-major terms: out (rows x cols) = inp (rows x k) · W^T, W (cols x k),
// i.e. column-major D (cols x rows) = W^T' · inp' with transa (as matmul_forward calls it).
struct Shape {
  std::string name;
  std::int64_t rows, cols, k;
};

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(std::size_t bytes) { DSTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceMem() { (void)cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    require_cuda_device(o.device);
    DSTRAIN_CUDA_CHECK(cudaSetDevice(o.device));
    const CudaInfo info = cuda_info();
    const CudaDeviceInfo& dev = info.devices.at(static_cast<std::size_t>(o.device));
    std::printf("%s\n", format_cuda_info(info).c_str());

    const std::int64_t C = 768, BT = o.bt, Vp = 50304;
    std::vector<Shape> shapes;
    if (o.only.empty() || o.only == "square") shapes.push_back({"square 8192^3", 8192, 8192, 8192});
    if (o.only.empty() || o.only == "d12") {
      shapes.push_back({"d12 qkv fwd (BTx768 . 768x2304)", BT, 3 * C, C});
      shapes.push_back({"d12 attn proj fwd (BTx768 . 768x768)", BT, C, C});
      shapes.push_back({"d12 fc fwd (BTx768 . 768x3072)", BT, 4 * C, C});
      shapes.push_back({"d12 fc proj fwd (BTx3072 . 3072x768)", BT, C, 4 * C});
      shapes.push_back({"d12 lm head fwd (BTx768 . 768x50304)", BT, Vp, C});
      shapes.push_back({"d12 qkv dW (2304xBT . BTx768)", 3 * C, C, BT});
      shapes.push_back({"d12 fc dW (3072xBT . BTx768)", 4 * C, C, BT});
    }
    std::size_t max_in = 0, max_w = 0, max_out = 0;
    for (const Shape& s : shapes) {
      max_in = std::max(max_in, static_cast<std::size_t>(s.rows * s.k));
      max_w = std::max(max_w, static_cast<std::size_t>(s.cols * s.k));
      max_out = std::max(max_out, static_cast<std::size_t>(s.rows * s.cols));
    }
    // Random bf16 in [-1, 1): one host pattern copied into both inputs.
    std::vector<std::uint16_t> host(std::max(max_in, max_w));
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::uint16_t& h : host) h = fp32_to_bf16_bits(u(gen));
    DeviceMem in(max_in * 2), w(max_w * 2), out(max_out * 2);
    DSTRAIN_CUDA_CHECK(cudaMemcpy(in.p, host.data(), max_in * 2, cudaMemcpyHostToDevice));
    DSTRAIN_CUDA_CHECK(cudaMemcpy(w.p, host.data(), max_w * 2, cudaMemcpyHostToDevice));

    cuda::CublasLtContext& ctx = cuda::CublasLtContext::get(o.device);
    cudaEvent_t start = nullptr, stop = nullptr;
    DSTRAIN_CUDA_CHECK(cudaEventCreate(&start));
    DSTRAIN_CUDA_CHECK(cudaEventCreate(&stop));
    std::printf("%-42s %7s %7s %7s %10s %10s\n", "GEMM (bf16 in/out, fp32 accumulate)", "M", "N", "K", "ms", "TFLOP/s");
    std::string json = fmt::format(R"({{"device": "{}", "sms": {}, "bt": {}, "iters": {}, "results": [)", dev.name, dev.multiprocessors, BT, o.iters);
    double best = 0.0;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      cuda::GemmArgs g;
      g.dtype = DType::bf16;
      g.transa = true;
      g.transb = false;
      g.m = s.cols;
      g.n = s.rows;
      g.k = s.k;
      g.A = w.p;
      g.lda = s.k;
      g.B = in.p;
      g.ldb = s.k;
      g.D = out.p;
      g.ldd = s.cols;
      for (int r = 0; r < o.warmup; ++r) ctx.gemm(g, cudaStreamLegacy);
      DSTRAIN_CUDA_CHECK(cudaEventRecord(start, cudaStreamLegacy));
      for (int r = 0; r < o.iters; ++r) ctx.gemm(g, cudaStreamLegacy);
      DSTRAIN_CUDA_CHECK(cudaEventRecord(stop, cudaStreamLegacy));
      DSTRAIN_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms_total = 0.0f;
      DSTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms_total, start, stop));
      const double ms = static_cast<double>(ms_total) / o.iters;
      const double tflops = 2.0 * static_cast<double>(s.rows) * static_cast<double>(s.cols) * static_cast<double>(s.k) / (ms * 1e-3) / 1e12;
      best = std::max(best, tflops);
      std::printf("%-42s %7lld %7lld %7lld %10.3f %10.1f\n", s.name.c_str(), static_cast<long long>(s.rows), static_cast<long long>(s.cols),
                  static_cast<long long>(s.k), ms, tflops);
      json += fmt::format(R"({}{{"name": "{}", "m": {}, "n": {}, "k": {}, "ms": {:.4f}, "tflops": {:.2f}}})", i == 0 ? "" : ", ", s.name, s.rows,
                          s.cols, s.k, ms, tflops);
    }
    json += fmt::format(R"(], "best_tflops": {:.2f}}})", best);
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    std::printf("best: %.1f TFLOP/s (H100 SXM datasheet dense bf16: 989.4 TFLOP/s)\n%s\n", best, json.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_peak: %s\n", e.what());
    return 1;
  }
}
