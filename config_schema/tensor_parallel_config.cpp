#include "config_schema/tensor_parallel_config.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"

namespace dstrain::config {

const char* to_string(TpPartitionType t) {
  switch (t) {
    case TpPartitionType::column:
      return "column";
    case TpPartitionType::row:
      return "row";
    case TpPartitionType::skip:
      return "skip";
  }
  return "column";
}

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string index_path(const std::string& path, std::size_t i) { return fmt::format("{}[{}]", path, i); }

// A JSON list of strings, or an Error naming the element.
std::vector<std::string> string_list(const Json& v, const std::string& path) {
  if (!v.is_array()) fail("{}: invalid value {}; expected a list of strings", path, show(v));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) fail("{}: invalid value {}; expected a string", index_path(path, i), show(v[i]));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

// An integer of a shape as Python's isinstance(x, int) sees it: JSON integers (hjson reads 2.0 as 2).
bool is_int(const Json& v) { return v.is_number_integer(); }

// TPLayerSpec._validate_shape_format, with DeepSpeed's messages.
std::vector<TpShapeDim> read_shape(const Json& v, std::int64_t partition_dim, const std::string& path) {
  if (!v.is_array())
    fail("{}: {} — AutoTP shape must be a tuple of ints or a tuple at partition_dim (DeepSpeed's ValueError); write a list such as [2, -1]", path,
         show(v));
  const auto n = static_cast<std::int64_t>(v.size());
  if (partition_dim < 0 || partition_dim >= n)
    fail("{}: {} — AutoTP partition_dim {} is out of range for shape length {} (DeepSpeed's ValueError); give a partition_dim between 0 and {}", path,
         show(v), partition_dim, n, n - 1);
  std::vector<TpShapeDim> dims;
  for (std::int64_t i = 0; i < n; ++i) {
    const Json& d = v[static_cast<std::size_t>(i)];
    const std::string at = index_path(path, static_cast<std::size_t>(i));
    TpShapeDim dim;
    if (d.is_array()) {
      if (i != partition_dim)
        fail("{}: {} — AutoTP shape nested tuple only allowed at partition_dim={}, got at {} (DeepSpeed's ValueError)", at, show(d), partition_dim,
             i);
      if (d.empty()) fail("{}: [] — AutoTP shape nested tuple cannot be empty (DeepSpeed's ValueError); list the sub-parameter sizes", at);
      for (const Json& s : d) {
        if (s.is_array()) fail("{}: {} — AutoTP shape supports only 1-level nesting at partition_dim (DeepSpeed's ValueError)", at, show(d));
        if (!is_int(s) || s.get<std::int64_t>() <= 0)
          fail("{}: {} — AutoTP nested sub-parameter sizes must be positive integers (DeepSpeed's ValueError)", at, show(d));
        dim.sub_sizes.push_back(s.get<std::int64_t>());
      }
    } else if (is_int(d)) {
      const auto x = d.get<std::int64_t>();
      if (x == 0 || x < -1) fail("{}: {} — AutoTP shape dimensions must be positive integers or -1 (DeepSpeed's ValueError)", at, show(d));
      dim.size = x;
    } else {
      fail("{}: {} — AutoTP shape must contain only integers or a tuple at partition_dim (DeepSpeed's ValueError)", at, show(d));
    }
    dims.push_back(std::move(dim));
  }
  return dims;
}

TpLayerSpec read_layer_spec(const Json& v, const std::string& path, ParseContext& ctx, Json& r) {
  // AutoTPConfig.from_dict reads each entry with spec_dict.get(...): anything but an object fails there.
  if (!v.is_object())
    fail("{}: {} — each layer spec is an object such as {{\"patterns\": [\".*\\\\.o_proj\\\\.weight$\"], \"partition_type\": \"row\"}}", path,
         show(v));
  r = read_section(v, tp_layer_spec_section_spec(path), ctx);
  TpLayerSpec s;
  s.patterns = string_list(r["patterns"], path + ".patterns");
  for (std::size_t i = 0; i < s.patterns.size(); ++i) (void)compile_tp_pattern(s.patterns[i], index_path(path + ".patterns", i));
  if (s.patterns.empty())
    ctx.warn(path + ".patterns", fmt::format("{} has no patterns, so it matches no parameter (DeepSpeed skips it silently); give at least one "
                                             "regular expression over parameter names",
                                             path));
  const std::string type = r["partition_type"].get<std::string>();
  s.partition_type = type == "row" ? TpPartitionType::row : type == "skip" ? TpPartitionType::skip : TpPartitionType::column;
  if (!r["partition_dim"].is_null()) s.partition_dim = r["partition_dim"].get<std::int64_t>();
  if (!r["shape"].is_null()) s.shape = read_shape(r["shape"], s.effective_partition_dim(), path + ".shape");
  if (s.partition_dim && !s.shape)
    ctx.warn(path + ".partition_dim", fmt::format("{}.partition_dim {} has no effect without a shape (DeepSpeed cuts a 2-D weight by "
                                                  "partition_type alone: column = dimension 0, row = dimension 1); remove it or give a shape",
                                                  path, *s.partition_dim));
  if (!r["model_types"].is_null()) s.model_types = string_list(r["model_types"], path + ".model_types");
  s.gather_output = r["gather_output"].get<bool>();
  s.grad_allreduce = r["grad_allreduce"].get<bool>();
  if (s.gather_output && s.partition_type == TpPartitionType::column && s.shape)
    fail(
        "{}: gather_output true with a shape — AutoTP gather_output does not yet support shaped sub-parameter layers (DeepSpeed's "
        "NotImplementedError once a parameter matches); remove gather_output or the shape",
        path);
  if (s.gather_output && s.partition_type != TpPartitionType::column)
    ctx.warn(path + ".gather_output", fmt::format("{}.gather_output has no effect with partition_type \"{}\": only column-parallel outputs are "
                                                  "gathered; remove it",
                                                  path, to_string(s.partition_type)));
  if (s.grad_allreduce && s.partition_type != TpPartitionType::skip)
    ctx.warn(path + ".grad_allreduce",
             fmt::format("{}.grad_allreduce with partition_type \"{}\": it is meant for replicated (\"skip\") parameters that see sharded "
                         "activations; DeepSpeed sums the gradients of every matched parameter over the tensor-parallel group, which for a "
                         "sharded parameter adds up different shards' gradients",
                         path, to_string(s.partition_type)));
  return s;
}

TpPartitionConfig read_partition_config(const Json& v, std::int64_t tp_size, ParseContext& ctx, Json& resolved) {
  const std::string path = "tensor_parallel.partition_config";
  resolved = read_section(v, tp_partition_config_section_spec(), ctx);
  TpPartitionConfig c;
  c.use_default_specs = resolved["use_default_specs"].get<bool>();
  c.embedding_partition_dim = resolved["embedding_partition_dim"].get<std::int64_t>();
  c.lm_head_patterns = string_list(resolved["lm_head_patterns"], path + ".lm_head_patterns");
  c.strict_mode = resolved["strict_mode"].get<bool>();
  Json& specs = resolved["layer_specs"];
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Json spec_resolved;
    c.layer_specs.push_back(read_layer_spec(specs[i], index_path(path + ".layer_specs", i), ctx, spec_resolved));
    specs[i] = std::move(spec_resolved);
  }
  if (resolved["tp_size"].get<std::int64_t>() != 1 && resolved["tp_size"].get<std::int64_t>() != tp_size)
    ctx.warn(path + ".tp_size", fmt::format("tensor_parallel.partition_config.tp_size {} has no effect: DeepSpeed sets the partition's size "
                                            "from tensor_parallel.autotp_size ({}); remove it",
                                            resolved["tp_size"].get<std::int64_t>(), tp_size));
  return c;
}

