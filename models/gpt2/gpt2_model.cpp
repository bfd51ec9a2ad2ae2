#include "models/gpt2/gpt2_model.h"

#include "ops/error.h"
#include "models/gpt2/gpt2_layers.h"

namespace dstrain {
namespace {

const Gpt2Config& checked(const Gpt2Config& cfg, std::int64_t T) {
  validate(cfg);
  if (T > cfg.n_positions) fail("Gpt2Model: T = {} exceeds n_positions = {}; use T <= {}", T, cfg.n_positions, cfg.n_positions);
  return cfg;
}

}  // namespace

Gpt2Model::Gpt2Model(const Gpt2Config& cfg, DType dtype, std::int64_t B, std::int64_t T, Allocator& allocator)
    : LayerStack(make_gpt2_layers(checked(cfg, T)), cfg.n_embd, dtype, B, T, allocator, "Gpt2Model"), cfg_(cfg) {}

}  // namespace dstrain
