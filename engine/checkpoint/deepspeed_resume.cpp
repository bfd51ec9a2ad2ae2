// A DeepSpeed checkpoint mapped onto dstrain's parameters and checked against the config
// (engine/checkpoint/deepspeed_resume.h).
#include "engine/checkpoint/deepspeed_resume.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/lr_schedule.h"
#include "engine/optim/optimizer.h"
#include "models/hf_param_names.h"
#include "ops/error.h"

namespace dstrain {
namespace {

struct WholeParam {
  std::vector<std::int64_t> shape;
  bool hf_transposed = false;
};

// The Hugging Face tensor `e` saved under `saved` (or nullptr).
const std::string* find_saved(const HfParamName& e, const std::map<std::string, std::vector<float>>& tensors) {
  if (const auto it = tensors.find(e.name); it != tensors.end()) return &it->first;
  for (const std::string& a : e.aliases)
    if (const auto it = tensors.find(a); it != tensors.end()) return &it->first;
  return nullptr;
}

// "FusedAdam", "DeepSpeedCPUAdam", "AdamW", "torch.optim.AdamW" -> "adam"; the optimizers whose
// states and update agree are one family (DeepSpeed's FusedAdam is Adam and AdamW by adam_w_mode).
std::string optimizer_family(std::string type) {
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (const auto dot = type.rfind('.'); dot != std::string::npos) type = type.substr(dot + 1);
  for (const char* prefix : {"deepspeedcpu", "fused", "cpu"})
    if (type.starts_with(prefix)) type = type.substr(std::string(prefix).size());
  if (type == "adamw") return "adam";
  return type;
}

}  // namespace

std::vector<std::int64_t> shape_dims(const Shape& s) {
  std::vector<std::int64_t> out;
  for (int d = 0; d < s.rank; ++d) out.push_back(s[d]);
  return out;
}

std::map<std::string, std::vector<float>> map_hf_tensors(const Architecture& model, const std::map<std::string, std::vector<float>>& tensors,
                                                         const std::map<std::string, std::vector<std::int64_t>>& shapes, const std::string& source,
                                                         const std::string& what) {
  std::map<std::string, WholeParam> params;
  std::set<std::string> tied;  // dstrain names of tied parameters (the lm_head of a tied model)
  for (const std::unique_ptr<Layer>& layer : model.make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) {
        tied.insert(ps.name);
        continue;
      }
      params[ps.name] = {shape_dims(ps.whole_shape()), ps.hf_transposed};
    }
  }
  const std::vector<HfParamName> table = model.hf_param_names();
  std::map<std::string, std::vector<const HfParamName*>> blocks;  // param -> its untied tensors, in order
  std::map<std::string, std::vector<const HfParamName*>> ties;    // param -> its tied tensors
  for (const HfParamName& e : table) {
    bool is_tied = tied.contains(e.name);
    for (const std::string& a : e.aliases) is_tied = is_tied || tied.contains(a);
    if (!params.contains(e.param)) fail("{}: the model's Hugging Face tensor '{}' names no parameter '{}'", source, e.name, e.param);
    (is_tied ? ties : blocks)[e.param].push_back(&e);
  }
  std::set<std::string> used;
  std::map<std::string, std::vector<float>> out;
  for (const auto& [pname, wp] : params) {
    const auto bit = blocks.find(pname);
    if (bit == blocks.end()) fail("{}: parameter '{}' has no Hugging Face name to read its {} from", source, pname, what);
    const std::vector<const HfParamName*>& parts = bit->second;
    // Each Hugging Face tensor is the next block of the whole parameter's elements, in the table's
    // order: Llama's q_proj / k_proj / v_proj the row blocks of qkv_proj, a mixture of experts'
    // expert e the e-th (I x C) block of the stacked (E, I, C) weights; one tensor alone may be
    // shorter (the real vocabulary of a padded table: the rows past it stay zero).
    std::vector<float> whole(static_cast<std::size_t>(whole_numel(wp.shape)), 0.0f);
    std::int64_t at = 0;
    for (const HfParamName* e : parts) {
      const std::string* saved = find_saved(*e, tensors);
      // A tied tensor saved instead of its owner (DeepSpeed keeps the first name of a shared one).
      if (saved == nullptr && parts.size() == 1 && ties.contains(pname))
        for (const HfParamName* t : ties.at(pname))
          if (saved == nullptr) saved = find_saved(*t, tensors);
      if (saved == nullptr) fail("{}: it has no {} for '{}' (dstrain's '{}')", source, what, e->name, pname);
      used.insert(*saved);
      std::vector<std::int64_t> hf = shape_dims(e->shape);
      const bool transpose = wp.hf_transposed && hf.size() == 2;
      if (transpose) std::swap(hf[0], hf[1]);
      const std::vector<float>& v = tensors.at(*saved);
      if (const auto s = shapes.find(*saved); s != shapes.end() && s->second != hf)
        fail("{}: its {} '{}' is {}, but this model's is {}", source, what, *saved, fmt::join(s->second, "x"), fmt::join(hf, "x"));
      const std::int64_t n = whole_numel(hf);
      if (static_cast<std::int64_t>(v.size()) != n)
        fail("{}: its {} '{}' has {} elements, but this model's is {} ({} elements)", source, what, *saved, v.size(), fmt::join(hf, "x"), n);
      if (at + n > static_cast<std::int64_t>(whole.size()))
        fail("{}: its {} '{}' ({}) does not fit dstrain's '{}' ({})", source, what, *saved, fmt::join(hf, "x"), pname, fmt::join(wp.shape, "x"));
      if (transpose) {
        // Conv1D (in, out) -> (out, in).
        const std::int64_t in = hf[0], o = hf[1];
        for (std::int64_t i = 0; i < in; ++i)
          for (std::int64_t j = 0; j < o; ++j) whole[static_cast<std::size_t>(at + j * in + i)] = v[static_cast<std::size_t>(i * o + j)];
      } else {
        std::copy(v.begin(), v.end(), whole.begin() + at);
      }
      at += n;
    }
    const bool padded_vocab = parts.size() == 1 && parts[0]->split.kind == SplitKind::vocabulary;  // rows past the vocabulary stay zero
    if (at != static_cast<std::int64_t>(whole.size()) && !padded_vocab)
      fail("{}: its {} of dstrain's '{}' covers {} of its {} elements", source, what, pname, at, whole.size());
    out[pname] = std::move(whole);
  }
  // A tied weight saved twice must be saved the same (both names hold one tensor).
  for (const auto& [pname, list] : ties) {
    const std::string* owner = find_saved(*blocks.at(pname).front(), tensors);
    for (const HfParamName* t : list) {
      const std::string* saved = find_saved(*t, tensors);
      if (saved == nullptr) continue;
      used.insert(*saved);
      if (owner != nullptr && *owner != *saved && tensors.at(*owner) != tensors.at(*saved))
        fail("{}: the tied weights '{}' and '{}' are one tensor in this model, but their saved {} values differ", source, *owner, *saved, what);
    }
  }
  for (const auto& [name, v] : tensors)
    if (!used.contains(name)) fail("{}: its {} '{}' is no tensor of this model (dstrain's {} has none of that name)", source, what, name, model.family().name());
  return out;
}

