#include "formats/deepspeed_save_parts.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <system_error>

#include "formats/deepspeed_checkpoint_parts.h"
#include "ops/error.h"

namespace dstrain::ds_save {
namespace {

namespace fs = std::filesystem;
using W = TorchSaveWriter;

nlohmann::ordered_json parse_object(const std::string& text, const char* what) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    fail("DeepSpeed checkpoint writer: {} is not JSON ({})", what, e.what());
  }
  if (!j.is_object()) fail("DeepSpeed checkpoint writer: {} is not a JSON object", what);
  return j;
}

// The ds_config saved: the run's own (so that DeepSpeed's load sees the run it came from), with the
// keys the layout decides set to the layout — a config from another layout would contradict the
// files beside it (the reader takes BF16_Optimizer's stage from it) — or, without one, a config of
// just those keys: train_batch_size and the rest are unknown, and DeepSpeed's load never reads them.
nlohmann::ordered_json config_of(const DeepSpeedTrainingState& st, const DeepSpeedSaveLayout& l) {
  nlohmann::ordered_json c = st.ds_config_json ? parse_object(*st.ds_config_json, "ds_config_json") : nlohmann::ordered_json::object();
  if (!st.ds_config_json && !st.optimizer_type.empty()) {
    nlohmann::ordered_json params = nlohmann::ordered_json::object();
    if (auto it = st.param_group.find("lr"); it != st.param_group.end()) params["lr"] = it->second;
    if (st.param_group.count("betas0") && st.param_group.count("betas1")) params["betas"] = {st.param_group.at("betas0"), st.param_group.at("betas1")};
    if (auto it = st.param_group.find("eps"); it != st.param_group.end()) params["eps"] = it->second;
    if (auto it = st.param_group.find("weight_decay"); it != st.param_group.end()) params["weight_decay"] = it->second;
    c["optimizer"] = {{"type", st.optimizer_type == "adamw" ? "AdamW" : "Adam"}, {"params", params}};
  }
  const auto section = [&c](const char* key) -> nlohmann::ordered_json& {
    if (!c.contains(key) || !c[key].is_object()) c[key] = nlohmann::ordered_json::object();
    return c[key];
  };
  section("fp16")["enabled"] = l.dtype == "fp16";
  section("bf16")["enabled"] = l.dtype == "bf16";
  section("zero_optimization")["stage"] = l.zero_stage;
  return c;
}

}  // namespace

