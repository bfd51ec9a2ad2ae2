// A dstrain checkpoint as the DeepSpeed run of its Hugging Face model would have saved it
// (engine/checkpoint/deepspeed_export.h).
#include "engine/checkpoint/deepspeed_export.h"

#include <cctype>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config_schema/ds_config.h"
#include "data/run_files.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/deepspeed_resume.h"
#include "engine/checkpoint/whole_state_load.h"
#include "engine/lr_schedule.h"
#include "models/hf_param_names.h"
#include "ops/error.h"

namespace dstrain {
namespace {

std::int64_t json_int(const config::Json& j, const char* key, std::int64_t otherwise) {
  return j.contains(key) && j.at(key).is_number_integer() ? j.at(key).get<std::int64_t>() : otherwise;
}

}  // namespace

namespace {

// Where one Hugging Face tensor lies in its dstrain parameter: elements [offset, offset + rows·cols)
// of the whole parameter, transposed to Conv1D's (in, out) or not.
struct HfPlace {
  std::string name, param;
  std::vector<std::int64_t> shape;  // as saved
  std::int64_t offset = 0, rows = 0, cols = 0, param_numel = 0;
  bool transpose = false, tied = false;
  bool decayed = false;  // its parameter's ParamSpec::weight_decay
};

// Every Hugging Face tensor of the model placed in its parameter, in the Hugging Face model's
// order; the Errors of check_deepspeed_exportable.
std::vector<HfPlace> plan_hf_tensors(const Architecture& model) {
  struct Param {
    std::vector<std::int64_t> shape;
    bool hf_transposed = false, weight_decay = false;
  };
  std::map<std::string, Param> params;
  std::set<std::string> tied;
  for (const std::unique_ptr<Layer>& layer : model.make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) {
        tied.insert(ps.name);
      } else {
        params[ps.name] = {shape_dims(ps.whole_shape()), ps.hf_transposed, ps.weight_decay};
      }
    }
  }
  std::vector<HfPlace> out;
  std::map<std::string, std::int64_t> next;  // param -> the first element of its next block
  std::map<std::string, int> blocks;         // param -> how many untied tensors it is
  for (const HfParamName& e : model.hf_param_names()) {
    const auto pit = params.find(e.param);
    if (pit == params.end()) fail("the model's Hugging Face tensor '{}' names no parameter '{}'", e.name, e.param);
    const Param& p = pit->second;
    HfPlace t;
    t.name = e.name;
    t.param = e.param;
    t.decayed = p.weight_decay;
    t.tied = tied.contains(e.name);
    for (const std::string& a : e.aliases) t.tied = t.tied || tied.contains(a);
    std::vector<std::int64_t> hf = shape_dims(e.shape);  // nn.Linear's (out, in)
    t.transpose = p.hf_transposed && hf.size() == 2;
    t.rows = hf.empty() ? 1 : hf[0];
    t.cols = hf.size() >= 2 ? whole_numel({hf.begin() + 1, hf.end()}) : 1;
    t.param_numel = whole_numel(p.shape);
    // A tied name is the owner's tensor again, from its first element; otherwise each tensor is the
    // next block of the parameter's elements (map_hf_tensors' order: q_proj / k_proj / v_proj of
    // qkv_proj, expert e of a stacked expert weight).
    t.offset = t.tied ? 0 : next[e.param];
    if (!t.tied) {
      next[e.param] = t.offset + t.rows * t.cols;
      ++blocks[e.param];
    }
    if (t.offset + t.rows * t.cols > t.param_numel)
      fail("the Hugging Face tensor '{}' ({}) does not fit parameter '{}' ({})", e.name, fmt::join(hf, "x"), e.param, fmt::join(p.shape, "x"));
    if (t.transpose) std::swap(hf[0], hf[1]);
    t.shape = std::move(hf);
    out.push_back(std::move(t));
  }
  for (const auto& [name, p] : params) {
    if (!next.contains(name)) fail("parameter '{}' has no Hugging Face name to save it under", name);
    // Elements past the last block: only a padded vocabulary's rows (dstrain's own, always zero).
    if (next.at(name) != whole_numel(p.shape) && blocks.at(name) != 1)
      fail("the Hugging Face tensors of parameter '{}' cover {} of its {} elements", name, next.at(name), whole_numel(p.shape));
  }
  return out;
}

}  // namespace

