#include "models/model_family.h"

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {

void Architecture::check_sequence(std::int64_t T, const Device&) const {
  if (T < 1 || T > n_positions()) {
    fail("sequence length {} must be between 1 and the model's {} ({}): give --sequence-length <= {} or a model with a longer {}", T,
         n_positions_key(), n_positions(), n_positions(), n_positions_key());
  }
}

void Architecture::check_tensor_parallel(int ranks) const {
  if (ranks != 1) {
    fail("tensor_parallel: {} ranks, but the model family '{}' does not split its layers across tensor-parallel ranks; set "
         "tensor_parallel.autotp_size to 1 (or remove the section)",
         ranks, family().name());
  }
}

std::vector<std::unique_ptr<Layer>> Architecture::make_tensor_parallel_layers(TensorParallelRank tp) const {
  check_tensor_parallel(tp.ranks);
  return make_layers();
}

std::shared_ptr<const Architecture> Architecture::with_n_layer(std::int64_t) const { return nullptr; }

std::string Architecture::hf_model_type() const { return family().name(); }

std::vector<HfParamName> Architecture::hf_param_names() const { return hf_param_names_of(make_layers(), vocab_size()); }

void Architecture::check_sequence_parallel(int sp_ranks, int) const {
  if (sp_ranks != 1) {
    fail("sequence_parallel_size {}: the model family '{}' does not split its attention across sequence-parallel ranks; remove "
         "sequence_parallel_size (or set it to 1)",
         sp_ranks, family().name());
  }
}

std::vector<std::unique_ptr<Layer>> Architecture::make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp) const {
  check_sequence_parallel(sp.ranks, tp.ranks);
  return make_tensor_parallel_layers(tp);
}

void Architecture::check_expert_parallel(int ranks) const {
  if (ranks != 1) {
    fail("expert_parallel.autoep_size {}: the model family '{}' has no experts to spread across expert-parallel ranks; set "
         "expert_parallel.autoep_size to 1 (or remove the section)",
         ranks, family().name());
  }
}

std::shared_ptr<const Architecture> Architecture::with_moe_config(const MoeConfig&) const {
  fail("the model family '{}' has no mixture-of-experts layers, so expert_parallel's routing keys have nothing to configure; remove them (or the "
       "section)",
       family().name());
}

std::vector<std::unique_ptr<Layer>> Architecture::make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep) const {
  if (ep.ranks != 1) check_expert_parallel(ep.ranks);
  if (ep.ranks != 1)  // an override of check_expert_parallel that accepts, without layers that can use it
    fail("expert_parallel.autoep_size {}: the model family '{}' does not build expert-parallel layers (its Architecture does not implement "
         "make_parallel_layers with an ExpertParallelRank)",
         ep.ranks, family().name());
  return make_parallel_layers(tp, sp);
}

double Architecture::flops_per_token(std::int64_t T) const {
  return 6.0 * stored_parameter_count() + 6.0 * static_cast<double>(n_layer()) * static_cast<double>(n_embd()) * static_cast<double>(T);
}

ModuleFlops Architecture::forward_flops(std::int64_t B, std::int64_t T) const {
  const std::int64_t tokens = B * T;
  std::vector<ModuleFlops> children;
  const auto layers = make_layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::int64_t params = 0, matrix = 0;
    for (const ParamSpec& p : layers[i]->params()) {
      if (!p.tied()) params += p.shape.numel();
      // The first layer looks its tables up; every later matrix (a tied LM head too) multiplies:
      // one multiply-accumulate per element and token.
      if (i > 0 && p.shape.rank >= 2) matrix += p.shape.numel();
    }
    children.push_back(flops_leaf(layers[i]->name(), layers[i]->type_name(), params, tokens * matrix, 2 * tokens * matrix));
  }
  return flops_parent("", family().name(), std::move(children));
}

void Architecture::import_weights(const std::filesystem::path& path, const ParamLookup&) const {
  fail("weights '{}': the model family '{}' reads no weight files (its Architecture does not implement import_weights)", path.string(),
       family().name());
}

void Architecture::export_weights(const std::filesystem::path& path, const ParamLookup&, DType) const {
  fail("weights '{}': the model family '{}' writes no weight files (its Architecture does not implement export_weights)", path.string(),
       family().name());
}

bool ModelFamily::reads_hf_config(std::string_view) const { return false; }

std::string ModelFamily::hf_config_forms() const { return ""; }

}  // namespace dstrain
