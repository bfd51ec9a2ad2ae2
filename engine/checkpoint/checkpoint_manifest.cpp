#include "engine/checkpoint/checkpoint_manifest.h"

#include <charconv>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "engine/checkpoint/checkpoint_file_io.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/loss_scaler.h"
#include "models/model_registry.h"
#include "ops/error.h"

namespace dstrain {
namespace fs = std::filesystem;
using checkpoint_io::q;
using config::Json;

namespace {

// The most ranks, elements of a dimension: far beyond any run, far from overflow.
constexpr std::int64_t kMaxWorld = std::int64_t{1} << 20;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 48;

// The value as the manifest holds it, cut short for a message.
std::string shown(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// N of a tag "global_step<N>" (the default tag of a save); nullopt for any other tag.
std::optional<std::int64_t> step_of_tag(std::string_view tag) {
  constexpr std::string_view prefix = "global_step";
  if (!tag.starts_with(prefix) || tag.size() == prefix.size()) return std::nullopt;
  std::int64_t n = 0;
  const char* b = tag.data() + prefix.size();
  const char* e = tag.data() + tag.size();
  const auto [p, ec] = std::from_chars(b, e, n);
  if (ec != std::errc() || p != e) return std::nullopt;
  return n;
}

// Reads the fields of one manifest, each failure naming the field ("engine.global_steps"), the file
// and the value.
class ManifestFields {
 public:
  ManifestFields(const Json& manifest, const fs::path& file) : m_(manifest), file_(file) {}

  [[noreturn]] void bad(const std::string& field, const std::string& value, std::string_view want) const {
    fail(
        "checkpoint manifest {} is malformed: \"{}\" is {}, but {}; the manifest was edited or damaged — resume from another checkpoint "
        "(--load-tag), "
        "or save this one again",
        q(file_), field, value, want);
  }
  [[noreturn]] void bad(const std::string& field, const Json& value, std::string_view want) const { bad(field, shown(value), want); }

  // The member `key` of the object at `path` ("" for the top level); `required`: its absence is an Error.
  const Json* member(const Json& object, const std::string& path, const char* key, bool required = true) const {
    const std::string field = path.empty() ? key : path + "." + key;
    if (!object.is_object()) bad(path, object, "it must be an object");
    const auto it = object.find(key);
    if (it == object.end()) {
      if (required) bad(field, std::string("missing"), "every checkpoint dstrain saves has it");
      return nullptr;
    }
    return &*it;
  }
  const Json& object(const Json& parent, const std::string& path, const char* key) const {
    const Json& v = *member(parent, path, key);
    if (!v.is_object()) bad(join(path, key), v, "it must be an object");
    return v;
  }
  std::int64_t integer(const Json& parent, const std::string& path, const char* key, std::int64_t lo, std::int64_t hi) const {
    const Json& v = *member(parent, path, key);
    return integer_value(v, join(path, key), lo, hi);
  }
  std::int64_t integer_value(const Json& v, const std::string& field, std::int64_t lo, std::int64_t hi) const {
    const std::string want = fmt::format("it must be a whole number (no fraction or exponent) from {} to {}", lo, hi);
    if (!v.is_number_integer()) bad(field, v, want);
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) bad(field, v, want);
    const std::int64_t n = v.get<std::int64_t>();
    if (n < lo || n > hi) bad(field, v, want);
    return n;
  }
  std::string string(const Json& parent, const std::string& path, const char* key) const {
    const Json& v = *member(parent, path, key);
    if (!v.is_string()) bad(join(path, key), v, "it must be a string");
    return v.get<std::string>();
  }
  void number(const Json& parent, const std::string& path, const char* key, bool null_allowed) const {
    const Json& v = *member(parent, path, key);
    if (v.is_number() || (null_allowed && v.is_null())) return;
    bad(join(path, key), v, null_allowed ? "it must be a number (null: not finite)" : "it must be a number");
  }
  static std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }

  void check() const {
    const std::string tag = string(m_, "", "tag");
    check_layout_and_ranks();
    check_model();
    check_optimizer();
    const std::int64_t steps = check_engine();
    check_scaler_and_schedule();
    // A default tag names the step it was saved at: an edited counter or a renamed folder no longer does.
    const auto same_step = [&](const char* what, const std::string& name) {
      if (const std::optional<std::int64_t> n = step_of_tag(name); n && *n != steps) {
        bad("engine.global_steps", fmt::format("{}", steps), fmt::format("{} '{}' says it was saved at step {}", what, name, *n));
      }
    };
    same_step("its \"tag\"", tag);
    same_step("its folder's name", file_.parent_path().filename().string());
    const Json& seed = *member(m_, "", "seed");
    if (!seed.is_number_integer() || (!seed.is_number_unsigned() && seed.get<std::int64_t>() < 0)) {
      bad("seed", seed, "it must be a whole number from 0 to 2^64 - 1");
    }
    if (const Json* v = member(m_, "", "bf16_stochastic_rounding", false); v && !v->is_boolean())
      bad("bf16_stochastic_rounding", *v, "it must be true or false");
    if (const Json* v = member(m_, "", "ds_config", false); v && !v->is_object())
      bad("ds_config", *v, "it must be an object (the resolved ds_config)");
    if (const Json* v = member(m_, "", "client_state", false); v && !v->is_object() && !v->is_null()) bad("client_state", *v, "it must be an object");
    if (const Json* v = member(m_, "", "architecture", false); v && !v->is_null()) {
      string(*v, "architecture", "family");
      object(*v, "architecture", "config");
    }
  }