TpLayerSpec spec(std::string pattern, TpPartitionType type, std::optional<std::vector<TpShapeDim>> shape = std::nullopt,
                 std::optional<std::int64_t> dim = std::nullopt) {
  TpLayerSpec s;
  s.patterns = {std::move(pattern)};
  s.partition_type = type;
  s.shape = std::move(shape);
  s.partition_dim = dim;
  return s;
}

// (n, -1): n equal sub-parameters along dimension 0.
std::vector<TpShapeDim> fused(std::int64_t n) { return {TpShapeDim{n, {}}, TpShapeDim{-1, {}}}; }

}  // namespace

const std::vector<std::string>& tp_preset_names() {
  static const std::vector<std::string> names = {"llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3"};
  return names;
}

// deepspeed/module_inject/autotp_config.py, AutoTPPresets.
std::optional<TpPartitionConfig> tp_preset(const std::string& name_in) {
  using enum TpPartitionType;
  const std::string name = lower(name_in);
  TpPartitionConfig c;
  auto& s = c.layer_specs;
  if (name == "llama" || name == "qwen2") {
    s = {spec(R"(.*\.self_attn\.o_proj\.weight$)", row), spec(R"(.*\.self_attn\.[qkv]_proj\.weight$)", column),
         spec(R"(.*\.mlp\.down_proj\.weight$)", row), spec(R"(.*\.mlp\.(up|gate)_proj\.weight$)", column)};
  } else if (name == "bloom") {
    s = {spec(R"(.*\.self_attention\.dense\.weight$)", row), spec(R"(.*\.self_attention\.query_key_value\.weight$)", column),
         spec(R"(.*\.mlp\.dense_4h_to_h\.weight$)", row), spec(R"(.*\.mlp\.dense_h_to_4h\.weight$)", column)};
  } else if (name == "chatglm") {
    s = {spec(R"(.*\.self_attention\.dense\.weight$)", row), spec(R"(.*\.self_attention\.query_key_value\.weight$)", column, fused(3), 0),
         spec(R"(.*\.mlp\.dense_4h_to_h\.weight$)", row), spec(R"(.*\.mlp\.dense_h_to_4h\.weight$)", column, fused(2), 0)};
  } else if (name == "mixtral") {
    s = {spec(R"(.*\.self_attn\.o_proj\.weight$)", row), spec(R"(.*\.self_attn\.[qkv]_proj\.weight$)", column),
         spec(R"(.*\.block_sparse_moe\.experts\.\d+\.w2\.weight$)", row), spec(R"(.*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$)", column),
         spec(R"(.*\.block_sparse_moe\.gate\.weight$)", skip)};
  } else if (name == "deepseek_v2") {
    s = {spec(R"(.*\.self_attn\.o_proj\.weight$)", row),
         spec(R"(.*\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight$)", skip),
         spec(R"(.*\.self_attn\.(q_b_proj|kv_b_proj)\.weight$)", column),
         spec(R"(.*\.mlp\.experts\.\d+\.down_proj\.weight$)", row),
         spec(R"(.*\.mlp\.experts\.\d+\.(up|gate)_proj\.weight$)", column),
         spec(R"(.*\.mlp\.gate\.weight$)", skip),
         spec(R"(.*\.mlp\.shared_experts\.down_proj\.weight$)", row),
         spec(R"(.*\.mlp\.shared_experts\.(up|gate)_proj\.weight$)", column)};
  } else if (name == "phi3") {
    s = {spec(R"(.*\.self_attn\.o_proj\.weight$)", row), spec(R"(.*\.self_attn\.qkv_proj\.weight$)", column, fused(3), 0),
         spec(R"(.*\.mlp\.down_proj\.weight$)", row), spec(R"(.*\.mlp\.gate_up_proj\.weight$)", column, fused(2), 0)};
  } else {
    return std::nullopt;
  }
  return c;
}

