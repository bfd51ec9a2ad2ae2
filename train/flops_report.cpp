#include "train/flops_report.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "train/monitor/flops.h"
#include "train/progress.h"
#include "ops/allocator.h"
#include "ops/error.h"
#include "ops/buffer.h"
#include "ops/dtype.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/tensor.h"

namespace dstrain {

double measure_gemm_flops(Device device, DType dtype) {
  using Clock = std::chrono::steady_clock;
  const bool gpu = !device.is_cpu();
  const std::int64_t n = gpu ? 4096 : 1024;
  const Shape sq{n, n};
  std::vector<float> a, b, c, c_scratch;
  std::unique_ptr<Allocator> alloc;
  Buffer buf;
  Tensor ta, tb, tc, scratch;  // scratch: the fp32 one matmul's contract asks of 16-bit storage (unused on a GPU)
  if (gpu) {
    alloc = make_device_allocator(device);
    const std::size_t bytes = static_cast<std::size_t>(n * n) * dtype_size(dtype);
    const auto scratch_elems = static_cast<std::int64_t>(matmul_scratch_elems(dtype, n));
    buf = Buffer(*alloc, 3 * bytes + static_cast<std::size_t>(scratch_elems) * sizeof(float), MemoryPurpose::buffers);
    ta = buf.tensor(dtype, sq, 0);
    tb = buf.tensor(dtype, sq, bytes);
    tc = buf.tensor(dtype, sq, 2 * bytes);
    if (scratch_elems > 0) scratch = buf.tensor(DType::fp32, Shape{scratch_elems}, 3 * bytes);
    zero_tensor(ta);
    zero_tensor(tb);
    matmul_forward(tc, ta, tb, Tensor{}, scratch);  // warm-up: cuBLASLt's handle and algorithm choice
    synchronize_device(device);
  } else {
    // Host memory in the run's dtype (fp32 words hold the 16-bit elements too), values that are
    // neither zero nor equal (as training's), and the fp32 scratch 16-bit storage asks for.
    const std::size_t elems = static_cast<std::size_t>(n * n);
    const std::size_t words = dtype == DType::fp32 ? elems : (elems + 1) / 2;
    a.resize(words);
    b.resize(words);
    c.resize(words);
    std::vector<float> values(elems);
    for (std::size_t i = 0; i < elems; ++i) values[i] = 0.5f + static_cast<float>(i % 97) / 97.0f;
    convert(values.data(), DType::fp32, a.data(), dtype, elems);
    convert(values.data(), DType::fp32, b.data(), dtype, elems);
    ta = Tensor(a.data(), dtype, sq);
    tb = Tensor(b.data(), dtype, sq);
    tc = Tensor(c.data(), dtype, sq);
    c_scratch.resize(matmul_scratch_elems(dtype, n));
    if (!c_scratch.empty()) scratch = Tensor(c_scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(c_scratch.size())});
    matmul_forward(tc, ta, tb, Tensor{}, scratch);  // warm-up: the BLAS's threads, a library's kernel choice
  }
  double best = 0.0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    matmul_forward(tc, ta, tb, Tensor{}, scratch);
    if (gpu) synchronize_device(device);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.0) best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
  }
  return best;
}

std::string gemm_peak_description(Device device, DType dtype) {
  if (!device.is_cpu()) return fmt::format("a 4096^3 {} GEMM through cuBLASLt on {}, measured at start", dtype_name(dtype), device.str());
  return fmt::format("a 1024^3 {} GEMM through {}, measured at start", dtype_name(dtype),
                     dtype == DType::fp32 ? std::string("OpenBLAS sgemm") : cpu_gemm_path(dtype));
}

std::string flops_report(const config::DsConfig& cfg, const FlopsReportInput& in) {
  DSTRAIN_CHECK(in.model != nullptr, "flops_report: no architecture given");
  const Architecture& g = *in.model;
  const std::int64_t T = in.sequence_length;
  const ModuleFlops tree = g.forward_flops(in.micro_batch, T);
  FlopsProfileInput p;
  p.model = &tree;
  p.profile_step = cfg.flops_profiler.profile_step;
  p.micro_batch_per_gpu = in.micro_batch;
  p.fwd_ms = in.fwd_ms;
  p.bwd_ms = in.bwd_ms;
  p.step_ms = in.step_ms;
  std::string text = format_flops_profile(p, cfg.flops_profiler);
  const double step_s = (in.fwd_ms + in.bwd_ms + in.step_ms) / 1000.0;
  const double tokens_per_s = step_s > 0.0 ? static_cast<double>(in.train_batch_size * T) / step_s : 0.0;
  const double per_token = g.flops_per_token(T);
  text += fmt::format("\nMFU (6N + 6LCT = {} per token, {} tokens/s, against a peak of {}{}): {:.2f}%\n", flops_number_to_string(per_token),
                      format_count(tokens_per_s), flops_flops_to_string(in.peak_flops),
                      in.peak_measured ? " measured by one GEMM on the training device; set --peak-flops" : " from --peak-flops",
                      100.0 * mfu(per_token, tokens_per_s, in.peak_flops));
  return text;
}

}  // namespace dstrain
