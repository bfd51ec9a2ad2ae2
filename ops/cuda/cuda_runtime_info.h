// What CUDA this build has and what the machine offers: runtime, driver, GPUs, cuBLASLt, NCCL.
//
// cuda_info() never throws and needs no GPU: on a machine without a driver it reports
// driver_version 0 and problem "no CUDA driver found", so `dstrain --version` and CI can print it.
// require_cuda_device() is the gate before using a GPU: it throws an Error that names the fix.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dstrain {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;              // "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;      // compute capability
  std::size_t total_memory = 0;  // bytes
  int multiprocessors = 0;
};

struct CudaInfo {
  int compiled_runtime_version = 0;  // CUDART_VERSION of the headers: 1000*major + 10*minor (13000)
  int runtime_version = 0;           // cudaRuntimeGetVersion: the libcudart actually loaded
  int driver_version = 0;            // cudaDriverGetVersion: the newest CUDA the driver supports; 0 = no driver
  std::size_t cublaslt_version = 0;  // cublasLtGetVersion: 10000*major + 100*minor + patch
  int nccl_version = 0;              // ncclGetVersion: 10000*major + 100*minor + patch (0 if it failed)
  std::vector<CudaDeviceInfo> devices;
  std::string problem;  // why no GPU can be used ("no CUDA driver found", ...); empty if devices exist

  bool has_driver() const { return driver_version > 0; }
};

CudaInfo cuda_info();

// Multi-line, human-readable:
//   CUDA runtime 13.0 (built with 13.0), driver: no CUDA driver found
//   cuBLASLt 13.0.0, NCCL 2.28.9
//   GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0, 79.19 GiB, 132 SMs
std::string format_cuda_info(const CudaInfo& info);

// "13.0" from 13000; "2.28.9" from 22809; "13.0.2" from 130002.
std::string format_cuda_version(int version);
std::string format_library_version(std::size_t version);

// Throws Error when GPU `ordinal` cannot be used: no driver, a driver older than the runtime, no
// visible GPU, or an ordinal out of range. Each message says what to do.
void require_cuda_device(int ordinal);

}  // namespace dstrain
