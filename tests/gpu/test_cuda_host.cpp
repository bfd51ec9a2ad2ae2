// The host side of the CUDA backend, on any machine (CI has nvcc but no GPU and no driver):
// cuda_info() must not throw and must report consistent values; status checks must produce
// Errors that name the call, the place and the status; argument checks fire before any GPU work.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "ops/cuda/cast.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_runtime_info.h"
#include "ops/cuda/device_allocator.h"
#include "ops/error.h"

using namespace dstrain;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Returns a status through a function, as a real call would.
template <typename T>
T returns(T status) {
  return status;
}

}  // namespace

TEST(CudaInfo, DoesNotThrowAndIsConsistent) {
  CudaInfo info;
  ASSERT_NO_THROW(info = cuda_info());
  EXPECT_EQ(info.compiled_runtime_version, CUDART_VERSION);
  EXPECT_EQ(info.runtime_version / 1000, CUDART_VERSION / 1000) << "libcudart of another major version loaded";
  EXPECT_EQ(info.cublaslt_version / 10000, static_cast<std::size_t>(CUBLAS_VER_MAJOR));
  EXPECT_EQ(info.nccl_version / 10000, NCCL_MAJOR);
  EXPECT_GE(info.driver_version, 0);
  const std::string text = format_cuda_info(info);
  std::printf("%s", text.c_str());  // for the test log: what this machine has
  EXPECT_TRUE(contains(text, "CUDA runtime " + format_cuda_version(info.runtime_version))) << text;
  if (!info.has_driver()) {
    EXPECT_TRUE(info.devices.empty());
    EXPECT_EQ(info.problem, "no CUDA driver found");
    EXPECT_TRUE(contains(text, "driver: no CUDA driver found")) << text;
  } else if (info.devices.empty()) {
    EXPECT_FALSE(info.problem.empty());  // a driver but no GPU: it must say why
  } else {
    EXPECT_TRUE(info.problem.empty()) << info.problem;
    for (std::size_t i = 0; i < info.devices.size(); ++i) {
      const CudaDeviceInfo& d = info.devices[i];
      EXPECT_EQ(d.ordinal, static_cast<int>(i));
      EXPECT_FALSE(d.name.empty());
      EXPECT_GE(d.major * 10 + d.minor, 75) << "CUDA 13 supports compute capability 7.5 and newer only";
      EXPECT_GT(d.total_memory, 0u);
      EXPECT_GT(d.multiprocessors, 0);
      EXPECT_TRUE(contains(text, "GPU " + std::to_string(i) + ": " + d.name)) << text;
    }
  }
}

TEST(CudaInfo, Versions) {
  EXPECT_EQ(format_cuda_version(13000), "13.0");
  EXPECT_EQ(format_cuda_version(12040), "12.4");
  EXPECT_EQ(format_cuda_version(11080), "11.8");
  EXPECT_EQ(format_library_version(22809), "2.28.9");
  EXPECT_EQ(format_library_version(130002), "13.0.2");
  EXPECT_EQ(format_library_version(120903), "12.9.3");
}

TEST(CudaInfo, FormatKnownInfo) {
  CudaInfo info;
  info.compiled_runtime_version = 13000;
  info.runtime_version = 13000;
  info.driver_version = 13010;
  info.cublaslt_version = 130002;
  info.nccl_version = 22809;
  info.devices.push_back(CudaDeviceInfo{0, "NVIDIA H100 80GB HBM3", 9, 0, std::size_t{80} << 30, 132});
  EXPECT_EQ(format_cuda_info(info),
            "CUDA runtime 13.0 (built with 13.0), driver: CUDA 13.1\n"
            "cuBLASLt 13.0.2, NCCL 2.28.9\n"
            "GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0, 80.00 GiB, 132 SMs\n");
  CudaInfo none;
  none.compiled_runtime_version = none.runtime_version = 13000;
  none.problem = "no CUDA driver found";
  EXPECT_EQ(format_cuda_info(none), "CUDA runtime 13.0 (built with 13.0), driver: no CUDA driver found\ncuBLASLt 0.0.0, NCCL unavailable\n");
}

