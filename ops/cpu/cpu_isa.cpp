#include "ops/kernels/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_isa{kUnset};
std::once_flag g_decided;

CpuIsa from_env_or_detected() {
  const char* env = std::getenv("DSTRAIN_CPU_ISA");
  if (env == nullptr || *env == '\0') return detected_cpu_isa();
  const std::string want(env);
  for (const CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (want != cpu_isa_name(isa)) continue;
    if (!cpu_isa_supported(isa)) {
      fail(
          "DSTRAIN_CPU_ISA={}: this CPU cannot run {} kernels (the widest it supports is {}); unset the variable or choose one it "
          "supports",
          want, want, cpu_isa_name(detected_cpu_isa()));
    }
    return isa;
  }
  fail(
      "DSTRAIN_CPU_ISA={} is not an instruction set of the CPU optimizer kernels; use scalar, avx2 or avx512 (or unset it to detect "
      "the CPU's own)",
      want);
}

}  // namespace

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
      return "scalar";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
      return true;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    // libgcc's CPU model also checks that the OS saves the YMM / ZMM state (XGETBV).
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") != 0;
    case CpuIsa::avx512:
      return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0 && __builtin_cpu_supports("avx512vl") != 0 &&
             __builtin_cpu_supports("avx512dq") != 0;
#else
    case CpuIsa::avx2:
    case CpuIsa::avx512:
      return false;
#endif
  }
  return false;
}

CpuIsa detected_cpu_isa() {
  if (cpu_isa_supported(CpuIsa::avx512)) return CpuIsa::avx512;
  if (cpu_isa_supported(CpuIsa::avx2)) return CpuIsa::avx2;
  return CpuIsa::scalar;
}

CpuIsa cpu_isa() {
  const int now = g_isa.load(std::memory_order_acquire);
  if (now != kUnset) return static_cast<CpuIsa>(now);
  std::call_once(g_decided, [] {
    const CpuIsa isa = from_env_or_detected();
    int expected = kUnset;
    g_isa.compare_exchange_strong(expected, static_cast<int>(isa), std::memory_order_acq_rel);
    log_info("CPU optimizer kernels: {} (detected {}{})", cpu_isa_name(static_cast<CpuIsa>(g_isa.load())), cpu_isa_name(detected_cpu_isa()),
             std::getenv("DSTRAIN_CPU_ISA") != nullptr && *std::getenv("DSTRAIN_CPU_ISA") != '\0' ? ", DSTRAIN_CPU_ISA set" : "");
  });
  return static_cast<CpuIsa>(g_isa.load(std::memory_order_acquire));
}

void set_cpu_isa(CpuIsa isa) {
  if (!cpu_isa_supported(isa)) {
    fail("set_cpu_isa({}): this CPU cannot run {} kernels (the widest it supports is {})", cpu_isa_name(isa), cpu_isa_name(isa),
         cpu_isa_name(detected_cpu_isa()));
  }
  g_isa.store(static_cast<int>(isa), std::memory_order_release);
}

}  // namespace dstrain