std::optional<TpPartitionConfig> TensorParallelConfig::effective_partition_config() const {
  std::optional<TpPartitionConfig> config;
  if (preset_model) config = tp_preset(*preset_model);
  if (partition_config) {
    if (config && partition_config->use_default_specs) {
      // merge_autotp_configs(base=preset, override=custom): the custom specs take precedence.
      TpPartitionConfig merged = *partition_config;
      merged.layer_specs.insert(merged.layer_specs.end(), config->layer_specs.begin(), config->layer_specs.end());
      if (merged.lm_head_patterns.empty()) merged.lm_head_patterns = config->lm_head_patterns;
      config = std::move(merged);
    } else {
      config = *partition_config;
    }
  }
  return config;
}

std::regex compile_tp_pattern(const std::string& pattern, const std::string& path) {
  // Python re constructs that ECMAScript (std::regex) lacks, or reads as something else.
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (!in_class && (n == 'A' || n == 'Z'))
        fail(
            "{}: \"{}\" uses \\{}, a Python-only anchor that dstrain's regular expressions (ECMAScript) do not have; write {} instead "
            "(DeepSpeed matches with Python's re.match, which already anchors at the start of the name)",
            path, pattern, n, n == 'A' ? "^" : "$");
      ++i;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      continue;
    }
    if (c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') ++i;
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') ++i;  // "[]...]": a leading ] is a member
      continue;
    }
    if (c == '(' && i + 2 < pattern.size() && pattern[i + 1] == '?' && pattern[i + 2] != ':' && pattern[i + 2] != '=' && pattern[i + 2] != '!')
      fail(
          "{}: \"{}\" uses the Python group \"(?{}...\" (a named group, look-behind, inline flag or comment), which dstrain's regular "
          "expressions (ECMAScript) do not have; use plain groups (...), (?:...), (?=...) or (?!...)",
          path, pattern, pattern[i + 2]);
  }
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(
        "{}: \"{}\" is not a valid regular expression ({}); DeepSpeed compiles it with Python's re when it matches the parameter names "
        "and fails there (re.error); fix the pattern, e.g. \".*\\\\.o_proj\\\\.weight$\"",
        path, pattern, e.what());
  }
}