TEST(CudaInfo, RequireCudaDeviceNamesTheFix) {
  const CudaInfo info = cuda_info();
  const int count = static_cast<int>(info.devices.size());
  for (int bad : {-1, count, count + 7}) {
    try {
      require_cuda_device(bad);
      ADD_FAILURE() << "cuda:" << bad << " accepted with " << count << " GPUs";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "cuda:" + std::to_string(bad) + " requested")) << msg;
      EXPECT_TRUE(contains(msg, "Fix:")) << msg;
      if (!info.has_driver()) {
        EXPECT_TRUE(contains(msg, "no CUDA driver found") && contains(msg, "install")) << msg;
      }
    }
  }
  if (count == 0) {
    EXPECT_THROW(require_cuda_device(0), Error);
    EXPECT_THROW(CudaAllocator{0}, Error);  // constructing an allocator for a missing GPU says why
  } else {
    EXPECT_NO_THROW(require_cuda_device(count - 1));
  }
}

TEST(CudaCheck, CudaErrorNamesCallPlaceAndStatus) {
  EXPECT_NO_THROW(DSTRAIN_CUDA_CHECK(returns(cudaSuccess)));
  const int line = __LINE__ + 2;
  try {
    DSTRAIN_CUDA_CHECK(returns(cudaErrorInvalidValue));
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "returns(cudaErrorInvalidValue)")) << msg;
    EXPECT_TRUE(contains(msg, "test_cuda_host.cpp:" + std::to_string(line))) << msg;
    EXPECT_TRUE(contains(msg, "cudaErrorInvalidValue (invalid argument)")) << msg;
  }
  try {
    DSTRAIN_CUDA_CHECK(returns(cudaErrorInsufficientDriver));
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "update the NVIDIA driver")) << e.what();
  }
  // Nothing stale left behind. Without a driver every runtime call, cudaGetLastError included,
  // reports the failed initialisation, so this is checkable only where a driver exists.
  if (cuda_info().has_driver()) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

TEST(CudaCheck, CublasAndNcclErrors) {
  EXPECT_NO_THROW(DSTRAIN_CUBLAS_CHECK(returns(CUBLAS_STATUS_SUCCESS)));
  EXPECT_NO_THROW(DSTRAIN_NCCL_CHECK(returns(ncclSuccess)));
  try {
    DSTRAIN_CUBLAS_CHECK(returns(CUBLAS_STATUS_NOT_SUPPORTED));
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "cuBLAS call returns(CUBLAS_STATUS_NOT_SUPPORTED) failed at")) << msg;
    EXPECT_TRUE(contains(msg, "test_cuda_host.cpp:")) << msg;
    EXPECT_TRUE(contains(msg, ": CUBLAS_STATUS_NOT_SUPPORTED (")) << msg;
  }
  try {
    DSTRAIN_NCCL_CHECK(returns(ncclInvalidArgument));
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "NCCL call returns(ncclInvalidArgument) failed at")) << msg;
    EXPECT_TRUE(contains(msg, "invalid argument")) << msg;
    EXPECT_TRUE(contains(msg, "(status 4)")) << msg;
  }
}

// Argument checks happen before any CUDA call, so they hold without a GPU.
TEST(CudaConvert, RejectsBadArgumentsWithoutTouchingTheGpu) {
  EXPECT_NO_THROW(cuda_convert(nullptr, DType::fp32, nullptr, DType::bf16, 0, nullptr));
  EXPECT_THROW(cuda_convert(nullptr, DType::fp32, nullptr, DType::bf16, 5, nullptr), Error);
  try {
    cuda_convert(nullptr, DType::int32, nullptr, DType::fp32, 5, nullptr);
    ADD_FAILURE() << "int32 accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "int32 -> fp32")) << e.what();
  }
  EXPECT_THROW(cuda_convert(nullptr, DType::fp16, nullptr, DType::uint16, 5, nullptr), Error);
}
