// The bf16 GEMM path of the CPU matmuls (ops/cpu/cpu_bf16_gemm.h): the choice, and the oneDNN
// matmul primitives.
//
// oneDNN objects: one CPU engine for the process; a stream per calling thread (the local backend
// runs ranks as threads, and a stream is not meant to be shared between threads); a primitive per
// (shape, transposes, bias, accumulate, OpenMP thread count), built on first use and kept in a map
// under a mutex — building one costs far more than a small GEMM. A primitive is immutable, so two
// threads may execute the same one at once with their own memory objects; its scratchpad is ours
// (scratchpad_mode::user), a buffer per calling thread, so no state is shared by concurrent calls.
// The thread count is in the key because oneDNN's OpenMP build fixes a primitive's work split (and
// the number of threads it asks for) when the primitive is created.
#include "ops/cpu/cpu_bf16_gemm.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ops/error.h"
#include "ops/log.h"

#ifdef DSTRAIN_HAS_ONEDNN
#include <omp.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace dstrain {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_path{kUnset};
std::atomic<bool> g_path_set_by_call{false};
std::once_flag g_decided;

bool env_forces_widened() {
  const char* env = std::getenv("DSTRAIN_CPU_BF16_GEMM");
  if (env == nullptr || *env == '\0') return false;
  const std::string v(env);
  if (v == "0") return true;
  if (v == "1") return false;
  fail(
      "DSTRAIN_CPU_BF16_GEMM={}: use 0 (bf16 matmuls widen to fp32 and run OpenBLAS sgemm) or 1 (oneDNN's bf16 matmul where the CPU has bf16 "
      "dot products; the default)",
      v);
}

#ifdef DSTRAIN_HAS_ONEDNN

// The name of oneDNN's effective ISA when it has bf16 dot products, else empty.
std::string_view onednn_bf16_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return {};
  }
}

const char* status_name(dnnl_status_t s) {
  switch (s) {
    case dnnl_success:
      return "success";
    case dnnl_out_of_memory:
      return "out_of_memory";
    case dnnl_invalid_arguments:
      return "invalid_arguments";
    case dnnl_unimplemented:
      return "unimplemented";
    case dnnl_iterator_ends:
      return "iterator_ends";
    case dnnl_runtime_error:
      return "runtime_error";
    case dnnl_not_required:
      return "not_required";
    default:
      return "unknown status";
  }
}

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

// (M, N, K, trans_a, trans_b, bias, accumulate, OpenMP threads)
using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool, bool, bool, bool, int>;

struct Prim {
  dnnl::memory::desc a, b, bias, c, scratch;
  dnnl::matmul matmul;
};

struct State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<Key, std::shared_ptr<const Prim>> prims;
};

State& state() {
  static State s;
  return s;
}

// Beyond this many shapes the map is emptied (a run uses a few dozen; this only bounds a caller
// that sweeps shapes, e.g. a benchmark, or a run whose batch rows vary step to step).
constexpr std::size_t kMaxPrims = 512;

