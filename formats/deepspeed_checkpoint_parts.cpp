// The pieces both DeepSpeed checkpoint readers take from the same files (formats/deepspeed_checkpoint_parts.h).
#include "formats/deepspeed_checkpoint_parts.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ops/error.h"

namespace dstrain {
namespace {

nlohmann::json to_json(const TorchValue& v) {
  using K = TorchValue::Kind;
  switch (v.kind) {
    case K::none: return nullptr;
    case K::boolean: return v.b;
    case K::integer: return v.i;
    case K::real: return v.f;
    case K::string: return v.s;
    case K::list:
    case K::tuple: {
      nlohmann::json a = nlohmann::json::array();
      for (const TorchValue& x : v.items) a.push_back(to_json(x));
      return a;
    }
    case K::dict: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, x] : v.pairs) {
        const std::string key = k.kind == K::string ? k.s : k.kind == K::integer ? std::to_string(k.i) : std::string(k.kind_name());
        o[key] = to_json(x);
      }
      return o;
    }
    default: return nullptr;  // tensors, bytes, objects: not part of a scheduler's JSON
  }
}

// The JSON text of a pickled dict (ds_config, lr_scheduler). The unpickler takes a str's bytes as
// they are, where Python's decodes them as UTF-8 and refuses the file otherwise; JSON text must be
// UTF-8, so such a string is refused here, by name, as torch.load would refuse it (nlohmann's
// type_error is no answer a caller of the reader expects).
std::string json_text(const TorchValue& v) {
  try {
    return to_json(v).dump();
  } catch (const nlohmann::json::type_error&) {
    fail("DeepSpeed checkpoint file '{}': '{}' holds a string that is not UTF-8 (torch.load refuses such a file)", v.file, v.where);
  }
}

}  // namespace

namespace deepspeed_parts {

namespace {
// The element count, or nullopt for a negative size or more than 2^40 elements.
std::optional<std::int64_t> sane_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || (d != 0 && n > (std::int64_t{1} << 40) / d)) return std::nullopt;
    n *= d;
  }
  return n;
}
}  // namespace

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  const std::optional<std::int64_t> n = sane_numel(shape);
  if (!n) fail("DeepSpeed checkpoint: a parameter shape ({}) with a negative or huge size", fmt::join(shape, ", "));
  return *n;
}

void check_param_shape(const std::vector<std::int64_t>& shape, const std::string& file, const std::string& name) {
  if (!sane_numel(shape))
    fail("DeepSpeed checkpoint file '{}': parameter '{}' has the shape ({}): a negative size or over 2^40 elements, which no saved parameter has",
         file, name, fmt::join(shape, ", "));
}

std::string first_repeated(const std::vector<std::string>& names) {
  std::set<std::string> seen;
  for (const std::string& n : names)
    if (!seen.insert(n).second) return n;
  return "";
}

bool is_folder_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\\') == std::string::npos &&
         n.find('\0') == std::string::npos;
}

void check_param_name(const std::string& n, const std::string& file) {
  if (!is_folder_name(n)) {
    fail("DeepSpeed checkpoint file '{}': the parameter name '{}' is not one folder name (empty, '.', '..' or a path), as a universal "
         "checkpoint's zero/<name>/ needs",
         file, n);
  }
}

std::vector<std::int64_t> shape_of(const TorchValue& v) {
  std::vector<std::int64_t> s;
  if (v.is_tensor()) return v.as_tensor().shape;
  for (std::size_t k = 0; k < v.size(); ++k) s.push_back(v[k].as_int());
  return s;
}

std::string dtype_name(const std::string& st) {
  if (st == "F32") return "fp32";
  if (st == "F16") return "fp16";
  if (st == "BF16") return "bf16";
  if (st == "F64") return "fp64";
  return st;
}

// A scalar saved as a number or a one-element tensor (torch's Adam keeps `step` as a tensor). A
// float outside int64's range (or NaN) is refused: converting it is undefined behaviour.
std::int64_t scalar_int(const TorchPickle& file, const TorchValue& v) {
  if (v.kind == TorchValue::Kind::integer || v.kind == TorchValue::Kind::boolean) return v.as_int();
  double d = 0;
  if (v.is_tensor()) {
    const std::vector<double> t = file.read_f64(v);
    if (t.size() != 1) v.fail_here(" is a tensor of " + std::to_string(t.size()) + " elements, not a scalar");
    d = t[0];
  } else {
    d = v.as_double();
  }
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) v.fail_here(fmt::format(" is {}, not a count (outside int64's range)", d));
  return static_cast<std::int64_t>(d);
}

void read_param_group(const TorchValue& g, DeepSpeedTrainingState& st) {
  for (const char* k : {"lr", "eps", "weight_decay"})
    if (const TorchValue* v = g.find(k); v != nullptr && !v->is_none()) st.param_group[k] = v->as_double();
  if (const TorchValue* b = g.find("betas"); b != nullptr && b->is_sequence() && b->size() == 2) {
    st.param_group["betas0"] = (*b)[0].as_double();
    st.param_group["betas1"] = (*b)[1].as_double();
  }
  if (st.optimizer_type.empty()) {
    if (g.has("betas")) {
      const TorchValue* w = g.find("adam_w_mode");
      st.optimizer_type = w != nullptr && w->kind == TorchValue::Kind::boolean && w->b ? "adamw" : "adam";
    } else if (g.has("momentum")) {
      st.optimizer_type = "sgd";
    }
  }
}

