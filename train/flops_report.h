// The flops profiler's report of a training run (config "flops_profiler"): DeepSpeed's
// print_model_profile at profile_step with the step's measured forward / backward / step times,
// plus MFU against a peak — given, or measured once by one GEMM on the training device.
#pragma once

#include <cstdint>
#include <string>

#include "config_schema/ds_config.h"
#include "ops/device.h"
#include "ops/dtype.h"
#include "models/model_family.h"

namespace dstrain {

// FLOP/s of one n x n x n GEMM through dstrain's matmul kernel on `device`, best of 3: the
// practical peak for MFU when none is given. The CPU: a 1024^3 GEMM in `dtype` through the path
// the layers use (fp32: OpenBLAS's sgemm; bf16 / fp16: ops/cpu/matmul.cpp's). A GPU: a 4096^3 GEMM in `dtype` (the tensor cores for fp16 / bf16) on device memory, each
// run synchronised; a CPU sgemm would make a GPU's MFU meaningless.
double measure_gemm_flops(Device device, DType dtype);
// What measure_gemm_flops(device, dtype) measures, for the start line and the summary:
// "a 1024^3 bf16 GEMM through onednn avx512_core_bf16, measured at start".
std::string gemm_peak_description(Device device, DType dtype);

// The step's times and the model's shape, for the report.
struct FlopsReportInput {
  const Architecture* model = nullptr;  // forward_flops and flops_per_token
  std::int64_t micro_batch = 0, sequence_length = 0, train_batch_size = 0;
  double fwd_ms = 0.0, bwd_ms = 0.0, step_ms = 0.0;
  double peak_flops = 0.0;
  bool peak_measured = false;  // false: from --peak-flops
};

// DeepSpeed's profile text for cfg.flops_profiler.profile_step, then
// "MFU (6N + 6LCT = ... per token, ... tokens/s, against a peak of ...): x.xx%" (llm.c's count,
// Architecture::flops_per_token: L·C·T with C the attention's query width).
std::string flops_report(const config::DsConfig& cfg, const FlopsReportInput& in);

}  // namespace dstrain
