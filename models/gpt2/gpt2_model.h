// Gpt2Model: the GPT-2 layer list with its own memory (LayerStack), for standalone use and tests.
#pragma once

#include <cstdint>

#include "ops/allocator.h"
#include "models/gpt2/gpt2_config.h"
#include "models/layer_stack.h"

namespace dstrain {

using Gpt2StepOptions = StepOptions;

class Gpt2Model : public LayerStack {
 public:
  // Allocates params, grads (storage dtype `dtype`) and activations for micro-batches of B x T
  // (T <= n_positions) from `allocator`; parameters and gradients start at zero. Parameter names
  // are Hugging Face GPT-2's (wte.weight, h.0.attn.c_attn.weight, ln_f.bias; lm_head.weight is
  // tied to wte.weight).
  Gpt2Model(const Gpt2Config& cfg, DType dtype, std::int64_t B, std::int64_t T, Allocator& allocator = cpu_allocator());

  const Gpt2Config& config() const { return cfg_; }

 private:
  Gpt2Config cfg_;
};

}  // namespace dstrain
