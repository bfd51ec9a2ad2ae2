// GEMM throughput on the CPU, GFLOP/s (2 per multiply-add), for the three paths a dstrain matmul
// can take: fp32 storage (OpenBLAS cblas_sgemm), bf16 through oneDNN's bf16 matmul primitive, and
// bf16 widened tile by tile to fp32 for sgemm (ops/cpu/cpu_bf16_gemm.h) — each timed through
// matmul_forward / matmul_backward, so what is measured is what training runs.
//
// Shapes: large squares (2048, 3072), and GPT-2 d12's linear layers at BT = 4·256 = 1024 rows
// (qkv 768→2304, attention projection 768→768, fc 768→3072, fc projection 3072→768, LM head
// 768→50304): the forward GEMM (BT, C)·(OC, C)ᵀ and the weight gradient (BT, OC)ᵀ·(BT, C).
// Each is run on every thread count given (OpenMP for oneDNN and our loops, OpenBLAS's own count
// for sgemm). Best of the repetitions within --min-time seconds (at least 3).
//
// The last line is a JSON object for programs: the largest thread count given, and the best
// GFLOP/s of each path over the shapes at that count ("bf16_gflops" is the path bf16 matmuls take
// by default here, named in "bf16_path"). Never asserts.
//
// Runs under OMP_WAIT_POLICY=passive, as `dstrain` does (tools/main.cpp; re-executed with it unless
// the variable is set): with libgomp's default spinning, the widened path's OpenMP threads steal
// the cores OpenBLAS's sgemm threads compute on.
//
// Usage: bench_gemm_peak_cpu [--threads 1,2] [--min-time 0.5] [--only squares|gpt2]
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ops/cpu/cpu_bf16_gemm.h"
#include "ops/dtype.h"
#include "ops/kernels/matmul.h"
#include "ops/tensor.h"

// OpenBLAS's own thread count (libopenblas, linked through dstrain_ops_cpu); declared here because
// the cblas.h on the include path may be another BLAS's.
extern "C" void openblas_set_num_threads(int num_threads);

using namespace dstrain;

namespace {

struct HostBuf {
  std::vector<unsigned char> bytes;
  DType dtype;
  HostBuf(DType t, std::int64_t n, std::mt19937& rng) : bytes(static_cast<std::size_t>(n) * dtype_size(t)), dtype(t) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> tmp(static_cast<std::size_t>(n));
    for (float& x : tmp) x = d(rng);
    convert(tmp.data(), DType::fp32, bytes.data(), t, static_cast<std::size_t>(n));
  }
  Tensor t(Shape s) { return Tensor(bytes.data(), dtype, s); }
};

struct Case {
  std::string name;
  bool weight_grad;  // false: out (M, N) = inp (M, K) · w (N, K)ᵀ;  true: dw (OC, C) += dout (BT, OC)ᵀ · inp (BT, C)
  std::int64_t BT, C, OC;
  double flop() const { return 2.0 * static_cast<double>(BT) * static_cast<double>(C) * static_cast<double>(OC); }
};

std::vector<Case> cases(const std::string& only) {
  std::vector<Case> out;
  if (only.empty() || only == "squares") {
    for (std::int64_t n : {2048, 3072}) out.push_back({"square " + std::to_string(n), false, n, n, n});
  }
  if (only.empty() || only == "gpt2") {
    constexpr std::int64_t BT = 1024;
    const struct {
      const char* name;
      std::int64_t C, OC;
    } layers[] = {{"qkv 768->2304", 768, 2304}, {"proj 768->768", 768, 768}, {"fc 768->3072", 768, 3072}, {"fcproj 3072->768", 3072, 768},
                  {"lm head 768->50304", 768, 50304}};
    for (const auto& l : layers) {
      out.push_back({std::string(l.name) + " fwd", false, BT, l.C, l.OC});
      out.push_back({std::string(l.name) + " dW", true, BT, l.C, l.OC});
    }
  }
  return out;
}

