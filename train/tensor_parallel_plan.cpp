#include "train/tensor_parallel_plan.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"

namespace dstrain {
namespace {

using config::TpLayerSpec;
using config::TpPartitionConfig;
using config::TpPartitionType;
using config::TpShapeDim;

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// One rule of the merged list, with where the config gave it.
struct Rule {
  TpLayerSpec spec;
  std::string where;  // "tensor_parallel.partition_config.layer_specs[1]", "tensor_parallel.preset_model \"llama\" (its layer spec 1)"
  bool from_preset = false;
  std::vector<std::regex> patterns;
  bool applies = true;  // model_types admit the model

  std::string pattern_where(std::size_t k) const {
    return from_preset ? fmt::format("{} pattern \"{}\"", where, spec.patterns[k]) : fmt::format("{}.patterns[{}] \"{}\"", where, k, spec.patterns[k]);
  }
  // "layer_specs[1] (partition_type \"row\", shape [3, -1])" for messages.
  std::string describe() const;
};

std::string shape_text(const std::vector<TpShapeDim>& shape) {
  std::vector<std::string> dims;
  for (const TpShapeDim& d : shape) dims.push_back(d.sub_sizes.empty() ? std::to_string(d.size) : fmt::format("[{}]", fmt::join(d.sub_sizes, ", ")));
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

std::string Rule::describe() const {
  std::string s = fmt::format("{} (partition_type \"{}\"", where, config::to_string(spec.partition_type));
  if (spec.shape) s += fmt::format(", shape {}, partition_dim {}", shape_text(*spec.shape), spec.effective_partition_dim());
  return s + ")";
}

// The rules as DeepSpeed's get_partition_config_object merges them, each labelled with its place.
struct Rules {
  TpPartitionConfig config;
  std::vector<Rule> rules;
  std::vector<std::string> notes;
};

std::optional<Rules> build_rules(const config::TensorParallelConfig& tp, const std::string& model_type) {
  const std::optional<TpPartitionConfig> effective = tp.effective_partition_config();
  if (!effective) return std::nullopt;
  Rules r;
  r.config = *effective;
  const std::optional<TpPartitionConfig> preset = tp.preset_model ? config::tp_preset(*tp.preset_model) : std::nullopt;
  auto add = [&](const TpLayerSpec& spec, std::string where, bool from_preset) {
    Rule rule;
    rule.spec = spec;
    rule.where = std::move(where);
    rule.from_preset = from_preset;
    for (std::size_t k = 0; k < spec.patterns.size(); ++k) {
      rule.patterns.push_back(config::compile_tp_pattern(spec.patterns[k], from_preset ? rule.where : fmt::format("{}.patterns[{}]", rule.where, k)));
    }
    if (spec.model_types) {
      rule.applies = std::any_of(spec.model_types->begin(), spec.model_types->end(), [&](const std::string& t) { return lower(t) == model_type; });
    }
    r.rules.push_back(std::move(rule));
  };
  auto add_preset = [&] {
    for (std::size_t j = 0; j < preset->layer_specs.size(); ++j)
      add(preset->layer_specs[j], fmt::format("tensor_parallel.preset_model \"{}\" (its layer spec {})", *tp.preset_model, j), true);
  };
  if (tp.partition_config) {
    for (std::size_t i = 0; i < tp.partition_config->layer_specs.size(); ++i)
      add(tp.partition_config->layer_specs[i], fmt::format("tensor_parallel.partition_config.layer_specs[{}]", i), false);
    if (preset && tp.partition_config->use_default_specs) {
      add_preset();
    } else if (preset) {
      r.notes.push_back(fmt::format("autotp: tensor_parallel.preset_model \"{}\" is not used: partition_config.use_default_specs is false, so DeepSpeed "
                                    "takes partition_config's rules alone",
                                    *tp.preset_model));
    }
  } else if (preset) {
    add_preset();
  }
  DSTRAIN_CHECK(r.rules.size() == r.config.layer_specs.size(), "tensor_parallel: {} labelled rules for {} merged ones", r.rules.size(),
                r.config.layer_specs.size());
  return r;
}

bool name_matches(const std::regex& re, const HfParamName& p) {
  if (config::tp_pattern_matches(re, p.name)) return true;
  return std::any_of(p.aliases.begin(), p.aliases.end(), [&](const std::string& a) { return config::tp_pattern_matches(re, a); });
}

bool rule_matches(const Rule& r, const HfParamName& p) {
  return std::any_of(r.patterns.begin(), r.patterns.end(), [&](const std::regex& re) { return name_matches(re, p); });
}

// The names of the embedding, the first block and the head (no block index but 0), for messages.
std::string example_names(const std::vector<HfParamName>& names) {
  static const std::regex later_block(R"(\.([1-9][0-9]*)\.)");
  std::vector<std::string> shown;
  for (const HfParamName& p : names) {
    if (std::regex_search(p.name, later_block)) continue;
    shown.push_back(p.name);
  }
  return fmt::format("{}", fmt::join(shown, ", "));
}

std::int64_t product(const std::vector<std::int64_t>& v, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t i = begin; i < end; ++i) n *= v[i];
  return n;
}

// A weight (out, in) viewed as a layer spec's shape: DeepSpeed's _infer_subparam_logical_shapes.
struct View {
  std::vector<std::int64_t> logical;
  std::vector<std::int64_t> sub_sizes;  // along partition_dim (one: the whole dimension)
};

std::optional<View> infer_view(const std::vector<TpShapeDim>& shape, std::int64_t pdim, std::int64_t out, std::int64_t in, std::string& err) {
  const std::size_t n = shape.size(), p = static_cast<std::size_t>(pdim);
  std::vector<std::optional<std::int64_t>> dims(n);
  std::optional<std::int64_t> count;
  std::vector<std::int64_t> sub;
  for (std::size_t i = 0; i < n; ++i) {
    if (i == p) {
      if (!shape[i].sub_sizes.empty()) {
        sub = shape[i].sub_sizes;
        std::int64_t sum = 0;
        for (std::int64_t s : sub) sum += s;
        dims[i] = sum;
      } else if (shape[i].size > 0) {
        count = shape[i].size;
      }
      continue;
    }
    if (shape[i].size > 0) dims[i] = shape[i].size;
  }
  const std::int64_t total = out * in;
  std::int64_t known = 1;
  std::vector<std::size_t> unknown;
  for (std::size_t i = 0; i < n; ++i) {
    if (dims[i])
      known *= *dims[i];
    else
      unknown.push_back(i);
  }
  if (unknown.empty()) {
    if (known != total) {
      err = fmt::format("shape product {} != weight numel {}", known, total);
      return std::nullopt;
    }
  } else if (unknown.size() == 1) {
    if (known == 0 || total % known != 0) {
      err = fmt::format("cannot infer shape for weight with numel {}", total);
      return std::nullopt;
    }
    dims[unknown[0]] = total / known;
  } else if (n == 2) {
    const std::int64_t weight[2] = {out, in};
    for (std::size_t i : unknown) dims[i] = weight[i];
    std::int64_t prod = 1;
    for (const auto& d : dims) prod *= *d;
    if (prod != total) {
      err = fmt::format("shape product {} != weight numel {}", prod, total);
      return std::nullopt;
    }
  } else {
    err = "shape has multiple inferred dims and is ambiguous for weight";
    return std::nullopt;
  }
  View v;
  for (const auto& d : dims) v.logical.push_back(*d);
  if (v.logical.back() != in) {
    err = fmt::format("shape last dim {} must match weight input dim {}", v.logical.back(), in);
    return std::nullopt;
  }
  if (n < 2) {
    err = "shape must include at least one output dimension";
    return std::nullopt;
  }
  if (product(v.logical, 0, n - 1) != out) {
    err = fmt::format("output shape product {} != weight output dim {}", product(v.logical, 0, n - 1), out);
    return std::nullopt;
  }
  const std::int64_t size = v.logical[p];
  if (count) {
    if (size % *count != 0) {
      err = fmt::format("partition_dim size {} not divisible by sub-param count {}", size, *count);
      return std::nullopt;
    }
    sub.assign(static_cast<std::size_t>(*count), size / *count);
  }
  if (sub.empty()) sub = {size};
  v.sub_sizes = std::move(sub);
  return v;
}

// dstrain's blocks of the cut dimension of `p` (one: the whole dimension).
std::vector<std::int64_t> dstrain_blocks(const HfParamName& p) {
  const int dim = p.split.dim() < 0 ? 0 : p.split.dim();
  if (p.split.parts.empty()) return {p.shape[dim]};
  std::vector<std::int64_t> b;
  for (const ParamSplit::Part& part : p.split.parts) b.push_back(part.size);
  return b;
}

// The shape that views `blocks` as sub-parameters along partition_dim `dim` of a 2-D weight.
std::string suggested_shape(const std::vector<std::int64_t>& blocks, bool along_rows) {
  const bool equal = std::all_of(blocks.begin(), blocks.end(), [&](std::int64_t b) { return b == blocks.front(); });
  const std::string sub = equal ? std::to_string(blocks.size()) : fmt::format("[{}]", fmt::join(blocks, ", "));
  return along_rows ? fmt::format("\"shape\": [{}, -1], \"partition_dim\": 0", sub) : fmt::format("\"shape\": [-1, {}], \"partition_dim\": 1", sub);
}

// dstrain's cut of `p` in words, and the partition_type that asks for it.
std::string dstrain_cut(const HfParamName& p) {
  switch (p.split.kind) {
    case SplitKind::replicated:
      return "keeps it whole on every rank";
    case SplitKind::rows:
      return p.split.parts.empty() ? std::string("cuts its output rows (column-parallel)")
                                   : fmt::format("cuts its output rows (column-parallel, {})", p.split.describe());
    case SplitKind::columns:
      return p.split.parts.empty() ? std::string("cuts its input columns (row-parallel)")
                                   : fmt::format("cuts its input columns (row-parallel, {})", p.split.describe());
    case SplitKind::vocabulary:
      return "cuts it by vocabulary rows (vocabulary-parallel, with the cross-entropy computed on each rank's rows)";
    case SplitKind::experts:
      return "gives each rank whole experts";
  }
  return "";
}

std::optional<TpPartitionType> dstrain_type(const HfParamName& p) {
  if (p.module == HfModuleKind::norm || p.module == HfModuleKind::bias) return TpPartitionType::skip;
  switch (p.split.kind) {
    case SplitKind::replicated:
      return TpPartitionType::skip;
    case SplitKind::rows:
      return TpPartitionType::column;
    case SplitKind::columns:
      return TpPartitionType::row;
    case SplitKind::vocabulary:
      if (p.module == HfModuleKind::linear) return TpPartitionType::column;
      return std::nullopt;
    case SplitKind::experts:
      return std::nullopt;
  }
  return std::nullopt;
}

// What the rule asks of `p`, as AutoTP would do it.
std::string rule_cut(const Rule& r, const HfParamName& p) {
  if (r.spec.partition_type == TpPartitionType::skip) return "keeps it whole on every rank";
  if (p.module == HfModuleKind::embedding) return "cuts its hidden dimension (AutoTP slices an nn.Embedding a rule names along dim 1)";
  return r.spec.partition_type == TpPartitionType::column ? "cuts its output dimension (column-parallel)" : "cuts its input dimension (row-parallel)";
}

std::string fix_for(const HfParamName& p) {
  const std::optional<TpPartitionType> t = dstrain_type(p);
  if (p.module == HfModuleKind::embedding && p.split.kind == SplitKind::vocabulary) {
    return fmt::format("narrow the patterns so that they do not name {} (dstrain's token embedding is always vocabulary-parallel)", p.name);
  }
  if (!t) return fmt::format("narrow the patterns so that they do not name {}", p.name);
  return fmt::format("make it \"partition_type\": \"{}\", or narrow the patterns so that they do not name {}", config::to_string(*t), p.name);
}

// The shape check of a cut linear weight: the blocks the rule cuts against dstrain's.
std::optional<std::string> check_blocks(const Rule& r, const HfParamName& p, bool column) {
  const std::int64_t out = p.shape[0], in = p.shape[1];
  const std::vector<std::int64_t> want = dstrain_blocks(p);
  std::vector<std::int64_t> got;
  if (!r.spec.shape) {
    got = {column ? out : in};
    if (got == want) return std::nullopt;
    return fmt::format(
        "{} holds {} fused blocks along its {} ({} of {}); without a shape AutoTP cuts them as one block, so a rank would hold some blocks "
        "whole and others not at all, while dstrain cuts each block on its own: add {}",
        p.name, want.size(), column ? "output rows" : "input columns", fmt::join(want, " | "), column ? out : in, suggested_shape(want, column));
  }
  const std::int64_t pdim = r.spec.effective_partition_dim();
  std::string err;
  const std::optional<View> v = infer_view(*r.spec.shape, pdim, out, in, err);
  if (!v) {
    return fmt::format("its shape does not fit {} of shape [{}, {}]: {} (DeepSpeed's ValueError when it builds the layer); write {}", p.name, out, in,
                       err, suggested_shape(want, column));
  }
  const std::size_t n = v->logical.size();
  const std::string view = fmt::format("[{}]", fmt::join(v->logical, ", "));
  if (column) {
    if (static_cast<std::size_t>(pdim) == n - 1) {
      return fmt::format("partition_dim {} of the view {} of {} is its input dimension: a row-parallel cut under a column rule; write {}", pdim, view,
                         p.name, suggested_shape(want, true));
    }
    if (pdim != 0) {
      return fmt::format(
          "partition_dim {} of the view {} of {} cuts every block of dimension 0 into interleaved slices, and dstrain cuts contiguous row "
          "blocks; write {}",
          pdim, view, p.name, suggested_shape(want, true));
    }
    const std::int64_t stride = product(v->logical, 1, n - 1);
    for (std::int64_t s : v->sub_sizes) got.push_back(s * stride);
  } else {
    if (static_cast<std::size_t>(pdim) != n - 1) {
      return fmt::format("partition_dim {} of the view {} of {} is an output dimension; a row-parallel layer is cut along its input (the last); "
                         "remove the shape",
                         pdim, view, p.name);
    }
    got = v->sub_sizes;
  }
  if (got == want) return std::nullopt;
  return fmt::format("its shape {} cuts {} as blocks of {} {}, but dstrain's blocks are {}; write {}", shape_text(*r.spec.shape), p.name,
                     fmt::join(got, " | "), column ? "rows" : "columns", fmt::join(want, " | "), suggested_shape(want, column));
}

// Why `r` (the first rule that names `p`) cannot apply to `p`, or nullopt when it asks for dstrain's cut.
std::optional<std::string> judge(const Rule& r, std::size_t ri, const HfParamName& p, const std::map<std::string, std::size_t>& decided_by, int tp_ranks) {
  const TpPartitionType t = r.spec.partition_type;
  const std::string asks = rule_cut(r, p);
  auto contradicts = [&]() -> std::string {
    return fmt::format("the rule {}, but dstrain's layer {}; dstrain cannot train another cut of it. Fix: {}", asks, dstrain_cut(p), fix_for(p));
  };
  switch (p.module) {
    case HfModuleKind::norm:
      if (t != TpPartitionType::skip) {
        return fmt::format(
            "a norm weight (1-D): AutoTP cuts only modules with a 2-D weight, and {}; there is no cut of it to ask for. Fix: make it "
            "\"partition_type\": \"skip\", or narrow the patterns so that they do not name {}",
            p.split.is_replicated()
                ? std::string("dstrain keeps this norm whole on every rank")
                : "dstrain cuts this norm itself, with the heads of the projection it normalises (OLMoE's q/k norm, " + p.split.describe() + ")",
            p.name);
      }
      break;
    case HfModuleKind::bias: {
      const std::string weight = p.module_name() + ".weight";
      const auto w = decided_by.find(weight);
      const bool follows = w != decided_by.end() && w->second == ri;
      if (t != TpPartitionType::skip && !follows) {
        return fmt::format(
            "a bias: AutoTP decides a module's cut by its weight's name ({}) and cuts the bias with it, so a rule that names the bias alone "
            "cuts nothing; dstrain's layer {}. Fix: name {} in the patterns (or make this rule \"skip\")",
            weight, dstrain_cut(p), weight);
      }
      break;
    }
    case HfModuleKind::embedding:
      if (p.split.kind == SplitKind::replicated && t == TpPartitionType::skip) break;
      return contradicts();
    case HfModuleKind::linear:
      switch (p.split.kind) {
        case SplitKind::replicated:
          if (t != TpPartitionType::skip) return contradicts();
          break;
        case SplitKind::rows:
        case SplitKind::vocabulary:
          if (t != TpPartitionType::column) return contradicts();
          if (auto why = check_blocks(r, p, true)) return why;
          if (r.spec.gather_output && p.split.kind != SplitKind::vocabulary) {
            return fmt::format(
                "gather_output all-gathers {}'s output shards on every rank, but dstrain's next layer reads the rank's own shard "
                "(Megatron's pairing of a column- with a row-parallel layer); dstrain gathers nothing there. Fix: remove gather_output",
                p.module_name());
          }
          break;
        case SplitKind::columns:
          if (t != TpPartitionType::row) return contradicts();
          if (auto why = check_blocks(r, p, false)) return why;
          break;
        case SplitKind::experts:
          return contradicts();
      }
      break;
  }
  if (r.spec.grad_allreduce && !p.grad_summed) {
    return fmt::format(
        "grad_allreduce sums {}'s gradient over the {} tensor-parallel ranks, but in dstrain {}: summing would {}. dstrain sums only the "
        "gradients that need it (Qwen3's q/k norm weights). Fix: remove grad_allreduce",
        p.name, tp_ranks,
        p.split.is_replicated() ? "its gradient is already whole and equal on every rank" : "each rank holds the gradient of its own piece",
        p.split.is_replicated() ? fmt::format("multiply it by {}", tp_ranks) : std::string("add up different pieces' gradients"));
  }
  return std::nullopt;
}

std::vector<std::string> check_partition(const config::TensorParallelConfig& tp, const Architecture& model, int tp_ranks, bool suggest) {
  const std::string model_type = lower(model.hf_model_type());
  const std::optional<Rules> rules = build_rules(tp, model_type);
  if (!rules) return {};
  const std::vector<HfParamName> names = model.hf_param_names();
  std::vector<std::string> lines = rules->notes;
  const std::string this_model = fmt::format("this {} model", model_type);
  auto fitting_presets = [&]() -> std::string {
    if (!suggest) return "";
    const std::vector<std::string> fit = tp_presets_for(model);
    if (fit.empty()) return fmt::format(" No preset of DeepSpeed's fits a {} model.", model_type);
    std::vector<std::string> quoted;
    for (const std::string& f : fit) quoted.push_back("\"" + f + "\"");
    return fmt::format(" The presets that fit it: preset_model {}.", fmt::join(quoted, " or "));
  };

  // 1. Every pattern of a rule that applies names some parameter.
  for (const Rule& r : rules->rules) {
    if (!r.applies) continue;
    for (std::size_t k = 0; k < r.patterns.size(); ++k) {
      if (std::any_of(names.begin(), names.end(), [&](const HfParamName& p) { return name_matches(r.patterns[k], p); })) continue;
      std::string hint;
      for (const HfParamName& p : names) {
        if (config::tp_pattern_matches(r.patterns[k], p.module_name())) {
          hint = fmt::format(" It matches the module name \"{}\", but AutoTP matches parameter names (\"{}\"): end it with \\.weight$ or drop the $.",
                             p.module_name(), p.name);
          break;
        }
      }
      if (r.from_preset) {
        fail(
            "{} names no parameter of {}: the preset is written for another architecture's Hugging Face module names, and DeepSpeed, which "
            "matches presets by name only, would skip the rule silently and leave what it meant to cut whole. This model's parameters: {}.{} "
            "Fix: use a preset that fits, or remove preset_model (dstrain cuts its layers as they declare, docs/parallelism.md §2), or give "
            "partition_config with \"use_default_specs\": false to use your own rules alone",
            r.pattern_where(k), this_model, example_names(names), fitting_presets());
      }
      fail(
          "{} names no parameter of {} (patterns are matched with Python's re.match, from the start of each name). DeepSpeed would skip it "
          "silently and leave what it meant to cut whole.{} This model's parameters: {}. Fix: correct the pattern (e.g. \".*\\\\.mlp\\\\..*\\\\.weight$\"), "
          "or remove it",
          r.pattern_where(k), this_model, hint, example_names(names));
    }
  }

  // 2. Each parameter takes the first rule that names it (AutoTPConfig.find_matching_spec).
  std::map<std::string, std::size_t> decided_by;
  std::vector<std::vector<std::size_t>> decides(rules->rules.size());
  for (std::size_t pi = 0; pi < names.size(); ++pi) {
    for (std::size_t ri = 0; ri < rules->rules.size(); ++ri) {
      const Rule& r = rules->rules[ri];
      if (!r.applies || !rule_matches(r, names[pi])) continue;
      decided_by[names[pi].name] = ri;
      decides[ri].push_back(pi);
      break;
    }
  }
  for (std::size_t ri = 0; ri < rules->rules.size(); ++ri) {
    const Rule& r = rules->rules[ri];
    for (std::size_t pi : decides[ri]) {
      if (auto why = judge(r, ri, names[pi], decided_by, tp_ranks)) fail("{} names {}, {}: {}", r.describe(), names[pi].name, hf_module_kind_name(names[pi].module), *why);
    }
  }

  // 3. strict_mode: every linear layer is named (DeepSpeed's ValueError "No matching spec for ...").
  if (rules->config.strict_mode) {
    for (const HfParamName& p : names) {
      if (p.module != HfModuleKind::linear || decided_by.count(p.name) != 0) continue;
      const std::optional<TpPartitionType> t = dstrain_type(p);
      fail(
          "tensor_parallel.partition_config.strict_mode: no layer spec names {} (DeepSpeed's ValueError \"No matching spec for {}\"). Fix: add a "
          "rule for it — dstrain {} — such as {{\"patterns\": [\"{}\"], \"partition_type\": \"{}\"}}, or set strict_mode to false",
          p.name, p.name, dstrain_cut(p), std::regex_replace(p.name, std::regex(R"(\.)"), "\\\\."), t ? config::to_string(*t) : "column");
    }
  }

  // 4. The embedding and the head: vocabulary-parallel in dstrain.
  const std::string pc = "tensor_parallel.partition_config";
  const HfParamName* embedding = nullptr;
  const HfParamName* head = nullptr;
  for (const HfParamName& p : names) {
    if (p.split.kind != SplitKind::vocabulary) continue;
    if (p.module == HfModuleKind::embedding && !embedding) embedding = &p;
    if (p.module == HfModuleKind::linear && !head) head = &p;
  }
  if (embedding && rules->config.embedding_partition_dim != 1) {
    fail(
        "{}.embedding_partition_dim {}: dstrain cuts the token embedding {} by vocabulary rows — the dimension DeepSpeed's AutoTPConfig "
        "documents as embedding_partition_dim 1 (\"Usually partition vocab dim\"; AutoTP itself does not read the key) — and provides no other "
        "cut of it. Fix: remove the key, or set it to 1",
        pc, rules->config.embedding_partition_dim, embedding->name);
  }
  if (head) {
    bool names_head = false;
    const auto& pats = rules->config.lm_head_patterns;
    for (std::size_t k = 0; k < pats.size(); ++k) {
      const std::string at = fmt::format("{}.lm_head_patterns[{}]", pc, k);
      const std::regex re = config::compile_tp_pattern(pats[k], at);
      for (const HfParamName& p : names) {
        const bool hit = name_matches(re, p) || config::tp_pattern_matches(re, p.module_name());
        if (!hit) continue;
        if (p.name == head->name) {
          names_head = true;
          continue;
        }
        fail(
            "{} \"{}\" names {}, which is not the output layer: dstrain's output layer is {} (vocabulary-parallel), and {} is a {} it {}. Fix: "
            "list the head's module name, \"{}\"",
            at, pats[k], p.name, head->module_name(), p.name, hf_module_kind_name(p.module), dstrain_cut(p), head->module_name());
      }
    }
    if (!names_head) {
      fail(
          "{}.lm_head_patterns {}: none names dstrain's output layer \"{}\", which dstrain cuts by vocabulary rows (vocabulary-parallel, the "
          "cross-entropy computed on each rank's rows). Fix: add \"{}\" to the list, or remove the key (default [\"lm_head\", \"embed_out\"])",
          pc, fmt::format("[{}]", fmt::join(pats, ", ")), head->module_name(), head->module_name());
    }
  }

  // 5. What the run does with each rule, in one line each.
  std::vector<std::string> undecided;
  for (const HfParamName& p : names) {
    if (p.module == HfModuleKind::bias || p.module == HfModuleKind::norm || p.split.is_replicated()) continue;
    if (decided_by.count(p.name) == 0) undecided.push_back(fmt::format("{} ({})", p.name, p.split.describe()));
  }
  for (std::size_t ri = 0; ri < rules->rules.size(); ++ri) {
    const Rule& r = rules->rules[ri];
    if (!r.applies) {
      lines.push_back(fmt::format("autotp: {} applies to model_types [{}] only; this model's model_type is \"{}\": not applied",
                                  r.where, fmt::join(*r.spec.model_types, ", "), model_type));
    } else if (decides[ri].empty()) {
      lines.push_back(fmt::format("autotp: {} names only parameters an earlier rule decides (the first match wins): no effect", r.where));
    } else {
      const HfParamName& first = names[decides[ri].front()];
      lines.push_back(fmt::format("autotp: {} honoured: {} parameter{} it decides {} cut so by dstrain's layers already (e.g. {}: {})",
                                  r.describe(), decides[ri].size(), decides[ri].size() == 1 ? "" : "s", decides[ri].size() == 1 ? "is" : "are",
                                  first.name, first.split.describe()));
    }
  }
  if (!undecided.empty()) {
    lines.push_back(fmt::format(
        "autotp: no rule names {} parameter{} that dstrain cuts (e.g. {}); DeepSpeed would keep {} whole, dstrain cuts {} as its layers "
        "declare (docs/parallelism.md §2)",
        undecided.size(), undecided.size() == 1 ? "" : "s", fmt::join(undecided.begin(), undecided.begin() + std::min<std::ptrdiff_t>(3, static_cast<std::ptrdiff_t>(undecided.size())), ", "),
        undecided.size() == 1 ? "it" : "them", undecided.size() == 1 ? "it" : "them"));
  }
  return lines;
}

}  // namespace

std::vector<std::string> check_tensor_parallel_partition(const config::TensorParallelConfig& tp, const Architecture& model, int tp_ranks) {
  return check_partition(tp, model, tp_ranks, true);
}

std::vector<std::string> tp_presets_for(const Architecture& model) {
  std::vector<std::string> fit;
  for (const std::string& name : config::tp_preset_names()) {
    config::TensorParallelConfig tp;
    tp.autotp_size = 2;
    tp.preset_model = name;
    try {
      (void)check_partition(tp, model, 2, false);
      fit.push_back(name);
    } catch (const Error&) {
    }
  }
  return fit;
}

}  // namespace dstrain