 private:
  void check_layout_and_ranks() const {
    const Json& layout = object(m_, "", "layout");
    const std::int64_t world = integer(layout, "layout", "world_size", 1, kMaxWorld);
    const std::int64_t stage = integer(layout, "layout", "zero_stage", 0, 3);
    const std::string dtype = string(layout, "layout", "dtype");
    if (dtype != dtype_name(DType::fp32) && dtype != dtype_name(DType::fp16) && dtype != dtype_name(DType::bf16)) {
      bad("layout.dtype", fmt::format("\"{}\"", dtype), "it must be one of the training dtypes: fp32, fp16, bf16");
    }
    // The mesh it was saved on (absent: no tensor parallelism): world_size counts every rank.
    std::int64_t tp = 1;
    if (member(layout, "layout", "tensor_parallel", false) != nullptr) {
      tp = integer(layout, "layout", "tensor_parallel", 1, kMaxWorld);
      if (world % tp != 0) {
        bad("layout.tensor_parallel", fmt::format("{}", tp), fmt::format("it must divide layout.world_size {} (data-parallel x tensor-parallel)", world));
      }
    }
    // Pipeline stages (absent: none): the outermost dimension of the mesh, so they divide the
    // ranks of a tensor-parallel index (docs/checkpoints.md "Pipeline parallelism").
    std::int64_t pp = 1;
    if (member(layout, "layout", "pipeline_stages", false) != nullptr) {
      pp = integer(layout, "layout", "pipeline_stages", 1, kMaxWorld);
      if ((world / tp) % pp != 0) {
        bad("layout.pipeline_stages", fmt::format("{}", pp),
            fmt::format("it must divide layout.world_size {} / layout.tensor_parallel {} (pipeline x data-parallel)", world, tp));
      }
    }
    // Expert parallelism (absent: none): EP ranks of the data group hold different experts.
    std::int64_t ep = 1;
    if (member(layout, "layout", "expert_parallel", false) != nullptr) {
      ep = integer(layout, "layout", "expert_parallel", 1, kMaxWorld);
      if ((world / tp / pp) % ep != 0) {
        bad("layout.expert_parallel", fmt::format("{}", ep),
            fmt::format("it must divide the data-parallel ranks, layout.world_size {} / (tensor-parallel {} x pipeline {})", world, tp, pp));
      }
    }
    const Json& ranks = *member(m_, "", "ranks");
    if (!ranks.is_array()) bad("ranks", ranks, "it must be a list of rank indexes");
    // ZeRO stage >= 1: every rank wrote its partition; stage 0: data-parallel rank 0 alone wrote the
    // whole — one rank, or each of the tensor-parallel ranks its pieces, of every pipeline stage
    // (docs/checkpoints.md "Files") — except under expert parallelism, where the data ranks hold
    // different experts and every rank writes a file (those that save nothing, an empty one).
    const std::int64_t files = stage >= 1 || ep > 1 ? world : tp * pp;
    if (static_cast<std::int64_t>(ranks.size()) != files) {
      bad("ranks", fmt::format("a list of {} rank file{}", ranks.size(), ranks.size() == 1 ? "" : "s"),
          fmt::format("layout.world_size {}{}{} at layout.zero_stage {} writes {}", world,
                      tp > 1 ? fmt::format(" with layout.tensor_parallel {}", tp) : std::string(),
                      pp > 1 ? fmt::format(" and layout.pipeline_stages {}", pp) : std::string(), stage,
                      files == 1   ? std::string("one rank file")
                      : stage >= 1 || ep > 1 ? fmt::format("{} rank files, one per rank", files)
                      : pp > 1     ? fmt::format("{} rank files, one per pipeline stage and tensor-parallel rank", files)
                                   : fmt::format("{} rank files, one per tensor-parallel rank", files)));
    }
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const std::string path = fmt::format("ranks[{}]", k);
      const Json& r = ranks[k];
      // Exactly the name a save gives it: never a path out of the checkpoint's folder.
      const std::string index = string(r, path, "index");
      if (index != rank_file_name(static_cast<int>(k), ".json")) {
        bad(path + ".index", fmt::format("\"{}\"", index),
            fmt::format("rank {}'s index is named \"{}\"", k, rank_file_name(static_cast<int>(k), ".json")));
      }
      integer(r, path, "bytes", 0, kMaxElements);
      integer(r, path, "crc32c", 0, std::numeric_limits<std::uint32_t>::max());
    }
  }