Plan make_plan(const fs::path& save_dir, const DeepSpeedTrainingState& st, const DeepSpeedSaveLayout& l) {
  Plan p;
  p.st = &st;
  p.layout = l;
  if (l.zero_stage < 0 || l.zero_stage > 3) fail("DeepSpeed checkpoint writer: ZeRO stage {} (DeepSpeed has stages 0 to 3)", l.zero_stage);
  if (l.dp_world_size < 1 || l.dp_world_size > (1 << 20)) fail("DeepSpeed checkpoint writer: data-parallel world size {} (at least 1)", l.dp_world_size);
  if (l.dtype != "fp32" && l.dtype != "fp16" && l.dtype != "bf16") fail("DeepSpeed checkpoint writer: dtype '{}' (fp32, fp16 or bf16)", l.dtype);
  p.lp_dtype = l.dtype == "fp32" ? "F32" : l.dtype == "fp16" ? "F16" : "BF16";
  if (!deepspeed_parts::is_folder_name(st.tag)) fail("DeepSpeed checkpoint writer: the tag '{}' is not one folder name (empty, '.', '..' or a path)", st.tag);
  p.tag_dir = save_dir / st.tag;
  if (st.optimizer_type != "" && st.optimizer_type != "adam" && st.optimizer_type != "adamw") {
    fail("DeepSpeed checkpoint writer: optimizer '{}'; only Adam / AdamW (DeepSpeed's FusedAdam) states are written", st.optimizer_type);
  }

  if (st.names.empty()) fail("DeepSpeed checkpoint writer: the state has no parameters");
  std::set<std::string> seen;
  for (const std::string& n : st.names) {
    if (n.empty() || !seen.insert(n).second) fail("DeepSpeed checkpoint writer: parameter name '{}' is empty or listed twice", n);
    // A universal checkpoint makes each name a folder under zero/, and the reader refuses a name
    // that is a path in either layout: none is written.
    if (!deepspeed_parts::is_folder_name(n)) fail("DeepSpeed checkpoint writer: parameter name '{}' is not one folder name ('.', '..' or a path)", n);
    const auto sh = st.shapes.find(n);
    if (sh == st.shapes.end()) fail("DeepSpeed checkpoint writer: parameter '{}' has no shape", n);
    const std::int64_t numel = numel_of(sh->second);
    const auto check = [&](const std::map<std::string, std::vector<float>>& m, const std::string& what, bool required) {
      const auto it = m.find(n);
      if (it == m.end()) {
        if (required) fail("DeepSpeed checkpoint writer: parameter '{}' has no {}", n, what);
        return;
      }
      if (static_cast<std::int64_t>(it->second.size()) != numel) {
        fail("DeepSpeed checkpoint writer: parameter '{}' has {} {} values, its shape {}", n, it->second.size(), what, numel);
      }
    };
    check(st.master, "fp32 master", true);
    check(st.module, "module weight", !st.module.empty());
    static const std::map<std::string, std::vector<float>> kNone;
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      // A reference either way: a conditional of a temporary and the map would copy every state.
      const auto it = st.optimizer_states.find(key);
      const std::map<std::string, std::vector<float>>& m = it == st.optimizer_states.end() ? kNone : it->second;
      check(m, std::string("optimizer state '") + key + "'", true);
    }
  }
  for (const auto& [key, m] : st.optimizer_states) {
    if (key != "exp_avg" && key != "exp_avg_sq") fail("DeepSpeed checkpoint writer: optimizer state '{}' (FusedAdam keeps exp_avg and exp_avg_sq)", key);
    for (const auto& [n, v] : m)
      if (!seen.count(n)) fail("DeepSpeed checkpoint writer: optimizer state '{}' of '{}', which is not a parameter of the state", key, n);
  }
  for (const auto& [n, v] : st.master)
    if (!seen.count(n)) fail("DeepSpeed checkpoint writer: a master for '{}', which is not a parameter of the state", n);
  for (const auto& [alias, owner] : st.tied) {
    if (!seen.count(owner)) fail("DeepSpeed checkpoint writer: the tied name '{}' is '{}', which is not a parameter of the state", alias, owner);
    if (seen.count(alias)) fail("DeepSpeed checkpoint writer: the tied name '{}' is also a parameter of its own", alias);
  }

  // Param groups: each name in exactly one; none given: one group of every name.
  p.groups_given = !st.groups.empty();
  if (st.groups.empty()) {
    DeepSpeedParamGroup g;
    g.names = st.names;
    const auto wd = st.param_group.find("weight_decay");
    g.weight_decay = wd == st.param_group.end() ? 0.0 : wd->second;
    p.groups.push_back(std::move(g));
  } else {
    std::set<std::string> grouped;
    for (std::size_t g = 0; g < st.groups.size(); ++g) {
      if (st.groups[g].names.empty()) fail("DeepSpeed checkpoint writer: param group {} has no parameters", g);
      for (const std::string& n : st.groups[g].names) {
        if (!seen.count(n)) fail("DeepSpeed checkpoint writer: param group {} names '{}', which is not a parameter of the state", g, n);
        if (!grouped.insert(n).second) fail("DeepSpeed checkpoint writer: parameter '{}' is in two param groups", n);
      }
    }
    if (grouped.size() != seen.size()) {
      for (const std::string& n : st.names)
        if (!grouped.count(n)) fail("DeepSpeed checkpoint writer: parameter '{}' is in no param group", n);
    }
    p.groups = st.groups;
  }

  if (st.lr_scheduler_json) (void)parse_object(*st.lr_scheduler_json, "lr_scheduler_json");
  if (st.dstrain_json) (void)parse_object(*st.dstrain_json, "dstrain_json");
  p.config = config_of(st, l);
  p.optimizer_step = st.optimizer_step.value_or(st.global_steps - st.skipped_steps);
  if (p.optimizer_step < 0) fail("DeepSpeed checkpoint writer: optimizer step {} is negative", p.optimizer_step);
  // engine.gradient_clipping(): the config's gradient_clipping, 0.0 by default; FP16_Optimizer and
  // the ZeRO optimizers keep it as clip_grad.
  if (const auto it = p.config.find("gradient_clipping"); it != p.config.end() && it->is_number()) p.clip_grad = it->get<double>();
  // BF16_Optimizer: engine._do_optimizer_sanity_check picks it for bf16 with grad_accum_dtype fp32
  // (data_types.grad_accum_dtype) at ZeRO stage 1 without CPU offload; the default grad_accum_dtype
  // is the model's, which gives DeepSpeedZeroOptimizer.
  if (l.dtype == "bf16" && l.zero_stage == 1) {
    const auto& c = p.config;
    const bool fp32_accum = c.contains("data_types") && c["data_types"].is_object() && c["data_types"].contains("grad_accum_dtype") &&
                            c["data_types"]["grad_accum_dtype"].is_string() &&
                            (c["data_types"]["grad_accum_dtype"] == "fp32" || c["data_types"]["grad_accum_dtype"] == "float32");
    bool offload = false;
    if (const auto z = c.find("zero_optimization"); z != c.end() && z->contains("offload_optimizer") && (*z)["offload_optimizer"].is_object()) {
      const auto& o = (*z)["offload_optimizer"];
      offload = o.contains("device") && o["device"].is_string() && o["device"] == "cpu";
    }
    p.bf16_optimizer = fp32_accum && !offload;
  }
  if (l.zero_stage == 3) check_zero3(p);
  return p;
}

