#include "config_schema/zero_config.h"

#include "config_schema/state_placement.h"

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

const char* to_string(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::none:
      return "none";
    case OffloadDevice::cpu:
      return "cpu";
    case OffloadDevice::nvme:
      return "nvme";
  }
  return "none";
}

namespace {

const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};

OffloadDevice device_of(const Json& v) {
  const auto s = v.get<std::string>();
  return s == "cpu" ? OffloadDevice::cpu : s == "nvme" ? OffloadDevice::nvme : OffloadDevice::none;
}

std::optional<std::string> opt_string(const Json& v) {
  if (v.is_null()) return std::nullopt;
  return v.get<std::string>();
}

// DeepSpeed's deprecated booleans: mapped to their replacement with a warning; giving both is an
// error even when the deprecated value is false (docs/config.md §5).
void check_deprecated_pair(const Json& obj, const std::string& old_key, const std::vector<std::string>& new_keys) {
  if (!obj.contains(old_key)) return;
  for (const auto& k : new_keys)
    if (obj.contains(k))
      fail(
          "zero_optimization: Cannot provide deprecated parameter '{}' and replacing parameter '{}' together; "
          "remove \"{}\" and keep \"{}\"",
          old_key, k, old_key, k);
}

bool deprecated_bool(const Json& obj, const std::string& key) {
  FieldSpec f = bool_field(key, false, "");
  f.section = "zero_optimization";
  f.regime = Regime::validated;
  f.nullable = true;
  const Json v = coerce_validated(obj.at(key), f);
  return v.is_boolean() && v.get<bool>();
}

}  // namespace

SectionSpec offload_param_section_spec() {
  return make_section("zero_optimization.offload_param", Regime::validated,
                      "Offload of partitioned parameters (ZeRO stage 3 only; ignored at stages 0-2, as DeepSpeed does).",
                      {
                          string_field("device", "none", "Where partitioned parameters live: none, cpu or nvme (lower-case).").one_of(kDevices),
                          string_field("nvme_path", nullptr, "NVMe swap folder; required when device is nvme."),
                          int_field("buffer_count", 5, "Number of NVMe swap buffers.").min(0),
                          int_field("buffer_size", 100000000, "Elements per swap buffer; must fit the largest parameter.").min(0),
                          int_field("max_in_cpu", 1000000000, "Elements kept in CPU memory when device is nvme.").min(0),
                          bool_field("pin_memory", true, "Page-locked host buffers (default true since DeepSpeed v0.19.5)."),
                      });
}

SectionSpec offload_optimizer_section_spec() {
  return make_section("zero_optimization.offload_optimizer", Regime::validated,
                      "Offload of optimizer states; the optimizer step then runs on the CPU.",
                      {
                          string_field("device", "none", "Where optimizer states live: none, cpu or nvme (lower-case).").one_of(kDevices),
                          string_field("nvme_path", nullptr, "NVMe swap folder; required when device is nvme."),
                          int_field("buffer_count", 4, "Swap buffers; at least the optimizer tensors per parameter (Adam: 4).").min(0),
                          bool_field("pin_memory", true, "Page-locked host buffers (default true since DeepSpeed v0.19.5)."),
                          bool_field("pipeline_read", false, "Overlap NVMe reads of optimizer tiles with compute."),
                          bool_field("pipeline_write", false, "Overlap NVMe writes of optimizer tiles with compute."),
                          bool_field("fast_init", false, "Fast NVMe optimizer initialisation."),
                          number_field("ratio", 1.0, "Fraction of the optimizer step run on the CPU; < 1 needs stage 3.").min(0).max(1),
                          bool_field("super_offload", false, "DeepSpeed SuperOffload (stage 3); not provided by dstrain."),
                          number_field("cpuadam_cores_perc", 0.8, "Share of CPU cores used by CPU Adam with super_offload.").min(0).max(1),
                      });
}

