#include "config_schema/precision_config.h"

#include <cmath>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {
const std::vector<std::string> kDtypes = {"fp32", "fp16", "bf16"};

const Json& or_empty(const Json* v) {
  static const Json empty = Json::object();
  return v == nullptr ? empty : *v;
}

std::optional<std::string> opt_string(const Json& v) {
  if (v.is_null()) return std::nullopt;
  return v.get<std::string>();
}
}  // namespace

SectionSpec fp16_section_spec() {
  return make_section("fp16", Regime::validated, "fp16 mixed precision with dynamic loss scaling.",
                      {
                          bool_field("enabled", false, "fp16 weights and activations, fp32 master weights."),
                          bool_field("auto_cast", false, "Cast floating-point inputs of forward to fp16."),
                          number_field("loss_scale", 0.0, "0 = dynamic loss scaling; > 0 = static scale (finite, >= 0).").min(0),
                          int_field("initial_scale_power", 16, "Initial dynamic scale is 2^initial_scale_power."),
                          int_field("loss_scale_window", 1000, "Clean steps before the dynamic scale doubles (> 0 when dynamic)."),
                          int_field("hysteresis", 2, "Overflows tolerated before the scale halves (ZeRO only)."),
                          bool_field("consecutive_hysteresis", false, "Refill hysteresis after every clean step."),
                          int_field("min_loss_scale", 1, "Floor of the dynamic scale; an integer > 0 when dynamic."),
                          bool_field("fp16_master_weights_and_grads", false, "fp16 master weights and gradients; needs ZeRO 1-3."),
                      });
}

SectionSpec bf16_section_spec(const std::string& key) {
  return make_section(key, Regime::validated,
                      key == "bf16" ? "bf16 mixed precision (no loss scaling)."
                                    : "Legacy spelling of bf16; used only when bf16 is absent or null (never merged).",
                      {
                          bool_field("enabled", false, "bf16 weights and activations."),
                          bool_field("immediate_grad_update", false, "Accumulate into the fp32 gradient buffer in the backward hook."),
                          bool_field("check_grad_overflow", true, "Skip steps with inf/NaN gradients (ZeRO 1/2; default true since v0.19.3)."),
                          bool_field("bf16_master_weights_and_grads", false, "bf16 master weights; needs ZeRO 1-3."),
                          bool_field("bf16_optimizer_states", false, "bf16 optimizer moments; needs bf16_master_weights_and_grads."),
                      });
}

SectionSpec amp_section_spec() {
  return make_section("amp", Regime::dict_lookup, "NVIDIA Apex AMP; not provided by dstrain.",
                      {bool_field("enabled", false, "Enable Apex AMP (other keys go to apex.amp.initialize).")});
}

SectionSpec torch_autocast_section_spec() {
  return make_section("torch_autocast", Regime::dict_lookup, "torch.autocast around forward; not provided by dstrain.",
                      {
                          bool_field("enabled", false, "Enable torch.autocast."),
                          string_field("dtype", nullptr, "Autocast dtype; null = torch's default (float16 on CUDA).")
                              .one_of({"float16", "fp16", "half", "bfloat16", "bf16", "float32", "fp32", "float"}),
                          array_field("lower_precision_safe_modules", nullptr,
                                      "Module classes (package.Class) run in lower precision; null = Linear and Conv."),
                      });
}

SectionSpec data_types_section_spec() {
  return make_section("data_types", Regime::dict_lookup, "Data types of gradient accumulation, parameters, buffers.",
                      {
                          string_field("grad_accum_dtype", nullptr, "Gradient accumulation dtype; null = model dtype.").one_of(kDtypes),
                          string_field("param_dtype", nullptr, "Must match the enabled fp16/bf16 mode.").one_of(kDtypes),
                          string_field("buffer_dtype", nullptr, "Buffer dtype.").one_of(kDtypes),
                      });
}