std::vector<float> flat_of(const Plan& p, const std::vector<std::string>& names, const std::map<std::string, std::vector<float>>& what) {
  std::vector<float> out;
  for (const std::string& n : names) {
    const std::vector<float>& v = what.at(n);
    out.insert(out.end(), v.begin(), v.end());
  }
  (void)p;
  return out;
}

TorchValue str(const std::string& s) { return W::string(s); }
TorchValuePair kv(const std::string& key, TorchValue v) { return TorchValuePair(W::string(key), std::move(v)); }

TorchValue ordered_dict(std::vector<TorchValuePair> pairs) {
  std::vector<TorchValue> items;
  items.reserve(pairs.size());
  for (TorchValuePair& kvp : pairs) items.push_back(W::tuple({std::move(kvp.first), std::move(kvp.second)}));
  return W::object("collections.OrderedDict", {W::list(std::move(items))}, std::nullopt);
}

TorchValue torch_size(const std::vector<std::int64_t>& shape) {
  std::vector<TorchValue> d;
  for (const std::int64_t x : shape) d.push_back(W::integer(x));
  return W::object("torch.Size", {W::tuple(std::move(d))}, std::nullopt);
}

TorchValue json_value(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return W::none();
    case nlohmann::ordered_json::value_t::boolean: return W::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return W::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) fail("DeepSpeed checkpoint writer: the JSON integer {} does not fit a Python int dstrain writes", u);
      return W::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return W::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return W::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<TorchValue> items;
      for (const auto& x : j) items.push_back(json_value(x));
      return W::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<TorchValuePair> pairs;
      for (const auto& [k, x] : j.items()) pairs.push_back(kv(k, json_value(x)));
      return W::dict(std::move(pairs));
    }
    default: fail("DeepSpeed checkpoint writer: a JSON value of a kind Python's json does not make");
  }
}

namespace {
double pg(const Plan& p, const char* key, double dflt) {
  const auto it = p.st->param_group.find(key);
  return it == p.st->param_group.end() ? dflt : it->second;
}
}  // namespace

TorchValue adam_param_group(const Plan& p, std::size_t g, std::vector<std::int64_t> param_ids) {
  // FusedAdam's defaults (ops/adam/fused_adam.py): lr 1e-3, betas (0.9, 0.999), eps 1e-8; the
  // config's values are the run's (param_group as saved).
  std::vector<TorchValuePair> d;
  const double wd = p.groups[g].weight_decay;
  if (p.groups_given) d.push_back(kv("weight_decay", W::real(wd)));
  d.push_back(kv("lr", W::real(pg(p, "lr", 1e-3))));
  d.push_back(kv("bias_correction", W::boolean(true)));
  d.push_back(kv("betas", W::tuple({W::real(pg(p, "betas0", 0.9)), W::real(pg(p, "betas1", 0.999))})));
  d.push_back(kv("eps", W::real(pg(p, "eps", 1e-8))));
  if (!p.groups_given) d.push_back(kv("weight_decay", W::real(wd)));
  d.push_back(kv("step", W::integer(0)));
  std::vector<TorchValue> ids;
  for (const std::int64_t i : param_ids) ids.push_back(W::integer(i));
  d.push_back(kv("params", W::list(std::move(ids))));
  return W::dict(std::move(d));
}

