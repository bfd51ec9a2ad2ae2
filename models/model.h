// Model: what the engine trains — an ordered list of layers plus what the engine needs to know
// about them beyond the Layer interface (a name for logs, and the architecture's config when it
// is a built-in one, which weight import/export in the Hugging Face layout and the data's
// vocabulary check need).
//
// The layers own no memory (models/layer.h); the engine allocates everything for them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/gpt2/gpt2_config.h"
#include "models/layer.h"
#include "models/llama/llama_config.h"

namespace dstrain {

struct Model {
  std::vector<std::unique_ptr<Layer>> layers;  // run first to last in forward, last to first in backward
  std::string description;                     // one line for the top of a run
  std::optional<Gpt2Config> gpt2;              // set for GPT-2: enables save/load of HF safetensors
  std::optional<LlamaConfig> llama;            // set for the Llama family: the same (docs/models.md §4)
  // Width of the residual stream (B, T, n_embd) that flows between layers; the engine keeps one
  // buffer of this shape for its gradient and runs backward in place through it (as Gpt2Model).
  std::int64_t n_embd = 0;
  std::int64_t n_positions = 0;   // longest sequence the model takes (T <= n_positions)
  std::int64_t vocab_size = 0;    // tokens must be < vocab_size
};

// The architecture a --model spec names: GPT-2 or the Llama family (exactly one is set).
struct ModelConfig {
  std::optional<Gpt2Config> gpt2;
  std::optional<LlamaConfig> llama;

  std::int64_t n_layer() const;
  std::int64_t n_embd() const;
  std::int64_t n_positions() const;  // the longest T
  std::int64_t vocab_size() const;
  std::int64_t padded_vocab_size() const;
  std::int64_t parameters() const;         // with the real vocabulary, tied weights once
  std::int64_t parameters_stored() const;  // as allocated: the padded vocabulary rows too
  std::string describe() const;
};

// gpt2:... presets and descriptors (models/gpt2/gpt2_config.h), llama:... descriptors
// (models/llama/llama_config.h), or a config.json (or its folder): the Llama family when its
// model_type / architectures say so, GPT-2 otherwise. Error naming the spec and the accepted forms.
ModelConfig model_config_of(std::string_view spec);

// GPT-2 of shape `cfg` (validated): embedding, n_layer blocks, head.
Model make_gpt2_model(const Gpt2Config& cfg);
// The same from a spec (gpt2:d12, gpt2:tiny, gpt2:L4-C256-H4-T128, a config.json path; see
// models/gpt2/gpt2_config.h). Error naming the spec and the accepted forms.
Model make_gpt2_model(std::string_view spec);
// A Llama-family model of shape `cfg` (validated): embedding, n_layer blocks, head.
Model make_llama_model(const LlamaConfig& cfg);
// Either, as the config says.
Model make_model(const ModelConfig& cfg);

}  // namespace dstrain