bool tp_pattern_matches(const std::regex& pattern, const std::string& name) {
  return std::regex_search(name, pattern, std::regex_constants::match_continuous);
}

SectionSpec tensor_parallel_section_spec() {
  FieldSpec tp = object_field("tensor_parallel", "TPConfig {tp_size, tp_grain_size}: tp_size must be 1 or autotp_size.").alias("tp");
  tp.default_value = Json::object();  // Field({}, alias="tp"): not Optional
  tp.nullable = false;
  return make_section("tensor_parallel", Regime::validated, "AutoTP tensor parallelism for training (DeepSpeed's TPTrainingConfig).",
                      {
                          int_field("autotp_size", 0, "Tensor-parallel degree; 0 or 1 = off. World size = data-parallel x sequence-parallel x this."),
                          bool_field("tp_overlap_comm", false, "Overlap the row-parallel all-reduce with computation."),
                          std::move(tp),
                          array_field("injection_policy_tuple", nullptr, "Inference injection policy; no effect in training."),
                          object_field("partition_config", "Custom partition rules {use_default_specs, layer_specs, ...}; see partition_config."),
                          string_field("preset_model", nullptr,
                                       "Built-in rules: llama, bloom, chatglm, mixtral, deepseek_v2, qwen2, phi3 (any case)."),
                          bool_field("keep_module_on_host", false, "Keep loaded checkpoint weights in host memory."),
                          bool_field("replace_with_kernel_inject", false, "Inference kernels; no effect in training.").alias("kernel_inject"),
                      });
}