namespace {

// "AdamW" -> "adamw": DeepSpeedTrainingState's optimizer_type, as the reader gives it.
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

namespace {

void check_adam(const std::string& optimizer_type) {
  const std::string t = lower(optimizer_type);
  if (t != "adam" && t != "adamw")
    fail("the optimizer is \"{}\"; a DeepSpeed checkpoint is written with Adam / AdamW states (DeepSpeed's FusedAdam) only", optimizer_type);
}

}  // namespace

void check_deepspeed_exportable(const Architecture& model, const std::string& optimizer_type) {
  check_adam(optimizer_type);
  (void)plan_hf_tensors(model);
}

namespace {

// Each placed tensor's values cut out of dstrain's whole tensors `whole`.
std::vector<HfTensor> tensors_of(const std::vector<HfPlace>& plan, const std::map<std::string, std::vector<float>>& whole, const std::string& what) {
  std::vector<HfTensor> out;
  for (const HfPlace& t : plan) {
    const auto wit = whole.find(t.param);
    if (wit == whole.end()) fail("the checkpoint has no {} of parameter '{}' (for '{}')", what, t.param, t.name);
    const std::vector<float>& w = wit->second;
    if (static_cast<std::int64_t>(w.size()) != t.param_numel)
      fail("the {} of parameter '{}' has {} elements, but the parameter has {}", what, t.param, w.size(), t.param_numel);
    HfTensor h{t.name, t.shape, t.tied, std::vector<float>(static_cast<std::size_t>(t.rows * t.cols))};
    if (t.transpose) {
      // dstrain's (out, in) rows -> Conv1D's (in, out).
      for (std::int64_t o = 0; o < t.rows; ++o)
        for (std::int64_t i = 0; i < t.cols; ++i)
          h.values[static_cast<std::size_t>(i * t.rows + o)] = w[static_cast<std::size_t>(t.offset + o * t.cols + i)];
    } else {
      std::copy(w.begin() + t.offset, w.begin() + t.offset + t.rows * t.cols, h.values.begin());
    }
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace

std::vector<HfTensor> hf_tensors_of(const Architecture& model, const std::map<std::string, std::vector<float>>& whole, const std::string& what) {
  return tensors_of(plan_hf_tensors(model), whole, what);
}

namespace {

std::string resolve_tag(const std::filesystem::path& save_dir, const std::string& tag) {
  if (!tag.empty()) {
    check_checkpoint_tag(tag);
    return tag;
  }
  const std::optional<std::string> latest = read_latest_tag(save_dir);
  if (!latest) fail("export: no '{}' file in '{}'; give the checkpoint with --tag", kLatestFile, save_dir.string());
  return *latest;
}

}  // namespace

namespace {

// The run's ZeRO stage, data-parallel ranks (the world over the tensor-, pipeline- and
// sequence-parallel splits) and dtype, from its manifest.
DeepSpeedSaveLayout layout_of(const config::Json& m) {
  const config::Json& layout = m.at("layout");
  const config::Json& ds = m.contains("ds_config") ? m.at("ds_config") : config::Json::object();
  const std::int64_t split = json_int(layout, "tensor_parallel", 1) * json_int(layout, "pipeline_stages", 1) *
                             std::max<std::int64_t>(json_int(ds, "sequence_parallel_size", 1), 1);
  DeepSpeedSaveLayout l;
  l.zero_stage = static_cast<int>(json_int(layout, "zero_stage", 0));
  l.dp_world_size = static_cast<int>(std::max<std::int64_t>(1, json_int(layout, "world_size", 1) / std::max<std::int64_t>(split, 1)));
  l.dtype = layout.value("dtype", std::string("fp32"));
  return l;
}

}  // namespace

DeepSpeedSaveLayout deepspeed_layout_of_checkpoint(const std::filesystem::path& save_dir, const std::string& tag) {
  return layout_of(CheckpointReader(save_dir, resolve_tag(save_dir, tag)).manifest());
}

namespace {

// The run's config, its LR schedule's position and the optimizer's hyperparameters as DeepSpeed's
// param groups hold them after a step: the lr the next step uses (the schedule at
// last_batch_iteration, as DeepSpeed's scheduler leaves it), betas, eps, weight_decay.
void set_config_and_schedule(const config::Json& m, DeepSpeedTrainingState& s) {
  const config::Json& e = m.at("engine");
  const std::int64_t it = m.at("lr_scheduler").at("last_batch_iteration").get<std::int64_t>();
  double wd = 0, lr = e.value("last_step_lr", 0.0);
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  if (m.contains("ds_config") && m.at("ds_config").is_object()) {
    const config::Json& dsj = m.at("ds_config");
    s.ds_config_json = dsj.dump();
    config::ConfigOptions opts;
    opts.world_size = json_int(m.at("layout"), "world_size", 1);
    if (m.at("layout").contains("pipeline_stages")) opts.pipeline_stages = json_int(m.at("layout"), "pipeline_stages", 1);
    const config::DsConfig cfg = config::parse_ds_config(dsj, opts);
    wd = cfg.optimizer.params.weight_decay;
    betas = cfg.optimizer.params.betas;
    eps = cfg.optimizer.params.eps;
    if (cfg.scheduler.present()) {
      LrSchedule sched(cfg.scheduler, cfg.optimizer.params.lr, betas);
      sched.set_last_batch_iteration(it);
      lr = sched.lr();
      s.lr_scheduler_json = config::Json{{"last_batch_iteration", it}}.dump();
    } else {
      lr = cfg.optimizer.params.lr;
    }
  }
  s.param_group = {{"lr", lr}, {"betas0", betas.first}, {"betas1", betas.second}, {"eps", eps}, {"weight_decay", wd}};
}

}  // namespace

DeepSpeedTrainingState deepspeed_state_of_checkpoint(const std::filesystem::path& save_dir, const std::string& tag_in) {
  const std::string tag = resolve_tag(save_dir, tag_in);
  CheckpointReader rd(save_dir, tag);
  const config::Json& m = rd.manifest();
  const std::shared_ptr<const Architecture> arch = manifest_architecture(m, rd.dir().string());
  DeepSpeedTrainingState s;
  s.dir = rd.dir();
  s.tag = tag;
  s.optimizer_type = lower(m.at("optimizer").at("type").get<std::string>());
  check_adam(s.optimizer_type);                          // before anything is read
  const std::vector<HfPlace> plan = plan_hf_tensors(*arch);  // the model's mapping, once for every buffer
  const DeepSpeedSaveLayout own = layout_of(m);
  s.zero_stage = own.zero_stage;
  s.dp_world_size = own.dp_world_size;
  s.dtype = own.dtype;

  // Every buffer whole, by dstrain name.
  std::vector<std::string> buffers{"master"};
  for (const config::Json& st : m.at("optimizer").at("states")) buffers.push_back(st.get<std::string>());
  std::map<std::string, std::map<std::string, std::vector<float>>> whole;
  for (const std::string& b : buffers) {
    const std::optional<DType> dt = rd.buffer_dtype(b);
    if (!dt) fail("export: checkpoint {} holds no '{}' values", rd.dir().string(), b);
    if (*dt != DType::fp32) fail("export: checkpoint {} holds its '{}' values in {}, not fp32", rd.dir().string(), b, dtype_name(*dt));
    for (const config::Json& p : m.at("model").at("params")) {
      const std::string name = p.at("name").get<std::string>();
      std::vector<float> v(static_cast<std::size_t>(whole_numel(p.at("shape").get<std::vector<std::int64_t>>())));
      rd.read(b, name, 0, static_cast<std::int64_t>(v.size()), v.data());
      whole[b][name] = std::move(v);
    }
  }
  std::map<std::string, std::string> hf_owner;  // dstrain parameter -> its untied Hugging Face name
  std::set<std::string> decayed;                // Hugging Face names of what dstrain decays (ParamSpec::weight_decay)
  for (const HfPlace& p : plan) {
    if (p.tied) continue;
    hf_owner.emplace(p.param, p.name);
    if (p.decayed) decayed.insert(p.name);
  }
  std::vector<HfTensor> masters = tensors_of(plan, whole.at("master"), "master");
  whole.erase("master");  // each buffer held once: dstrain's whole tensors go as their Hugging Face copies come
  for (std::size_t k = 0; k < masters.size(); ++k) {
    HfTensor& t = masters[k];
    if (t.tied) {
      s.tied[t.name] = hf_owner.at(plan[k].param);
      continue;
    }
    s.names.push_back(t.name);
    s.shapes[t.name] = t.shape;
    s.master[t.name] = std::move(t.values);
  }
  for (std::size_t b = 1; b < buffers.size(); ++b) {
    std::vector<HfTensor> ts = tensors_of(plan, whole.at(buffers[b]), buffers[b]);
    whole.erase(buffers[b]);
    for (HfTensor& t : ts)
      if (!t.tied) s.optimizer_states[buffers[b]][t.name] = std::move(t.values);
  }

  const config::Json& e = m.at("engine");
  s.global_steps = e.at("global_steps").get<std::int64_t>();
  s.global_samples = e.at("global_samples").get<std::int64_t>();
  s.skipped_steps = e.at("skipped_steps").get<std::int64_t>();
  if (buffers.size() > 1) s.optimizer_step = s.global_steps - s.skipped_steps;
  // The data loader's position and the seed a `dstrain train` checkpoint holds, for a resume from
  // the DeepSpeed folder to continue the data as dstrain's own resume does.
  if (m.contains("client_state") && m.at("client_state").is_object() && m.at("client_state").contains("data")) {
    config::Json d{{"data", m.at("client_state").at("data")}, {"seed", m.at("seed")}};
    if (e.contains("sequence_length")) d["sequence_length"] = e.at("sequence_length");
    s.dstrain_json = d.dump();
  }
  const config::Json& ls = m.at("loss_scaler");
  const std::string kind = ls.at("kind").get<std::string>();
  if (kind.starts_with("dynamic") || kind == "static") {
    DeepSpeedLossScaler l;
    l.cur_scale = ls.at("cur_scale").get<double>();
    l.cur_iter = ls.at("cur_iter").get<std::int64_t>();
    l.last_overflow_iter = ls.at("last_overflow_iter").get<std::int64_t>();
    l.cur_hysteresis = ls.at("cur_hysteresis").get<std::int64_t>();
    l.dynamic = kind.starts_with("dynamic");
    s.loss_scaler = l;
  }
  set_config_and_schedule(m, s);
  DeepSpeedParamGroup decay{{}, s.param_group.at("weight_decay")}, no_decay{{}, 0.0};
  for (const std::string& n : s.names) (decayed.contains(n) ? decay : no_decay).names.push_back(n);
  for (DeepSpeedParamGroup* g : {&decay, &no_decay})
    if (!g->names.empty()) s.groups.push_back(std::move(*g));
  return s;
}

std::string export_deepspeed_checkpoint(const std::filesystem::path& save_dir, const std::string& tag, const std::filesystem::path& output,
                                        DeepSpeedExportFormat format, std::optional<DeepSpeedSaveLayout> layout) {
  // The DeepSpeed folder gets its own `latest` and tag folders: inside the checkpoint's folder (or
  // around it) they would replace dstrain's `latest` or mix with its tags.
  if (is_inside(output, save_dir) || is_inside(save_dir, output))
    fail("export: the output folder {} {} the checkpoint folder {}; give -o a folder outside it (train --save-format writes DeepSpeed's files "
         "into the checkpoint's own tag folder)",
         output.string(), is_inside(output, save_dir) ? "is or lies inside" : "holds", save_dir.string());
  // A tag folder already there (an earlier export, another run's save) would keep its files beside
  // the new ones — rank files of two layouts, which a reader globbing *_optim_states.pt mixes.
  // Checked before the checkpoint is read.
  if (const std::filesystem::path out_tag = output / resolve_tag(save_dir, tag); std::filesystem::exists(out_tag))
    fail("export: {} already exists; the new files would mix with its own (another layout's rank files under one `latest`). Remove it, or "
         "give -o another folder",
         out_tag.string());
  DeepSpeedTrainingState s = deepspeed_state_of_checkpoint(save_dir, tag);
  if (format == DeepSpeedExportFormat::universal) {
    write_universal_checkpoint(output, s);
  } else {
    write_deepspeed_checkpoint(output, s, layout.value_or(DeepSpeedSaveLayout{s.zero_stage, s.dp_world_size, s.dtype}));
  }
  return s.tag;
}

}  // namespace dstrain