TorchValue adam_state(TorchSaveWriter& w, const Plan& p, const std::vector<std::int64_t>& shape, const std::vector<float>& exp_avg,
                      const std::vector<float>& exp_avg_sq) {
  return W::dict({kv("step", W::integer(p.optimizer_step)), kv("exp_avg", w.tensor_from_fp32("F32", shape, exp_avg)),
                  kv("exp_avg_sq", w.tensor_from_fp32("F32", shape, exp_avg_sq))});
}

namespace {
// The fp16 section's value, or DeepSpeed's default (runtime/precision_config.py).
template <typename T>
T fp16_key(const Plan& p, const char* key, T dflt) {
  const auto& c = p.config;
  if (!c.contains("fp16") || !c["fp16"].is_object() || !c["fp16"].contains(key)) return dflt;
  const auto& v = c["fp16"][key];
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean() ? v.get<bool>() : dflt;
  } else {
    return v.is_number() ? v.get<T>() : dflt;
  }
}
}  // namespace

bool dynamic_loss_scale(const Plan& p) {
  if (p.layout.dtype != "fp16") return false;
  if (p.st->loss_scaler) return p.st->loss_scaler->dynamic;
  return fp16_key<double>(p, "loss_scale", 0.0) == 0.0;  // loss_scale 0: dynamic
}

TorchValue loss_scaler(const Plan& p) {
  const auto& ls = p.st->loss_scaler;
  if (dynamic_loss_scale(p)) {
    // DynamicLossScaler.__init__ (runtime/fp16/loss_scaler.py) with the config's
    // dynamic_loss_scale_args; __dict__ in the order its __init__ (and LossScalerBase's) sets it.
    const std::int64_t hysteresis = fp16_key<std::int64_t>(p, "hysteresis", 2);
    const double init = std::ldexp(1.0, static_cast<int>(fp16_key<std::int64_t>(p, "initial_scale_power", 16)));
    std::vector<TorchValuePair> d;
    d.push_back(kv("cur_scale", W::real(ls ? ls->cur_scale : init)));
    d.push_back(kv("dynamic", W::boolean(true)));
    d.push_back(kv("cur_iter", W::integer(ls ? ls->cur_iter : 0)));
    d.push_back(kv("last_overflow_iter", W::integer(ls ? ls->last_overflow_iter : -1)));
    d.push_back(kv("scale_factor", W::real(2.0)));
    d.push_back(kv("scale_window", W::integer(fp16_key<std::int64_t>(p, "loss_scale_window", 1000))));
    d.push_back(kv("min_scale", W::integer(fp16_key<std::int64_t>(p, "min_loss_scale", 1))));
    d.push_back(kv("delayed_shift", W::integer(hysteresis)));
    d.push_back(kv("cur_hysteresis", W::integer(ls ? ls->cur_hysteresis : hysteresis)));
    d.push_back(kv("consecutive_hysteresis", W::boolean(fp16_key<bool>(p, "consecutive_hysteresis", false))));
    d.push_back(kv("raise_error_at_min_scale", W::boolean(true)));
    d.push_back(kv("dtype", W::object("torch.float16", {}, std::nullopt)));
    return W::object("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", {}, W::dict(std::move(d)));
  }
  // CreateLossScaler: LossScaler(static_loss_scale) under fp16, LossScaler(1.0) otherwise.
  const double scale = p.layout.dtype == "fp16" ? (ls ? ls->cur_scale : fp16_key<double>(p, "loss_scale", 1.0)) : 1.0;
  return W::object("deepspeed.runtime.fp16.loss_scaler.LossScaler", {}, W::dict({kv("cur_scale", W::real(scale)), kv("dynamic", W::boolean(false))}));
}

