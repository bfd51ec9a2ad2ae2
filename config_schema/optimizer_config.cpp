#include "config_schema/optimizer_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// DeepSpeed's own optimizer names, matched case-insensitively (docs/optimizers.md §1).
const std::vector<std::string> kDeepSpeedNames = {"adagrad",    "adam",   "adamw",   "lamb",  "onebitadam", "zerooneadam",
                                                  "onebitlamb", "muadam", "muadamw", "musgd", "lion",       "muon"};
// torch.optim classes: the fallback, matched case-sensitively.
const std::vector<std::string> kTorchOptimizers = {"Adadelta", "Adafactor", "Adagrad", "Adam",    "AdamW", "SparseAdam", "Adamax", "ASGD",
                                                   "LBFGS",    "NAdam",     "RAdam",   "RMSprop", "Rprop", "SGD",        "Muon"};

std::vector<std::string> params_for(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "torch_adam", "fp32_optimizer_states", "amsgrad"};
    case OptimizerKind::lamb:
      return {"lr", "betas", "eps", "weight_decay", "bias_correction", "max_coeff", "min_coeff", "eps_inside_sqrt", "amsgrad"};
    case OptimizerKind::sgd:
      return {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"};
    // deepspeed/runtime/fp16/onebit/{adam,zoadam,lamb}.py constructors (max_grad_norm is refused
    // for every type, above).
    case OptimizerKind::onebit_adam:
      return {"lr",      "freeze_step", "bias_correction",  "betas", "eps", "eps_inside_sqrt", "weight_decay",
              "amsgrad", "cuda_aware",  "comm_backend_name"};
    case OptimizerKind::zero_one_adam:
      return {"lr",
              "bias_correction",
              "betas",
              "eps",
              "eps_inside_sqrt",
              "weight_decay",
              "var_freeze_step",
              "var_update_scaler",
              "local_step_scaler",
              "local_step_clipper",
              "amsgrad",
              "cuda_aware",
              "comm_backend_name"};
    case OptimizerKind::onebit_lamb:
      return {"lr",           "freeze_step", "bias_correction", "betas",           "eps",        "eps_inside_sqrt",
              "weight_decay", "max_coeff",   "min_coeff",       "amsgrad",         "cuda_aware", "comm_backend_name",
              "coeff_beta",   "factor_max",  "factor_min",      "factor_threshold"};
    // torch.optim's constructor arguments (torch 2.x; foreach / fused / capturable / differentiable
    // choose torch's implementation, not the update) and FusedLion's.
    case OptimizerKind::adagrad:
      return {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "foreach", "maximize", "differentiable", "fused"};
    case OptimizerKind::lion:
      return {"lr", "betas", "weight_decay", "set_grad_none"};
    case OptimizerKind::rmsprop:
      return {"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable", "foreach", "maximize", "differentiable"};
    case OptimizerKind::adamax:
      return {"lr", "betas", "eps", "weight_decay", "foreach", "maximize", "differentiable", "capturable"};
    case OptimizerKind::nadam:
      return {"lr",      "betas",    "eps",        "weight_decay",  "momentum_decay", "decoupled_weight_decay",
              "foreach", "maximize", "capturable", "differentiable"};
    case OptimizerKind::radam:
      return {"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "foreach", "maximize", "capturable", "differentiable"};
    case OptimizerKind::adadelta:
      return {"lr", "rho", "eps", "weight_decay", "foreach", "capturable", "maximize", "differentiable"};
    case OptimizerKind::asgd:
      return {"lr", "lambd", "alpha", "t0", "weight_decay", "foreach", "maximize", "differentiable", "capturable"};
    case OptimizerKind::rprop:
      return {"lr", "etas", "step_sizes", "capturable", "foreach", "maximize", "differentiable"};
    default:
      return {};
  }
}

