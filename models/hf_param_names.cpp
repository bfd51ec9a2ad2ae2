#include "models/hf_param_names.h"

namespace dstrain {

const char* hf_module_kind_name(HfModuleKind kind) {
  switch (kind) {
    case HfModuleKind::linear:
      return "linear weight";
    case HfModuleKind::embedding:
      return "embedding";
    case HfModuleKind::norm:
      return "norm weight";
    case HfModuleKind::bias:
      return "bias";
  }
  return "linear weight";
}

std::string HfParamName::module_name() const {
  for (const char* suffix : {".weight", ".bias"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.ends_with(s)) return name.substr(0, name.size() - s.size());
  }
  return name;
}

std::vector<HfParamName> hf_param_names_of(const std::vector<std::unique_ptr<Layer>>& layers, std::int64_t vocab_size) {
  std::vector<HfParamName> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    for (const ParamSpec& ps : layers[i]->params()) {
      HfParamName p;
      p.name = ps.name;
      p.param = ps.tied() ? ps.tied_to : ps.name;
      p.shape = ps.whole_shape();
      p.split = ps.split;
      if (p.shape.rank >= 2) {
        p.module = i == 0 ? HfModuleKind::embedding : HfModuleKind::linear;
      } else {
        p.module = ps.name.ends_with(".bias") ? HfModuleKind::bias : HfModuleKind::norm;
      }
      if (p.split.kind == SplitKind::vocabulary && p.shape.rank == 2 && vocab_size > 0 && vocab_size < p.shape[0]) {
        p.shape = Shape{vocab_size, p.shape[1]};
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace dstrain
