#include "formats/deepspeed_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <system_error>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "formats/deepspeed_checkpoint_parts.h"
#include "formats/torch_pickle.h"
#include "ops/error.h"

namespace dstrain {
namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

using namespace deepspeed_parts;

// One data-parallel rank's piece of a flat group: its values and the padding at its tail (0 for a
// piece saved with its padding already removed).
struct Piece {
  std::vector<float> values;
  std::int64_t padding = 0;
  std::string file;
};

// The ranks' pieces of a flat group concatenated as saved: DeepSpeed's alignment padding lies at the
// group's tail only (the last ranks' partitions), so the parameters are the first `need` values, as
// zero_to_fp32 takes them. The paddings must account for exactly what is left over: a shape that
// does not add up with the partitions and paddings is an Error.
std::vector<float> join(const std::vector<Piece>& pieces, std::int64_t need, const std::string& what, const std::string& shapes_file) {
  std::vector<float> out;
  std::size_t total = 0;
  for (const Piece& p : pieces) total += p.values.size();
  out.reserve(total);  // one allocation: growing by insert would copy the group again at every doubling
  std::int64_t padding = 0;
  for (const Piece& p : pieces) {
    if (p.padding < 0) fail("DeepSpeed checkpoint file '{}': {} has a negative padding {} (corrupt group_paddings)", p.file, what, p.padding);
    out.insert(out.end(), p.values.begin(), p.values.end());
    // The padding lies at the group's tail, possibly over several ranks' pieces (BF16_Optimizer
    // counts it all on the last rank), so it never exceeds the values up to its rank: more is
    // corrupt, and would let the sum overflow.
    if (p.padding > static_cast<std::int64_t>(out.size()) - padding) {
      fail("DeepSpeed checkpoint file '{}': {} has a padding of {}, more than the {} values of the ranks up to it (corrupt group_paddings)", p.file,
           what, p.padding, out.size());
    }
    padding += p.padding;
  }
  if (static_cast<std::int64_t>(out.size()) - padding != need) {
    fail(
        "DeepSpeed checkpoint file '{}': {} holds {} values across the {} rank file(s), {} of them padding, but the parameter shapes of '{}' "
        "need {} (shapes that do not add up with the partitions and paddings)",
        pieces.empty() ? shapes_file : pieces.front().file, what, out.size(), pieces.size(), padding, shapes_file, need);
  }
  out.resize(static_cast<std::size_t>(need));
  return out;
}

// Cuts `flat` into the named parameters, in order.
void split(const std::vector<float>& flat, const std::vector<std::string>& names, const std::map<std::string, std::vector<std::int64_t>>& shapes,
           std::map<std::string, std::vector<float>>& out) {
  std::size_t at = 0;
  for (const std::string& n : names) {
    const auto k = static_cast<std::size_t>(numel_of(shapes.at(n)));
    out[n].assign(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + k));
    at += k;
  }
}

// Adam's moments (any tensor entry of a parameter's state) and its step.
struct ParamState {
  std::map<std::string, std::vector<float>> tensors;
  std::optional<std::int64_t> step;
};

ParamState read_param_state(const TorchPickle& file, const TorchValue& s) {
  ParamState out;
  for (const auto& [k, v] : s.pairs) {
    if (k.kind != TorchValue::Kind::string) continue;
    if (k.s == "step") {
      out.step = scalar_int(file, v);
    } else if (v.is_tensor() && !v.as_tensor().shape.empty()) {
      out.tensors[k.s] = file.read_fp32(v);
    }
  }
  return out;
}

