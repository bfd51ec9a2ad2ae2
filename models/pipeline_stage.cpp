#include "models/pipeline_stage.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "ops/error.h"

namespace dstrain {
namespace {

// A layer whose tied parameters' owners live on another stage: each such entry becomes a parameter
// of its own, with the owner's spec (name, shape, init, decay, split), so that the stage holds,
// initialises and updates a copy of it. Everything else is the wrapped layer's.
class StageCopyLayer final : public Layer {
 public:
  StageCopyLayer(std::unique_ptr<Layer> inner, std::map<std::string, ParamSpec> owners) : inner_(std::move(inner)), owners_(std::move(owners)) {}
  std::string name() const override { return inner_->name(); }
  std::string type_name() const override { return inner_->type_name(); }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> specs = inner_->params();
    for (ParamSpec& s : specs) {
      if (!s.tied()) continue;
      auto it = owners_.find(s.tied_to);
      if (it != owners_.end()) s = it->second;
    }
    return specs;
  }
  ActivationSpec output(const LayerDims& dims) const override { return inner_->output(dims); }
  std::vector<ActivationSpec> saved_activations(const LayerDims& dims) const override { return inner_->saved_activations(dims); }
  std::vector<ActivationSpec> scratch(const LayerDims& dims) const override { return inner_->scratch(dims); }
  void forward(const ForwardArgs& args) override { inner_->forward(args); }
  void backward(const BackwardArgs& args) override { inner_->backward(args); }
  bool fuses_loss_grad() const override { return inner_->fuses_loss_grad(); }

 private:
  std::unique_ptr<Layer> inner_;
  std::map<std::string, ParamSpec> owners_;
};

}  // namespace

std::vector<int> virtual_stages_of(const StageParts& parts, int stages, int stage) {
  if (stages < 1 || parts.size() < 2 || (parts.size() - 1) % static_cast<std::size_t>(stages) != 0)
    fail("pipeline: {} layer pieces do not divide into {} stages", parts.size() < 1 ? 0 : parts.size() - 1, stages);
  if (stage < 0 || stage >= stages) fail("pipeline: stage {} is outside [0, {})", stage, stages);
  std::vector<int> v;
  for (int k = stage; k < static_cast<int>(parts.size()) - 1; k += stages) v.push_back(k);
  return v;
}

Model make_pipeline_stage_model(Model whole, const StageParts& parts, int stages, int stage) {
  const std::size_t L = whole.layers.size();
  if (parts.empty() || parts.front() != 0 || parts.back() != L)
    fail("pipeline: the partition covers layers [{}, {}) but the model has {} layers", parts.empty() ? 0 : parts.front(),
         parts.empty() ? 0 : parts.back(), L);
  const std::vector<int> mine = virtual_stages_of(parts, stages, stage);
  // Which stage holds each layer, and every owned parameter's spec and stage.
  std::vector<int> stage_of_layer(L, -1);
  for (std::size_t v = 0; v + 1 < parts.size(); ++v) {
    if (parts[v + 1] <= parts[v]) fail("pipeline: virtual stage {} of {} gets no layer (partition {})", v, parts.size() - 1, parts.size());
    for (std::size_t i = parts[v]; i < parts[v + 1]; ++i) stage_of_layer[i] = stage_of_virtual_stage(static_cast<int>(v), stages);
  }
  std::map<std::string, std::pair<ParamSpec, int>> owner;  // name -> spec, stage
  for (std::size_t i = 0; i < L; ++i)
    for (const ParamSpec& s : whole.layers[i]->params())
      if (!s.tied()) owner.emplace(s.name, std::make_pair(s, stage_of_layer[i]));
  // The stages holding each parameter: its owner's, and every stage with a layer tied to it.
  std::map<std::string, std::set<int>> holders;
  for (const auto& [name, os] : owner) holders[name].insert(os.second);
  for (std::size_t i = 0; i < L; ++i)
    for (const ParamSpec& s : whole.layers[i]->params())
      if (s.tied()) {
        auto it = owner.find(s.tied_to);
        if (it == owner.end()) fail("pipeline: layer '{}' ties '{}' to '{}', which no layer owns", whole.layers[i]->name(), s.name, s.tied_to);
        holders[s.tied_to].insert(stage_of_layer[i]);
      }

  Model m;
  m.architecture = whole.architecture;
  m.description = whole.description;
  m.n_embd = whole.n_embd;
  m.n_positions = whole.n_positions;
  m.vocab_size = whole.vocab_size;
  m.sequence_parallel_ranks = whole.sequence_parallel_ranks;
  m.tensor_parallel = whole.tensor_parallel;
  m.expert_parallel = whole.expert_parallel;
  m.whole_layers = L;
  for (int v : mine) {
    ModelChunk c;
    c.begin = m.layers.size();
    c.virtual_stage = v;
    for (std::size_t i = parts[static_cast<std::size_t>(v)]; i < parts[static_cast<std::size_t>(v) + 1]; ++i) {
      std::map<std::string, ParamSpec> copies;
      for (const ParamSpec& s : whole.layers[i]->params())
        if (s.tied() && owner.at(s.tied_to).second != stage) copies.emplace(s.tied_to, owner.at(s.tied_to).first);
      std::unique_ptr<Layer> layer = std::move(whole.layers[i]);
      if (!copies.empty()) layer = std::make_unique<StageCopyLayer>(std::move(layer), std::move(copies));
      m.layers.push_back(std::move(layer));
      m.layer_ids.push_back(i);
    }
    c.end = m.layers.size();
    m.chunks.push_back(c);
  }
  for (const auto& [name, st] : holders) {
    if (st.size() < 2 || !st.contains(stage)) continue;
    SharedParam sp;
    sp.name = name;
    sp.stages.assign(st.begin(), st.end());
    sp.copy = owner.at(name).second != stage;
    m.shared_params.push_back(std::move(sp));
  }
  return m;
}

}  // namespace dstrain
