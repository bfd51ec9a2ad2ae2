// How close the CPU AdamW step (the kernel optimizer offload runs, ops/kernels/adamw.h) comes to
// this machine's memory bandwidth. The step is memory-bound: a handful of flops per element
// against 28 bytes moved, so the yardstick is a STREAM-style triad, a[i] = b[i] + s·c[i], over
// arrays far larger than the caches, on the same OpenMP threads in the same contiguous per-thread
// blocks as the optimizer (ops/cpu/isa_dispatch.h's for_each_block). Best of N, as STREAM reports.
//
// Bytes counted as STREAM counts them: what the loop reads and writes, no write-allocate traffic.
//   triad:  3 arrays · 4 B (fp32)                                   = 12 B per element
//   AdamW:  θ, m, v fp32 read + write (24 B), the gradient read (4 B fp32 or 2 B fp16/bf16),
//           and the 16-bit copy of θ written (2 B) when there is one   = 28 or 30 B per parameter
// The offload path (zero/model_states.cpp) runs mixed precision with 16-bit gradients and writes
// the 16-bit copy in the same pass: 8 + 2 + 8 + 8 + 2 = 28 B.
//
// Usage: bench_cpu_optimizer [--mparams N (default 64)] [--repeats N (default 10)] [--json]
// Threads: OMP_NUM_THREADS, as for training. Never asserts. Figures: docs/offload.md §8.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/dtype.h"
#include "ops/kernels/adamw.h"
#include "ops/kernels/cpu_isa.h"
#include "ops/tensor.h"

using namespace dstrain;

namespace {

// 64-byte aligned, first touched by the thread that will use each block (first-touch NUMA
// placement, as STREAM initialises in parallel).
struct Array {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> mem;
  std::int64_t n = 0;
  std::size_t elem = 0;
  Array(std::int64_t count, std::size_t elem_bytes) : n(count), elem(elem_bytes) {
    const std::size_t bytes = (static_cast<std::size_t>(count) * elem_bytes + 63) / 64 * 64;
    mem.reset(std::aligned_alloc(64, bytes));
    if (!mem) throw std::bad_alloc();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(mem.get());
  }
};

// fn(begin, end) on every OpenMP thread, one contiguous 64-aligned block each: the optimizer's split.
void for_each_thread_block(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
#pragma omp parallel
  {
    const auto threads = static_cast<std::int64_t>(omp_get_num_threads());
    const auto t = static_cast<std::int64_t>(omp_get_thread_num());
    const std::int64_t per = ((n + threads - 1) / threads + 63) / 64 * 64;
    const std::int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) fn(lo, hi);
  }
}