fs::path resolve_step_dir(const fs::path& dir, const std::string& tag, std::string& tag_out) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("DeepSpeed checkpoint '{}' is not a folder", dir.string());
  const bool step_itself = fs::exists(dir / "mp_rank_00_model_states.pt", ec) || fs::exists(dir / "zero_pp_rank_0_mp_rank_00_model_states.pt", ec);
  if (tag.empty() && step_itself) {
    const fs::path n = dir.lexically_normal();
    tag_out = (n.has_filename() ? n.filename() : n.parent_path().filename()).string();
    return dir;
  }
  std::string t = tag;
  std::string named_by = "the tag given";
  if (t.empty()) {
    // engine.load_checkpoint reads `latest`, or with load_universal `latest_universal`, which
    // ds_to_universal.py writes beside its output folder: the save_checkpoint folder is read when
    // both are there (exact, module weights and all), the universal one when only it is.
    fs::path latest = dir / "latest";
    if (!fs::is_regular_file(latest, ec)) latest = dir / "latest_universal";
    if (!fs::is_regular_file(latest, ec)) {
      if (fs::is_directory(dir / "zero", ec)) {
        fail("DeepSpeed checkpoint '{}' holds zero/ but no model states file (mp_rank_00_model_states.pt, which ds_to_universal.py copies beside it)",
             dir.string());
      }
      fail("DeepSpeed checkpoint '{}' has no 'latest' or 'latest_universal' file and no mp_rank_00_model_states.pt; name the tag (the global_step folder)",
           dir.string());
    }
    std::ifstream in(latest);
    std::stringstream ss;
    ss << in.rdbuf();
    t = trim(ss.str());
    named_by = "'" + latest.string() + "'";
  }
  if (!is_folder_name(t)) {
    fail("DeepSpeed checkpoint: {} names the tag '{}', which is not the name of a folder inside '{}' (a path, or empty)", named_by, t, dir.string());
  }
  const fs::path step = dir / t;
  if (!fs::is_directory(step, ec)) fail("DeepSpeed checkpoint: {} names the tag '{}', but the folder '{}' is not there", named_by, t, step.string());
  // A symlinked tag folder must still lie inside the checkpoint folder.
  const fs::path real_dir = fs::canonical(dir, ec), real_step = fs::canonical(step, ec);
  if (ec || real_step.parent_path() != real_dir) {
    fail("DeepSpeed checkpoint: {} names the tag '{}', whose folder '{}' lies outside '{}'", named_by, t, step.string(), dir.string());
  }
  tag_out = t;
  return step;
}

// ZeRO stage 3 (zero_to_fp32._zero3_merge_trainable_params): every parameter is partitioned on
// its own, ceil(numel / W) values per rank (the last rank's piece padded), and rank r's flats (its
// fp32_flat_groups, or an optimizer state's flat per group, the groups back to back) hold its piece
// of each parameter in param_shapes order. Parameter p's values are the ranks' slices at the same
// running offset, concatenated, the padding cut off. Each rank's flats must be exactly the sum of
// the pieces, as zero_to_fp32 checks.
void zero3_split(const std::vector<std::vector<float>>& rank_flats, const std::vector<std::string>& names,
                 const std::map<std::string, std::vector<std::int64_t>>& shapes, const std::vector<std::string>& files, const std::string& what,
                 const std::string& shapes_file, std::map<std::string, std::vector<float>>& out) {
  const auto w = static_cast<std::int64_t>(rank_flats.size());
  std::int64_t need = 0;
  for (const std::string& n : names) need += (numel_of(shapes.at(n)) + w - 1) / w;
  for (std::size_t r = 0; r < rank_flats.size(); ++r) {
    if (static_cast<std::int64_t>(rank_flats[r].size()) != need) {
      fail(
          "DeepSpeed checkpoint file '{}': {} holds {} values, but the parameter shapes of '{}' cut into ceil(numel / {}) per rank need {} "
          "(shapes that do not add up with the partitions)",
          files[r], what, rank_flats[r].size(), shapes_file, w, need);
    }
  }
  std::size_t at = 0;
  for (const std::string& n : names) {
    const std::int64_t numel = numel_of(shapes.at(n));
    const auto piece = static_cast<std::size_t>((numel + w - 1) / w);
    std::vector<float>& v = out[n];
    v.clear();
    v.reserve(piece * rank_flats.size());
    for (const std::vector<float>& f : rank_flats) v.insert(v.end(), f.begin() + static_cast<std::ptrdiff_t>(at), f.begin() + static_cast<std::ptrdiff_t>(at + piece));
    v.resize(static_cast<std::size_t>(numel));
    at += piece;
  }
}

