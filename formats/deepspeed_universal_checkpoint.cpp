// DeepSpeed's universal checkpoint (deepspeed/checkpoint/ds_to_universal.py) read into a
// DeepSpeedTrainingState, as DeepSpeed's load_universal reads it (checkpoint/universal_checkpoint.py
// load_hp_checkpoint_state, runtime/base_optimizer.py load_hp_checkpoint_state_from_checkpoint_dir,
// zero/stage3.py load_hp_checkpoint_state_from_checkpoint_dir_stage3). The folder is
// ds_to_universal's --output_folder:
//   mp_rank_00_model_states.pt (ZeRO 1/2) or every zero_pp_rank_<r>_mp_rank_00_model_states.pt
//     (ZeRO-3), copied unchanged from the source checkpoint: counters, lr_scheduler, ds_config,
//     param_shapes (the parameters and their groups). load_universal takes no weights from its module.
//   zero/optimizer_state.pt: the ZeRO optimizer's state_dict without its partitioned entries, plus
//     "param_groups" (the base optimizer's): loss_scaler, zero_stage, partition_count; ZeRO-3's also
//     the base optimizer's state_dict, whose state[0].step is the step.
//   zero/<param name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt: the whole tensor, the data-parallel
//     partitions (and tensor-parallel slices) merged: ZeRO 1/2 a dict {"param": tensor of the
//     parameter's shape, "cat_dim", maybe "vocab_tensor": True with the padded vocabulary rows
//     stripped to original_vocab_size}; ZeRO-3 the flat tensor itself (merge_zero3_slices).
//   zero/<param name>/step.pt: the base optimizer's step as saved (a number or a tensor), ZeRO 1/2 only.
// `latest_universal` beside the folder names it (resolved in formats/deepspeed_checkpoint.cpp).
#include <algorithm>
#include <optional>
#include <set>
#include <system_error>

#include <fmt/ranges.h>

#include "formats/deepspeed_checkpoint_parts.h"
#include "ops/error.h"