// The constructor defaults of a type where they differ from the params table's (Adam's).
Json type_defaults(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adagrad:
      return {{"lr", 1e-2}, {"eps", 1e-10}};
    case OptimizerKind::rmsprop:
      return {{"lr", 1e-2}};
    case OptimizerKind::adamax:
    case OptimizerKind::nadam:
      return {{"lr", 2e-3}};
    case OptimizerKind::adadelta:
      return {{"lr", 1.0}, {"eps", 1e-6}};
    case OptimizerKind::asgd:
      return {{"lr", 1e-2}, {"alpha", 0.75}};
    case OptimizerKind::rprop:
      return {{"lr", 1e-2}};
    default:
      return Json::object();
  }
}

// The type of a name DeepSpeed builds: its own names in any case, torch.optim's as spelt there.
OptimizerKind kind_of(const std::string& type) {
  const std::string low = lower(type);
  if (low == "adam") return OptimizerKind::adam;
  if (low == "adamw") return OptimizerKind::adamw;
  if (low == "lamb") return OptimizerKind::lamb;
  if (low == "adagrad") return OptimizerKind::adagrad;
  if (low == "lion") return OptimizerKind::lion;
  if (low == "onebitadam") return OptimizerKind::onebit_adam;
  if (low == "zerooneadam") return OptimizerKind::zero_one_adam;
  if (low == "onebitlamb") return OptimizerKind::onebit_lamb;
  if (low == "muon") return OptimizerKind::muon;
  if (type == "SGD") return OptimizerKind::sgd;
  if (type == "RMSprop") return OptimizerKind::rmsprop;
  if (type == "Adamax") return OptimizerKind::adamax;
  if (type == "NAdam") return OptimizerKind::nadam;
  if (type == "RAdam") return OptimizerKind::radam;
  if (type == "Adadelta") return OptimizerKind::adadelta;
  if (type == "ASGD") return OptimizerKind::asgd;
  if (type == "Rprop") return OptimizerKind::rprop;
  if (type == "Adafactor") return OptimizerKind::adafactor;
  return OptimizerKind::none;
}

std::pair<double, double> number_pair(const Json& v, const char* key, const char* example) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number())
    fail("optimizer.params.{} is {}: expected a list of two numbers, e.g. {}", key, show(v), example);
  return {v[0].get<double>(), v[1].get<double>()};
}

// Muon: deepspeed/runtime/engine.py (_configure_basic_optimizer) builds MuonWithAuxAdam from two
// param groups, copying only these keys of the params block into them; the constructor's defaults
// fill the rest (docs/optimizers.md §9).
const std::vector<std::string> kMuonGroupKeys = {"lr", "momentum", "weight_decay", "muon_lr", "ns_method"};
const std::vector<std::string> kAdamGroupKeys = {"lr", "betas", "eps", "weight_decay", "adam_lr"};