TorchValue module_state(TorchSaveWriter& w, const Plan& p, bool placeholders) {
  std::vector<TorchValuePair> m;
  std::map<std::string, TorchValue> tensor_of;
  for (const std::string& n : p.st->names) {
    if (placeholders) {
      // ZeRO-3 frees every partitioned parameter's data to an empty tensor of its dtype.
      m.push_back(kv(n, tensor_of[n] = w.tensor(p.lp_dtype, {0}, "")));
      continue;
    }
    const auto it = p.st->module.find(n);
    m.push_back(kv(n, tensor_of[n] = w.tensor_from_fp32(p.lp_dtype, p.st->shapes.at(n), it != p.st->module.end() ? it->second : p.st->master.at(n))));
  }
  // A tied weight's second name: the same tensor (one storage), as module.state_dict() holds it.
  for (const auto& [alias, owner] : p.st->tied) m.push_back(kv(alias, tensor_of.at(owner)));
  return ordered_dict(std::move(m));
}

TorchValue model_states(const Plan& p, TorchValue module, TorchValue optimizer) {
  const DeepSpeedTrainingState& st = *p.st;
  const bool zero = p.layout.zero_stage > 0;
  // zero_optimization_partition_gradients(): stages 2 and 3 save the frozen parameters' shapes and
  // fragments (none here: every parameter trains).
  const bool save_frozen = p.layout.zero_stage >= 2;
  TorchValue param_shapes = W::none();
  if (zero) {
    std::vector<TorchValue> groups;
    for (const DeepSpeedParamGroup& g : p.groups) {
      std::vector<TorchValuePair> shapes;
      for (const std::string& n : g.names) shapes.push_back(kv(n, torch_size(st.shapes.at(n))));
      groups.push_back(ordered_dict(std::move(shapes)));
    }
    param_shapes = W::list(std::move(groups));
  }
  std::vector<TorchValuePair> d;
  d.push_back(kv("module", std::move(module)));
  d.push_back(kv("buffer_names", W::list({})));
  d.push_back(kv("optimizer", std::move(optimizer)));
  d.push_back(kv("param_shapes", std::move(param_shapes)));
  d.push_back(kv("frozen_param_shapes", save_frozen ? ordered_dict({}) : W::none()));
  std::vector<TorchValuePair> shared;  // DeepSpeed's _get_shared_params: second name -> the parameter's
  for (const auto& [alias, owner] : st.tied) shared.push_back(kv(alias, W::string(owner)));
  d.push_back(kv("shared_params", zero ? W::dict(std::move(shared)) : W::none()));
  d.push_back(kv("frozen_param_fragments", save_frozen ? ordered_dict({}) : W::none()));
  d.push_back(kv("lr_scheduler", st.lr_scheduler_json ? json_value(nlohmann::ordered_json::parse(*st.lr_scheduler_json)) : W::none()));
  d.push_back(kv("data_sampler", W::none()));
  d.push_back(kv("random_ltd", W::none()));
  d.push_back(kv("sparse_tensor_module_names", W::object("builtins.set", {W::list({})}, std::nullopt)));
  d.push_back(kv("skipped_steps", W::integer(st.skipped_steps)));
  d.push_back(kv("global_steps", W::integer(st.global_steps)));
  d.push_back(kv("global_samples", W::integer(st.global_samples)));
  d.push_back(kv("dp_world_size", W::integer(p.layout.dp_world_size)));
  d.push_back(kv("mp_world_size", W::integer(1)));
  d.push_back(kv("checkpoint_parallel_dimensions", W::dict({kv("pp_degree", W::integer(1)), kv("tp_degree", W::integer(1))})));
  d.push_back(kv("ds_config", json_value(p.config)));
  d.push_back(kv("ds_version", str(kDeepSpeedVersion)));
  // save_checkpoint(client_state={"dstrain": ...}): the client's keys come after DeepSpeed's own.
  if (st.dstrain_json) d.push_back(kv("dstrain", json_value(nlohmann::ordered_json::parse(*st.dstrain_json))));
  return W::dict(std::move(d));
}

}  // namespace dstrain::ds_save