  void check_model() const {
    const Json& model = object(m_, "", "model");
    integer(model, "model", "parameter_count", 0, std::numeric_limits<std::int64_t>::max());
    const Json& params = *member(model, "model", "params");
    if (!params.is_array()) bad("model.params", params, "it must be a list of {\"name\", \"shape\"}");
    std::set<std::string> names;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string path = fmt::format("model.params[{}]", i);
      const std::string name = string(params[i], path, "name");
      if (name.empty() || !names.insert(name).second) bad(path + ".name", params[i].at("name"), "it must be a parameter name, once in the list");
      const Json& shape = *member(params[i], path, "shape");
      if (!shape.is_array()) bad(path + ".shape", shape, "it must be a list of dimensions");
      for (std::size_t d = 0; d < shape.size(); ++d) integer_value(shape[d], fmt::format("{}.shape[{}]", path, d), 0, kMaxElements);
    }
  }

  void check_optimizer() const {
    const Json& opt = object(m_, "", "optimizer");
    string(opt, "optimizer", "type");
    const Json& states = *member(opt, "optimizer", "states");
    if (!states.is_array()) bad("optimizer.states", states, "it must be a list of state names");
    for (std::size_t i = 0; i < states.size(); ++i) {
      if (!states[i].is_string() || states[i].get<std::string>().empty())
        bad(fmt::format("optimizer.states[{}]", i), states[i], "it must be a state name");
    }
  }

  // The counters; returns global_steps.
  std::int64_t check_engine() const {
    const Json& e = object(m_, "", "engine");
    const std::int64_t steps = integer(e, "engine", "global_steps", 0, kMaxCheckpointSteps);
    integer(e, "engine", "skipped_steps", 0, steps);
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    integer(e, "engine", "global_samples", 0, kMax);
    integer(e, "engine", "micro_steps", 0, kMax);
    integer(e, "engine", "gradient_accumulation_steps", 1, kMax);
    integer(e, "engine", "train_batch_size", 1, kMax);
    number(e, "engine", "last_step_lr", false);
    number(e, "engine", "last_step_loss", true);                                                  // a non-finite loss is written as null
    if (e.contains("sequence_length")) integer(e, "engine", "sequence_length", 1, kMaxElements);  // saved since it was added
    return steps;
  }

  void check_scaler_and_schedule() const {
    const Json& ls = object(m_, "", "loss_scaler");
    const std::string kind = string(ls, "loss_scaler", "kind");
    bool known = false;
    std::string kinds;
    for (const LossScalerKind k :
         {LossScalerKind::dynamic_zero, LossScalerKind::dynamic_non_zero, LossScalerKind::static_scale, LossScalerKind::unscaled}) {
      known = known || kind == loss_scaler_kind_name(k);
      kinds += fmt::format("{}\"{}\"", kinds.empty() ? "" : ", ", loss_scaler_kind_name(k));
    }
    if (!known) bad("loss_scaler.kind", fmt::format("\"{}\"", kind), fmt::format("it must be one of {}", kinds));
    number(ls, "loss_scaler", "cur_scale", false);
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    integer(ls, "loss_scaler", "cur_iter", 0, kMax);
    integer(ls, "loss_scaler", "last_overflow_iter", -1, kMax);
    integer(ls, "loss_scaler", "cur_hysteresis", 0, kMax);
    integer(object(m_, "", "lr_scheduler"), "lr_scheduler", "last_batch_iteration", -1, kMaxCheckpointSteps);
  }

  const Json& m_;
  const fs::path& file_;
};

}  // namespace

void validate_checkpoint_manifest(const Json& manifest, const fs::path& manifest_path) { ManifestFields(manifest, manifest_path).check(); }

namespace {

// Config keys that set how a model is trained or first made, not the function its weights compute:
// a resume may change them (a fine-tuning run turns dropout off) and is told so, not refused.
bool is_training_setting(std::string_view key) {
  return key.find("pdrop") != std::string_view::npos || key.find("dropout") != std::string_view::npos || key == "initializer_range" ||
         key == "use_cache";
}

}  // namespace

ArchitectureDifferences architecture_differences(const Json& manifest, const std::string& where, const Architecture& built) {
  bool recorded = manifest.contains("architecture") && !manifest.at("architecture").is_null();
  for (const auto& f : model_families()) recorded = recorded || (manifest.contains(f->name()) && manifest.at(f->name()).is_object());
  if (!recorded) return {};
  const std::shared_ptr<const Architecture> saved = manifest_architecture(manifest, where);
  if (saved->family().name() != built.family().name()) {
    return {{fmt::format("family {} in the checkpoint, {} here", saved->family().name(), built.family().name())}, {}};
  }
  const Json a = Json::parse(saved->config_json()), b = Json::parse(built.config_json());
  std::map<std::string, std::pair<std::string, std::string>> keys;  // sorted: the same message every time
  for (const auto& [k, v] : a.items()) keys[k].first = v.dump();
  for (const auto& [k, v] : b.items()) keys[k].second = v.dump();
  ArchitectureDifferences differ;
  for (const auto& [k, v] : keys) {
    if (v.first == v.second) continue;
    (is_training_setting(k) ? differ.settings : differ.model)
        .push_back(fmt::format("{} {} in the checkpoint, {} here", k, v.first.empty() ? "absent" : v.first, v.second.empty() ? "absent" : v.second));
  }
  return differ;
}

}  // namespace dstrain
