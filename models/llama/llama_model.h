// LlamaModel: the Llama-family layer list with its own memory (LayerStack), for standalone use
// and tests. Parameter names as llama_layers.h says (Hugging Face's, with q/k/v fused).
#pragma once

#include <cstdint>

#include "ops/allocator.h"
#include "models/layer_stack.h"
#include "models/llama/llama_config.h"

namespace dstrain {

class LlamaModel : public LayerStack {
 public:
  // Micro-batches of B x T (T <= max_position_embeddings, and <= sliding_window when there is one).
  LlamaModel(const LlamaConfig& cfg, DType dtype, std::int64_t B, std::int64_t T, Allocator& allocator = cpu_allocator());

  const LlamaConfig& config() const { return cfg_; }

 private:
  LlamaConfig cfg_;
};

}  // namespace dstrain