SectionSpec zero_section_spec() {
  const Json huge = std::int64_t{INT64_MAX};
  return make_section("zero_optimization", Regime::validated, "ZeRO redundancy optimizer (stages 0-3).",
                      {
                          int_field("stage", 0, "0 off, 1 optimizer states, 2 +gradients, 3 +parameters.").one_of({"0", "1", "2", "3"}),
                          bool_field("contiguous_gradients", true, "Copy gradients into a contiguous buffer during backward."),
                          bool_field("reduce_scatter", true, "Average gradients with reduce-scatter instead of all-reduce."),
                          int_field("reduce_bucket_size", 500000000, "Elements per gradient reduction bucket.").min(0),
                          bool_field("use_multi_rank_bucket_allreduce", true, "Merge ranks' buckets into one all-reduce (stages 1-2)."),
                          bool_field("allgather_partitions", true, "All-gather updated partitions instead of broadcasts (stages 1-2)."),
                          int_field("allgather_bucket_size", 500000000, "Elements per all-gather (stages 1-2).").min(0),
                          bool_field("overlap_comm", false, "Overlap gradient reduction with backward; null/absent = true iff stage 3.")
                              .default_none(),
                          bool_field("load_from_fp32_weights", true, "On load, initialise master weights from the fp32 copies."),
                          bool_field("elastic_checkpoint", false, "Legacy elastic checkpoint (stages 1-2)."),
                          object_field("offload_param", "Parameter offload (stage 3), see offload_param."),
                          object_field("offload_optimizer", "Optimizer-state offload, see offload_optimizer."),
                          object_field("zenflow", "ZenFlow asynchronous offload; not provided by dstrain."),
                          int_field("sub_group_size", 1000000000, "Elements per optimizer sub-group (stage 3).").min(0),
                          int_field("prefetch_bucket_size", 50000000, "Elements prefetched ahead (stage 3); docs say 5e8, code 5e7.")
                              .min(0)
                              .alias("stage3_prefetch_bucket_size"),
                          int_field("param_persistence_threshold", 100000, "Parameters smaller than this stay unpartitioned (stage 3).")
                              .min(0)
                              .alias("stage3_param_persistence_threshold"),
                          int_field("model_persistence_threshold", huge, "Cap on total persisted elements (stage 3).")
                              .min(0)
                              .alias("stage3_model_persistence_threshold"),
                          int_field("max_live_parameters", 1000000000, "Most gathered elements resident at once (stage 3).")
                              .min(0)
                              .alias("stage3_max_live_parameters"),
                          int_field("max_reuse_distance", 1000000000, "Keep a parameter gathered if reused within this distance.")
                              .min(0)
                              .alias("stage3_max_reuse_distance"),
                          bool_field("gather_16bit_weights_on_model_save", false, "Consolidate 16-bit weights on model save (stage 3).")
                              .alias("stage3_gather_16bit_weights_on_model_save"),
                          int_field("module_granularity_threshold", 0, "Fetch fine-grained modules as a unit (stage 3).")
                              .alias("stage3_module_granularity_threshold"),
                          bool_field("use_all_reduce_for_fetch_params", false, "Fetch parameters with all-reduce (stage 3).")
                              .alias("stage3_use_all_reduce_for_fetch_params"),
                          bool_field("allgather_sequential", false, "Per-parameter all-gather without bucketing (stage 3).")
                              .alias("stage3_allgather_sequential"),
                          bool_field("ignore_unused_parameters", true, "Tolerate parameters without gradients (stage 2)."),
                          bool_field("legacy_stage1", false, "Removed in DeepSpeed 0.5.9; true is an error."),
                          bool_field("round_robin_gradients", false, "CPU-offload gradient copy parallelism (stages 1-2)."),
                          int_field("zero_hpz_partition_size", 1, "ZeRO++ hpZ: a secondary 16-bit weight shard over groups of this many ranks (a node) for the backward gathers; 1 = off.").min(0),
                          bool_field("zero_quantized_weights", false, "ZeRO++ qwZ: stage-3 parameter all-gathers in int8 blocks."),
                          bool_field("zero_quantized_nontrainable_weights", false, "ZeRO++: int8 gathers of frozen weights (dstrain trains every parameter)."),
                          bool_field("zero_quantized_gradients", false, "ZeRO++ qgZ: int4 hierarchical all-to-all gradient reduce-scatter across nodes."),
                          object_field("zeropp_loco_param", "ZeRO++ LoCo parameters {err_beta, reset_T}; refused before step 1: dstrain has no LoCo error feedback."),
                          int_field("mics_shard_size", -1, "> 0: MiCS, parameters and states sharded over groups of this many ranks, replicated across groups."),
                          bool_field("mics_hierarchical_params_gather", false, "MiCS: all-gather across nodes first, then within the node."),
                          bool_field("memory_efficient_linear", true, "Memory-efficient linear autograd function (stage 3)."),
                          bool_field("pipeline_loading_checkpoint", false, "Pipeline checkpoint loading (stage 3)."),
                          bool_field("override_module_apply", true, "Gather parameters inside module.apply (stage 3)."),
                          bool_field("log_trace_cache_warnings", false, "Log trace-cache invalidations (stage 3)."),
                          bool_field("enable_sanity_checks", false, "Extra consistency checks (stage 3)."),
                          bool_field("save_muon_momentum_buffer_in_memory", false, "Keep Muon momentum in memory (stage 3)."),
                          object_field("leaf_module", "Modules fetched as a unit {classes, names, name_suffixes} (stage 3)."),
                          // Deprecated spellings, mapped by parse_zero_config with DeepSpeed's warning.
                          bool_field("cpu_offload", false, "Deprecated: true means offload_optimizer {device: cpu}.")
                              .default_none()
                              .deprecated_for("offload_optimizer"),
                          bool_field("cpu_offload_param", false, "Deprecated: true means offload_param {device: cpu}.")
                              .default_none()
                              .deprecated_for("offload_param"),
                          bool_field("cpu_offload_use_pin_memory", false, "Deprecated; has no effect.")
                              .default_none()
                              .deprecated_for("offload_param or offload_optimizer"),
                          bool_field("stage3_gather_fp16_weights_on_model_save", false, "Deprecated spelling of gather_16bit_weights_on_model_save.")
                              .deprecated_for("gather_16bit_weights_on_model_save"),
                      });
}