template <typename Fn>
double best_seconds(int repeats, Fn&& fn) {
  fn();  // warm: page faults, thread start-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct Row {
  std::string name;
  double bytes_per_elem;
  double seconds;
  std::int64_t n;
  double gbs() const { return bytes_per_elem * static_cast<double>(n) / seconds / 1e9; }
  double per_s() const { return static_cast<double>(n) / seconds; }
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t mparams = 64;
  int repeats = 10;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mparams" && i + 1 < argc) {
      mparams = std::atoll(argv[++i]);
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: bench_cpu_optimizer [--mparams N] [--repeats N] [--json]\n");
      return 2;
    }
  }
  const std::int64_t n = mparams * 1000 * 1000;
  const int threads = omp_get_max_threads();

  // The triad: 3 × 4n bytes (768 MB at the default), far beyond any last-level cache.
  Array a(n, 4), b(n, 4), c(n, 4);
  for_each_thread_block(n, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      a.as<float>()[i] = 0.0f;
      b.as<float>()[i] = 1.0f;
      c.as<float>()[i] = 2.0f;
    }
  });
  const float s = 3.0f;
  const double triad_s = best_seconds(repeats, [&] {
    for_each_thread_block(n, [&](std::int64_t lo, std::int64_t hi) {
      float* __restrict pa = a.as<float>();
      const float* __restrict pb = b.as<float>();
      const float* __restrict pc = c.as<float>();
      for (std::int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
    });
  });
  const Row triad{"triad a = b + s*c", 12.0, triad_s, n};
  // In place, a[i] += s·b[i]: every line written was read first, as AdamW's θ, m and v are, so no
  // write-allocate traffic beyond the counted bytes. The triad's a is written without being read:
  // the cache reads each of its lines before writing it (16 B moved per 12 counted).
  const double axpy_s = best_seconds(repeats, [&] {
    for_each_thread_block(n, [&](std::int64_t lo, std::int64_t hi) {
      float* __restrict pa = a.as<float>();
      const float* __restrict pb = b.as<float>();
      for (std::int64_t i = lo; i < hi; ++i) pa[i] += s * pb[i];
    });
  });
  const Row axpy{"in place a += s*b (reference)", 12.0, axpy_s, n};
  a.mem.reset();
  b.mem.reset();
  c.mem.reset();

  // AdamW on n parameters, for the gradient / 16-bit copy combinations training uses.
  struct Case {
    const char* name;
    DType grad;
    DType lowp;  // fp32: no 16-bit copy
  };
  const Case cases[] = {
      {"adamw fp32 grads, no copy (fp32 training)", DType::fp32, DType::fp32},
      {"adamw bf16 grads + bf16 copy (offload, bf16)", DType::bf16, DType::bf16},
      {"adamw fp16 grads + fp16 copy (offload, fp16)", DType::fp16, DType::fp16},
  };
  std::vector<Row> rows{triad, axpy};
  for (const Case& k : cases) {
    Array p(n, 4), m(n, 4), v(n, 4), g(n, dtype_size(k.grad));
    const bool copy = k.lowp != DType::fp32;
    Array lowp(copy ? n : 1, 2);
    for_each_thread_block(n, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        p.as<float>()[i] = 0.01f * static_cast<float>(i % 97);
        m.as<float>()[i] = 0.0f;
        v.as<float>()[i] = 0.0f;
      }
      std::memset(g.as<unsigned char>() + lo * static_cast<std::int64_t>(g.elem), 0x3c, static_cast<std::size_t>(hi - lo) * g.elem);
      if (copy) std::memset(lowp.as<unsigned char>() + lo * 2, 0, static_cast<std::size_t>(hi - lo) * 2);
    });
    const Shape sh{n};
    AdamWConfig cfg;
    cfg.weight_decay = 0.01f;
    const Tensor tp(p.mem.get(), DType::fp32, sh), tm(m.mem.get(), DType::fp32, sh), tv(v.mem.get(), DType::fp32, sh), tg(g.mem.get(), k.grad, sh);
    const Tensor tl = copy ? Tensor(lowp.mem.get(), k.lowp, sh) : Tensor{};
    const double sec = best_seconds(repeats, [&] {
      adamw_update(tp, tg, tm, tv, tl, cfg);
      ++cfg.step;
    });
    rows.push_back(Row{k.name, 24.0 + static_cast<double>(dtype_size(k.grad)) + (copy ? 2.0 : 0.0), sec, n});
  }

  const double triad_gbs = triad.gbs();
  if (json) {
    nlohmann::json j;
    j["threads"] = threads;
    j["isa"] = std::string(cpu_isa_name(cpu_isa()));
    j["elements"] = n;
    j["repeats"] = repeats;
    j["triad_gb_per_s"] = triad_gbs;
    j["in_place_gb_per_s"] = axpy.gbs();
    nlohmann::json arr = nlohmann::json::array();
    for (std::size_t i = 2; i < rows.size(); ++i) {
      arr.push_back({{"case", rows[i].name},
                     {"bytes_per_param", rows[i].bytes_per_elem},
                     {"params_per_s", rows[i].per_s()},
                     {"gb_per_s", rows[i].gbs()},
                     {"fraction_of_triad", rows[i].gbs() / triad_gbs},
                     {"fraction_of_in_place", rows[i].gbs() / axpy.gbs()}});
    }
    j["adamw"] = arr;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s", fmt::format("{} threads, ISA {}, {} elements per array, best of {}\n", threads, cpu_isa_name(cpu_isa()), n, repeats).c_str());
  std::printf("%s",
              fmt::format("{:<46} {:>6} {:>10} {:>12} {:>8} {:>9} {:>9}\n", "", "B/elem", "ms", "Melem/s", "GB/s", "of triad", "in place").c_str());
  for (const Row& r : rows) {
    std::printf("%s", fmt::format("{:<46} {:>6.0f} {:>10.2f} {:>12.1f} {:>8.2f} {:>8.0f}% {:>8.0f}%\n", r.name, r.bytes_per_elem, r.seconds * 1e3,
                                  r.per_s() / 1e6, r.gbs(), 100.0 * r.gbs() / triad_gbs, 100.0 * r.gbs() / axpy.gbs())
                          .c_str());
  }
  return 0;
}