Fp16Config parse_fp16_config(const Json* value, ParseContext& ctx, Json& resolved) {
  if (value != nullptr && value->is_null()) {
    resolved = read_section(Json::object(), fp16_section_spec(), ctx);
  } else {
    const Json& obj = or_empty(value);
    // loss_scale must be a real number: DeepSpeed (v0.18.8+) rejects booleans, which pydantic would
    // otherwise turn into 1.0 / 0.0.
    if (obj.is_object() && obj.contains("loss_scale") && obj["loss_scale"].is_boolean())
      fail("fp16.loss_scale is {}: the loss scale must be a finite number >= 0, not a boolean (0 = dynamic scaling)", show(obj["loss_scale"]));
    resolved = read_section(obj, fp16_section_spec(), ctx);
  }
  Fp16Config c;
  c.enabled = resolved["enabled"].get<bool>();
  c.auto_cast = resolved["auto_cast"].get<bool>();
  c.loss_scale = resolved["loss_scale"].get<double>();
  c.initial_scale_power = resolved["initial_scale_power"].get<std::int64_t>();
  c.loss_scale_window = resolved["loss_scale_window"].get<std::int64_t>();
  c.hysteresis = resolved["hysteresis"].get<std::int64_t>();
  c.consecutive_hysteresis = resolved["consecutive_hysteresis"].get<bool>();
  c.min_loss_scale = resolved["min_loss_scale"].get<std::int64_t>();
  c.fp16_master_weights_and_grads = resolved["fp16_master_weights_and_grads"].get<bool>();

  if (!std::isfinite(c.loss_scale)) fail("fp16.loss_scale is {}: the loss scale must be a finite number >= 0 (0 = dynamic scaling)", c.loss_scale);
  if (c.dynamic()) {
    // v0.19.3 rules: only meaningful for dynamic scaling.
    if (c.loss_scale_window <= 0)
      fail(
          "fp16.loss_scale_window is {}: with dynamic loss scaling (loss_scale 0) it must be a positive integer "
          "(default 1000)",
          c.loss_scale_window);
    if (c.min_loss_scale <= 0)
      fail(
          "fp16.min_loss_scale is {}: with dynamic loss scaling (loss_scale 0) it must be a positive integer "
          "(default 1)",
          c.min_loss_scale);
    if (c.hysteresis <= 0 && c.enabled)
      ctx.warn("fp16.hysteresis", fmt::format("fp16.hysteresis is {}: DeepSpeed accepts it, but with hysteresis <= 0 the ZeRO loss scaler "
                                              "never reduces the scale (overflowing steps are still skipped)",
                                              c.hysteresis));
  }
  return c;
}

Bf16Config parse_bf16_config(const Json& root, ParseContext& ctx, Json& resolved) {
  std::string key = "bf16";
  const Json* value = nullptr;
  if (root.contains("bf16") && !root["bf16"].is_null()) {
    value = &root["bf16"];
    if (root.contains("bfloat16"))
      ctx.warn("bfloat16",
               "both bf16 and the legacy bfloat16 are given; DeepSpeed uses bf16 and ignores bfloat16 entirely (the "
               "two are never merged), and so does dstrain. Remove bfloat16");
  } else if (root.contains("bfloat16") && !root["bfloat16"].is_null()) {
    key = "bfloat16";
    value = &root["bfloat16"];
  }
  resolved = read_section(or_empty(value), bf16_section_spec(key), ctx);
  Bf16Config c;
  c.source_key = key;
  c.enabled = resolved["enabled"].get<bool>();
  c.immediate_grad_update = resolved["immediate_grad_update"].get<bool>();
  c.check_grad_overflow = resolved["check_grad_overflow"].get<bool>();
  c.bf16_master_weights_and_grads = resolved["bf16_master_weights_and_grads"].get<bool>();
  c.bf16_optimizer_states = resolved["bf16_optimizer_states"].get<bool>();
  return c;
}

AmpConfig parse_amp_config(const Json* value, ParseContext& ctx, Json& resolved) {
  AmpConfig c;
  if (value == nullptr || value->is_null()) {
    resolved = Json{{"enabled", false}};
    return c;
  }
  if (!value->is_object()) fail("amp must be an object such as {{\"enabled\": false}}, got {}", show(*value));
  // Every key except enabled is forwarded to apex.amp.initialize, so none of them is "unknown".
  Json rest = *value;
  Json en = Json::object();
  if (rest.contains("enabled")) {
    en["enabled"] = rest["enabled"];
    rest.erase("enabled");
  }
  resolved = read_section(en, amp_section_spec(), ctx);
  c.enabled = resolved["enabled"].get<bool>();
  c.params = rest;
  for (const auto& [k, v] : rest.items()) resolved[k] = v;
  if (c.enabled)
    ctx.warn("amp",
             "dstrain does not provide NVIDIA Apex AMP; the `amp` section is ignored. Use \"fp16\": "
             "{\"enabled\": true} or \"bf16\": {\"enabled\": true} instead");
  return c;
}