// torch.optim.Adafactor (torch 2.5+): its keyword arguments and constructor checks. `eps` is a pair
// (eps1 or null, eps2), unlike every other type's number, so it is read here rather than through
// the params table.
void parse_adafactor_params(const Json& raw, OptimizerConfig& c, Json& resolved) {
  const std::vector<std::string> valid = {"lr", "beta2_decay", "eps", "d", "weight_decay", "foreach", "maximize"};
  for (const auto& [key, v] : raw.items()) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    const std::string guess = closest_key(key, valid);
    fail(
        "optimizer.params.{}: {} does not take a parameter named \"{}\" (DeepSpeed fails with \"unexpected keyword argument\"){}; valid "
        "parameters: {}",
        key, c.type, key, guess.empty() ? "" : fmt::format("; did you mean \"{}\"?", guess), fmt::format("{}", fmt::join(valid, ", ")));
  }
  auto number = [&](const char* key, double fallback) {
    if (!raw.contains(key)) return fallback;
    const Json& v = raw[key];
    if (!v.is_number()) fail("optimizer.params.{} is {}: Adafactor expects a number", key, show(v));
    return v.get<double>();
  };
  auto flag = [&](const char* key) {
    if (!raw.contains(key) || raw[key].is_null()) return false;
    if (!raw[key].is_boolean()) fail("optimizer.params.{} is {}: expected true or false", key, show(raw[key]));
    return raw[key].get<bool>();
  };
  auto& p = c.params;
  p.lr = number("lr", 1e-2);
  p.beta2_decay = number("beta2_decay", -0.8);
  p.clip_threshold = number("d", 1.0);
  p.weight_decay = number("weight_decay", 0.0);
  p.maximize = flag("maximize");
  (void)flag("foreach");  // how torch computes the step, not what
  p.eps1.reset();
  p.eps2 = 1e-3;
  if (raw.contains("eps")) {
    const Json& e = raw["eps"];
    if (!e.is_array() || e.size() != 2 || !(e[0].is_null() || e[0].is_number()) || !e[1].is_number())
      fail("optimizer.params.eps is {}: Adafactor's eps is a pair (eps1, eps2) with eps1 a number or null, e.g. [null, 0.001]", show(e));
    if (e[0].is_number()) p.eps1 = e[0].get<double>();
    p.eps2 = e[1].get<double>();
  }
  // torch.optim.Adafactor's constructor checks, with its words.
  if (!(p.lr >= 0.0)) fail("optimizer.params.lr is {}: Learning rate should be >= 0 (torch.optim.Adafactor)", p.lr);
  if (!(p.beta2_decay <= 0.0)) fail("optimizer.params.beta2_decay is {}: beta2_decay should be <= 0 (torch.optim.Adafactor)", p.beta2_decay);
  if (p.eps1 && !(*p.eps1 >= 0.0)) fail("optimizer.params.eps is {}: epsilon1 should be >= 0 (torch.optim.Adafactor)", show(raw["eps"]));
  if (!(p.eps2 >= 0.0)) fail("optimizer.params.eps is {}: epsilon2 should be >= 0 (torch.optim.Adafactor)", show(raw["eps"]));
  if (!(p.clip_threshold >= 1.0)) fail("optimizer.params.d is {}: Clipping threshold d should be >= 1 (torch.optim.Adafactor)", p.clip_threshold);
  if (!(p.weight_decay >= 0.0)) fail("optimizer.params.weight_decay is {}: weight_decay should be >= 0 (torch.optim.Adafactor)", p.weight_decay);
  resolved["params"] = Json{{"lr", p.lr},
                            {"beta2_decay", p.beta2_decay},
                            {"eps", Json::array({p.eps1 ? Json(*p.eps1) : Json(nullptr), p.eps2})},
                            {"d", p.clip_threshold},
                            {"weight_decay", p.weight_decay},
                            {"maximize", p.maximize}};
}

