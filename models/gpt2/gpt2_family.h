// GPT-2 as a model family (models/model_family.h): the "gpt2:" specs and GPT-2 config.json files,
// its layers, FLOPs tree and Hugging Face weights (model.safetensors, or a torch.save state dict on
// import). Registered in models/model_registry.cpp.
#pragma once

#include <memory>
#include <string_view>

#include "models/gpt2/gpt2_config.h"
#include "models/model.h"
#include "models/model_family.h"

namespace dstrain {

class Gpt2Architecture final : public Architecture {
 public:
  explicit Gpt2Architecture(const Gpt2Config& cfg);  // validates
  const Gpt2Config& config() const { return cfg_; }

  const ModelFamily& family() const override;
  std::int64_t n_layer() const override { return cfg_.n_layer; }
  std::int64_t n_embd() const override { return cfg_.n_embd; }
  std::int64_t n_positions() const override { return cfg_.n_positions; }
  std::int64_t vocab_size() const override { return cfg_.vocab_size; }
  std::int64_t padded_vocab_size() const override { return cfg_.padded_vocab_size; }
  double parameter_count() const override;
  double stored_parameter_count() const override;
  std::string describe() const override;
  std::vector<std::unique_ptr<Layer>> make_layers() const override;
  void check_tensor_parallel(int ranks) const override;
  std::vector<std::unique_ptr<Layer>> make_tensor_parallel_layers(TensorParallelRank tp) const override;
  std::shared_ptr<const Architecture> with_n_layer(std::int64_t n_layer) const override;
  void check_sequence_parallel(int sp_ranks, int tp_ranks) const override;
  std::vector<std::unique_ptr<Layer>> make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp) const override;
  ModuleFlops forward_flops(std::int64_t B, std::int64_t T) const override;
  std::string hf_model_type() const override { return "gpt2"; }
  // GPT2LMHeadModel's names: "transformer." + dstrain's ("transformer.h.0.attn.c_attn.weight"; the
  // bare name, GPT2Model's, as an alias) and "lm_head.weight" (tied to wte). The Conv1D weights are
  // read as nn.Linear's (out, in), as dstrain holds them.
  std::vector<HfParamName> hf_param_names() const override;
  std::string config_json() const override;
  void import_weights(const std::filesystem::path& path, const ParamLookup& param) const override;
  void export_weights(const std::filesystem::path& path, const ParamLookup& param, DType file_dtype) const override;

 private:
  Gpt2Config cfg_;
};

// The family: name "gpt2"; reads a config.json whose model_type is "gpt2" or whose architectures
// name a GPT2 class, and one with neither key (GPT-2's own keys then shape it).
const ModelFamily& gpt2_family();
std::shared_ptr<const ModelFamily> gpt2_family_ptr();

// The GPT-2 model of `cfg` (validated), or of a gpt2: spec or a GPT-2 config.json.
Model make_gpt2_model(const Gpt2Config& cfg);
Model make_gpt2_model(std::string_view spec);

// The config of a GPT-2 architecture; nullptr for another family's.
const Gpt2Config* gpt2_config_of(const Architecture& architecture);

}  // namespace dstrain