void read_zero3(const std::vector<std::unique_ptr<TorchPickle>>& ranks, const std::vector<std::string>& names, DeepSpeedTrainingState& st,
                const std::string& shapes_file, std::map<std::string, std::vector<float>>& master,
                std::map<std::string, std::map<std::string, std::vector<float>>>& states) {
  std::vector<std::string> files;
  std::vector<std::vector<float>> fp32;
  std::map<std::string, std::vector<std::vector<float>>> moments;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const TorchPickle& f = *ranks[r];
    files.push_back(f.path().string());
    const TorchValue& osd = f.root().at("optimizer_state_dict");
    if (r == 0)
      if (const TorchValue* l = osd.find("loss_scaler"); l != nullptr && !l->is_none()) st.loss_scaler = loss_scaler_of(*l);
    std::vector<float>& mine = fp32.emplace_back();
    const TorchValue& flats = osd.at("fp32_flat_groups");
    for (std::size_t g = 0; g < flats.size(); ++g) {
      const std::vector<float> v = f.read_fp32(flats[g]);
      mine.insert(mine.end(), v.begin(), v.end());
    }
    // stage3._rigid_state_dict: the base optimizer's own state_dict, its param groups' params the
    // fp32 flats (one state per group, shaped as that group's flat).
    const TorchValue& base = osd.at("optimizer_state_dict");
    const TorchValue& pgs = base.at("param_groups");
    std::map<std::string, std::vector<float>> per_key;
    for (std::size_t g = 0; g < pgs.size(); ++g) {
      if (g == 0 && r == 0) read_param_group(pgs[g], st);
      const TorchValue& ids = pgs[g].at("params");
      if (ids.size() == 0) continue;
      if (const TorchValue* s = base.at("state").find(ids[0].as_int())) {
        ParamState ps = read_param_state(f, *s);
        if (ps.step) st.optimizer_step = ps.step;
        for (const auto& [key, vals] : ps.tensors) per_key[key].insert(per_key[key].end(), vals.begin(), vals.end());
      }
      if (!st.optimizer_step)
        if (const TorchValue* s = pgs[g].find("step"); s != nullptr && !s->is_none()) st.optimizer_step = scalar_int(f, *s);
    }
    for (auto& [key, vals] : per_key) moments[key].push_back(std::move(vals));
  }
  zero3_split(fp32, names, st.shapes, files, "fp32_flat_groups", shapes_file, master);
  for (const auto& [key, flats] : moments) {
    if (flats.size() != ranks.size()) fail("DeepSpeed checkpoint '{}': optimizer state '{}' is saved by some ranks only", st.dir.string(), key);
    zero3_split(flats, names, st.shapes, files, "optimizer state '" + key + "'", shapes_file, states[key]);
  }
}

// Stage 0 saves no names for the optimizer's parameters (param_shapes is None): torch numbers them
// over the param groups in order, and which module parameter each group holds is the program's
// choice. Two choices are tried, in this order, and the first that every known size agrees with is
// taken: a Hugging Face Trainer's (and dstrain's) two groups — the matrices (2 or more dimensions:
// the decayed weights and embeddings), then the rest (biases, norm weights), each in module order —
// and the module's order cut into consecutive groups. `totals`: each group's element count
// (FP16_Optimizer's flat groups); `counts`: each group's parameter count and each parameter's state
// size (-1: none) (a torch optimizer's state). Error naming the file when neither fits.
struct Stage0Counts {
  std::vector<std::size_t> counts;
  std::vector<std::int64_t> sizes;
};

std::vector<std::vector<std::string>> stage0_group_members(const std::vector<std::string>& names,
                                                           const std::map<std::string, std::vector<std::int64_t>>& shapes,
                                                           const std::vector<std::int64_t>& totals, const std::optional<Stage0Counts>& counts,
                                                           const std::string& file) {
  const std::size_t groups = counts ? counts->counts.size() : totals.size();
  const auto fits = [&](const std::vector<std::vector<std::string>>& c) {
    if (c.size() != groups) return false;
    std::size_t k = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      std::int64_t sum = 0;
      if (counts && c[g].size() != counts->counts[g]) return false;
      for (const std::string& n : c[g]) {
        const std::int64_t numel = numel_of(shapes.at(n));
        if (counts && counts->sizes[k] >= 0 && counts->sizes[k] != numel) return false;
        sum += numel;
        ++k;
      }
      if (!totals.empty() && sum != totals[g]) return false;
    }
    return k == names.size();
  };
  if (groups == 2) {
    std::vector<std::vector<std::string>> trainer(2);
    for (const std::string& n : names) trainer[shapes.at(n).size() >= 2 ? 0 : 1].push_back(n);
    if (fits(trainer)) return trainer;
  }
  std::vector<std::vector<std::string>> consecutive(groups);
  std::size_t next = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    std::int64_t sum = 0;
    while (next < names.size() && (counts ? consecutive[g].size() < counts->counts[g] : sum < totals[g])) {
      sum += numel_of(shapes.at(names[next]));
      consecutive[g].push_back(names[next++]);
    }
  }
  if (fits(consecutive)) return consecutive;
  fail("DeepSpeed checkpoint file '{}': its optimizer's {} param groups are neither the matrices and then the other parameters, nor the "
       "module's parameters in order cut into consecutive groups (a stage-0 checkpoint names no group members: dstrain reads these two "
       "groupings); save it with ZeRO stage 1 or more, whose param_shapes name them",
       file, groups);
}

}  // namespace