TorchAutocastConfig parse_torch_autocast_config(const Json* value, ParseContext& ctx, Json& resolved) {
  TorchAutocastConfig c;
  resolved = read_section(value == nullptr || value->is_null() ? Json::object() : *value, torch_autocast_section_spec(), ctx);
  c.enabled = resolved["enabled"].get<bool>();
  if (!resolved["dtype"].is_null()) {
    const std::string d = resolved["dtype"].get<std::string>();
    c.dtype = (d == "fp16" || d == "half" || d == "float16") ? "float16" : (d == "bf16" || d == "bfloat16") ? "bfloat16" : "float32";
  }
  if (!resolved["lower_precision_safe_modules"].is_null()) {
    for (const auto& m : resolved["lower_precision_safe_modules"]) {
      if (!m.is_string())
        fail(
            "torch_autocast.lower_precision_safe_modules contains {}: every entry must be a string naming a module "
            "class as package.Class",
            show(m));
      c.lower_precision_safe_modules.push_back(m.get<std::string>());
    }
  }
  if (c.enabled)
    ctx.warn("torch_autocast",
             "dstrain does not provide torch.autocast; the `torch_autocast` section is ignored. "
             "Use the fp16 or bf16 section for mixed precision");
  return c;
}

DataTypesConfig parse_data_types_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(value == nullptr || value->is_null() ? Json::object() : *value, data_types_section_spec(), ctx);
  DataTypesConfig c;
  c.grad_accum_dtype = opt_string(resolved["grad_accum_dtype"]);
  c.param_dtype = opt_string(resolved["param_dtype"]);
  c.buffer_dtype = opt_string(resolved["buffer_dtype"]);
  return c;
}

void check_precision(const Fp16Config& fp16, Bf16Config& bf16, const AmpConfig& amp, const DataTypesConfig& data_types, int zero_stage,
                     ParseContext& ctx) {
  if (fp16.enabled && bf16.enabled)
    fail(
        "fp16.enabled and {}.enabled are both true: bfloat16 and fp16 modes cannot be simultaneously enabled; "
        "set one of them to false",
        bf16.source_key);
  if (amp.enabled && zero_stage > 0)
    fail(
        "amp.enabled is true with zero_optimization.stage {}: Amp and ZeRO are not currently compatible; "
        "remove the amp section and use fp16 or bf16",
        zero_stage);
  if (amp.enabled && (fp16.enabled || bf16.enabled))
    fail(
        "amp.enabled is true together with {}.enabled: DeepSpeed raises NotImplementedError for this mix; enable "
        "only one of them",
        fp16.enabled ? "fp16" : bf16.source_key);
  if (fp16.fp16_master_weights_and_grads && fp16.enabled && zero_stage == 0)
    fail("fp16.fp16_master_weights_and_grads is true but ZeRO is off: it requires zero_optimization.stage 1, 2 or 3");
  if (bf16.bf16_optimizer_states && !bf16.bf16_master_weights_and_grads)
    fail(
        "{}.bf16_optimizer_states is true but {}.bf16_master_weights_and_grads is false: bf16 optimizer states "
        "need bf16 master weights; set bf16_master_weights_and_grads to true or bf16_optimizer_states to false",
        bf16.source_key, bf16.source_key);
  // The ZeRO optimizers own the master weights; without ZeRO these options have nothing to act on
  // (DeepSpeed raises no error here, so this is a warning, not an error; docs/precision.md §1).
  if (bf16.enabled && zero_stage == 0 && (bf16.bf16_master_weights_and_grads || bf16.bf16_optimizer_states)) {
    ctx.warn(bf16.source_key + ".bf16_master_weights_and_grads",
             "bf16_master_weights_and_grads / bf16_optimizer_states need ZeRO stage 1, 2 or 3; with ZeRO off they "
             "are ignored (fp32 master weights are used). Set zero_optimization.stage to use them");
    bf16.bf16_master_weights_and_grads = false;
    bf16.bf16_optimizer_states = false;
  }

  const std::string model_dtype = fp16.enabled ? "fp16" : bf16.enabled ? "bf16" : "fp32";
  if (data_types.param_dtype && *data_types.param_dtype != model_dtype)
    fail(
        "data_types.param_dtype is \"{}\" but the model dtype is {} (from the fp16/bf16 sections); they must "
        "match",
        *data_types.param_dtype, model_dtype);
  if (zero_stage == 0 && data_types.grad_accum_dtype && *data_types.grad_accum_dtype != model_dtype)
    fail(
        "data_types.grad_accum_dtype is \"{}\" with model dtype {} and ZeRO off: DeepSpeed raises "
        "NotImplementedError (unsupported mix of model dtype and gradient accumulation dtype); remove "
        "grad_accum_dtype or use ZeRO stage 1-3",
        *data_types.grad_accum_dtype, model_dtype);
}

}  // namespace dstrain::config