SectionSpec tensor_parallel_tp_section_spec(const std::string& key) {
  // TPConfig's `object` fields: pydantic takes any value, and the engine uses it as a Python object.
  FieldSpec mpu;
  mpu.key = "mpu";
  mpu.kind = FieldKind::any;
  mpu.default_value = nullptr;
  mpu.nullable = true;
  mpu.description = "A model-parallel unit object; only a program can pass it.";
  FieldSpec group = mpu;
  group.key = "tp_group";
  group.description = "A process-group object; only a program can pass it.";
  return make_section("tensor_parallel." + key, Regime::validated, "Tensor-parallel group settings (DeepSpeed's TPConfig).",
                      {
                          int_field("tp_size", 1, "1, or the same value as autotp_size (DeepSpeed overwrites it with autotp_size)."),
                          int_field("tp_grain_size", 1, "Granularity of uneven shards.").min(1),
                          std::move(mpu),
                          std::move(group),
                      });
}

SectionSpec tp_partition_config_section_spec() {
  return make_section("tensor_parallel.partition_config", Regime::dict_lookup, "Custom AutoTP partition rules (DeepSpeed's AutoTPConfig.from_dict).",
                      {
                          bool_field("use_default_specs", true, "With preset_model: the preset's specs follow these; false = these alone."),
                          array_field("layer_specs", Json::array(), "Ordered rules {patterns, partition_type, shape, partition_dim, ...}."),
                          int_field("embedding_partition_dim", 1, "Embedding dimension to cut (the vocabulary)."),
                          array_field("lm_head_patterns", Json::array({"lm_head", "embed_out"}), "Names of the output layer."),
                          bool_field("strict_mode", false, "A Linear layer that no spec matches is an error."),
                          int_field("tp_size", 1, "No effect: DeepSpeed sets it from autotp_size."),
                      });
}

SectionSpec tp_layer_spec_section_spec(const std::string& path) {
  return make_section(path, Regime::dict_lookup, "One AutoTP partition rule (DeepSpeed's TPLayerSpec).",
                      {
                          array_field("patterns", Json::array(), "Regular expressions over parameter names (Python's re.match)."),
                          string_field("partition_type", "column", "How matched parameters are cut.").one_of({"column", "row", "skip"}, true),
                          array_field("shape", nullptr, "Logical shape before cutting: ints (-1 = inferred), a list at partition_dim."),
                          int_field("partition_dim", nullptr, "Dimension of shape to cut; default 0 for column, 1 for row."),
                          array_field("model_types", nullptr, "Apply only to these model_type values (any case)."),
                          bool_field("gather_output", false, "Column: all-gather the output shards."),
                          bool_field("grad_allreduce", false, "Skip: sum the replicated parameter's gradient over the TP group."),
                      });
}

