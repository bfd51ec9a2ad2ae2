// FLOP and parameter counts of a GPT-2 forward pass, per module, the model-FLOPs formula used for
// MFU, and a summary in the shape of DeepSpeed's flops profiler (print_model_profile at
// flops_profiler.profile_step).
//
// What is counted (forward, one micro-batch of B sequences of T tokens, hs = C / NH):
//   Linear(in, out)        2·B·T·in·out (matmul, 2 FLOPs per multiply-accumulate) + B·T·out (bias)
//   attention QKᵀ and AV   2·B·NH·T·T·hs each = 2·B·T²·C each, the full T×T product as the kernels
//                          compute it (causal masking does not remove work from a dense kernel)
//   softmax                B·NH·T² (one per element, DeepSpeed's convention)
//   LayerNorm              5·B·T·C (DeepSpeed's estimate with affine)
//   GELU                   B·T·4C;  residual adds B·T·C each;  token + position embedding add B·T·C
//   embedding lookups, dropout, the loss: 0 (DeepSpeed counts none of them)
// Backward is 2× forward (dX and dW of every matmul); a training step is (3 + recompute) × forward,
// with recompute = flops_profiler.recompute_fwd_factor (1.0 with full activation checkpointing).
// MACs count the multiply-accumulates of the matmuls only.
//
// MFU uses the model-FLOPs formula of llm.c / PaLM appendix B instead, which does not depend on how
// kernels are written: flops per token = 6·N + 6·L·C·T (N parameters as stored, the attention term
// counting the causal half of QKᵀ and AV, fwd + bwd).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_schema/monitor_config.h"

namespace dstrain {

struct Gpt2FlopsShape {
  std::int64_t batch = 1;        // B: sequences per micro-batch on this GPU
  std::int64_t seq_len = 1024;   // T
  std::int64_t channels = 768;   // C
  std::int64_t heads = 12;       // NH
  std::int64_t vocab = 50304;    // V as stored and multiplied: the padded vocabulary (wte rows)
  std::int64_t layers = 12;      // L
  std::int64_t max_seq_len = 0;  // wpe rows (n_positions); 0 = seq_len
};

// One module of the model tree; figures include the module's children (DeepSpeed's
// get_module_flops), `own_*` only what the module computes itself (e.g. attention's QKᵀ).
struct ModuleFlops {
  std::string name;  // attribute name as in HF GPT-2: "wte", "h", "0", "attn", "c_attn", ...
  std::string type;  // "GPT2", "Embedding", "ModuleList", "Block", "Attention", "Linear", ...
  std::int64_t params = 0;
  std::int64_t macs = 0;
  std::int64_t flops = 0;
  std::int64_t own_macs = 0;
  std::int64_t own_flops = 0;
  std::string note;  // e.g. "weight tied to wte"
  std::vector<ModuleFlops> children;
};

// The forward-pass tree: GPT2 > {wte, wpe, h: ModuleList > Block × L > {ln_1, attn > {c_attn,
// c_proj}, ln_2, mlp > {c_fc, gelu, c_proj}}, ln_f, lm_head (tied: 0 own params)}.
// Throws Error when a dimension is <= 0 or C is not a multiple of NH.
ModuleFlops gpt2_forward_flops(const Gpt2FlopsShape& shape);

// Parameters as stored: V·C + maxT·C + L·(12C² + 13C) + 2C (GPT-2 124M: 124,439,808 with V = 50257,
// 124,475,904 with the padded 50304 that llm.c counts).
std::int64_t gpt2_num_parameters(const Gpt2FlopsShape& shape);

// llm.c / PaLM: 6·N + 6·L·C·T.
double model_flops_per_token(std::int64_t num_parameters, std::int64_t layers, std::int64_t channels,
                             std::int64_t seq_len);

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
  const ModuleFlops* model = nullptr;  // from gpt2_forward_flops, for one micro-batch on this GPU
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