void parse_muon_params(const Json& raw, OptimizerConfig& c, ParseContext& ctx, Json& resolved) {
  for (const auto& [key, v] : raw.items()) {
    if (std::find(kMuonGroupKeys.begin(), kMuonGroupKeys.end(), key) != kMuonGroupKeys.end() ||
        std::find(kAdamGroupKeys.begin(), kAdamGroupKeys.end(), key) != kAdamGroupKeys.end())
      continue;
    const std::string guess = closest_key(key, {"lr", "momentum", "weight_decay", "muon_lr", "ns_method", "betas", "eps", "adam_lr"});
    ctx.warn(fmt::format("optimizer.params.{}", key),
             fmt::format("{} is ignored: DeepSpeed's engine gives MuonWithAuxAdam only lr, momentum, weight_decay, muon_lr, ns_method "
                         "(the Muon matrices) and lr, betas, eps, weight_decay, adam_lr (the Adam parameters){}",
                         key, guess.empty() ? "" : fmt::format("; did you mean \"{}\"?", guess)));
  }
  auto number = [&](const char* key, double fallback) {
    if (!raw.contains(key)) return fallback;
    const Json& v = raw[key];
    if (!v.is_number()) fail("optimizer.params.{} is {}: Muon expects a number, e.g. {}", key, show(v), fallback);
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail("optimizer.params.{} is {}: expected a finite number", key, show(v));
    return x;
  };
  auto& p = c.params;
  // "muon_lr will override lr", "adam_lr will override lr" (engine.py); else MuonWithAuxAdam's defaults.
  const double lr = number("lr", -1.0);
  p.lr = number("muon_lr", raw.contains("lr") ? lr : 0.02);
  p.adam_lr = number("adam_lr", raw.contains("lr") ? lr : 3e-4);
  for (const auto& [key, v] : {std::pair{"muon_lr", p.lr}, std::pair{"adam_lr", p.adam_lr}})
    if (v < 0.0) fail("optimizer.params.{}: the {} lr is {}; give an lr >= 0", raw.contains(key) ? key : "lr", key, v);
  p.momentum = number("momentum", 0.95);
  p.weight_decay = number("weight_decay", 0.0);
  p.eps = number("eps", 1e-10);
  p.betas = raw.contains("betas") ? number_pair(raw["betas"], "betas", "[0.9, 0.95]") : std::pair{0.9, 0.95};
  for (double b : {p.betas.first, p.betas.second})
    if (b < 0.0 || b >= 1.0)
      fail("optimizer.params.betas is {}: each beta must be in [0, 1) (the Adam bias correction divides by 1 - beta^t)", show(raw["betas"]));
  if (raw.contains("ns_method")) {
    const Json& v = raw["ns_method"];
    if (!v.is_string() || (v.get<std::string>() != "gram" && v.get<std::string>() != "standard"))
      fail("optimizer.params.ns_method is {}: ns_method must be one of {{'standard', 'gram'}} (MuonWithAuxAdam asserts this)", show(v));
    p.ns_method = v.get<std::string>();
  }
  resolved["params"] = Json{{"muon_lr", p.lr},
                            {"adam_lr", p.adam_lr},
                            {"momentum", p.momentum},
                            {"weight_decay", p.weight_decay},
                            {"ns_method", p.ns_method},
                            {"betas", Json::array({p.betas.first, p.betas.second})},
                            {"eps", p.eps}};
}

}  // namespace

std::optional<std::string> deepspeed_failure_reason(const OptimizerConfig& c) {
  if (c.kind != OptimizerKind::unsupported) return std::nullopt;
  const std::string& t = c.type;
  if (t == "SparseAdam")
    return fmt::format(
        "optimizer.type \"{}\": DeepSpeed builds torch.optim.SparseAdam, which takes only sparse gradients "
        "(nn.Embedding(sparse=True)); every gradient of a dstrain model is dense, so DeepSpeed's first step would raise "
        "\"SparseAdam does not support dense gradients, please consider Adam instead\"; use \"Adam\" or \"AdamW\"",
        t);
  if (t == "LBFGS")
    return fmt::format(
        "optimizer.type \"{}\": DeepSpeed builds torch.optim.LBFGS, whose step(closure) re-evaluates the model through the "
        "closure; DeepSpeed's engine calls optimizer.step() without one, so its first step would raise \"TypeError: step() "
        "missing 1 required positional argument: 'closure'\"; use a first-order optimizer (\"AdamW\", \"SGD\", \"Lion\", ...)",
        t);
  const std::string low = lower(t);
  if (low == "muadam" || low == "muadamw" || low == "musgd") {
    const char* plain = low == "muadam" ? "Adam" : low == "muadamw" ? "AdamW" : "SGD";
    return fmt::format(
        "optimizer.type \"{}\": DeepSpeed builds mup's {} (μP learning-rate scaling), which asserts that every parameter has "
        "μP base shapes (\"A parameter with shape ... does not have `infshape` attribute. Did you forget to call "
        "`mup.set_base_shapes` on the model?\"), so deepspeed.initialize fails unless the program called "
        "mup.set_base_shapes on a μP-parametrised model; dstrain's models have no μP base shapes; use \"{}\" (what {} "
        "becomes at the base width)",
        t, t, plain, t);
  }
  return std::nullopt;
}

