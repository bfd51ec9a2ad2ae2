#include "models/gpt2/gpt2_family.h"

#include <nlohmann/json.hpp>

#include "models/gpt2/gpt2_flops.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_weights.h"

namespace dstrain {
namespace {

class Gpt2Family final : public ModelFamily {
 public:
  std::string name() const override { return "gpt2"; }
  std::string spec_forms() const override { return "gpt2:d6|d12|d24|d36|d48, gpt2:tiny, gpt2:L<n>-C<c>-H<h>[-V<v>][-T<t>], or a GPT-2 config.json"; }
  std::shared_ptr<const Architecture> from_spec(std::string_view spec) const override {
    return std::make_shared<Gpt2Architecture>(model_config_from_spec(spec));
  }
  bool reads_hf_config(std::string_view json_text) const override {
    const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
    if (!j.is_object()) return false;
    const bool has_type = j.contains("model_type"), has_arch = j.contains("architectures");
    if (has_type) return j["model_type"] == "gpt2";
    if (has_arch && j["architectures"].is_array()) {
      for (const auto& a : j["architectures"])
        if (a.is_string() && a.get<std::string>().rfind("GPT2", 0) == 0) return true;
      return false;
    }
    return !has_arch;  // neither key: GPT-2's keys shape it (and name what is missing)
  }
  std::string hf_config_forms() const override { return "\"gpt2\" (GPT2LMHeadModel)"; }
  std::shared_ptr<const Architecture> from_config_json(std::string_view json_text, std::string_view source) const override {
    return std::make_shared<Gpt2Architecture>(gpt2_config_from_hf_json(json_text, source));
  }
};

}  // namespace

Gpt2Architecture::Gpt2Architecture(const Gpt2Config& cfg) : cfg_(cfg) { validate(cfg_); }

const ModelFamily& Gpt2Architecture::family() const { return gpt2_family(); }

double Gpt2Architecture::parameter_count() const {
  // As parameter_count(Gpt2Config), in double: wte V·C, wpe P·C, per block 12C² + 13C, final LN 2C.
  const double L = static_cast<double>(cfg_.n_layer), C = static_cast<double>(cfg_.n_embd);
  return static_cast<double>(cfg_.vocab_size) * C + static_cast<double>(cfg_.n_positions) * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
}

double Gpt2Architecture::stored_parameter_count() const {
  return parameter_count() + static_cast<double>(cfg_.padded_vocab_size - cfg_.vocab_size) * static_cast<double>(cfg_.n_embd);
}

std::string Gpt2Architecture::describe() const { return dstrain::describe(cfg_); }

std::vector<std::unique_ptr<Layer>> Gpt2Architecture::make_layers() const { return make_gpt2_layers(cfg_); }

void Gpt2Architecture::check_tensor_parallel(int ranks) const {
  if (ranks < 1) fail("tensor_parallel: {} ranks; give 1 or more", ranks);
  // Heads are kept whole (AutoTP's rule) and may be spread unevenly; with more ranks than heads the
  // surplus ranks hold none and add zeros. The MLP's 4C features are cut one by one.
  if (ranks > 4 * cfg_.n_embd) {
    fail("tensor_parallel.autotp_size {} is more than GPT-2's 4 x n_embd = {} MLP features: every rank must hold some; use at most {} ranks", ranks,
         4 * cfg_.n_embd, 4 * cfg_.n_embd);
  }
}

void Gpt2Architecture::check_sequence_parallel(int sp_ranks, int tp_ranks) const {
  check_tensor_parallel(tp_ranks);
  if (sp_ranks < 1) fail("sequence_parallel_size {}: give 1 or more", sp_ranks);
  // Ulysses: every tensor-parallel rank's heads split evenly across the sequence-parallel ranks.
  for (int r = 0; r < tp_ranks; ++r) {
    const std::int64_t heads = units_of_rank(cfg_.n_head, tp_ranks, r);
    if (heads % sp_ranks != 0) {
      fail("sequence_parallel_size {}: GPT-2's {} heads{} do not divide by it (DeepSpeed-Ulysses splits each rank's heads across the sequence-"
           "parallel ranks); use a sequence_parallel_size that divides {}",
           sp_ranks, heads, tp_ranks > 1 ? fmt::format(" on tensor-parallel rank {} of {}", r, tp_ranks) : std::string(), heads);
    }
  }
}

std::vector<std::unique_ptr<Layer>> Gpt2Architecture::make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp) const {
  check_sequence_parallel(sp.ranks, tp.ranks);
  return make_gpt2_layers(cfg_, tp, sp);
}

std::vector<std::unique_ptr<Layer>> Gpt2Architecture::make_tensor_parallel_layers(TensorParallelRank tp) const {
  check_tensor_parallel(tp.ranks);
  return make_gpt2_layers(cfg_, tp);
}

std::shared_ptr<const Architecture> Gpt2Architecture::with_n_layer(std::int64_t n_layer) const {
  // Every block has the same parameters and cut (only its name and its residual projections' init
  // scale depend on the index and the depth).
  Gpt2Config c = cfg_;
  c.n_layer = n_layer;
  return std::make_shared<Gpt2Architecture>(c);
}

ModuleFlops Gpt2Architecture::forward_flops(std::int64_t B, std::int64_t T) const {
  return gpt2_forward_flops(Gpt2FlopsShape{.batch = B,
                                           .seq_len = T,
                                           .channels = cfg_.n_embd,
                                           .heads = cfg_.n_head,
                                           .vocab = cfg_.padded_vocab_size,
                                           .layers = cfg_.n_layer,
                                           .max_seq_len = cfg_.n_positions});
}

std::vector<HfParamName> Gpt2Architecture::hf_param_names() const {
  std::vector<HfParamName> names = hf_param_names_of(make_gpt2_layers(cfg_), cfg_.vocab_size);
  for (HfParamName& p : names) {
    if (p.name == "lm_head.weight") continue;  // GPT2LMHeadModel's own module, beside its transformer
    p.aliases.push_back(p.name);
    p.name = "transformer." + p.name;
  }
  return names;
}

std::string Gpt2Architecture::config_json() const { return gpt2_hf_config_json(cfg_); }

void Gpt2Architecture::import_weights(const std::filesystem::path& path, const ParamLookup& param) const { import_gpt2_weights(path, cfg_, param); }

void Gpt2Architecture::export_weights(const std::filesystem::path& path, const ParamLookup& param, DType file_dtype) const {
  export_gpt2_safetensors(path, cfg_, param, file_dtype);
}

std::shared_ptr<const ModelFamily> gpt2_family_ptr() {
  static const std::shared_ptr<const ModelFamily> family = std::make_shared<Gpt2Family>();
  return family;
}

const ModelFamily& gpt2_family() { return *gpt2_family_ptr(); }

Model make_gpt2_model(const Gpt2Config& cfg) { return make_model(std::make_shared<Gpt2Architecture>(cfg)); }

Model make_gpt2_model(std::string_view spec) { return make_model(gpt2_family().from_spec(spec)); }

const Gpt2Config* gpt2_config_of(const Architecture& architecture) {
  const auto* a = dynamic_cast<const Gpt2Architecture*>(&architecture);
  return a != nullptr ? &a->config() : nullptr;
}

}  // namespace dstrain
