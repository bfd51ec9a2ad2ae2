// Shared by the gpu-labelled tests: skip, with the reason, where no GPU can be used.
#pragma once

#include <gtest/gtest.h>

#include "ops/cuda/cuda_runtime_info.h"

// First statement of every GPU test. cuda_info() never throws, so this is safe without a driver.
#define DSTRAIN_SKIP_WITHOUT_GPU()                                                                                                      \
  do {                                                                                                                                  \
    const ::dstrain::CudaInfo dstrain_info_ = ::dstrain::cuda_info();                                                                   \
    if (dstrain_info_.devices.empty())                                                                                                  \
      GTEST_SKIP() << "no usable CUDA GPU (" << dstrain_info_.problem << "); the gpu-labelled tests need a machine with an NVIDIA GPU"; \
  } while (0)
