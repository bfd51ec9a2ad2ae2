#include "ops/cuda/cuda_runtime_info.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/memory_stats.h"

namespace dstrain {

namespace {

// Why cudaGetDeviceCount failed, in words with the fix.
std::string device_count_problem(cudaError_t status, const CudaInfo& info) {
  switch (status) {
    case cudaErrorInsufficientDriver:
      return fmt::format(
          "the NVIDIA driver (CUDA {}) is older than the CUDA {} runtime dstrain was built with. Fix: "
          "update the NVIDIA driver",
          format_cuda_version(info.driver_version), format_cuda_version(info.runtime_version));
    case cudaErrorNoDevice:
      return "no CUDA GPU visible. Fix: check that nvidia-smi lists a GPU and that CUDA_VISIBLE_DEVICES does not hide it";
    default:
      return fmt::format("cudaGetDeviceCount failed: {} ({}). Fix: check the driver with nvidia-smi", cudaGetErrorName(status),
                         cudaGetErrorString(status));
  }
}

}  // namespace

std::string format_cuda_version(int version) { return fmt::format("{}.{}", version / 1000, (version % 1000) / 10); }

std::string format_library_version(std::size_t version) { return fmt::format("{}.{}.{}", version / 10000, (version / 100) % 100, version % 100); }

CudaInfo cuda_info() {
  CudaInfo info;
  info.compiled_runtime_version = CUDART_VERSION;
  // None of these need a driver; failures leave the field at 0 rather than throwing.
  if (cudaRuntimeGetVersion(&info.runtime_version) != cudaSuccess) info.runtime_version = 0;
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  info.cublaslt_version = cublasLtGetVersion();
  if (ncclGetVersion(&info.nccl_version) != ncclSuccess) info.nccl_version = 0;
  (void)cudaGetLastError();

  if (info.driver_version == 0) {
    info.problem = "no CUDA driver found";
    return info;
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    info.problem = device_count_problem(status == cudaSuccess ? cudaErrorNoDevice : status, info);
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      info.devices.push_back(CudaDeviceInfo{i, "(properties unavailable)", 0, 0, 0, 0});
      continue;
    }
    info.devices.push_back(CudaDeviceInfo{i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  return info;
}

std::string format_cuda_info(const CudaInfo& info) {
  std::string out =
      fmt::format("CUDA runtime {} (built with {}), driver: {}\n", format_cuda_version(info.runtime_version),
                  format_cuda_version(info.compiled_runtime_version),
                  info.has_driver() ? fmt::format("CUDA {}", format_cuda_version(info.driver_version)) : std::string("no CUDA driver found"));
  out += fmt::format("cuBLASLt {}, NCCL {}\n", format_library_version(info.cublaslt_version),
                     info.nccl_version > 0 ? format_library_version(static_cast<std::size_t>(info.nccl_version)) : std::string("unavailable"));
  for (const CudaDeviceInfo& d : info.devices) {
    out += fmt::format("GPU {}: {}, compute capability {}.{}, {}, {} SMs\n", d.ordinal, d.name, d.major, d.minor, format_bytes(d.total_memory),
                       d.multiprocessors);
  }
  if (info.has_driver() && !info.problem.empty()) out += fmt::format("GPUs: {}\n", info.problem);
  return out;
}

void require_cuda_device(int ordinal) {
  const CudaInfo info = cuda_info();
  if (!info.has_driver()) {
    fail(
        "cuda:{} requested but no CUDA driver found: this dstrain was built with CUDA {}, which needs an NVIDIA "
        "driver for CUDA {}.0 or newer. Fix: install the NVIDIA driver (nvidia-smi must work), or run on the CPU "
        "(device cpu)",
        ordinal, format_cuda_version(info.compiled_runtime_version), info.compiled_runtime_version / 1000);
  }
  // CUDA's minor-version compatibility lets a driver run any runtime of its own major version.
  if (info.driver_version / 1000 < info.runtime_version / 1000) {
    fail(
        "cuda:{} requested but the NVIDIA driver supports CUDA {} only, older than the CUDA {} runtime dstrain uses. "
        "Fix: update the NVIDIA driver to one for CUDA {}.0 or newer",
        ordinal, format_cuda_version(info.driver_version), format_cuda_version(info.runtime_version), info.runtime_version / 1000);
  }
  if (info.devices.empty()) fail("cuda:{} requested but {}", ordinal, info.problem);
  const int count = static_cast<int>(info.devices.size());
  if (ordinal < 0 || ordinal >= count) {
    fail(
        "cuda:{} requested but only {} GPU{} visible (cuda:0{}). Fix: use one of those ordinals; "
        "CUDA_VISIBLE_DEVICES renumbers the GPUs it lists from 0",
        ordinal, count, count == 1 ? " is" : "s are", count == 1 ? std::string() : fmt::format(" .. cuda:{}", count - 1));
  }
}

}  // namespace dstrain