SectionSpec optimizer_section_spec() {
  return make_section("optimizer", Regime::dict_lookup, "The optimizer built from the config.",
                      {
                          string_field("type", nullptr,
                                       "Adam, AdamW, Lamb, Adagrad, Lion, Muon, OneBitAdam, ZeroOneAdam, OneBitLamb (any case), SGD, RMSprop, "
                                       "Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop, Adafactor (as torch.optim); SparseAdam, LBFGS, MuAdam, MuAdamW, "
                                       "MuSGD are recognised and refused with DeepSpeed's reason."),
                          object_field("params", "Constructor arguments of the optimizer."),
                          bool_field("legacy_fusion", false, "Legacy fused fp16 optimizer path."),
                      });
}

SectionSpec optimizer_params_section_spec() {
  return make_section("optimizer.params", Regime::dict_lookup, "Optimizer constructor arguments; which ones are valid depends on optimizer.type.",
                      {
                          number_field("lr", 1e-3, "Learning rate (every type; defaults per type, docs/optimizers.md).").min(0),
                          array_field("betas", Json::array({0.9, 0.999}), "Adam/Lamb coefficients [beta1, beta2], each in [0, 1)."),
                          number_field("eps", 1e-8, "Denominator epsilon (Adam, AdamW, Lamb).").min(0),
                          number_field("weight_decay", 0.0, "Weight decay (decoupled for AdamW and Adam with adam_w_mode).").min(0),
                          bool_field("bias_correction", true, "Adam/Lamb bias correction."),
                          bool_field("adam_w_mode", true, "Adam/AdamW: decoupled weight decay (\"Adam\" is AdamW unless false)."),
                          bool_field("torch_adam", false, "Adam/AdamW: use torch's implementation instead of the fused one."),
                          bool_field("fp32_optimizer_states", true, "Adam/AdamW with CPU offload: keep optimizer states in fp32."),
                          bool_field("amsgrad", false, "Not supported by FusedAdam/FusedLamb; must be false."),
                          number_field("max_coeff", 10.0, "Lamb: upper clamp of the trust ratio."),
                          number_field("min_coeff", 0.01, "Lamb: lower clamp of the trust ratio."),
                          bool_field("eps_inside_sqrt", false, "Lamb: add eps inside the square root."),
                          number_field("momentum", 0.0, "SGD momentum.").min(0),
                          number_field("dampening", 0.0, "SGD dampening."),
                          bool_field("nesterov", false, "SGD Nesterov momentum (needs momentum > 0 and dampening 0)."),
                          bool_field("maximize", false, "SGD and torch's types: maximise the objective."),
                          number_field("lr_decay", 0.0, "Adagrad: lr / (1 + (t - 1) lr_decay).").min(0),
                          number_field("initial_accumulator_value", 0.0, "Adagrad: the sum of squares starts here.").min(0),
                          number_field("alpha", 0.99, "RMSprop smoothing constant (ASGD: the eta power, default 0.75).").min(0),
                          bool_field("centered", false, "RMSprop: normalise by the variance estimate."),
                          number_field("momentum_decay", 4e-3, "NAdam momentum decay psi.").min(0),
                          bool_field("decoupled_weight_decay", false, "NAdam / RAdam: decoupled (AdamW-style) weight decay."),
                          number_field("rho", 0.9, "Adadelta: running average coefficient.").min(0).max(1),
                          number_field("lambd", 1e-4, "ASGD decay term."),
                          number_field("t0", 1e6, "ASGD: the step averaging starts at."),
                          array_field("etas", Json::array({0.5, 1.2}), "Rprop (etaminus, etaplus), 0 < etaminus < 1 < etaplus."),
                          array_field("step_sizes", Json::array({1e-6, 50}), "Rprop (min, max) step size."),
                          bool_field("foreach", false, "torch: implementation choice (no effect on the update)."),
                          bool_field("fused", false, "torch: implementation choice (no effect on the update)."),
                          bool_field("capturable", false, "torch: implementation choice (no effect on the update)."),
                          bool_field("differentiable", false, "torch: autograd through the step (no effect on the update)."),
                          bool_field("set_grad_none", true, "Lion: zero_grad sets gradients to None (no effect on the update)."),
                          number_field("freeze_step", 100000, "OneBitAdam/OneBitLamb: full-precision warm-up steps before compression.").min(0),
                          string_field("comm_backend_name", "nccl",
                                       "1-bit optimizers: nccl, mpi, hccl or compressed (dstrain: the engine's communicator)."),
                          bool_field("cuda_aware", false, "1-bit optimizers with MPI: CUDA-aware MPI."),
                          number_field("var_freeze_step", 100000, "ZeroOneAdam: steps before the variance freezes.").min(0),
                          number_field("var_update_scaler", 16, "ZeroOneAdam: variance updates per doubling of their interval.").min(1),
                          number_field("local_step_scaler", 32678, "ZeroOneAdam: local steps per doubling of their interval.").min(1),
                          number_field("local_step_clipper", 16, "ZeroOneAdam: the largest local-step interval.").min(1),
                          number_field("coeff_beta", 0.9, "OneBitLamb: EMA coefficient of the warm-up trust ratios."),
                          number_field("factor_max", 4.0, "OneBitLamb: upper clamp of the frozen ratio's factor."),
                          number_field("factor_min", 0.5, "OneBitLamb: lower clamp of the frozen ratio's factor."),
                          number_field("factor_threshold", 0.1, "OneBitLamb: the factor's largest relative change per step."),
                      });
}

