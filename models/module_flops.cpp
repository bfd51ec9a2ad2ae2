#include "models/module_flops.h"

#include <utility>

namespace dstrain {

ModuleFlops flops_leaf(std::string name, std::string type, std::int64_t params, std::int64_t macs, std::int64_t flops) {
  ModuleFlops m;
  m.name = std::move(name);
  m.type = std::move(type);
  m.params = params;
  m.macs = m.own_macs = macs;
  m.flops = m.own_flops = flops;
  return m;
}

ModuleFlops flops_parent(std::string name, std::string type, std::vector<ModuleFlops> children, std::int64_t own_macs, std::int64_t own_flops) {
  ModuleFlops m;
  m.name = std::move(name);
  m.type = std::move(type);
  m.own_macs = own_macs;
  m.own_flops = own_flops;
  m.macs = own_macs;
  m.flops = own_flops;
  for (const auto& c : children) {
    m.params += c.params;
    m.macs += c.macs;
    m.flops += c.flops;
  }
  m.children = std::move(children);
  return m;
}

ModuleFlops flops_linear(std::string name, std::int64_t tokens, std::int64_t in, std::int64_t out, bool bias) {
  const std::int64_t macs = tokens * in * out;
  return flops_leaf(std::move(name), "Linear", in * out + (bias ? out : 0), macs, 2 * macs + (bias ? tokens * out : 0));
}

ModuleFlops flops_layernorm(std::string name, std::int64_t tokens, std::int64_t c) {
  return flops_leaf(std::move(name), "LayerNorm", 2 * c, 0, 5 * tokens * c);
}

ModuleFlops flops_rmsnorm(std::string name, std::string type, std::int64_t tokens, std::int64_t c) {
  return flops_leaf(std::move(name), std::move(type), c, 0, 4 * tokens * c);
}

}  // namespace dstrain