TensorParallelConfig parse_tensor_parallel_config(const Json* value, ParseContext& ctx, Json& resolved) {
  TensorParallelConfig c;
  resolved = nullptr;
  if (value == nullptr) return c;
  const Json& v = *value;
  // deepspeed.initialize reads config.get("tensor_parallel", {}).get("autotp_size", 0), and the
  // config TPTrainingConfig(**ds_config["tensor_parallel"]): both need an object.
  if (!v.is_object())
    fail(
        "tensor_parallel: {} — DeepSpeed reads the section as keyword arguments and fails on anything but an object (an AttributeError or "
        "TypeError); give an object such as {{\"autotp_size\": 2}}, or remove the key",
        show(v));
  c.configured = true;
  if (v.contains("dtype"))
    fail(
        "tensor_parallel.dtype: {} — DeepSpeed's TPTrainingConfig takes only a torch.dtype object here, which a JSON config cannot hold "
        "(pydantic: \"Input should be an instance of dtype\"); remove the key: the model's dtype comes from bf16 / fp16",
        show(v["dtype"]));
  if (v.contains("autotp_size") && v["autotp_size"].is_string())
    fail(
        "tensor_parallel.autotp_size: {} — deepspeed.initialize compares it with 0 before any conversion and fails on a string (TypeError: "
        "'>' not supported between 'str' and 'int'); write the number without quotes, e.g. \"autotp_size\": 2",
        show(v["autotp_size"]));
  resolved = read_section(v, tensor_parallel_section_spec(), ctx);
  c.autotp_size = resolved["autotp_size"].get<std::int64_t>();
  c.tp_overlap_comm = resolved["tp_overlap_comm"].get<bool>();
  c.keep_module_on_host = resolved["keep_module_on_host"].get<bool>();
  c.replace_with_kernel_inject = resolved["replace_with_kernel_inject"].get<bool>();
  if (!resolved["injection_policy_tuple"].is_null()) c.injection_policy_tuple = resolved["injection_policy_tuple"];

  // tp (or its field name, tensor_parallel): DeepSpeed's TPConfig.
  const std::string tp_key = v.contains("tp") ? "tp" : "tensor_parallel";
  const std::string tp_path = "tensor_parallel." + tp_key;
  Json tp = read_section(resolved["tensor_parallel"], tensor_parallel_tp_section_spec(tp_key), ctx);
  c.tp_size = tp["tp_size"].get<std::int64_t>();
  c.tp_grain_size = tp["tp_grain_size"].get<std::int64_t>();
  if (!tp["tp_group"].is_null())
    fail(
        "{}.tp_group: {} — a process group that only a program can pass (deepspeed.tp_model_init); DeepSpeed would use this value as a "
        "group and fail; remove it",
        tp_path, show(tp["tp_group"]));
  if (!tp["mpu"].is_null())
    ctx.warn(tp_path + ".mpu", fmt::format("{}.mpu has no effect: a model-parallel unit is an object the program passes to "
                                           "deepspeed.initialize(mpu=...), not a config value; remove it",
                                           tp_path));
  resolved["tensor_parallel"] = tp;

  if (c.autotp_size < 0)
    ctx.warn("tensor_parallel.autotp_size", fmt::format("tensor_parallel.autotp_size {} turns tensor parallelism off (DeepSpeed shards only "
                                                        "when it is > 1); write 0 for off",
                                                        c.autotp_size));
  if (c.autotp_size > 1 && c.tp_size != 1 && c.tp_size != c.autotp_size)
    fail("{}.tp_size ({}) does not match tensor_parallel.autotp_size ({}) (DeepSpeed's ValueError); remove {}.tp_size, or set it to {}", tp_path,
         c.tp_size, c.autotp_size, tp_path, c.autotp_size);
  if (c.autotp_size <= 1 && c.tp_size > 1)
    ctx.warn(tp_path + ".tp_size",
             fmt::format("{}.tp_size {} has no effect: DeepSpeed's training engine shards the model only when tensor_parallel.autotp_size "
                         "is > 1 (and then sets tp_size from it), so this config trains without tensor parallelism; set "
                         "\"autotp_size\": {} to shard",
                         tp_path, c.tp_size, c.tp_size));
  c.tp_size = c.size();  // as DeepSpeed leaves it once the engine is built

  if (!resolved["preset_model"].is_null()) {
    c.preset_model = lower(resolved["preset_model"].get<std::string>());
    if (!tp_preset(*c.preset_model))
      ctx.warn("tensor_parallel.preset_model",
               fmt::format("tensor_parallel.preset_model \"{}\" is not a preset DeepSpeed knows ({}); DeepSpeed ignores it silently and falls "
                           "back to the model's Hugging Face tp_plan or its own heuristics",
                           resolved["preset_model"].get<std::string>(), fmt::join(tp_preset_names(), ", ")));
  }
  if (!resolved["partition_config"].is_null()) {
    Json pc;
    c.partition_config = read_partition_config(resolved["partition_config"], c.size(), ctx, pc);
    resolved["partition_config"] = pc;
  }
  if (c.injection_policy_tuple)
    ctx.warn("tensor_parallel.injection_policy_tuple",
             "tensor_parallel.injection_policy_tuple has no effect in training: DeepSpeed's training engine replaces it with the policies its "
             "AutoTP parser finds (it is an inference setting); remove it");
  if (c.replace_with_kernel_inject)
    ctx.warn("tensor_parallel.replace_with_kernel_inject",
             "tensor_parallel.replace_with_kernel_inject has no effect in training: it selects DeepSpeed's inference kernels; remove it");
  return c;
}

}  // namespace dstrain::config