// The saved state carries only the schedule's iteration (DeepSpeed's {"last_batch_iteration"}), so
// the config's scheduler and optimizer decide the lr from here on — as DeepSpeed's load_checkpoint
// does. Where that lr is not the one the saved run's optimizer held (a scheduler or an lr changed
// between the runs), the run would jump silently: say so, with both schedules, before step 1.
static std::optional<std::string> lr_change_note(const DeepSpeedTrainingState& ds, const config::DsConfig& config, std::optional<std::int64_t> it,
                                          const std::string& source) {
  const auto saved = ds.param_group.find("lr");
  if (saved == ds.param_group.end()) return std::nullopt;
  double lr = config.optimizer.params.lr;
  if (config.scheduler.present() && it) {
    LrSchedule sched(config.scheduler, config.optimizer.params.lr, config.optimizer.params.betas);
    sched.set_last_batch_iteration(*it);
    lr = sched.lr();
  }
  if (std::abs(lr - saved->second) <= 1e-6 * std::max(std::abs(lr), std::abs(saved->second))) return std::nullopt;
  std::string before = "its ds_config is not saved";
  if (ds.ds_config_json) {
    const config::Json d = config::Json::parse(*ds.ds_config_json, nullptr, false);
    const bool has = d.is_object() && d.contains("scheduler") && d.at("scheduler").is_object();
    before = has ? fmt::format("its run's scheduler was {}", d.at("scheduler").dump()) : std::string("its run had no scheduler");
  }
  const std::string now = config.scheduler.present()
                              ? fmt::format("the config's is {{\"type\": \"{}\", \"params\": {}}}", config.scheduler.type, config.scheduler.raw_params.dump())
                              : std::string("the config has none");
  return fmt::format("{}: its optimizer was at lr {:.6g}, but this config gives lr {:.6g}{} ({}; {}): the lr changes at the resume, as "
                     "DeepSpeed's load_checkpoint would change it; resume with the saved run's scheduler and optimizer lr to continue its schedule",
                     source, saved->second, lr, it ? fmt::format(" at iteration {}", *it) : std::string(), before, now);
}

