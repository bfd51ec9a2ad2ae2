// The flops profiler's summary in the shape of DeepSpeed's (print_model_profile at
// flops_profiler.profile_step), from a model's forward-pass tree (models/module_flops.h, which each
// model family builds: Architecture::forward_flops), and the model-FLOPs formula used for MFU.
//
// Backward is 2× forward (dX and dW of every matmul); a training step is (3 + recompute) × forward,
// with recompute = flops_profiler.recompute_fwd_factor (1.0 with full activation checkpointing).
//
// MFU uses the model-FLOPs formula of llm.c / PaLM appendix B instead, which does not depend on how
// kernels are written: flops per token = 6·N + 6·L·C·T (N parameters as stored, the attention term
// counting the causal half of QKᵀ and AV, fwd + bwd; Architecture::flops_per_token).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_schema/monitor_config.h"
#include "models/module_flops.h"

namespace dstrain {

// llm.c / PaLM: 6·N + 6·L·C·T.
double model_flops_per_token(std::int64_t num_parameters, std::int64_t layers, std::int64_t channels, std::int64_t seq_len);

// Model FLOPs utilisation: flops_per_token · tokens_per_second / peak_flops_per_second (per GPU
// figures, or all GPUs' for both). Throws Error when the peak is <= 0.
double mfu(double flops_per_token, double tokens_per_second, double peak_flops_per_second);

// DeepSpeed's number formatting (profiler.py): number_to_string "87.1 G", params "124.44 M" (G->B),
// macs "43.5 GMACs", flops "1.2 TFLOPS", duration (seconds) "12.3 ms".
std::string flops_number_to_string(double num);
std::string flops_params_to_string(double params);
std::string flops_macs_to_string(double macs);
std::string flops_flops_to_string(double flops_per_second);
std::string flops_duration_to_string(double seconds);

struct FlopsProfileInput {
  const ModuleFlops* model = nullptr;  // Architecture::forward_flops, for one micro-batch on this GPU
  std::int64_t profile_step = 1;
  std::int64_t world_size = 1;
  std::int64_t data_parallel_size = 1;
  std::int64_t model_parallel_size = 1;
  std::int64_t micro_batch_per_gpu = 1;
  // From the global timers when wall_clock_breakdown is on: timers(kForwardGlobalTimer)
  // .elapsed_ms(false) etc. at the profile step, before the step's log line resets them (DeepSpeed
  // reads them the same way). Latency and throughput lines are printed only for what is given.
  std::optional<double> fwd_ms, bwd_ms, step_ms;
};

// The profile text, laid out like DeepSpeed's print_model_profile: the summary lines
// ('{:<70}  {:<8}'), "Aggregated Profile per GPU" with the top `top_modules` module types by
// params and MACs at each depth below `module_depth` (-1 = all but the innermost, as DeepSpeed's
// range(depth) gives), and, when `detailed`, the module tree with params / MACs / flops and their
// shares. Per-module latency is not measured (dstrain times the step, not each module), so
// DeepSpeed's latency columns are left out.
std::string format_flops_profile(const FlopsProfileInput& input, const config::FlopsProfilerConfig& cfg);

// Writes `text` to cfg.output_file (parent folders created, file replaced) when set, else logs it
// at info level. Throws Error naming the file and the fix when it cannot be written.
void emit_flops_profile(const std::string& text, const config::FlopsProfilerConfig& cfg);

}  // namespace dstrain