namespace {

OffloadParamConfig parse_offload_param(const Json& v, ParseContext& ctx, Json& resolved) {
  resolved = read_section(v, offload_param_section_spec(), ctx);
  OffloadParamConfig c;
  c.device = device_of(resolved["device"]);
  c.nvme_path = opt_string(resolved["nvme_path"]);
  c.buffer_count = resolved["buffer_count"].get<std::int64_t>();
  c.buffer_size = resolved["buffer_size"].get<std::int64_t>();
  c.max_in_cpu = resolved["max_in_cpu"].get<std::int64_t>();
  c.pin_memory = resolved["pin_memory"].get<bool>();
  return c;
}

OffloadOptimizerConfig parse_offload_optimizer(const Json& v, ParseContext& ctx, Json& resolved) {
  resolved = read_section(v, offload_optimizer_section_spec(), ctx);
  OffloadOptimizerConfig c;
  c.device = device_of(resolved["device"]);
  c.nvme_path = opt_string(resolved["nvme_path"]);
  c.buffer_count = resolved["buffer_count"].get<std::int64_t>();
  c.pin_memory = resolved["pin_memory"].get<bool>();
  c.pipeline_read = resolved["pipeline_read"].get<bool>();
  c.pipeline_write = resolved["pipeline_write"].get<bool>();
  c.fast_init = resolved["fast_init"].get<bool>();
  c.ratio = resolved["ratio"].get<double>();
  c.super_offload = resolved["super_offload"].get<bool>();
  c.cpuadam_cores_perc = resolved["cpuadam_cores_perc"].get<double>();
  return c;
}

void check_cross_fields(const ZeroConfig& z, ParseContext& ctx) {
  // Which offload acts at this stage is the placement's to say (the precision does not change it).
  const StatePlacement placement = state_placement(z, false);
  if (z.legacy_stage1)
    fail(
        "zero_optimization.legacy_stage1 is true: the legacy stage-1 implementation was removed in DeepSpeed "
        "0.5.9; remove the key (or set it to false)");
  if (z.offload_optimizer) {
    const auto& o = *z.offload_optimizer;
    if (o.ratio < 1.0 && z.stage != 3)
      fail(
          "zero_optimization.offload_optimizer.ratio is {}: Partial offloading only supported for ZeRO Stage 3. "
          "Set zero_optimization.stage to 3 or ratio to 1.0 (stage is {})",
          o.ratio, z.stage);
    if (o.device == OffloadDevice::nvme && !o.nvme_path)
      fail(
          "zero_optimization.offload_optimizer.device is \"nvme\" but nvme_path is not set (DeepSpeed would "
          "crash joining None); set offload_optimizer.nvme_path to a folder on the NVMe drive");
    // DeepSpeed accepts 0 (ge=0) and then fails building its swap buffers (an IndexError); the NVMe
    // store swaps through buffer_count host buffers of one sub-group each: 0 cannot work.
    if (placement.optimizer == StateHome::nvme && o.buffer_count < 1)
      fail(
          "zero_optimization.offload_optimizer.buffer_count is {}: the NVMe optimizer store swaps the sub-groups through that "
          "many host buffers and needs at least 1; set it to 1 or more (4, DeepSpeed's default, lets reads, updates and "
          "write-backs overlap)",
          o.buffer_count);
    if (placement.optimizer_offload_ignored)
      ctx.warn("zero_optimization.offload_optimizer",
               fmt::format("offload_optimizer.device is \"{}\" but ZeRO is off (stage 0): optimizer offload needs "
                           "stage 1, 2 or 3; DeepSpeed ignores it at stage 0, and so does dstrain: the optimizer state stays "
                           "on the training device. Set stage to 1, 2 or 3 to offload it, or remove \"offload_optimizer\"",
                           to_string(o.device)));
    if (placement.nvme_optimizer_as_cpu)
      ctx.warn("zero_optimization.offload_optimizer.device",
               fmt::format("offload_optimizer.device \"nvme\" at stage {} behaves exactly like \"cpu\" (DeepSpeed "
                           "swaps optimizer states to NVMe only at stage 3)",
                           z.stage));
    if (o.super_offload)
      ctx.warn("zero_optimization.offload_optimizer.super_offload",
               "dstrain does not provide SuperOffload; offload_optimizer.super_offload is ignored and the plain CPU "
               "offload path is used");
  }
  if (z.offload_param) {
    const auto& p = *z.offload_param;
    if (p.device == OffloadDevice::nvme && !p.nvme_path)
      fail(
          "zero_optimization.offload_param.device is \"nvme\" but nvme_path is not set (DeepSpeed asserts "
          "\"nvme_path\" in DeepSpeed Config cannot be None); set offload_param.nvme_path");
    // The same rule as offload_optimizer.buffer_count: checked whatever the model, so a config does
    // not work only while every unit fits max_in_cpu (DeepSpeed fails at the first swapped unit).
    if (placement.params == StateHome::nvme && p.buffer_count < 1)
      fail(
          "zero_optimization.offload_param.buffer_count is {}: the NVMe parameter store swaps the layer shards through that "
          "many host buffers and needs at least 1; set it to 1 or more (5 is DeepSpeed's default)",
          p.buffer_count);
    if (placement.param_offload_ignored)
      ctx.warn("zero_optimization.offload_param",
               fmt::format("offload_param.device is \"{}\" but parameter offload only acts at stage 3 (stage is {}); "
                           "DeepSpeed ignores it, and so does dstrain: the parameters stay on the training device. "
                           "Set stage to 3 to offload them, or remove \"offload_param\"",
                           to_string(p.device), z.stage));
  }
  // ZeRO++ and MiCS (docs/zero.md §10): stage-3 features; DeepSpeed reads them only in its stage-3
  // optimizer and MiCS_Init, so at stages 0-2 they have no effect there, nor here.
  const bool zeropp = z.zero_quantized_weights || z.zero_quantized_nontrainable_weights || z.zero_quantized_gradients || z.zero_hpz_partition_size > 1;
  if ((zeropp || z.mics_shard_size > 0) && z.stage != 3)
    ctx.warn("zero_optimization",
             fmt::format("ZeRO++ (zero_quantized_weights, zero_quantized_gradients, zero_hpz_partition_size) and MiCS (mics_shard_size) act on "
                         "ZeRO stage 3's parameter gathers and gradient reduce-scatters; at stage {} DeepSpeed ignores them, and so does "
                         "dstrain. Set stage to 3 to use them",
                         z.stage));
  if (!z.zeropp_loco_param.is_null())
    fail(
        "zero_optimization.zeropp_loco_param: dstrain has no LoCo (error-feedback compensation for qgZ's int4 gradients), "
        "and training without it would silently drop the compensation asked for. Fix: remove zeropp_loco_param (qgZ then runs as "
        "DeepSpeed's all_to_all_quant_reduce), or train with DeepSpeed");
  if (z.zero_quantized_weights && z.mics_shard_size > 0 && z.mics_hierarchical_params_gather)
    fail(
        "zero_optimization: zero_quantized_weights with mics_hierarchical_params_gather — the quantized all-gather is one flat gather of "
        "int8 blocks and the hierarchical one a two-level gather of 16-bit values; a gather cannot be both. Fix: drop one of them");
  if (z.mics_hierarchical_params_gather && z.mics_shard_size <= 0)
    ctx.warn("zero_optimization.mics_hierarchical_params_gather", "mics_hierarchical_params_gather has no effect without mics_shard_size > 0");
  if (!z.zenflow.is_null()) ctx.warn("zero_optimization.zenflow", "dstrain does not provide ZenFlow; the zenflow block is ignored");
  if (z.elastic_checkpoint && z.stage == 3) ctx.warn("zero_optimization.elastic_checkpoint", "elastic_checkpoint has no effect at stage 3");
}

}  // namespace