bool is_deepspeed_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  // dstrain's own save_dir has a `latest` file and global_step<N> folders too (docs/checkpoints.md
  // "Files"): a folder whose `latest` names a tag holding dstrain's manifest (checkpoint.json), or
  // a tag folder holding one, is dstrain's, so `--resume DIR` keeps loading dstrain checkpoints.
  if (fs::exists(dir / "checkpoint.json", ec)) return false;
  if (fs::is_regular_file(dir / "latest", ec)) {
    std::ifstream in(dir / "latest");
    std::string tag((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
    if (!tag.empty() && tag.find('/') == std::string::npos && tag != "." && tag != ".." && fs::exists(dir / tag / "checkpoint.json", ec))
      return false;
    return true;
  }
  if (fs::is_regular_file(dir / "latest_universal", ec)) return true;
  if (fs::exists(dir / "mp_rank_00_model_states.pt", ec) || fs::exists(dir / "zero_pp_rank_0_mp_rank_00_model_states.pt", ec)) return true;
  if (fs::is_directory(dir / "zero", ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory(ec) && e.path().filename().string().starts_with("global_step") &&
        (fs::exists(e.path() / "mp_rank_00_model_states.pt", ec) || fs::exists(e.path() / "zero_pp_rank_0_mp_rank_00_model_states.pt", ec))) {
      return true;
    }
  }
  return false;
}

DeepSpeedTrainingState read_deepspeed_checkpoint(const fs::path& dir, const std::string& tag) {
  DeepSpeedTrainingState st;
  st.dir = resolve_step_dir(dir, tag, st.tag);
  std::error_code ec;
  // ds_to_universal's output: the model states files copied, the optimizer's state per parameter
  // under zero/ (no *_optim_states.pt), read by its own reader.
  if (fs::is_directory(st.dir / "zero", ec)) {
    read_universal_checkpoint(st);
    return st;
  }
  // ZeRO stage 3 (engine._get_ckpt_name): every rank writes its own model states file,
  // zero_pp_rank_<r>_mp_rank_00_model_states.pt, all holding the same param_shapes; rank 0's is read.
  const bool stage3_layout = !fs::exists(st.dir / "mp_rank_00_model_states.pt", ec) && fs::exists(st.dir / "zero_pp_rank_0_mp_rank_00_model_states.pt", ec);
  const fs::path model_file = st.dir / (stage3_layout ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt");
  if (!fs::exists(model_file, ec)) {
    fail("DeepSpeed checkpoint '{}': the model states file '{}' is missing", st.dir.string(), model_file.string());
  }
  // Layouts whose parameters are spread over more files than these (each would otherwise read as a
  // model with missing or smaller tensors): refused by name.
  for (const fs::directory_entry& e : fs::directory_iterator(st.dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto starts = [&name](std::string_view p) { return name.rfind(p, 0) == 0; };
    if (name.find("mp_rank_") != std::string::npos && name.find("mp_rank_00") == std::string::npos) {
      fail("DeepSpeed checkpoint '{}' holds model-parallel rank files ('{}'): a tensor-parallel DeepSpeed run's checkpoint, which dstrain does not "
           "read yet; consolidate it with DeepSpeed's zero_to_fp32.py / ds_to_universal.py and --init-from the weights",
           st.dir.string(), name);
    }
    if (starts("layer_") || starts("expert_")) {
      fail("DeepSpeed checkpoint '{}' holds {} files ('{}'), which dstrain does not read yet; consolidate it with DeepSpeed's zero_to_fp32.py and "
           "--init-from the weights",
           st.dir.string(), starts("layer_") ? "pipeline-layer" : "mixture-of-experts", name);
    }
  }
  const TorchPickle ms(model_file);
  const TorchValue& root = ms.root();
  const TorchValue& module = root.at("module");
  if (!module.is_dict()) module.fail_here(" is not a state dict");

  std::vector<std::string> buffers;
  if (const TorchValue* b = root.find("buffer_names"); b != nullptr && b->is_sequence())
    for (const TorchValue& x : b->items) buffers.push_back(x.as_string());
  const auto is_buffer = [&](const std::string& n) { return std::find(buffers.begin(), buffers.end(), n) != buffers.end(); };

  read_run_state(root, st);

  // Names as saved: param_shapes' order under ZeRO (the flat order), else the module's parameters.
  std::vector<std::vector<std::string>> groups;  // raw names per flat group
  const TorchValue* param_shapes = root.find("param_shapes");
  if (param_shapes != nullptr && !param_shapes->is_none()) {
    for (std::size_t g = 0; g < param_shapes->size(); ++g) {
      const TorchValue& shapes = (*param_shapes)[g];
      if (!shapes.is_dict()) shapes.fail_here(" is not a dict of parameter shapes");
      groups.emplace_back();
      for (const auto& [k, v] : shapes.pairs) {
        groups.back().push_back(k.as_string());
        st.shapes[k.s] = shape_of(v);
      }
    }
  }
  std::vector<std::string> raw_names;
  for (const auto& g : groups) raw_names.insert(raw_names.end(), g.begin(), g.end());
  if (groups.empty()) {
    // A tied weight (GPT-2's lm_head.weight is transformer.wte.weight) is one parameter, which
    // named_parameters() — so the optimizer's param_groups — lists once, but the module's
    // state_dict holds under each name, both views of one storage: the first name is the parameter.
    std::set<std::tuple<std::string, std::int64_t, std::vector<std::int64_t>, std::vector<std::int64_t>>> seen;
    for (const auto& [k, v] : module.pairs) {
      if (!v.is_tensor() || is_buffer(k.as_string())) continue;
      const TorchTensorInfo& t = v.as_tensor();
      if (!seen.insert({t.storage_key, t.storage_offset, t.shape, t.stride}).second) continue;
      raw_names.push_back(k.s);
      st.shapes[k.s] = v.as_tensor().shape;
    }
  }
  if (raw_names.empty()) fail("DeepSpeed checkpoint file '{}': no parameters", model_file.string());
  for (const std::string& n : raw_names) {
    check_param_name(n, model_file.string());  // (the state may be written as a universal folder)
    check_param_shape(st.shapes.at(n), model_file.string(), n);
  }
  // A pickle may hold a key twice (Python's dict would keep the last); a name twice in param_shapes
  // or the module would have its values taken apart twice and handed on once empty: corrupt.
  if (const std::string twice = first_repeated(raw_names); !twice.empty()) {
    fail("DeepSpeed checkpoint file '{}': the parameter '{}' is named twice ({})", model_file.string(), twice,
         groups.empty() ? "in 'module'" : "in param_shapes");
  }
  // Names as the engine reads them: the "module." of a wrapped model dropped.
  const bool wrapped = std::all_of(raw_names.begin(), raw_names.end(), [](const std::string& n) { return n.starts_with("module."); });
  const std::function<std::string(const std::string&)> bare = [wrapped](const std::string& n) { return wrapped ? n.substr(7) : n; };

  // The module's weights (and their dtype), checked against param_shapes once the partitions are.
  std::map<std::string, std::vector<float>> master, module_w;
  const auto module_weights = [&] {
    std::map<std::string, std::vector<float>> w;
    for (const std::string& n : raw_names) {
      const TorchValue* v = module.find(n);
      if (v == nullptr) fail("DeepSpeed checkpoint file '{}': parameter '{}' of param_shapes is not in 'module'", model_file.string(), n);
      if (st.zero_stage == 3 && numel_of(v->as_tensor().shape) == 0 && numel_of(st.shapes.at(n)) != 0) {
        // ZeRO-3's module state_dict holds each partitioned parameter as an empty placeholder (the
        // weights live only in the ranks' partitions; stage3_gather_16bit_weights_on_model_save
        // off): its dtype is the module's, its weights are the fp32 master's, as zero_to_fp32 gives them.
        if (st.dtype.empty()) st.dtype = dtype_name(v->as_tensor().dtype);
        w[n] = master.at(n);
        continue;
      }
      if (v->as_tensor().shape != st.shapes.at(n)) {
        fail("DeepSpeed checkpoint file '{}': parameter '{}' has shape {} in 'module' but {} in param_shapes", model_file.string(), n,
             fmt::join(v->as_tensor().shape, "x"), fmt::join(st.shapes.at(n), "x"));
      }
      if (st.dtype.empty()) st.dtype = dtype_name(v->as_tensor().dtype);
      w[n] = ms.read_fp32(*v);
    }
    return w;
  };
  std::map<std::string, std::map<std::string, std::vector<float>>> states;  // state key -> raw name -> values

  if (groups.empty()) {
    // ---- stage 0: the model states file holds the optimizer ----
    st.zero_stage = 0;
    if (const TorchValue* w = root.find("dp_world_size"); w != nullptr && !w->is_none()) st.dp_world_size = static_cast<int>(w->as_int());
    const TorchValue* opt = root.find("optimizer");
    module_w = module_weights();
    master = module_w;
    if (opt != nullptr && !opt->is_none() && opt->has("fp32_groups_flat")) {
      // FP16_Optimizer (fp16, and bf16 without ZeRO): one flat fp32 copy per param group, in the
      // module's parameter order, no padding; the base optimizer steps the flat copies.
      if (const TorchValue* cs = opt->find("cur_scale")) {
        DeepSpeedLossScaler ls;
        ls.cur_scale = cs->as_double();
        if (const TorchValue* v = opt->find("cur_iter")) ls.cur_iter = v->as_int();
        if (const TorchValue* v = opt->find("dynamic_loss_scale")) ls.dynamic = v->as_bool();
        if (const TorchValue* v = opt->find("last_overflow_iter"); v != nullptr && !v->is_none()) ls.last_overflow_iter = v->as_int();
        st.loss_scaler = ls;
      }
      const TorchValue& flats = opt->at("fp32_groups_flat");
      const TorchValue& base = opt->at("optimizer_state_dict");
      const TorchValue& pgs = base.at("param_groups");
      std::vector<std::vector<float>> flat_values;
      std::vector<std::int64_t> totals;
      for (std::size_t g = 0; g < flats.size(); ++g) {
        flat_values.push_back(ms.read_fp32(flats[g]));
        totals.push_back(static_cast<std::int64_t>(flat_values.back().size()));
      }
      const std::vector<std::vector<std::string>> group_names = stage0_group_members(raw_names, st.shapes, totals, {}, model_file.string());
      for (std::size_t g = 0; g < flats.size(); ++g) {
        const std::vector<std::string>& names = group_names[g];
        split(flat_values[g], names, st.shapes, master);
        if (g < pgs.size()) {
          if (g == 0) read_param_group(pgs[g], st);
          const TorchValue& ids = pgs[g].at("params");
          if (ids.size() > 0) {
            if (const TorchValue* s = base.at("state").find(ids[0].as_int())) {
              ParamState ps = read_param_state(ms, *s);
              if (ps.step) st.optimizer_step = ps.step;
              for (const auto& [key, vals] : ps.tensors) {
                Piece p{vals, 0, model_file.string()};
                split(join({p}, totals[g], "optimizer state '" + key + "' of group " + std::to_string(g), model_file.string()), names, st.shapes,
                      states[key]);
              }
            }
          }
        }
      }
      set_groups(pgs, group_names, st, bare);  // FP16_Optimizer's flat groups are the param groups, in order
    } else if (opt != nullptr && !opt->is_none()) {
      // A torch optimizer's own state_dict (fp32 without ZeRO): param ids numbered over the groups
      // in order; which module parameter each is follows from the groups' members
      // (stage0_group_members), checked against every state tensor's size.
      const TorchValue& pgs = opt->at("param_groups");
      const TorchValue& state = opt->at("state");
      std::vector<std::int64_t> ids;
      std::vector<std::size_t> counts;
      std::vector<std::int64_t> sizes;  // each id's state size, -1 where it has no state yet
      for (std::size_t g = 0; g < pgs.size(); ++g) {
        if (g == 0) read_param_group(pgs[g], st);
        const TorchValue& p = pgs[g].at("params");
        counts.push_back(p.size());
        for (std::size_t k = 0; k < p.size(); ++k) {
          ids.push_back(p[k].as_int());
          std::int64_t n = -1;
          if (const TorchValue* s = state.find(ids.back()))
            if (const TorchValue* t = s->find("exp_avg"); t != nullptr && t->is_tensor()) n = numel_of(t->as_tensor().shape);
          sizes.push_back(n);
        }
      }
      if (ids.size() != raw_names.size()) {
        // The usual cause: a tied weight whose two names hold different values — two storages, so
        // two tensors of 'module', but one parameter of the optimizer. Name the suspects: matrices
        // whose shape exactly two names of 'module' have (a layer's weights repeat once per layer).
        std::map<std::vector<std::int64_t>, std::vector<std::string>> by_shape;
        for (const std::string& n : raw_names)
          if (st.shapes.at(n).size() >= 2) by_shape[st.shapes.at(n)].push_back(n);
        std::vector<std::string> suspects;
        for (const auto& [shape, names] : by_shape)
          if (names.size() == 2) suspects.push_back(fmt::format("'{}' (shaped as '{}')", names[1], names[0]));
        fail("DeepSpeed checkpoint file '{}': the optimizer's param_groups hold {} parameters, 'module' {}{}", model_file.string(), ids.size(),
             raw_names.size(),
             suspects.empty() ? std::string()
                              : fmt::format("; a tied weight saved under two names with different values would do that: {}", fmt::join(suspects, ", ")));
      }
      const std::vector<std::vector<std::string>> group_names =
          stage0_group_members(raw_names, st.shapes, {}, Stage0Counts{counts, sizes}, model_file.string());
      std::vector<std::string> id_names;  // ids[k]'s parameter
      for (const auto& g : group_names) id_names.insert(id_names.end(), g.begin(), g.end());
      set_groups(pgs, group_names, st, bare);
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const TorchValue* s = state.find(ids[k]);
        if (s == nullptr) continue;
        ParamState ps = read_param_state(ms, *s);
        if (ps.step) st.optimizer_step = ps.step;
        for (auto& [key, vals] : ps.tensors) {
          if (static_cast<std::int64_t>(vals.size()) != numel_of(st.shapes.at(id_names[k]))) {
            fail("DeepSpeed checkpoint file '{}': optimizer state '{}' of parameter '{}' has {} values, the parameter {}", model_file.string(), key,
                 id_names[k], vals.size(), numel_of(st.shapes.at(id_names[k])));
          }
          states[key][id_names[k]] = std::move(vals);
        }
      }
    }
  } else {
    // ---- ZeRO stages 1 and 2: one optimizer file per data-parallel rank ----
    // DeepSpeed's checkpoint constants name two prefixes (BF16_ZERO_FILE_PREFIX, FP16_ZERO_FILE_PREFIX);
    // its engine writes bf16_ on bf16 runs and none otherwise. One folder holds one of them.
    static const std::regex re(R"(^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$)");
    std::map<int, fs::path> files;
    std::string prefix;
    std::string first_file;                   // the first rank file met, and
    std::optional<std::string> other_prefix;  // a file of another prefix than its
    for (const auto& e : fs::directory_iterator(st.dir, ec)) {
      std::smatch m;
      const std::string f = e.path().filename().string();
      if (std::regex_match(f, m, re)) {
        // A rank number past int (a stray or hostile file name) is an Error, not std::stoi's out_of_range.
        const std::string digits = m[2].str();
        int r = 0;
        if (const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), r); err != std::errc()) {
          fail("DeepSpeed checkpoint '{}': the rank file '{}' has a rank number out of range", st.dir.string(), f);
        }
        if (first_file.empty()) {
          first_file = f;
          prefix = m[1].str();
        } else if (m[1].str() != prefix) {
          other_prefix = f;
        }
        files[r] = e.path();
      }
    }
    if (other_prefix) {
      fail("DeepSpeed checkpoint '{}': its optimizer files mix prefixes ('{}' beside '{}'): the rank files of two saves; keep the one save's files",
           st.dir.string(), *other_prefix, first_file);
    }
    if (files.empty()) {
      fail("DeepSpeed checkpoint '{}': param_shapes say ZeRO, but no zero_pp_rank_<r>_mp_rank_00_optim_states.pt file is there", st.dir.string());
    }
    const auto rank_file = [&](int r) { return st.dir / (prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt"); };
    for (int r = 0; r < static_cast<int>(files.size()); ++r) {
      if (!files.count(r)) fail("DeepSpeed checkpoint '{}': the rank file '{}' is missing", st.dir.string(), rank_file(r).string());
    }
    std::vector<std::unique_ptr<TorchPickle>> ranks;
    for (const auto& [r, f] : files) ranks.push_back(std::make_unique<TorchPickle>(f));
    const TorchValue& osd0 = ranks[0]->root().at("optimizer_state_dict");
    std::int64_t count = 0;
    const TorchValue& pc = osd0.at("partition_count");
    if (pc.is_sequence()) {
      for (std::size_t k = 0; k < pc.size(); ++k) count = std::max(count, pc[k].as_int());
    } else {
      count = pc.as_int();
    }
    if (count != static_cast<std::int64_t>(ranks.size())) {
      if (count > static_cast<std::int64_t>(ranks.size())) {
        fail("DeepSpeed checkpoint file '{}': partition_count is {}, but only {} rank file(s) are there: '{}' is missing", files.at(0).string(), count,
             ranks.size(), rank_file(static_cast<int>(ranks.size())).string());
      }
      fail("DeepSpeed checkpoint file '{}': partition_count is {}, but {} rank files are there", files.at(0).string(), count, ranks.size());
    }
    st.dp_world_size = static_cast<int>(count);
    const bool zero_optimizer = osd0.has("zero_stage");  // DeepSpeedZeroOptimizer; BF16_Optimizer has no zero_stage
    if (zero_optimizer) {
      st.zero_stage = zero_stage_of(osd0.at("zero_stage"));
      if (const TorchValue* l = osd0.find("loss_scaler"); l != nullptr && !l->is_none()) st.loss_scaler = loss_scaler_of(*l);
    } else {
      st.zero_stage = config_zero_stage(root) >= 0 ? config_zero_stage(root) : 1;
    }
    if (st.zero_stage < 1 || st.zero_stage > 3) fail("DeepSpeed checkpoint file '{}': zero_stage {} (stages 1 to 3 are read here)", files.at(0).string(), st.zero_stage);
    if ((st.zero_stage == 3) != stage3_layout) {
      fail("DeepSpeed checkpoint file '{}': zero_stage {}, but the model states are in '{}' ({})", files.at(0).string(), st.zero_stage, model_file.string(),
           stage3_layout ? "stage 3's per-rank file" : "stages 0-2's single file");
    }
    if (st.zero_stage == 3) {
      read_zero3(ranks, raw_names, st, model_file.string(), master, states);
      set_zero3_groups(osd0.at("optimizer_state_dict").at("param_groups"), groups, st, bare);
    } else if (const TorchValue& base = osd0.at("base_optimizer_state"); base.is_dict()) {
      set_groups(base.at("param_groups"), groups, st, bare);  // (an elastic checkpoint's per-group states hold no param groups)
    }
    for (std::size_t g = 0; st.zero_stage != 3 && g < groups.size(); ++g) {
      std::int64_t need = 0;
      for (const std::string& n : groups[g]) need += numel_of(st.shapes.at(n));
      std::vector<Piece> fp32;
      std::map<std::string, std::vector<Piece>> moments;
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        const TorchPickle& f = *ranks[r];
        const std::string fname = f.path().string();
        const TorchValue& osd = f.root().at("optimizer_state_dict");
        const std::int64_t pad = osd.at("group_paddings")[g].as_int();
        // DeepSpeedZeroOptimizer saves its fp32 partition with the padding removed; BF16_Optimizer with it.
        fp32.push_back(Piece{f.read_fp32(osd.at("single_partition_of_fp32_groups")[g]), zero_optimizer ? 0 : pad, fname});
        const TorchValue& base = osd.at("base_optimizer_state");
        if (base.is_sequence()) {  // elastic_checkpoint: per group, padding removed
          ParamState ps = read_param_state(f, base[g]);
          if (ps.step) st.optimizer_step = ps.step;
          if (const TorchValue* s = osd.find("base_optimizer_state_step"); s != nullptr && !st.optimizer_step) st.optimizer_step = scalar_int(f, *s);
          for (auto& [key, vals] : ps.tensors) moments[key].push_back(Piece{std::move(vals), 0, fname});
        } else {
          const TorchValue& pg = base.at("param_groups")[g];
          if (g == 0 && r == 0) read_param_group(pg, st);
          if (const TorchValue* s = base.at("state").find(pg.at("params")[0].as_int())) {
            ParamState ps = read_param_state(f, *s);
            if (ps.step) st.optimizer_step = ps.step;
            for (auto& [key, vals] : ps.tensors) moments[key].push_back(Piece{std::move(vals), pad, fname});
          }
          if (!st.optimizer_step)
            if (const TorchValue* s = pg.find("step"); s != nullptr && !s->is_none()) st.optimizer_step = scalar_int(f, *s);
        }
      }
      const std::string shapes_file = model_file.string();
      split(join(fp32, need, "single_partition_of_fp32_groups[" + std::to_string(g) + "]", shapes_file), groups[g], st.shapes, master);
      for (const auto& [key, pieces] : moments) {
        if (pieces.size() != ranks.size()) fail("DeepSpeed checkpoint '{}': optimizer state '{}' is saved by some ranks only", st.dir.string(), key);
        split(join(pieces, need, "optimizer state '" + key + "' of group " + std::to_string(g), shapes_file), groups[g], st.shapes, states[key]);
      }
    }
  }

  if (!groups.empty()) module_w = module_weights();

  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const std::string& n : raw_names) {
    const std::string b = bare(n);
    st.names.push_back(b);
    shapes[b] = st.shapes.at(n);
    st.master[b] = std::move(master.at(n));
    st.module[b] = std::move(module_w.at(n));
    for (auto& [key, m] : states)
      if (auto it = m.find(n); it != m.end()) st.optimizer_states[key][b] = std::move(it->second);
  }
  st.shapes = std::move(shapes);
  return st;
}

}  // namespace dstrain
