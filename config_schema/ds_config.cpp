#include "config_schema/ds_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"

namespace dstrain::config {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::fp16:
      return "fp16";
    case Precision::bf16:
      return "bf16";
  }
  return "fp32";
}

namespace {}  // namespace

std::vector<std::string> top_level_section_keys() {
  std::vector<std::string> keys = {"optimizer",
                                   "scheduler",
                                   "fp16",
                                   "bf16",
                                   "bfloat16",
                                   "amp",
                                   "torch_autocast",
                                   "data_types",
                                   "zero_optimization",
                                   "aio",
                                   "activation_checkpointing",
                                   "checkpoint",
                                   "tensorboard",
                                   "csv_monitor",
                                   "wandb",
                                   "comet",
                                   "comms_logger",
                                   "flops_profiler",
                                   "timers",
                                   "elasticity",
                                   "tensor_parallel",
                                   "pipeline",
                                   "expert_parallel"};
  const auto& extra = unsupported_section_keys();
  keys.insert(keys.end(), extra.begin(), extra.end());
  return keys;
}

namespace {

const Json* child(const Json& root, const char* key) { return root.contains(key) ? &root[key] : nullptr; }

std::optional<std::int64_t> opt_int(const Json& v) {
  if (v.is_null()) return std::nullopt;
  return v.get<std::int64_t>();
}
std::optional<std::string> opt_string(const Json& v) {
  if (v.is_null()) return std::nullopt;
  return v.get<std::string>();
}

// The device mesh (docs/batch.md §1): world = pipeline x data-parallel x sequence-parallel x
// tensor-parallel. Settled before "auto" resolution because train_batch_size = micro * GAS *
// data-parallel.
struct Mesh {
  std::int64_t dp = 1, sp = 1, tp = 1, pp = 1;
};

// Where the stage count came from, for messages: "--pipeline-stages 3" or "pipeline.stages 3".
std::string stages_source(std::int64_t pp, bool from_option) {
  return from_option ? fmt::format("--pipeline-stages {}", pp) : fmt::format("pipeline.stages {}", pp);
}

Mesh device_mesh(const Json& root, std::int64_t world, std::int64_t tp, std::int64_t pp, bool pp_from_option, std::vector<Warning>& scratch) {
  DSTRAIN_CHECK(world > 0, "world size is {}; it must be a positive number of ranks", world);
  ParseContext ctx(scratch);
  const SectionSpec top = top_level_section_spec();
  Mesh m;
  m.tp = tp;
  m.pp = pp;
  if (world % pp != 0) {
    std::int64_t below = pp;
    while (below > 1 && world % below != 0) --below;
    fail(
        "{} does not divide the world size {}: every pipeline stage holds the same number of ranks (world = pipeline stages x "
        "data-parallel x sequence-parallel x tensor-parallel). Fix: give {} a divisor of {} (e.g. {}), or run on a multiple of {} ranks",
        stages_source(pp, pp_from_option), world, pp_from_option ? "--pipeline-stages" : "pipeline.stages", world, below, pp);
  }
  const std::int64_t stage_ranks = world / pp;
  const bool has_sp = root.contains("sequence_parallel_size") && !root["sequence_parallel_size"].is_null();
  if (has_sp) m.sp = check_dict_lookup(root["sequence_parallel_size"], *top.find("sequence_parallel_size"), ctx).get<std::int64_t>();
  const std::int64_t model_ranks = m.sp * m.tp;
  if (stage_ranks % model_ranks != 0) {
    const std::string what =
        m.sp > 1 && m.tp > 1 ? fmt::format("sequence_parallel_size is {} and tensor_parallel.autotp_size is {} (product {})", m.sp, m.tp, model_ranks)
        : m.tp > 1           ? fmt::format("tensor_parallel.autotp_size is {}", m.tp)
                             : fmt::format("sequence_parallel_size is {}", m.sp);
    if (pp > 1)
      fail(
          "{} but the {} ranks of a pipeline stage (world size {} / {}) are not a multiple of {}: each stage's ranks form a data-parallel "
          "x sequence-parallel x tensor-parallel mesh. Use a world size that is a multiple of {} (e.g. {}), or sizes whose product divides {}",
          what, stage_ranks, world, stages_source(pp, pp_from_option), model_ranks, pp * model_ranks,
          (stage_ranks / model_ranks + 1) * model_ranks * pp, stage_ranks);
    fail(
        "{} but the world size {} is not a multiple of {}: the ranks form a data-parallel x sequence-parallel x tensor-parallel mesh, so "
        "the data-parallel size would be {}/{} (not a whole number of ranks). Use a world size that is a multiple of {} (e.g. {}), or "
        "sizes whose product divides {}",
        what, world, model_ranks, world, model_ranks, model_ranks, (world / model_ranks + 1) * model_ranks, world);
  }
  m.dp = stage_ranks / model_ranks;
  if (has_sp && root.contains("data_parallel_size") && !root["data_parallel_size"].is_null()) {
    const std::int64_t given = check_dict_lookup(root["data_parallel_size"], *top.find("data_parallel_size"), ctx).get<std::int64_t>();
    if (given != m.dp)
      fail(
          "data_parallel_size is {} but world size {} / ({}sequence_parallel_size {} x tensor-parallel size {}) = {}; the device mesh needs "
          "data_parallel_size x sequence_parallel_size x tensor_parallel.autotp_size{} == world size: set data_parallel_size to {}, or "
          "remove it",
          given, world, pp > 1 ? fmt::format("pipeline stages {} x ", pp) : "", m.sp, m.tp, m.dp, pp > 1 ? " x pipeline stages" : "", m.dp);
  }
  return m;
}

void read_top_level(DsConfig& c, const Json& t) {
  c.managed_gradient_accumulation = t["managed_gradient_accumulation"].get<bool>();
  c.steps_per_print = opt_int(t["steps_per_print"]);
  c.wall_clock_breakdown = t["wall_clock_breakdown"].get<bool>();
  c.memory_breakdown = t["memory_breakdown"].get<bool>();
  c.dump_state = t["dump_state"].get<bool>();
  c.gradient_clipping = t["gradient_clipping"].get<double>();
  c.prescale_gradients = t["prescale_gradients"].get<bool>();
  c.gradient_predivide_factor = t["gradient_predivide_factor"].get<double>();
  c.gradient_allreduce_op = t["gradient_allreduce_op"].get<std::string>();
  c.communication_data_type = opt_string(t["communication_data_type"]);
  c.seq_parallel_communication_data_type = opt_string(t["seq_parallel_communication_data_type"]);
  c.sparse_gradients = t["sparse_gradients"].get<bool>();
  c.disable_allgather = t["disable_allgather"].get<bool>();
  c.zero_allow_untested_optimizer = t["zero_allow_untested_optimizer"].get<bool>();
  c.zero_force_ds_cpu_optimizer = t["zero_force_ds_cpu_optimizer"].get<bool>();
  c.graph_harvesting = t["graph_harvesting"].get<bool>();
  c.dataloader_drop_last = t["dataloader_drop_last"].get<bool>();
  c.vocabulary_size = opt_int(t["vocabulary_size"]);
  c.use_data_before_expert_parallelism = t["use_data_before_expert_parallelism"].get<bool>();
  c.log_level = opt_string(t["log_level"]);
  c.sequence_parallel_size = opt_int(t["sequence_parallel_size"]);
  c.data_parallel_size = opt_int(t["data_parallel_size"]);
  c.allgather_size = t["allgather_size"].get<std::int64_t>();
}

// DeepSpeed's own messages for the two validated top-level enums.
void check_top_level_enums(const Json& root) {
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  if (root.contains("gradient_allreduce_op") && root["gradient_allreduce_op"].is_string()) {
    const std::string op = lower(root["gradient_allreduce_op"].get<std::string>());
    if (op != "mean" && op != "sum")
      fail("gradient_allreduce_op: Invalid gradient_allreduce_op. Supported operations: ['mean', 'sum']. Got: {}",
           root["gradient_allreduce_op"].get<std::string>());
  }
  for (const char* key : {"communication_data_type", "seq_parallel_communication_data_type"}) {
    if (root.contains(key) && root[key].is_string()) {
      const std::string d = lower(root[key].get<std::string>());
      if (d != "fp32" && d != "fp16" && d != "bf16")
        fail("{}: Invalid {}. Supported data types: ['fp16', 'bf16', 'fp32']. Got: {}", key, key, root[key].get<std::string>());
    }
  }
}

// prescale_gradients / gradient_predivide_factor where DeepSpeed's reduction path cannot apply them
// (docs/zero.md, "Gradient reduction"): its ZeRO-2 and ZeRO-3 optimizers assert at start-up on
// the reduce-scatter path, and its ZeRO-1 reduce-scatter path divides by the world size only.
void check_gradient_reduction(const DsConfig& c, ParseContext& ctx) {
  const int stage = c.zero_optimization.stage;
  const double p = c.gradient_predivide_factor;
  if (!(p > 0.0) || !std::isfinite(p))
    fail(
        "gradient_predivide_factor: {} — gradients are multiplied by 1/gradient_predivide_factor before the all-reduce; give a "
        "positive finite number (1.0 = off)",
        p);
  const bool average = c.gradient_allreduce_op != "sum";
  const bool rs = c.zero_optimization.reduce_scatter;
  if ((stage == 2 && rs && average) || (stage == 3 && rs)) {
    const std::string zero = fmt::format("ZeRO-{}", stage);
    if (p != 1.0)
      fail(
          "gradient_predivide_factor {} with zero_optimization.stage {}: gradient_predivide_factor != 1.0 is not yet supported with {} "
          "with reduce scatter enabled (DeepSpeed's assertion); set gradient_predivide_factor to 1.0, or "
          "zero_optimization.reduce_scatter to false",
          p, stage, zero);
    if (c.prescale_gradients)
      fail(
          "prescale_gradients true with zero_optimization.stage {}: pre-scale gradients is not yet supported with {} with reduce "
          "scatter enabled (DeepSpeed's assertion); set prescale_gradients to false, or zero_optimization.reduce_scatter to false",
          stage, zero);
  }
  if (stage == 3 && !rs && !c.prescale_gradients && p != 1.0 && p == static_cast<double>(c.data_parallel_world_size))
    fail(
        "gradient_predivide_factor {} equals the data-parallel world size at zero_optimization.stage 3 with reduce_scatter false: "
        "DeepSpeed's ZeRO-3 divides by the factor and by the world size but skips multiplying the factor back when the two are "
        "equal, so the gradients come out {} times too small; use 1.0 or another factor",
        p, c.data_parallel_world_size);
  if (stage == 1 && rs && average && (p != 1.0 || c.prescale_gradients))
    ctx.warn(c.prescale_gradients ? "prescale_gradients" : "gradient_predivide_factor",
             "has no effect at zero_optimization.stage 1 with reduce_scatter: DeepSpeed's ZeRO-1 reduce-scatter path divides the "
             "gradients by the world size before the reduce, whatever these keys say (they act at stage 0, and with "
             "reduce_scatter false)");
}

void check_cross_sections(DsConfig& c, ParseContext& ctx) {
  const int stage = c.zero_optimization.stage;
  if (c.gradient_allreduce_op == "sum" && stage == 3)
    fail(
        "gradient_allreduce_op is \"sum\" with zero_optimization.stage 3: ZeRO-3 always averages gradients; use "
        "\"mean\" or a lower ZeRO stage");
  check_gradient_reduction(c, ctx);
  const auto kind = c.optimizer.kind;
  // The 1-bit family is refused at any ZeRO stage below, by the assert DeepSpeed reaches first
  // (_configure_basic_optimizer runs before the whitelist check).
  if (stage > 0 && c.optimizer.present() && kind != OptimizerKind::unsupported && !c.optimizer.is_onebit() && !c.optimizer.zero_tested() &&
      !c.zero_allow_untested_optimizer)
    fail(
        "optimizer.type {} with zero_optimization.stage {}: You are using an untested ZeRO Optimizer. Please add "
        "<\"zero_allow_untested_optimizer\": true> in the configuration file to use it. (ZeRO's whitelist has "
        "Adam/AdamW, Adagrad and Lion; {} is not on it)",
        c.optimizer.type, stage, c.optimizer.type);
  if (kind == OptimizerKind::lamb && c.fp16.enabled && !c.fp16.dynamic())
    fail(
        "optimizer.type Lamb with fp16.loss_scale {}: DeepSpeed lamb optimizer requires dynamic loss scaling; set "
        "fp16.loss_scale to 0",
        c.fp16.loss_scale);
  // deepspeed/runtime/engine.py _configure_basic_optimizer: the 1-bit family is stage 0 only, 1-bit
  // LAMB needs dynamic loss scaling like Lamb, and their convergence is verified under fp16 only.
  if (c.optimizer.is_onebit()) {
    const char* ds_name = kind == OptimizerKind::onebit_adam ? "1bit-Adam" : kind == OptimizerKind::zero_one_adam ? "0/1 Adam" : "1bit-Lamb";
    if (stage > 0)
      fail(
          "optimizer.type {} with zero_optimization.stage {}: {} is not compatible with ZeRO (DeepSpeed asserts this); use "
          "zero_optimization.stage 0, or Adam/AdamW with ZeRO",
          c.optimizer.type, stage, ds_name);
    if (kind == OptimizerKind::onebit_lamb && c.fp16.enabled && !c.fp16.dynamic())
      fail(
          "optimizer.type {} with fp16.loss_scale {}: DeepSpeed onebitlamb optimizer requires dynamic loss scaling; set "
          "fp16.loss_scale to 0",
          c.optimizer.type, c.fp16.loss_scale);
    if (!c.fp16.enabled)
      ctx.warn("optimizer.type", fmt::format("Currently the convergence of {} is only verified under FP16 (DeepSpeed's warning)",
                                             kind == OptimizerKind::onebit_adam     ? "1-bit Adam"
                                             : kind == OptimizerKind::zero_one_adam ? "0/1 Adam"
                                                                                    : "1-bit Lamb"));
  }
  // deepspeed/runtime/zero/muon/muon_optimizer.py: DeepSpeed's engine-level MuonWithAuxAdam steps its
  // Muon matrices with the plain gradient and leaves the Newton-Schulz update to the ZeRO optimizers.
  if (kind == OptimizerKind::muon && stage == 0)
    ctx.warn("optimizer.type",
             "Muon at zero_optimization.stage 0: DeepSpeed computes Muon's orthogonalised update only in its ZeRO "
             "optimizers (stages 1-3) and steps the Muon matrices with the plain gradient at stage 0 "
             "(W -= lr*(grad + weight_decay*W)); dstrain applies Muon at every stage, so this run trains as DeepSpeed's "
             "stage 1-3 runs do (docs/optimizers.md §9)");
  if ((stage == 1 || stage == 2) && !c.optimizer.present())
    ctx.warn("optimizer", fmt::format("zero stage {} requires an optimizer and the config has none; DeepSpeed fails "
                                      "unless the program passes its own optimizer",
                                      stage));
  if (c.flops_profiler.enabled && !c.wall_clock_breakdown) {
    c.wall_clock_breakdown = true;  // DeepSpeed forces the timers on for the profiler
  }
  if (c.vocabulary_size && *c.vocabulary_size % 8 != 0)
    ctx.warn("vocabulary_size", fmt::format("vocabulary_size {} is not a multiple of 8; tensor cores work best with "
                                            "a padded vocabulary (e.g. {})",
                                            *c.vocabulary_size, (*c.vocabulary_size + 7) / 8 * 8));
  if (c.data_parallel_size && !c.sequence_parallel_size)
    ctx.warn("data_parallel_size",
             *c.data_parallel_size == c.data_parallel_world_size
                 ? std::string("data_parallel_size is only read together with sequence_parallel_size; alone it has no effect (the "
                               "data-parallel size is the world size / tensor_parallel.autotp_size)")
                 : fmt::format("data_parallel_size {} is only read together with sequence_parallel_size; alone it has no effect: the "
                               "data-parallel size is {} (world size {} / tensor-parallel size {})",
                               *c.data_parallel_size, c.data_parallel_world_size, c.world_size, c.tensor_parallel_size));
  if (c.optimizer.present() && c.zero_optimization.offload_optimizer && c.zero_optimization.offload_optimizer->device != OffloadDevice::none &&
      c.zero_optimization.stage > 0 && c.optimizer.kind != OptimizerKind::adam && c.optimizer.kind != OptimizerKind::adamw &&
      c.optimizer.kind != OptimizerKind::unsupported)
    ctx.warn("zero_optimization.offload_optimizer.device",
             fmt::format("optimizer offload runs the optimizer on the CPU; DeepSpeed has CPU versions of "
                         "Adam/AdamW/Adagrad/Lion only, so {} runs as the plain torch optimizer on the CPU",
                         c.optimizer.type));
}

// resolve_batch_sizes for the mesh's data-parallel size. Where the mesh has model-parallel ranks, an
// error says what W is, and an explicit train_batch_size that DeepSpeed's config-only AutoTP path
// reads differently is warned about: without an mpu, DeepSpeedConfig counts all world /
// sequence_parallel_size ranks in train_batch_size, tensor-parallel ones included, although a
// tensor-parallel group reads one sample stream (docs/batch.md §1).
BatchSizes resolve_mesh_batch_sizes(const DsConfig& c, std::optional<std::int64_t> tbs, std::optional<std::int64_t> mbs,
                                    std::optional<std::int64_t> gas, ParseContext& ctx) {
  const bool model_parallel = c.sequence_parallel_world_size > 1 || c.tensor_parallel_size > 1 || c.pipeline_parallel_size > 1;
  BatchSizes b;
  try {
    b = resolve_batch_sizes(tbs, mbs, gas, c.data_parallel_world_size);
  } catch (const Error& e) {
    // Only the messages that involve W (the product check, inferred values, the overflow) get the mesh.
    const std::string what = e.what();
    if (!model_parallel || what.find("world") == std::string::npos) throw;
    throw Error(fmt::format("{} (world_size here is the data-parallel size: {}; only data-parallel ranks read different samples)", e.what(),
                            c.mesh_description()));
  }
  if (c.tensor_parallel_size > 1 && tbs && !c.elasticity.enabled) {
    const std::int64_t ds_world = c.world_size / (c.sequence_parallel_world_size * c.pipeline_parallel_size);
    std::string deepspeed;
    try {
      const BatchSizes d = resolve_batch_sizes(tbs, mbs, gas, ds_world);
      if (d.train_micro_batch_size_per_gpu != b.train_micro_batch_size_per_gpu || d.gradient_accumulation_steps != b.gradient_accumulation_steps)
        deepspeed =
            fmt::format("resolves micro batch {} x gradient accumulation {}", d.train_micro_batch_size_per_gpu, d.gradient_accumulation_steps);
    } catch (const Error&) {
      deepspeed = "refuses the triple";
    }
    if (!deepspeed.empty())
      ctx.warn("train_batch_size",
               fmt::format("train_batch_size {} counts data-parallel ranks ({}), so each rank runs micro batch {} x gradient accumulation {}; "
                           "DeepSpeed, when the program passes no mpu to deepspeed.initialize, counts all {} ranks here (tensor-parallel "
                           "ones too, though a tensor-parallel group reads one sample stream) and {}; with an mpu it reads it as dstrain does",
                           b.train_batch_size, c.mesh_description(), b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps, ds_world,
                           deepspeed));
  }
  return b;
}

// expert_parallel.autoep_size splits the data-parallel ranks (zero/device_mesh.h): it must divide
// them. DeepSpeed's build_folding_spec asks only that it divide a pipeline stage's ranks, because
// its AutoEP+AutoTP folding lets an expert-parallel group span tensor-parallel ranks; dstrain's
// groups are data-parallel ranks of one tensor/sequence lane (DeepSpeed's layout without AutoTP).
void check_expert_parallel_mesh(const DsConfig& c, ParseContext& ctx) {
  const ExpertParallelConfig& e = c.expert_parallel;
  if (!e.enabled) return;
  const std::int64_t dp = c.data_parallel_world_size;
  if (e.autoep_size >= 1 && dp % e.autoep_size != 0) {
    // The mesh without the split that does not fit.
    const std::string mesh = fmt::format("world size {} = {}data-parallel {} x sequence-parallel {} x tensor-parallel {}", c.world_size,
                                         c.pipeline_parallel_size > 1 ? fmt::format("pipeline {} x ", c.pipeline_parallel_size) : "", dp,
                                         c.sequence_parallel_world_size, c.tensor_parallel_size);
    std::string divisors;
    for (std::int64_t d = 1; d <= dp; ++d)
      if (dp % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    fail(
        "expert_parallel.autoep_size {} does not divide the data-parallel size {} ({}): the expert-parallel groups split the "
        "data-parallel ranks into groups of {}. Fix: set expert_parallel.autoep_size to one of {}, or run on a world size whose "
        "data-parallel size is a multiple of {}",
        e.autoep_size, dp, mesh, e.autoep_size, divisors, e.autoep_size);
  }
  if (c.use_data_before_expert_parallelism)
    ctx.warn("use_data_before_expert_parallelism",
             "use_data_before_expert_parallelism is true: DeepSpeed then makes its expert-data-parallel groups of consecutive ranks "
             "and its expert-parallel groups strided (D + E); dstrain lays them out E + D (expert-parallel groups of consecutive "
             "data-parallel ranks), which changes which ranks exchange tokens, not the result. Remove the key to silence this");
  const auto& tp_preset = c.tensor_parallel.preset_model;
  if (tp_preset && e.preset_model && *tp_preset != *e.preset_model)
    fail(
        "tensor_parallel.preset_model is \"{}\" but expert_parallel.preset_model is \"{}\": DeepSpeed raises ValueError "
        "\"tensor_parallel.preset_model and expert_parallel.preset_model must match when both are set\". Fix: give both the same "
        "model, or remove one",
        *tp_preset, *e.preset_model);
}

}  // namespace

DsConfig parse_ds_config(const Json& input, const ConfigOptions& options) {
  if (!input.is_object()) fail("a ds_config must be a JSON object ({{...}}), got {}", show(input));
  DsConfig c;
  ParseContext ctx(c.warnings);
  std::vector<Warning> scratch;
  c.world_size = options.world_size;
  // tensor_parallel and pipeline first: autotp_size and the stage count are factors of the mesh,
  // which the batch arithmetic needs.
  Json tp_resolved;
  c.tensor_parallel = parse_tensor_parallel_config(child(input, "tensor_parallel"), ctx, tp_resolved);
  Json pipeline_resolved;
  c.pipeline = parse_pipeline_config(child(input, "pipeline"), ctx, pipeline_resolved);
  if (options.pipeline_stages && *options.pipeline_stages < 1)
    fail("--pipeline-stages {}: a pipeline has at least 1 stage (1: no pipeline parallelism)", *options.pipeline_stages);
  c.pipeline_parallel_size = options.pipeline_stages ? *options.pipeline_stages : std::max<std::int64_t>(c.pipeline.stages, 1);
  if (c.pipeline.present && c.pipeline.stages == 0 && !options.pipeline_stages)
    ctx.warn("pipeline.stages",
             "pipeline.stages is \"auto\": DeepSpeed takes num_stages from PipelineModule; give --pipeline-stages N (this run has 1 stage: "
             "no pipeline parallelism)");
  if (options.pipeline_stages && c.pipeline.stages > 0 && c.pipeline.stages != *options.pipeline_stages)
    ctx.warn("pipeline.stages", fmt::format("pipeline.stages {} is replaced by --pipeline-stages {}", c.pipeline.stages, *options.pipeline_stages));
  const Mesh mesh =
      device_mesh(input, options.world_size, c.tensor_parallel.size(), c.pipeline_parallel_size, options.pipeline_stages.has_value(), scratch);
  c.data_parallel_world_size = mesh.dp;
  c.sequence_parallel_world_size = mesh.sp;
  c.tensor_parallel_size = mesh.tp;
  const Json root = resolve_auto_values(input, options.autos, c.data_parallel_world_size, c.resolved_autos, &c.warnings);
  for (Warning& w : unused_auto_options(input, options.autos)) c.warnings.push_back(std::move(w));

  check_top_level_enums(root);
  Json top = read_section(root, top_level_section_spec(), ctx, top_level_section_keys());
  read_top_level(c, top);
  // (The default, fp32, written by every resolved config, is not worth a word.)
  if (root.contains("seq_parallel_communication_data_type") && c.seq_parallel_communication_data_type != "fp32" &&
      c.sequence_parallel_world_size == 1)
    ctx.warn("seq_parallel_communication_data_type",
             "seq_parallel_communication_data_type has no effect without sequence-parallel ranks: it replaces communication_data_type "
             "only when sequence_parallel_size is > 1 (DeepSpeed also takes the sequence-parallel size from an mpu, such as HF "
             "Accelerate's for ALST, which dstrain does not); set sequence_parallel_size, or remove the key");

  Json elastic_resolved;
  c.elasticity = parse_elasticity_config(child(root, "elasticity"), ctx, elastic_resolved);
  std::optional<std::int64_t> tbs = opt_int(top["train_batch_size"]);
  std::optional<std::int64_t> mbs = opt_int(top["train_micro_batch_size_per_gpu"]);
  std::optional<std::int64_t> gas = opt_int(top["gradient_accumulation_steps"]);
  if (c.elasticity.enabled) {
    // DeepSpeed tests presence of the keys (even null), not their values.
    std::vector<std::string> given;
    for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
      if (root.contains(k)) given.emplace_back(k);
    if (!given.empty() && !c.elasticity.ignore_non_elastic_batch_info)
      fail(
          "{}: One or more batch related parameters were found in your ds_config (train_batch_size, "
          "train_micro_batch_size_per_gpu, and/or gradient_accumulation_steps). These parameters *will not be used* "
          "since elastic training is enabled, which takes control of these parameters. If you want to suppress this "
          "error (the parameters will be silently ignored) please set 'ignore_non_elastic_batch_info':true in your "
          "elasticity config. Or remove {}",
          fmt::join(given, ", "), fmt::join(given, ", "));
    const ElasticBatch e = compute_elastic_batch(c.elasticity, c.data_parallel_world_size);
    if (!given.empty())
      ctx.warn("elasticity", fmt::format("elasticity is enabled: {} from the config {} replaced by the elastic values "
                                         "(train_batch_size {}, micro batch {}, gradient accumulation {})",
                                         fmt::join(given, ", "), given.size() == 1 ? "is" : "are", e.train_batch_size, e.micro_batch_size,
                                         e.gradient_accumulation_steps));
    tbs = e.train_batch_size;
    mbs = e.micro_batch_size;
    gas = e.gradient_accumulation_steps;
  }
  const BatchSizes b = resolve_mesh_batch_sizes(c, tbs, mbs, gas, ctx);
  c.train_batch_size = b.train_batch_size;
  c.train_micro_batch_size_per_gpu = b.train_micro_batch_size_per_gpu;
  c.gradient_accumulation_steps = b.gradient_accumulation_steps;

  Json out = top;
  out["train_batch_size"] = c.train_batch_size;
  out["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  out["gradient_accumulation_steps"] = c.gradient_accumulation_steps;

  Json r;
  // A client optimizer replaces the config's block; a default fills its absence (ConfigOptions).
  const Json* optimizer_block = child(root, "optimizer");
  const bool config_has_optimizer = optimizer_block != nullptr && !optimizer_block->is_null();
  if (options.client_optimizer) {
    if (config_has_optimizer)
      ctx.warn("optimizer",
               "the program passes its own optimizer, which replaces this block (DeepSpeed, too, uses "
               "the client optimizer and ignores the config's)");
    optimizer_block = &*options.client_optimizer;
    c.optimizer_source = OptimizerSource::client;
  } else if (!config_has_optimizer && options.default_optimizer) {
    optimizer_block = &*options.default_optimizer;
    c.optimizer_source = OptimizerSource::default_adamw;
  }
  c.optimizer = parse_optimizer_config(optimizer_block, ctx, r);
  if (c.optimizer.present()) out["optimizer"] = r;
  std::optional<double> opt_lr;
  if (c.optimizer.present()) {
    if (c.optimizer.kind != OptimizerKind::unsupported)
      opt_lr = c.optimizer.params.lr;
    else if (c.optimizer.raw_params.contains("lr") && c.optimizer.raw_params["lr"].is_number())
      opt_lr = c.optimizer.raw_params["lr"].get<double>();
  }
  c.scheduler = parse_scheduler_config(child(root, "scheduler"), opt_lr, ctx, r);
  if (c.scheduler.present()) out["scheduler"] = r;
  if (c.scheduler.present() && !c.optimizer.present())
    ctx.warn("scheduler",
             "a scheduler is configured but no optimizer: DeepSpeed builds the config scheduler only "
             "when an optimizer exists (from the config or passed by the program)");

  c.fp16 = parse_fp16_config(child(root, "fp16"), ctx, r);
  out["fp16"] = r;
  c.bf16 = parse_bf16_config(root, ctx, r);
  out["bf16"] = r;  // the legacy key bfloat16 is written under its current name
  c.amp = parse_amp_config(child(root, "amp"), ctx, r);
  out["amp"] = r;
  c.torch_autocast = parse_torch_autocast_config(child(root, "torch_autocast"), ctx, r);
  out["torch_autocast"] = r;
  c.data_types = parse_data_types_config(child(root, "data_types"), ctx, r);
  out["data_types"] = r;
  c.zero_optimization = parse_zero_config(child(root, "zero_optimization"), c.allgather_size, ctx, r);
  out["zero_optimization"] = r;
  c.aio = parse_aio_config(child(root, "aio"), ctx, r);
  out["aio"] = r;
  c.activation_checkpointing = parse_activation_checkpointing_config(child(root, "activation_checkpointing"), ctx, r);
  out["activation_checkpointing"] = r;
  c.checkpoint = parse_checkpoint_config(child(root, "checkpoint"), ctx, r);
  out["checkpoint"] = r;
  c.tensorboard = parse_file_monitor_config("tensorboard", child(root, "tensorboard"), ctx, r);
  out["tensorboard"] = r;
  c.csv_monitor = parse_file_monitor_config("csv_monitor", child(root, "csv_monitor"), ctx, r);
  out["csv_monitor"] = r;
  c.wandb = parse_wandb_config(child(root, "wandb"), ctx, r);
  out["wandb"] = r;
  c.comet = parse_comet_config(child(root, "comet"), ctx, r);
  out["comet"] = r;
  c.comms_logger = parse_comms_logger_config(child(root, "comms_logger"), ctx, r);
  if (c.comms_logger.configured) out["comms_logger"] = r;  // presence has meaning in DeepSpeed
  c.flops_profiler = parse_flops_profiler_config(child(root, "flops_profiler"), ctx, r);
  out["flops_profiler"] = r;
  c.timers = parse_timers_config(child(root, "timers"), ctx, r);
  out["timers"] = r;
  if (root.contains("elasticity")) out["elasticity"] = elastic_resolved;
  if (c.tensor_parallel.configured) out["tensor_parallel"] = tp_resolved;
  if (c.pipeline.present) out["pipeline"] = pipeline_resolved;
  Json ep_resolved;
  c.expert_parallel = parse_expert_parallel_config(child(root, "expert_parallel"), ctx, ep_resolved);
  if (c.expert_parallel.present) out["expert_parallel"] = ep_resolved;
  check_expert_parallel_mesh(c, ctx);
  c.ignored_sections = check_unsupported_sections(root, ctx);
  for (const auto& s : c.ignored_sections) out[s.key] = s.value;

  check_precision(c.fp16, c.bf16, c.amp, c.data_types, c.zero_optimization.stage, ctx);
  out["bf16"]["bf16_master_weights_and_grads"] = c.bf16.bf16_master_weights_and_grads;
  out["bf16"]["bf16_optimizer_states"] = c.bf16.bf16_optimizer_states;
  check_cross_sections(c, ctx);
  out["wall_clock_breakdown"] = c.wall_clock_breakdown;
  c.resolved = std::move(out);
  return c;
}

Json DsConfig::to_json() const { return resolved; }

std::string DsConfig::mesh_description() const {
  const int ep = expert_parallel.ep_size();
  return fmt::format("world size {} = {}data-parallel {}{} x sequence-parallel {} x tensor-parallel {}", world_size,
                     pipeline_parallel_size > 1 ? fmt::format("pipeline {} x ", pipeline_parallel_size) : "", data_parallel_world_size,
                     ep > 1 ? fmt::format(" (expert-parallel {} x expert-data-parallel {})", ep, data_parallel_world_size / ep) : "",
                     sequence_parallel_world_size, tensor_parallel_size);
}

std::string DsConfig::summary() const {
  std::string s;
  auto line = [&s](const std::string& text) { s += text + "\n"; };
  line(mesh_description());
  if (tensor_parallel.enabled()) {
    const auto rules = tensor_parallel.effective_partition_config();
    line(fmt::format("tensor parallelism: autotp_size {}{}, tp_overlap_comm {}{}", tensor_parallel.autotp_size,
                     tensor_parallel.preset_model ? fmt::format(", preset_model {}", *tensor_parallel.preset_model) : "",
                     tensor_parallel.tp_overlap_comm,
                     rules ? fmt::format(", {} partition rule{}", rules->layer_specs.size(), rules->layer_specs.size() == 1 ? "" : "s")
                           : ", partition rules from the model"));
  }
  if (expert_parallel.enabled) {
    const auto& e = expert_parallel;
    std::string what = fmt::format("expert parallelism: autoep_size {}", e.autoep_size);
    if (e.preset_model) what += fmt::format(", preset_model {}", *e.preset_model);
    if (e.moe_layer_pattern) what += fmt::format(", moe_layer_pattern \"{}\"", *e.moe_layer_pattern);
    what += e.top_k ? fmt::format(", top_k {}", *e.top_k) : std::string(", top_k from the model");
    what += fmt::format(", score_func {}", e.score_func);
    what += fmt::format(" (expert gradients summed over the {} expert-data-parallel ranks, divided by the data-parallel size {})",
                        data_parallel_world_size / std::max(1, e.ep_size()) * sequence_parallel_world_size, data_parallel_world_size);
    line(what);
  } else if (expert_parallel.present) {
    line("expert parallelism: off (expert_parallel.enabled is false)");
  }
  if (pipeline.present || pipeline_parallel_size > 1)
    line(fmt::format("pipeline parallelism: {} stage{}{}, partition \"{}\", activation_checkpoint_interval {}", pipeline_parallel_size,
                     pipeline_parallel_size == 1 ? "" : "s", pipeline.present && pipeline.stages == 0 ? " (pipeline.stages \"auto\")" : "",
                     pipeline.partition, pipeline.activation_checkpoint_interval));
  line(fmt::format("batch: train_batch_size {} = micro batch {} x gradient accumulation {} x data-parallel {}", train_batch_size,
                   train_micro_batch_size_per_gpu, gradient_accumulation_steps, data_parallel_world_size));
  std::string prec = to_string(precision());
  if (fp16.enabled)
    prec += fp16.dynamic() ? fmt::format(" (dynamic loss scale 2^{}, window {}, hysteresis {}, min {})", fp16.initial_scale_power,
                                         fp16.loss_scale_window, fp16.hysteresis, fp16.min_loss_scale)
                           : fmt::format(" (static loss scale {})", fp16.loss_scale);
  if (bf16.enabled) prec += fmt::format(" (check_grad_overflow {})", bf16.check_grad_overflow);
  line("precision: " + prec);
  const auto& z = zero_optimization;
  std::string zero = fmt::format("ZeRO stage {}", z.stage);
  if (z.stage > 0)
    zero += fmt::format(", overlap_comm {}, reduce_bucket_size {}, allgather_bucket_size {}", z.overlap_comm, z.reduce_bucket_size,
                        z.allgather_bucket_size);
  if (z.stage == 3)
    zero += fmt::format(", prefetch_bucket_size {}, param_persistence_threshold {}", z.prefetch_bucket_size, z.param_persistence_threshold);
  if (z.offload_optimizer && z.offload_optimizer->device != OffloadDevice::none)
    zero += fmt::format(", optimizer offload to {} (pin_memory {})", to_string(z.offload_optimizer->device), z.offload_optimizer->pin_memory);
  if (z.offload_param && z.offload_param->device != OffloadDevice::none)
    zero += fmt::format(", parameter offload to {}{}", to_string(z.offload_param->device), z.stage == 3 ? "" : " (ignored below stage 3)");
  line(zero);
  if (z.stage == 3) {
    // ZeRO++ and MiCS (docs/zero.md §10): what each changes in the gathers and reductions.
    std::vector<std::string> pp;
    if (z.zero_quantized_weights) pp.emplace_back("qwZ: int8 parameter all-gathers");
    if (z.zero_hpz_partition_size > 1) pp.push_back(fmt::format("hpZ: a pass's later gathers within {} ranks", z.zero_hpz_partition_size));
    if (z.zero_quantized_gradients) pp.emplace_back("qgZ: int4 gradient reduce-scatter across nodes");
    if (z.mics_shard_size > 0)
      pp.push_back(fmt::format("MiCS: shard groups of {} ranks{}", z.mics_shard_size, z.mics_hierarchical_params_gather ? ", hierarchical gather" : ""));
    if (!pp.empty()) line(fmt::format("ZeRO++ / MiCS: {}", fmt::join(pp, "; ")));
  }
  if (optimizer.present()) {
    const auto& p = optimizer.params;
    if (optimizer.kind == OptimizerKind::sgd)
      line(fmt::format("optimizer: SGD lr {} momentum {} weight_decay {}", p.lr, p.momentum, p.weight_decay));
    else if (optimizer.kind == OptimizerKind::unsupported)
      line(fmt::format("optimizer: {} (not provided by dstrain)", optimizer.type));
    else if (optimizer.kind != OptimizerKind::adam && optimizer.kind != OptimizerKind::adamw && optimizer.kind != OptimizerKind::lamb)
      line(fmt::format("optimizer: {} {}", optimizer.type, resolved.contains("optimizer") ? resolved["optimizer"]["params"].dump() : ""));
    else
      line(fmt::format("optimizer: {} lr {} betas ({}, {}) eps {} weight_decay {}{}", optimizer.type, p.lr, p.betas.first, p.betas.second, p.eps,
                       p.weight_decay, optimizer.decoupled_weight_decay() ? " (decoupled, AdamW)" : ""));
    if (optimizer_source == OptimizerSource::default_adamw)
      line(
          "  (the config has no \"optimizer\" block: the Hugging Face Trainer's default AdamW, with --lr, --adam-beta1, "
          "--adam-beta2, --adam-eps, --weight-decay)");
    else if (optimizer_source == OptimizerSource::client)
      line("  (the program's own optimizer, in place of the config's block)");
  } else {
    line(
        "optimizer: none in the config (dstrain train: AdamW with the Hugging Face Trainer's defaults, lr 5e-5, "
        "betas (0.9, 0.999), eps 1e-8, weight_decay 0)");
  }
  if (scheduler.present()) {
    const auto& p = scheduler.params;
    std::string sched = "scheduler: " + scheduler.type;
    switch (scheduler.kind) {
      case SchedulerKind::warmup_lr:
        sched += fmt::format(" {} -> {} over {} steps ({})", p.warmup_min_lr, p.warmup_max_lr, p.warmup_num_steps, p.warmup_type);
        break;
      case SchedulerKind::warmup_decay_lr:
        sched += fmt::format(" {} -> {} over {} steps ({}), decay to step {}", p.warmup_min_lr, p.warmup_max_lr, p.warmup_num_steps, p.warmup_type,
                             p.total_num_steps.value_or(0));
        break;
      case SchedulerKind::warmup_cosine_lr:
        sched += fmt::format(" warmup {} steps, cosine to ratio {} at step {}", p.warmup_num_steps, p.cos_min_ratio, p.total_num_steps.value_or(0));
        break;
      case SchedulerKind::one_cycle:
        sched += fmt::format(" lr {} .. {}, steps {} + {}", p.cycle_min_lr, p.cycle_max_lr, p.cycle_first_step_size, p.cycle_second_step_size);
        break;
      case SchedulerKind::lr_range_test:
        sched += fmt::format(" from {} step size {} rate {}", p.lr_range_test_min_lr, p.lr_range_test_step_size, p.lr_range_test_step_rate);
        break;
      default:
        sched += " (not provided by dstrain)";
        break;
    }
    line(sched);
  }
  line(gradient_clipping > 0 ? fmt::format("gradient clipping: max norm {}", gradient_clipping) : std::string("gradient clipping: off"));
  const std::optional<std::string> comm_dtype = gradient_communication_data_type();
  line(fmt::format("gradient reduction: {}{}{}{}", gradient_allreduce_op,
                   comm_dtype
                       ? fmt::format(" in {}{}", *comm_dtype, sequence_parallel_world_size > 1 ? " (seq_parallel_communication_data_type)" : "")
                       : "",
                   prescale_gradients ? ", prescaled by 1/world" : "",
                   gradient_predivide_factor != 1.0 ? fmt::format(", predivided by {}", gradient_predivide_factor) : ""));
  const auto& ac = activation_checkpointing;
  line(fmt::format("activation checkpointing: partition_activations {}, cpu_checkpointing {}", ac.partition_activations, ac.cpu_checkpointing));
  line(fmt::format("steps_per_print: {}", steps_per_print ? std::to_string(*steps_per_print) : "never"));
  std::vector<std::string> monitors;
  if (tensorboard.enabled) monitors.push_back("tensorboard");
  if (csv_monitor.enabled) monitors.push_back("csv_monitor");
  if (!monitors.empty()) line(fmt::format("monitors: {}", fmt::join(monitors, ", ")));
  if (!ignored_sections.empty()) {
    std::vector<std::string> keys;
    for (const auto& i : ignored_sections) keys.push_back(i.key + (i.active ? "" : " (disabled)"));
    line(fmt::format("ignored sections (not provided by dstrain): {}", fmt::join(keys, ", ")));
  }
  if (!resolved_autos.empty()) {
    line(fmt::format("\"auto\" values resolved ({}):", resolved_autos.size()));
    for (const auto& a : resolved_autos) line("  " + a);
  }
  if (!warnings.empty()) {
    line(fmt::format("warnings ({}):", warnings.size()));
    for (const auto& w : warnings) line(fmt::format("  {}: {}", w.path.empty() ? "<config>" : w.path, w.message));
  }
  return s;
}

}  // namespace dstrain::config