std::shared_ptr<const Prim> prim_for(State& st, const Key& key) {
  // One lock over lookup and creation: creating a primitive is rare (once per shape) but touches
  // oneDNN's global state (its primitive cache, its JIT), which Debian's libdnnl synchronises in ways
  // a ThreadSanitizer build cannot see; serialising creation here makes that order dstrain's own.
  std::lock_guard<std::mutex> lock(st.mu);
  if (auto it = st.prims.find(key); it != st.prims.end()) return it->second;
  const auto [M, N, K, ta, tb, has_bias, acc, threads] = key;
  (void)threads;
  auto p = std::make_shared<Prim>();
  // Row-major strides; a transposed operand is the same buffer read with swapped strides.
  p->a = dnnl::memory::desc(dims{M, K}, dt::bf16, ta ? dims{1, M} : dims{K, 1});
  p->b = dnnl::memory::desc(dims{K, N}, dt::bf16, tb ? dims{1, K} : dims{N, 1});
  p->c = dnnl::memory::desc(dims{M, N}, dt::bf16, dims{N, 1});
  if (has_bias) p->bias = dnnl::memory::desc(dims{1, N}, dt::bf16, dims{N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (acc) {  // c = round(acc + c_old): the sum post-op reads the bf16 destination, adds in fp32
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::desc d = has_bias ? dnnl::matmul::desc(p->a, p->b, p->bias, p->c) : dnnl::matmul::desc(p->a, p->b, p->c);
  const dnnl::matmul::primitive_desc pd(d, attr, st.engine);
  p->scratch = pd.scratchpad_desc();
  p->matmul = dnnl::matmul(pd);
  if (st.prims.size() >= kMaxPrims) st.prims.clear();
  return st.prims.emplace(key, std::move(p)).first->second;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// The calling thread's scratchpad, grown as needed (64-byte aligned, as oneDNN prefers).
void* thread_scratch(std::size_t bytes) {
  thread_local std::unique_ptr<void, FreeDeleter> buf;
  thread_local std::size_t have = 0;
  if (bytes > have) {
    const std::size_t want = (bytes + 63) / 64 * 64;
    buf.reset();
    have = 0;
    void* p = std::aligned_alloc(64, want);
    if (p == nullptr) fail("oneDNN bf16 matmul: cannot allocate a {}-byte scratchpad", want);
    buf.reset(p);
    have = want;
  }
  return buf.get();
}

#endif  // DSTRAIN_HAS_ONEDNN

CpuBf16Gemm decide() {
  if (env_forces_widened()) return CpuBf16Gemm::widened;
  return cpu_bf16_gemm_supported(CpuBf16Gemm::onednn) ? CpuBf16Gemm::onednn : CpuBf16Gemm::widened;
}

// Why bf16 matmuls are widened: what rules oneDNN out first, else who chose the widened path.
std::string widened_reason() {
#ifndef DSTRAIN_HAS_ONEDNN
  return "built without oneDNN";
#else
  if (onednn_bf16_isa().empty()) return "no bf16 instructions";
  if (g_path_set_by_call.load(std::memory_order_acquire)) return "set_cpu_bf16_gemm";
  return "DSTRAIN_CPU_BF16_GEMM=0";
#endif
}

}  // namespace

std::string_view cpu_bf16_gemm_name(CpuBf16Gemm path) { return path == CpuBf16Gemm::onednn ? "onednn" : "widened"; }

bool cpu_bf16_gemm_supported(CpuBf16Gemm path) {
  if (path == CpuBf16Gemm::widened) return true;
#ifdef DSTRAIN_HAS_ONEDNN
  return !onednn_bf16_isa().empty();
#else
  return false;
#endif
}

CpuBf16Gemm cpu_bf16_gemm() {
  const int now = g_path.load(std::memory_order_acquire);
  if (now != kUnset) return static_cast<CpuBf16Gemm>(now);
  std::call_once(g_decided, [] {
    const CpuBf16Gemm path = decide();
    int expected = kUnset;
    g_path.compare_exchange_strong(expected, static_cast<int>(path), std::memory_order_acq_rel);
    log_info("CPU bf16 matmuls: {}", cpu_bf16_gemm_path());
  });
  return static_cast<CpuBf16Gemm>(g_path.load(std::memory_order_acquire));
}

void set_cpu_bf16_gemm(CpuBf16Gemm path) {
  if (!cpu_bf16_gemm_supported(path)) {
#ifdef DSTRAIN_HAS_ONEDNN
    fail("set_cpu_bf16_gemm(onednn): oneDNN's effective CPU ISA here has no bf16 dot products (avx512_core_bf16 or wider)");
#else
    fail("set_cpu_bf16_gemm(onednn): dstrain was built without oneDNN (CMake option DSTRAIN_ONEDNN, Debian libdnnl-dev)");
#endif
  }
  g_path_set_by_call.store(true, std::memory_order_release);
  g_path.store(static_cast<int>(path), std::memory_order_release);
}

std::string cpu_bf16_gemm_path() {
  const int now = g_path.load(std::memory_order_acquire);
  const CpuBf16Gemm path = now != kUnset ? static_cast<CpuBf16Gemm>(now) : decide();
#ifdef DSTRAIN_HAS_ONEDNN
  if (path == CpuBf16Gemm::onednn) return "onednn " + std::string(onednn_bf16_isa());
#endif
  (void)path;
  return "widened fp32 sgemm (" + widened_reason() + ")";
}

namespace cpu {

void onednn_bf16_gemm(const char* op, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, const bf16_t* a,
                      const bf16_t* b, const bf16_t* bias, bf16_t* c, bool accumulate) {
  if (cpu_bf16_gemm() != CpuBf16Gemm::onednn) fail("{}: the oneDNN bf16 matmul is not the bf16 path here ({})", op, cpu_bf16_gemm_path());
#ifdef DSTRAIN_HAS_ONEDNN
  State& st = state();
  const Key key{M, N, K, trans_a, trans_b, bias != nullptr, accumulate, omp_get_max_threads()};
  try {
    const std::shared_ptr<const Prim> p = prim_for(st, key);
    thread_local dnnl::stream stream(st.engine);
    // oneDNN takes non-const handles; the inputs are only read.
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(p->a, st.engine, const_cast<bf16_t*>(a))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(p->b, st.engine, const_cast<bf16_t*>(b))},
        {DNNL_ARG_DST, dnnl::memory(p->c, st.engine, c)},
    };
    if (const std::size_t bytes = p->scratch.get_size(); bytes > 0) {
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p->scratch, st.engine, thread_scratch(bytes)));
    }
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p->bias, st.engine, const_cast<bf16_t*>(bias)));
    p->matmul.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    fail("{}: oneDNN bf16 matmul (M={}, N={}, K={}{}{}{}{}) failed: status {} ({})", op, M, N, K, trans_a ? ", a transposed" : "",
         trans_b ? ", b transposed" : "", bias ? ", bias" : "", accumulate ? ", accumulate" : "", status_name(e.status), e.what());
  }
#else
  (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)a, (void)b, (void)bias, (void)c, (void)accumulate;
#endif
}

}  // namespace cpu
}  // namespace dstrain