OptimizerConfig parse_optimizer_config(const Json* value, ParseContext& ctx, Json& resolved) {
  OptimizerConfig c;
  if (value == nullptr || value->is_null()) {
    resolved = nullptr;
    return c;
  }
  Json head = read_section(*value, optimizer_section_spec(), ctx);
  if (head["type"].is_null())
    fail(
        "optimizer.type is missing: name the optimizer, e.g. \"type\": \"AdamW\" (dstrain provides Adam, AdamW, "
        "Lamb and SGD)");
  c.type = head["type"].get<std::string>();
  c.legacy_fusion = head["legacy_fusion"].get<bool>();
  const std::string low = lower(c.type);
  c.kind = kind_of(c.type);
  if (c.kind == OptimizerKind::none) {
    if (std::find(kDeepSpeedNames.begin(), kDeepSpeedNames.end(), low) != kDeepSpeedNames.end() ||
        std::find(kTorchOptimizers.begin(), kTorchOptimizers.end(), c.type) != kTorchOptimizers.end()) {
      c.kind = OptimizerKind::unsupported;
    } else {
      std::vector<std::string> names = {"Adam",  "AdamW", "Lamb",     "Muon", "SGD",   "Adagrad",   "Lion",       "RMSprop",     "Adamax",
                                        "NAdam", "RAdam", "Adadelta", "ASGD", "Rprop", "Adafactor", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
      const std::string guess = closest_key(c.type, names);
      fail(
          "optimizer.type is \"{}\": {} is not a supported DeepSpeed Optimizer{}; dstrain provides Adam, AdamW, Lamb, "
          "Adagrad, Lion, Muon, OneBitAdam, ZeroOneAdam, OneBitLamb (any case) and SGD, RMSprop, Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop, "
          "Adafactor (case-sensitive, as torch.optim)",
          c.type, c.type, guess.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", guess));
    }
  }

  const Json& raw = head["params"].is_null() ? Json::object() : head["params"];
  c.raw_params = raw;
  resolved = Json{{"type", c.type}, {"params", Json::object()}, {"legacy_fusion", c.legacy_fusion}};

  // DeepSpeed refuses max_grad_norm for every optimizer type: clipping is the engine's job.
  if (raw.contains("max_grad_norm"))
    fail(
        "optimizer.params.max_grad_norm is {}: 'max_grad_norm' is not supported as an optimizer parameter, please "
        "switch to using the deepspeed parameter 'gradient_clipping' (top level, e.g. \"gradient_clipping\": {})",
        show(raw["max_grad_norm"]), show(raw["max_grad_norm"]));

  if (c.kind == OptimizerKind::unsupported) {
    if (const auto reason = deepspeed_failure_reason(c))
      ctx.warn("optimizer.type", fmt::format("DeepSpeed could not train with it either, and the engine refuses it: {}", *reason));
    else
      ctx.warn("optimizer.type",
               fmt::format("dstrain does not provide the {} optimizer (DeepSpeed would build it); the optimizer section is kept as given "
                           "and the engine refuses it. Use Adam, AdamW, Lamb, Muon or SGD",
                           c.type));
    resolved["params"] = raw;
    return c;
  }

  if (c.kind == OptimizerKind::muon) {
    parse_muon_params(raw, c, ctx, resolved);
    return c;
  }
  if (c.kind == OptimizerKind::adafactor) {
    parse_adafactor_params(raw, c, resolved);
    return c;
  }

  // Only the parameters the chosen constructor takes are valid; anything else is a TypeError in
  // DeepSpeed ("unexpected keyword argument").
  const std::vector<std::string> valid = params_for(c.kind);
  for (const auto& [key, v] : raw.items()) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    const std::string guess = closest_key(key, valid);
    fail(
        "optimizer.params.{}: {} does not take a parameter named \"{}\" (DeepSpeed fails with \"unexpected keyword "
        "argument\"){}; valid parameters: {}",
        key, c.type, key, guess.empty() ? "" : fmt::format("; did you mean \"{}\"?", guess), fmt::format("{}", fmt::join(valid, ", ")));
  }
  SectionSpec spec = optimizer_params_section_spec();
  Json all = read_section(raw, spec, ctx);
  const Json defaults = type_defaults(c.kind);
  for (const auto& [key, v] : defaults.items())
    if (!raw.contains(key)) all[key] = v;
  Json out = Json::object();
  for (const auto& k : valid) out[k] = all[k];

  auto& p = c.params;
  p.lr = all["lr"].get<double>();
  p.weight_decay = all["weight_decay"].get<double>();
  const Json& betas = all["betas"];
  if (betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number())
    fail("optimizer.params.betas is {}: expected a list of two numbers [beta1, beta2], e.g. [0.9, 0.999]", show(betas));
  p.betas = {betas[0].get<double>(), betas[1].get<double>()};
  for (double b : {p.betas.first, p.betas.second})
    if (b < 0.0 || b >= 1.0) fail("optimizer.params.betas is {}: each beta must be in [0, 1)", show(betas));
  p.eps = all["eps"].get<double>();
  p.bias_correction = all["bias_correction"].get<bool>();
  p.adam_w_mode = all["adam_w_mode"].get<bool>();
  p.torch_adam = all["torch_adam"].get<bool>();
  p.fp32_optimizer_states = all["fp32_optimizer_states"].get<bool>();
  p.amsgrad = all["amsgrad"].get<bool>();
  p.max_coeff = all["max_coeff"].get<double>();
  p.min_coeff = all["min_coeff"].get<double>();
  p.eps_inside_sqrt = all["eps_inside_sqrt"].get<bool>();
  p.momentum = all["momentum"].get<double>();
  p.dampening = all["dampening"].get<double>();
  p.nesterov = all["nesterov"].get<bool>();
  p.maximize = all["maximize"].get<bool>();
  auto& ob = c.onebit;
  auto integer = [&](const char* key) {
    const double v = all[key].get<double>();
    if (v != std::floor(v)) fail("optimizer.params.{} is {}: expected a whole number of steps", key, show(all[key]));
    return static_cast<std::int64_t>(v);
  };
  ob.freeze_step = integer("freeze_step");
  ob.comm_backend_name = all["comm_backend_name"].get<std::string>();
  ob.cuda_aware = all["cuda_aware"].get<bool>();
  ob.var_freeze_step = integer("var_freeze_step");
  ob.var_update_scaler = integer("var_update_scaler");
  ob.local_step_scaler = integer("local_step_scaler");
  ob.local_step_clipper = integer("local_step_clipper");
  ob.coeff_beta = all["coeff_beta"].get<double>();
  ob.factor_max = all["factor_max"].get<double>();
  ob.factor_min = all["factor_min"].get<double>();
  ob.factor_threshold = all["factor_threshold"].get<double>();
  if (c.is_onebit()) {
    // DeepSpeed builds its backend from this name and has none for any other (the optimizer then
    // fails on comm_backend_handle.size).
    const std::string& b = ob.comm_backend_name;
    if (b != "nccl" && b != "mpi" && b != "hccl" && b != "compressed")
      fail(
          "optimizer.params.comm_backend_name is \"{}\": {} communicates through \"nccl\", \"mpi\", \"hccl\" or \"compressed\" "
          "(DeepSpeed has no other backend for it); dstrain runs any of them on the engine's communicator",
          b, c.type);
  }
  p.lr_decay = all["lr_decay"].get<double>();
  p.initial_accumulator_value = all["initial_accumulator_value"].get<double>();
  p.alpha = all["alpha"].get<double>();
  p.centered = all["centered"].get<bool>();
  p.momentum_decay = all["momentum_decay"].get<double>();
  p.decoupled_weight_decay = all["decoupled_weight_decay"].get<bool>();
  p.rho = all["rho"].get<double>();
  p.lambd = all["lambd"].get<double>();
  p.t0 = all["t0"].get<double>();
  p.etas = number_pair(all["etas"], "etas", "[0.5, 1.2]");
  p.step_sizes = number_pair(all["step_sizes"], "step_sizes", "[1e-06, 50]");
  if (c.kind == OptimizerKind::rprop && !(0.0 < p.etas.first && p.etas.first < 1.0 && 1.0 < p.etas.second))
    fail("optimizer.params.etas is {}: Rprop needs 0 < etaminus < 1 < etaplus (torch: \"Invalid eta values\")", show(all["etas"]));

  if (p.amsgrad)
    fail("optimizer.params.amsgrad is true: DeepSpeed's {} does not support the AMSGrad variant; remove it", c.is_onebit() ? c.type
                                                                                                             : c.kind == OptimizerKind::lamb
                                                                                                                 ? "fused Lamb"
                                                                                                                 : "fused Adam");
  if (c.kind == OptimizerKind::sgd && p.nesterov && (p.momentum <= 0.0 || p.dampening != 0.0))
    fail(
        "optimizer.params.nesterov is true with momentum {} and dampening {}: Nesterov momentum requires a momentum "
        "and zero dampening",
        p.momentum, p.dampening);
  if (c.kind == OptimizerKind::adam && !p.adam_w_mode && p.weight_decay > 0.0)
    ctx.warn("optimizer.params.adam_w_mode", "adam_w_mode is false: weight decay is added to the gradient (classic L2 Adam), not decoupled");
  if (c.kind == OptimizerKind::adamw && !p.adam_w_mode)
    ctx.warn("optimizer.params.adam_w_mode", "type AdamW with adam_w_mode false: DeepSpeed still uses decoupled weight decay (type AdamW wins)");
  resolved["params"] = out;
  return c;
}

Json default_optimizer_block(const AutoValues& autos) {
  const double lr = autos.lr.value_or(5e-5), eps = autos.eps.value_or(1e-8), wd = autos.weight_decay.value_or(0.0);
  const std::pair<double, double> betas = autos.betas.value_or(std::pair{0.9, 0.999});
  // torch.optim.AdamW's constructor checks, named by the flag that gave the value.
  if (!(lr >= 0.0)) fail("--lr {}: the default AdamW (the config has no \"optimizer\" block) needs lr >= 0", lr);
  if (!(eps >= 0.0)) fail("--adam-eps {}: the default AdamW (the config has no \"optimizer\" block) needs eps >= 0", eps);
  if (!(wd >= 0.0)) fail("--weight-decay {}: the default AdamW (the config has no \"optimizer\" block) needs weight_decay >= 0", wd);
  for (double b : {betas.first, betas.second})
    if (!(b >= 0.0 && b < 1.0))
      fail("--adam-beta1 / --adam-beta2 ({}, {}): the default AdamW (the config has no \"optimizer\" block) needs each beta in [0, 1)", betas.first,
           betas.second);
  return Json{{"type", "AdamW"}, {"params", {{"lr", lr}, {"betas", Json::array({betas.first, betas.second})}, {"eps", eps}, {"weight_decay", wd}}}};
}

}  // namespace dstrain::config