namespace dstrain::deepspeed_parts {
namespace {

namespace fs = std::filesystem;

// One state file of a parameter: its values, and its shape normalized to the parameter's.
struct StateTensor {
  std::vector<float> values;
  std::vector<std::int64_t> shape;
  bool vocab = false;  // "vocab_tensor": padded vocabulary rows stripped
};

std::string shape_text(const std::vector<std::int64_t>& s) { return s.empty() ? std::string("a scalar") : fmt::format("{}", fmt::join(s, "x")); }

// fp32.pt / exp_avg.pt / exp_avg_sq.pt of a parameter whose param_shapes entry is `want`.
StateTensor read_state(const fs::path& file, const std::string& name, const std::vector<std::int64_t>& want, const fs::path& shapes_file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    fail("DeepSpeed universal checkpoint file '{}' is missing: ds_to_universal.py writes fp32.pt, exp_avg.pt and exp_avg_sq.pt for every "
         "parameter of param_shapes ('{}')",
         file.string(), name);
  }
  const TorchPickle f(file);
  const TorchValue& root = f.root();
  StateTensor out;
  const TorchValue* t = &root;
  if (root.is_dict()) {
    t = &root.at("param");
    if (const TorchValue* v = root.find("vocab_tensor"); v != nullptr && !v->is_none()) out.vocab = v->as_bool();
    if (const TorchValue* e = root.find("is_expert_param"); e != nullptr && !e->is_none() && e->as_bool())
      fail("DeepSpeed universal checkpoint file '{}': an expert (MoE) parameter's stacked experts, which dstrain does not read yet", file.string());
  }
  if (!t->is_tensor()) t->fail_here(std::string(" is a ") + t->kind_name() + ", not a tensor");
  out.values = f.read_fp32(*t);
  out.shape = t->as_tensor().shape;
  if (out.shape == want) return out;
  // A vocabulary parameter: ds_to_universal cut the rows Megatron padded the vocabulary with
  // (param[:original_vocab_size]); load_universal pads it again to the loading model's size. The
  // state keeps the real vocabulary; a model's own padding rows start at zero.
  const bool fewer_rows = out.vocab && out.shape.size() == want.size() && !want.empty() && out.shape[0] <= want[0] &&
                          std::equal(out.shape.begin() + 1, out.shape.end(), want.begin() + 1);
  // ZeRO-3's merge saves the flat concatenation of the ranks' pieces, without the shape.
  const bool flat = !root.is_dict() && out.shape.size() == 1 && out.shape[0] == numel_of(want);
  if (flat) out.shape = want;
  if (!fewer_rows && !flat) {
    fail("DeepSpeed universal checkpoint file '{}': '{}' is {}, but param_shapes of '{}' say {}", file.string(), name, shape_text(out.shape),
         shapes_file.string(), shape_text(want));
  }
  return out;
}

// Refused by name: a universal checkpoint of a model-parallel run. ds_to_universal merges its
// tensor-parallel slices by the model's own patterns (cat_dim, sub_param_shape, averaged and
// replicated parameters, Megatron's names) and copies each model-parallel rank's model states file
// with that rank's slice shapes; dstrain reads model-parallel size 1 only.
void refuse_model_parallel(const fs::path& dir, const TorchValue& root, const fs::path& model_file) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find("mp_rank_") != std::string::npos && name.find("mp_rank_00") == std::string::npos) {
      fail("DeepSpeed universal checkpoint '{}' holds model-parallel rank files ('{}'): it was converted from a tensor- or pipeline-parallel "
           "run, whose zero/<param>/ tensors are merged by that model's own slicing patterns and whose param_shapes are one rank's slices; "
           "dstrain reads universal checkpoints of model-parallel size 1 only",
           dir.string(), name);
    }
  }
  std::int64_t mp = 1;
  if (const TorchValue* v = root.find("mp_world_size"); v != nullptr && !v->is_none()) mp = v->as_int();
  if (const TorchValue* d = root.find("checkpoint_parallel_dimensions"); d != nullptr && d->is_dict()) {
    for (const char* k : {"tp_degree", "pp_degree"})
      if (const TorchValue* v = d->find(k); v != nullptr && !v->is_none()) mp = std::max(mp, v->as_int());
  }
  if (mp > 1) {
    fail("DeepSpeed universal checkpoint file '{}': the source run was model-parallel (mp_world_size / tp_degree / pp_degree {}); dstrain reads "
         "universal checkpoints of model-parallel size 1 only",
         model_file.string(), mp);
  }
}

std::int64_t partition_count_of(const TorchValue& pc) {
  if (!pc.is_sequence()) return pc.as_int();
  std::int64_t n = 0;
  for (std::size_t k = 0; k < pc.size(); ++k) n = std::max(n, pc[k].as_int());
  return n;
}

}  // namespace