ZeroConfig parse_zero_config(const Json* value, std::int64_t allgather_size, ParseContext& ctx, Json& resolved) {
  Json object = Json::object();
  bool legacy = false;
  if (value != nullptr) {
    if (value->is_boolean()) {
      legacy = true;
      if (value->get<bool>()) {
        object["stage"] = 1;
        object["allgather_bucket_size"] = allgather_size;
      }
      ctx.warn("zero_optimization",
               fmt::format("\"zero_optimization\": {} is the deprecated boolean form; it means stage {}{}. Write "
                           "{{\"stage\": {}}} instead",
                           value->get<bool>(), value->get<bool>() ? 1 : 0,
                           value->get<bool>() ? " with allgather_bucket_size = top-level allgather_size" : "", value->get<bool>() ? 1 : 0));
    } else if (value->is_null()) {
      fail(
          "zero_optimization is null (DeepSpeed crashes on it); remove the key for stage 0 or write "
          "{{\"stage\": 0}}");
    } else if (!value->is_object()) {
      fail("zero_optimization must be an object such as {{\"stage\": 2}}, got {}", show(*value));
    } else {
      object = *value;
    }
  }

  // Deprecated names (docs/config.md §5): converted, with DeepSpeed's warning text.
  check_deprecated_pair(object, "cpu_offload", {"offload_optimizer"});
  check_deprecated_pair(object, "cpu_offload_param", {"offload_param"});
  check_deprecated_pair(object, "stage3_gather_fp16_weights_on_model_save",
                        {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"});
  const std::vector<std::pair<std::string, std::string>> deprecated = {{"cpu_offload", "offload_optimizer"},
                                                                       {"cpu_offload_param", "offload_param"},
                                                                       {"cpu_offload_use_pin_memory", "offload_param or offload_optimizer"},
                                                                       {"stage3_gather_fp16_weights_on_model_save",
                                                                        "gather_16bit_weights_on_model_save"}};
  for (const auto& [old_key, new_key] : deprecated) {
    if (!object.contains(old_key)) continue;
    ctx.warn("zero_optimization." + old_key, fmt::format("Config parameter {} is deprecated use {} instead{}", old_key, new_key,
                                                         old_key == "cpu_offload_use_pin_memory" ? " (it has no effect)" : ""));
    const bool on = deprecated_bool(object, old_key);
    object.erase(old_key);
    if (old_key == "cpu_offload" && on) object["offload_optimizer"] = Json{{"device", "cpu"}};
    if (old_key == "cpu_offload_param" && on) object["offload_param"] = Json{{"device", "cpu"}};
    if (old_key == "stage3_gather_fp16_weights_on_model_save") object["gather_16bit_weights_on_model_save"] = on;
  }

  resolved = read_section(object, zero_section_spec(), ctx);
  const Json& r = resolved;
  ZeroConfig z;
  z.legacy_boolean_form = legacy;
  z.stage = static_cast<int>(r["stage"].get<std::int64_t>());
  z.contiguous_gradients = r["contiguous_gradients"].get<bool>();
  z.reduce_scatter = r["reduce_scatter"].get<bool>();
  z.reduce_bucket_size = r["reduce_bucket_size"].get<std::int64_t>();
  z.use_multi_rank_bucket_allreduce = r["use_multi_rank_bucket_allreduce"].get<bool>();
  z.allgather_partitions = r["allgather_partitions"].get<bool>();
  z.allgather_bucket_size = r["allgather_bucket_size"].get<std::int64_t>();
  // DeepSpeed's None default: overlap_comm is on by default only for stage 3.
  z.overlap_comm = r["overlap_comm"].is_null() ? z.stage == 3 : r["overlap_comm"].get<bool>();
  resolved["overlap_comm"] = z.overlap_comm;
  z.load_from_fp32_weights = r["load_from_fp32_weights"].get<bool>();
  z.elastic_checkpoint = r["elastic_checkpoint"].get<bool>();
  z.sub_group_size = r["sub_group_size"].get<std::int64_t>();
  z.prefetch_bucket_size = r["prefetch_bucket_size"].get<std::int64_t>();
  z.param_persistence_threshold = r["param_persistence_threshold"].get<std::int64_t>();
  z.model_persistence_threshold = r["model_persistence_threshold"].get<std::int64_t>();
  z.max_live_parameters = r["max_live_parameters"].get<std::int64_t>();
  z.max_reuse_distance = r["max_reuse_distance"].get<std::int64_t>();
  z.gather_16bit_weights_on_model_save = r["gather_16bit_weights_on_model_save"].get<bool>();
  z.module_granularity_threshold = r["module_granularity_threshold"].get<std::int64_t>();
  z.use_all_reduce_for_fetch_params = r["use_all_reduce_for_fetch_params"].get<bool>();
  z.allgather_sequential = r["allgather_sequential"].get<bool>();
  if (z.allgather_sequential) {
    // DeepSpeed sets the prefetch bucket to 1 element in sequential all-gather mode.
    z.prefetch_bucket_size = 1;
    resolved["prefetch_bucket_size"] = 1;
  }
  z.ignore_unused_parameters = r["ignore_unused_parameters"].get<bool>();
  z.legacy_stage1 = r["legacy_stage1"].get<bool>();
  z.round_robin_gradients = r["round_robin_gradients"].get<bool>();
  z.zero_hpz_partition_size = r["zero_hpz_partition_size"].get<std::int64_t>();
  z.zero_quantized_weights = r["zero_quantized_weights"].get<bool>();
  z.zero_quantized_nontrainable_weights = r["zero_quantized_nontrainable_weights"].get<bool>();
  z.zero_quantized_gradients = r["zero_quantized_gradients"].get<bool>();
  z.zeropp_loco_param = r["zeropp_loco_param"];
  z.mics_shard_size = r["mics_shard_size"].get<std::int64_t>();
  z.mics_hierarchical_params_gather = r["mics_hierarchical_params_gather"].get<bool>();
  z.memory_efficient_linear = r["memory_efficient_linear"].get<bool>();
  z.pipeline_loading_checkpoint = r["pipeline_loading_checkpoint"].get<bool>();
  z.override_module_apply = r["override_module_apply"].get<bool>();
  z.log_trace_cache_warnings = r["log_trace_cache_warnings"].get<bool>();
  z.enable_sanity_checks = r["enable_sanity_checks"].get<bool>();
  z.save_muon_momentum_buffer_in_memory = r["save_muon_momentum_buffer_in_memory"].get<bool>();
  z.leaf_module = r["leaf_module"];
  z.zenflow = r["zenflow"];

  if (!r["offload_param"].is_null()) {
    Json sub;
    z.offload_param = parse_offload_param(r["offload_param"], ctx, sub);
    resolved["offload_param"] = sub;
  }
  if (!r["offload_optimizer"].is_null()) {
    Json sub;
    z.offload_optimizer = parse_offload_optimizer(r["offload_optimizer"], ctx, sub);
    resolved["offload_optimizer"] = sub;
  }
  check_cross_fields(z, ctx);
  return z;
}

}  // namespace dstrain::config