DeepSpeedLossScaler loss_scaler_of(const TorchValue& obj) {
  DeepSpeedLossScaler ls;
  const std::string& name = obj.object_name();
  if (name != "deepspeed.runtime.fp16.loss_scaler.LossScaler" && name != "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler") {
    obj.fail_here(" is a " + name + ", not a DeepSpeed loss scaler");
  }
  ls.dynamic = name.ends_with("DynamicLossScaler");
  if (!obj.state || !obj.state->is_dict()) return ls;
  const TorchValue& s = *obj.state;
  if (const TorchValue* v = s.find("cur_scale")) ls.cur_scale = v->as_double();
  if (const TorchValue* v = s.find("cur_iter")) ls.cur_iter = v->as_int();
  if (const TorchValue* v = s.find("last_overflow_iter"); v != nullptr && !v->is_none()) ls.last_overflow_iter = v->as_int();
  if (const TorchValue* v = s.find("cur_hysteresis"); v != nullptr && !v->is_none()) ls.cur_hysteresis = v->as_int();
  if (const TorchValue* v = s.find("dynamic")) ls.dynamic = v->as_bool();
  return ls;
}

int zero_stage_of(const TorchValue& zs) {
  // ZeroStageEnum(2) (Python < 3.12) or getattr(ZeroStageEnum, 'gradients') (Python >= 3.12), or a plain int.
  if (zs.is_object() && zs.items.size() == 1 && zs.items[0].kind == TorchValue::Kind::string) {
    static const std::map<std::string, int> members = {{"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
    const auto it = members.find(zs.items[0].s);
    if (it == members.end()) zs.fail_here(" names ZeroStageEnum member '" + zs.items[0].s + "', which DeepSpeed does not have");
    return it->second;
  }
  if (zs.is_object()) {
    if (zs.items.empty()) zs.fail_here(" has no value");
    return static_cast<int>(zs.items[0].as_int());
  }
  return static_cast<int>(zs.as_int());
}

void read_run_state(const TorchValue& root, DeepSpeedTrainingState& st) {
  if (const TorchValue* c = root.find("ds_config"); c != nullptr && c->is_dict()) {
    st.ds_config_json = json_text(*c);
    if (const TorchValue* o = c->find("optimizer"); o != nullptr && o->is_dict()) {
      if (const TorchValue* t = o->find("type"); t != nullptr && t->kind == TorchValue::Kind::string) {
        st.optimizer_type = t->s;
        std::transform(st.optimizer_type.begin(), st.optimizer_type.end(), st.optimizer_type.begin(), [](unsigned char ch) { return std::tolower(ch); });
      }
    }
  }
  for (const char* k : {"global_steps", "global_samples", "skipped_steps"}) {
    const TorchValue* v = root.find(k);
    const std::int64_t x = v != nullptr && !v->is_none() ? v->as_int() : 0;
    (std::string(k) == "global_steps" ? st.global_steps : std::string(k) == "global_samples" ? st.global_samples : st.skipped_steps) = x;
  }
  if (const TorchValue* l = root.find("lr_scheduler"); l != nullptr && !l->is_none()) st.lr_scheduler_json = json_text(*l);
  if (const TorchValue* d = root.find("dstrain"); d != nullptr && d->is_dict()) st.dstrain_json = json_text(*d);
}

int config_zero_stage(const TorchValue& root) {
  if (const TorchValue* c = root.find("ds_config"); c != nullptr && c->is_dict())
    if (const TorchValue* z = c->find("zero_optimization"); z != nullptr && z->is_dict())
      if (const TorchValue* s = z->find("stage"); s != nullptr && s->kind == TorchValue::Kind::integer) return static_cast<int>(s->i);
  return -1;
}

void set_groups(const TorchValue& param_groups, const std::vector<std::vector<std::string>>& names_per_group, DeepSpeedTrainingState& st,
                const std::function<std::string(const std::string&)>& bare) {
  st.groups.clear();
  // Groups and names that do not correspond one to one say nothing reliable about which parameter
  // decays: the state then holds none (its readers fall back to param_group's weight decay).
  if (!param_groups.is_sequence() || param_groups.size() != names_per_group.size()) return;
  for (std::size_t g = 0; g < names_per_group.size(); ++g) {
    DeepSpeedParamGroup out;
    if (const TorchValue* wd = param_groups[g].find("weight_decay"); wd != nullptr && !wd->is_none()) out.weight_decay = wd->as_double();
    for (const std::string& n : names_per_group[g]) out.names.push_back(bare(n));
    st.groups.push_back(std::move(out));
  }
}
// ZeRO-3's param_shapes are its sub-groups (a param group cut at sub_group_size elements), and
// stage3._set_fp32_optimizer_param_groups puts each sub-group's flat into its param group, so a
// param group's `params` are the indices of its sub-groups. Left empty unless they cover the
// sub-groups exactly once.
void set_zero3_groups(const TorchValue& param_groups, const std::vector<std::vector<std::string>>& sub_groups, DeepSpeedTrainingState& st,
                      const std::function<std::string(const std::string&)>& bare) {
  std::vector<std::vector<std::string>> names;
  std::vector<bool> used(sub_groups.size(), false);
  for (std::size_t g = 0; g < param_groups.size(); ++g) {
    names.emplace_back();
    const TorchValue& ids = param_groups[g].at("params");
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::int64_t id = ids[k].as_int();
      if (id < 0 || id >= static_cast<std::int64_t>(sub_groups.size()) || used[static_cast<std::size_t>(id)]) return;
      used[static_cast<std::size_t>(id)] = true;
      names.back().insert(names.back().end(), sub_groups[static_cast<std::size_t>(id)].begin(), sub_groups[static_cast<std::size_t>(id)].end());
    }
  }
  if (std::find(used.begin(), used.end(), false) == used.end()) set_groups(param_groups, names, st, bare);
}

}  // namespace deepspeed_parts

}  // namespace dstrain
