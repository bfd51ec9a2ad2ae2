#include "models/llama/llama_model.h"

#include "models/llama/llama_layers.h"

namespace dstrain {
namespace {

const LlamaConfig& checked(const LlamaConfig& cfg, std::int64_t T) {
  validate(cfg);
  llama_check_sequence(cfg, T);
  return cfg;
}

}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& cfg, DType dtype, std::int64_t B, std::int64_t T, Allocator& allocator)
    : LayerStack(make_llama_layers(checked(cfg, T)), cfg.n_embd, dtype, B, T, allocator, "LlamaModel"), cfg_(cfg) {}

}  // namespace dstrain