void read_universal_checkpoint(DeepSpeedTrainingState& st) {
  std::error_code ec;
  const bool stage3_layout = !fs::exists(st.dir / "mp_rank_00_model_states.pt", ec) && fs::exists(st.dir / "zero_pp_rank_0_mp_rank_00_model_states.pt", ec);
  const fs::path model_file = st.dir / (stage3_layout ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt");
  if (!fs::exists(model_file, ec)) {
    fail("DeepSpeed universal checkpoint '{}': the model states file '{}' is missing (ds_to_universal.py copies it from the source checkpoint)",
         st.dir.string(), model_file.string());
  }
  const TorchPickle ms(model_file);
  const TorchValue& root = ms.root();
  refuse_model_parallel(st.dir, root, model_file);
  read_run_state(root, st);

  // The parameters, their order and groups: param_shapes, which load_universal reads the optimizer's
  // parameters by (the saving run's ZeRO groups; ZeRO-3's sub-groups).
  const TorchValue* param_shapes = root.find("param_shapes");
  if (param_shapes == nullptr || !param_shapes->is_sequence()) {
    fail("DeepSpeed universal checkpoint file '{}' has no param_shapes (the ZeRO run's parameters, by group)", model_file.string());
  }
  std::vector<std::vector<std::string>> groups;
  std::vector<std::string> raw_names;
  std::map<std::string, std::vector<std::int64_t>> want;
  for (std::size_t g = 0; g < param_shapes->size(); ++g) {
    const TorchValue& shapes = (*param_shapes)[g];
    if (!shapes.is_dict()) shapes.fail_here(" is not a dict of parameter shapes");
    groups.emplace_back();
    for (const auto& [k, v] : shapes.pairs) {
      // Each name is a folder under zero/: one that is a path would have the reader take files
      // from outside zero/ — elsewhere in the checkpoint or anywhere on the machine.
      const std::string& n = k.as_string();
      check_param_name(n, model_file.string());
      groups.back().push_back(n);
      raw_names.push_back(k.s);
      want[k.s] = shape_of(v);
    }
  }
  if (raw_names.empty()) fail("DeepSpeed universal checkpoint file '{}': param_shapes name no parameters", model_file.string());
  if (const std::string twice = first_repeated(raw_names); !twice.empty())
    fail("DeepSpeed universal checkpoint file '{}': param_shapes name the parameter '{}' twice", model_file.string(), twice);

  // The module's dtype (its weights are not read: load_universal casts the fp32 masters into them).
  if (const TorchValue* m = root.find("module"); m != nullptr && m->is_dict())
    if (const TorchValue* w = m->find(raw_names.front()); w != nullptr && w->is_tensor()) st.dtype = dtype_name(w->as_tensor().dtype);
  if (st.dtype.empty()) {
    st.dtype = "fp32";
    if (const TorchValue* c = root.find("ds_config"); c != nullptr && c->is_dict())
      for (const char* d : {"bf16", "fp16"})
        if (const TorchValue* x = c->find(d); x != nullptr && x->is_dict())
          if (const TorchValue* en = x->find("enabled"); en != nullptr && en->kind == TorchValue::Kind::boolean && en->b) st.dtype = d;
  }

  const fs::path zero = st.dir / "zero";
  const fs::path opt_file = zero / "optimizer_state.pt";
  if (!fs::is_regular_file(opt_file, ec)) {
    fail("DeepSpeed universal checkpoint file '{}' is missing (ds_to_universal.py saves the optimizer's global state there; load_universal needs it)",
         opt_file.string());
  }
  const TorchPickle of(opt_file);
  const TorchValue& opt = of.root();
  if (const TorchValue* l = opt.find("loss_scaler"); l != nullptr && !l->is_none()) st.loss_scaler = loss_scaler_of(*l);
  if (const TorchValue* zs = opt.find("zero_stage"); zs != nullptr && !zs->is_none()) {
    st.zero_stage = zero_stage_of(*zs);
  } else {
    // BF16_Optimizer's state_dict has no zero_stage: the run's config says.
    st.zero_stage = config_zero_stage(root) > 0 ? config_zero_stage(root) : (stage3_layout ? 3 : 1);
  }
  if (st.zero_stage < 1 || st.zero_stage > 3) fail("DeepSpeed universal checkpoint file '{}': zero_stage {} (ds_to_universal converts stages 1 to 3)", opt_file.string(), st.zero_stage);
  if (const TorchValue* pc = opt.find("partition_count"); pc != nullptr && !pc->is_none()) {
    st.dp_world_size = static_cast<int>(partition_count_of(*pc));
  } else if (const TorchValue* w = root.find("dp_world_size"); w != nullptr && !w->is_none()) {
    st.dp_world_size = static_cast<int>(w->as_int());
  }
  const TorchValue* base = opt.find("optimizer_state_dict");  // ZeRO-3: the base optimizer's state_dict
  const TorchValue* pgs = opt.find("param_groups");
  if ((pgs == nullptr || !pgs->is_sequence()) && base != nullptr) pgs = base->find("param_groups");
  if (pgs != nullptr && pgs->is_sequence() && pgs->size() > 0) read_param_group((*pgs)[0], st);

  const bool wrapped = std::all_of(raw_names.begin(), raw_names.end(), [](const std::string& n) { return n.starts_with("module."); });
  const std::function<std::string(const std::string&)> bare = [wrapped](const std::string& n) { return wrapped ? n.substr(7) : n; };
  if (pgs != nullptr && pgs->is_sequence()) {
    if (st.zero_stage == 3) {
      set_zero3_groups(*pgs, groups, st, bare);
    } else {
      set_groups(*pgs, groups, st, bare);
    }
  }

  // Every parameter's folder; a folder param_shapes does not name means they describe another model.
  const std::set<std::string> named(raw_names.begin(), raw_names.end());
  for (const fs::directory_entry& e : fs::directory_iterator(zero, ec)) {
    if (e.is_directory(ec) && !named.contains(e.path().filename().string())) {
      fail("DeepSpeed universal checkpoint '{}': the parameter folder '{}' is not in the param_shapes of '{}'", st.dir.string(), e.path().string(),
           model_file.string());
    }
  }
  std::optional<std::int64_t> step;
  fs::path step_file;
  for (const std::string& n : raw_names) {
    const fs::path folder = zero / n;
    if (!fs::is_directory(folder, ec)) {
      fail("DeepSpeed universal checkpoint '{}': the parameter folder '{}' is missing (param_shapes of '{}' name '{}')", st.dir.string(),
           folder.string(), model_file.string(), n);
    }
    StateTensor fp32 = read_state(folder / "fp32.pt", n, want.at(n), model_file);
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const fs::path f = folder / (std::string(key) + ".pt");
      StateTensor m = read_state(f, n, want.at(n), model_file);
      if (m.shape != fp32.shape) {
        fail("DeepSpeed universal checkpoint file '{}': {} of '{}' is {}, but its fp32.pt is {}", f.string(), key, n, shape_text(m.shape),
             shape_text(fp32.shape));
      }
      st.optimizer_states[key][bare(n)] = std::move(m.values);
    }
    if (const fs::path f = folder / "step.pt"; fs::is_regular_file(f, ec)) {
      const TorchPickle sf(f);
      const std::int64_t s = scalar_int(sf, sf.root());
      // One optimizer step for all: load_hp_checkpoint_state_from_checkpoint_dir asserts it per group.
      if (step && *step != s) fail("DeepSpeed universal checkpoint file '{}': step {}, but '{}' says {}", f.string(), s, step_file.string(), *step);
      step = s;
      step_file = f;
    }
    const std::string b = bare(n);
    st.names.push_back(b);
    st.shapes[b] = fp32.shape;
    st.module[b] = fp32.values;  // load_universal: the module's weights are the masters, cast (update_lp_params)
    st.master[b] = std::move(fp32.values);
  }
  // ZeRO-3 saves no step.pt: its step is the base optimizer's (stage3.py reads state[0]['step']);
  // a ZeRO 1/2 run whose base optimizer keeps the step in its param group (FusedAdam) has it there.
  if (!step && base != nullptr)
    if (const TorchValue* s = base->find("state"); s != nullptr && s->is_dict())
      if (const TorchValue* s0 = s->find(std::int64_t{0}); s0 != nullptr && s0->is_dict())
        if (const TorchValue* v = s0->find("step"); v != nullptr && !v->is_none()) step = scalar_int(of, *v);
  if (!step && pgs != nullptr && pgs->is_sequence() && pgs->size() > 0)
    if (const TorchValue* v = (*pgs)[0].find("step"); v != nullptr && !v->is_none()) step = scalar_int(of, *v);
  st.optimizer_step = step;
}

}  // namespace dstrain::deepspeed_parts