// Seconds per call: the best of the repetitions that fit in min_time (at least 3, after a warm-up).
template <typename Fn>
double time_best(Fn&& fn, double min_time) {
  fn();
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_time; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

// GFLOP/s of one case in storage dtype `dt` on the current bf16 path.
double run_case(const Case& c, DType dt, double min_time) {
  std::mt19937 rng(1234);
  HostBuf inp(dt, c.BT * c.C, rng), w(dt, c.OC * c.C, rng);
  const std::size_t scratch_n = matmul_scratch_elems(dt, c.C);
  std::vector<float> scratch(scratch_n);
  const Tensor sc = scratch_n ? Tensor(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch_n)}) : Tensor();
  double s = 0;
  if (!c.weight_grad) {
    HostBuf out(dt, c.BT * c.OC, rng);
    s = time_best([&] { matmul_forward(out.t({c.BT, c.OC}), inp.t({c.BT, c.C}), w.t({c.OC, c.C}), Tensor(), sc); }, min_time);
  } else {
    HostBuf dout(dt, c.BT * c.OC, rng), dw(dt, c.OC * c.C, rng);
    s = time_best(
        [&] { matmul_backward(Tensor(), dw.t({c.OC, c.C}), Tensor(), dout.t({c.BT, c.OC}), inp.t({c.BT, c.C}), w.t({c.OC, c.C}), sc); },
        min_time);
  }
  return c.flop() / s / 1e9;
}

// As tools/main.cpp: libgomp reads OMP_WAIT_POLICY when it loads, so run again with it set.
void prefer_passive_openmp_threads(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  std::vector<char> self(4096);
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0 || static_cast<std::size_t>(n) >= self.size() - 1) return;
  self[static_cast<std::size_t>(n)] = '\0';
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv(self.data(), argv);  // returns only on failure: go on with the default policy
}

std::vector<int> parse_threads(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int n = std::atoi(item.c_str());
    if (n > 0) out.push_back(n);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_openmp_threads(argv);
  std::vector<int> threads = {omp_get_max_threads()};
  double min_time = 0.5;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = parse_threads(argv[++i]);
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--threads 1,2] [--min-time 0.5] [--only squares|gpt2]\n", argv[0]);
      return 2;
    }
  }
  if (threads.empty()) threads = {omp_get_max_threads()};

  const CpuBf16Gemm default_path = cpu_bf16_gemm();
  const std::string default_name = cpu_bf16_gemm_path();
  const bool onednn = cpu_bf16_gemm_supported(CpuBf16Gemm::onednn);
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  std::printf("bf16 matmuls here: %s; OMP_WAIT_POLICY=%s\n", default_name.c_str(), wait ? wait : "(unset)");
  std::printf("%-40s %7s %12s %12s %12s %8s\n", "shape (BT x C x OC)", "threads", "fp32 sgemm", "bf16 onednn", "bf16 widened", "speedup");

  struct Best {
    double fp32 = 0, onednn = 0, widened = 0;
  };
  std::map<int, Best> best;
  for (const int n : threads) {
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    Best& b = best[n];
    for (const Case& c : cases(only)) {
      const double f32 = run_case(c, DType::fp32, min_time);
      double on = 0;
      if (onednn) {
        set_cpu_bf16_gemm(CpuBf16Gemm::onednn);
        on = run_case(c, DType::bf16, min_time);
      }
      set_cpu_bf16_gemm(CpuBf16Gemm::widened);
      const double wide = run_case(c, DType::bf16, min_time);
      set_cpu_bf16_gemm(default_path);
      b.fp32 = std::max(b.fp32, f32);
      b.onednn = std::max(b.onednn, on);
      b.widened = std::max(b.widened, wide);
      const std::string shape = c.name + " " + std::to_string(c.BT) + "x" + std::to_string(c.C) + "x" + std::to_string(c.OC);
      char on_s[32] = "n/a", sp_s[32] = "n/a";
      if (onednn) {
        std::snprintf(on_s, sizeof on_s, "%.1f", on);
        std::snprintf(sp_s, sizeof sp_s, "%.2fx", on / f32);
      }
      std::printf("%-40s %7d %12.1f %12s %12.1f %8s\n", shape.c_str(), n, f32, on_s, wide, sp_s);
      std::fflush(stdout);
    }
  }
  const int top = *std::max_element(threads.begin(), threads.end());
  const Best& b = best[top];
  const double bf16_default = default_path == CpuBf16Gemm::onednn ? b.onednn : b.widened;
  std::printf("{\"threads\": %d, \"fp32_gflops\": %.1f, \"bf16_gflops\": %.1f, \"bf16_onednn_gflops\": %.1f, \"bf16_widened_gflops\": %.1f, \"bf16_path\": \"%s\"}\n",
              top, b.fp32, bf16_default, b.onednn, b.widened, default_name.c_str());
  return 0;
}
