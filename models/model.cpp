#include "models/model.h"

#include <filesystem>

#include <fmt/format.h>

#include "ops/error.h"
#include "models/gpt2/gpt2_layers.h"
#include "formats/hf_config_json.h"
#include "models/llama/llama_layers.h"

namespace dstrain {
namespace {

const LlamaConfig* llama_of(const ModelConfig& m) { return m.llama ? &*m.llama : nullptr; }

const Gpt2Config& gpt2_of(const ModelConfig& m) {
  if (!m.gpt2) fail("ModelConfig: neither a GPT-2 nor a Llama-family config is set");
  return *m.gpt2;
}

}  // namespace

std::int64_t ModelConfig::n_layer() const { return llama ? llama->n_layer : gpt2_of(*this).n_layer; }
std::int64_t ModelConfig::n_embd() const { return llama ? llama->n_embd : gpt2_of(*this).n_embd; }
std::int64_t ModelConfig::n_positions() const { return llama ? llama->max_position_embeddings : gpt2_of(*this).n_positions; }
std::int64_t ModelConfig::vocab_size() const { return llama ? llama->vocab_size : gpt2_of(*this).vocab_size; }
std::int64_t ModelConfig::padded_vocab_size() const { return llama ? llama->padded_vocab_size : gpt2_of(*this).padded_vocab_size; }
std::int64_t ModelConfig::parameters() const { return llama ? parameter_count(*llama) : parameter_count(gpt2_of(*this)); }

std::int64_t ModelConfig::parameters_stored() const {
  if (const LlamaConfig* l = llama_of(*this)) {
    const std::int64_t pad_rows = l->padded_vocab_size - l->vocab_size;
    return parameter_count(*l) + pad_rows * l->n_embd * (l->tie_word_embeddings ? 1 : 2);
  }
  return parameter_count_padded(gpt2_of(*this));
}

std::string ModelConfig::describe() const { return llama ? dstrain::describe(*llama) : dstrain::describe(gpt2_of(*this)); }

ModelConfig model_config_of(std::string_view spec) {
  ModelConfig m;
  if (spec.rfind("llama:", 0) == 0) {
    m.llama = llama_config_from_spec(spec);
    return m;
  }
  if (spec.rfind("gpt2:", 0) != 0) {
    // A config.json, or a folder holding one: its model_type / architectures choose.
    std::filesystem::path p{std::string(spec)};
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) p /= "config.json";
    if (std::filesystem::is_regular_file(p, ec) && is_llama_family_json(read_model_config_file(p))) {
      m.llama = llama_config_from_spec(spec);
      return m;
    }
  }
  m.gpt2 = model_config_from_spec(spec);
  return m;
}

Model make_gpt2_model(const Gpt2Config& cfg) {
  validate(cfg);
  Model m;
  m.layers = make_gpt2_layers(cfg);
  m.description = describe(cfg);
  m.gpt2 = cfg;
  m.n_embd = cfg.n_embd;
  m.n_positions = cfg.n_positions;
  m.vocab_size = cfg.vocab_size;
  return m;
}

Model make_gpt2_model(std::string_view spec) { return make_gpt2_model(model_config_from_spec(spec)); }

Model make_llama_model(const LlamaConfig& cfg) {
  validate(cfg);
  Model m;
  m.layers = make_llama_layers(cfg);
  m.description = describe(cfg);
  m.llama = cfg;
  m.n_embd = cfg.n_embd;
  m.n_positions = cfg.max_position_embeddings;
  m.vocab_size = cfg.vocab_size;
  return m;
}

Model make_model(const ModelConfig& cfg) { return cfg.llama ? make_llama_model(*cfg.llama) : make_gpt2_model(gpt2_of(cfg)); }

}  // namespace dstrain