DeepSpeedResume deepspeed_resume_state(const DeepSpeedTrainingState& ds, const Architecture& model, const config::DsConfig& config) {
  DeepSpeedResume r;
  const std::string source = fmt::format("DeepSpeed checkpoint {}", ds.dir.string());
  WholeTrainingState& ws = r.state;
  ws.source = source;
  r.summary = fmt::format("{} (global_step {}, ZeRO stage {} on {} ranks, {})", source, ds.global_steps, ds.zero_stage, ds.dp_world_size,
                          ds.dtype.empty() ? std::string("?") : ds.dtype);
  std::vector<std::string> carried;
  // The masters: the fp32 ones, or where none was saved (fp32 without ZeRO) the module's weights.
  if (!ds.master.empty()) {
    ws.masters = map_hf_tensors(model, ds.master, ds.shapes, source, "fp32 master");
    carried.push_back("masters");
  } else {
    if (ds.module.empty()) fail("{}: it holds neither fp32 masters nor module weights", source);
    ws.masters = map_hf_tensors(model, ds.module, ds.shapes, source, "module weight");
    carried.push_back("masters (the module weights)");
    r.notes.push_back(fmt::format("{}: no fp32 masters saved; the module weights (as saved, {}) are the masters", source, ds.dtype));
  }
  // The optimizer: its type's family and its states, by name.
  if (!config.optimizer.present()) fail("{}: the config has no optimizer to continue its optimizer states with", source);
  if (!ds.optimizer_type.empty() && optimizer_family(ds.optimizer_type) != optimizer_family(config.optimizer.type)) {
    fail("{}: it was saved by optimizer {}, but the config's optimizer is \"{}\"; resume with the optimizer it was trained with", source,
         ds.optimizer_type, config.optimizer.type);
  }
  const std::vector<std::string> names = Optimizer(config.optimizer).state_names();
  std::vector<std::string> saved_names;
  for (const auto& [s, m] : ds.optimizer_states) saved_names.push_back(s);
  if (std::set<std::string>(saved_names.begin(), saved_names.end()) != std::set<std::string>(names.begin(), names.end())) {
    fail("{}: it holds the optimizer states [{}], but the config's optimizer \"{}\" keeps [{}]", source, fmt::join(saved_names, ", "),
         config.optimizer.type, fmt::join(names, ", "));
  }
  for (const std::string& s : names) {
    ws.states[s] = map_hf_tensors(model, ds.optimizer_states.at(s), ds.shapes, source, s);
    carried.push_back(s);
  }
  ws.optimizer_step = ds.optimizer_step;
  if (ds.optimizer_step) {
    if (*ds.optimizer_step != ds.global_steps - ds.skipped_steps) {
      fail("{}: its optimizer has taken {} steps, but global_steps {} - skipped_steps {} = {}, which dstrain's bias corrections count", source,
           *ds.optimizer_step, ds.global_steps, ds.skipped_steps, ds.global_steps - ds.skipped_steps);
    }
    carried.push_back(fmt::format("step {}", *ds.optimizer_step));
  }
  ws.global_steps = ds.global_steps;
  ws.global_samples = ds.global_samples;
  ws.skipped_steps = ds.skipped_steps;
  // The LR schedule: DeepSpeed's own schedulers save {"last_batch_iteration": it}.
  std::optional<config::Json> sched;
  if (ds.lr_scheduler_json) {
    try {
      sched = config::Json::parse(*ds.lr_scheduler_json);
    } catch (const config::Json::exception& e) {
      fail("{}: its lr_scheduler state is not JSON ({})", source, e.what());
    }
    if (sched->is_null()) sched.reset();
  }
  if (sched && !config.scheduler.present())
    fail("{}: it has an LR schedule's state ({}), but the config has no scheduler; add the scheduler it was trained with", source, sched->dump());
  if (!sched && config.scheduler.present())
    fail("{}: it has no LR schedule state, but the config's scheduler \"{}\" would start over at iteration 0; resume with the config it was trained "
         "with",
         source, config.scheduler.type);
  if (sched) {
    if (!sched->is_object() || !sched->contains("last_batch_iteration") || !sched->at("last_batch_iteration").is_number_integer() ||
        sched->size() != 1) {
      fail("{}: its LR schedule state {} is not one of DeepSpeed's schedulers ({{\"last_batch_iteration\": N}}), which are the schedules dstrain has",
           source, sched->dump());
    }
    ws.lr_last_batch_iteration = sched->at("last_batch_iteration").get<std::int64_t>();
    carried.push_back(fmt::format("lr schedule at iteration {}", *ws.lr_last_batch_iteration));
  }
  if (std::optional<std::string> change = lr_change_note(ds, config, ws.lr_last_batch_iteration, source)) r.notes.push_back(std::move(*change));
  // The loss scale: carried only into fp16 with dynamic loss scaling.
  const bool dynamic_fp16 = config.fp16.enabled && config.fp16.loss_scale == 0.0;
  if (ds.loss_scaler) {
    const DeepSpeedLossScaler& ls = *ds.loss_scaler;
    if (dynamic_fp16 && ls.dynamic) {
      ws.loss_scaler = LossScalerState{ls.cur_scale, ls.cur_iter, ls.last_overflow_iter, ls.cur_hysteresis};
      carried.push_back(fmt::format("loss scale {}", ls.cur_scale));
    } else if (dynamic_fp16) {
      r.notes.push_back(fmt::format("{}: its static loss scale {} is not carried over; the dynamic fp16 loss scale starts fresh", source, ls.cur_scale));
    } else if (ls.dynamic || ls.cur_scale != 1.0) {
      r.notes.push_back(fmt::format("{}: its {} loss scale {} is ignored: the config trains in {}", source, ls.dynamic ? "dynamic" : "static",
                                    ls.cur_scale, config.fp16.enabled ? "fp16 with a static loss scale" : config.bf16.enabled ? "bf16" : "fp32"));
    }
  } else if (dynamic_fp16) {
    r.notes.push_back(fmt::format("{}: it has no loss scaler state; the dynamic fp16 loss scale starts fresh", source));
  }
  r.carried = fmt::format("{}", fmt::join(carried, ", "));
  return r;
}

}  // namespace dstrain
