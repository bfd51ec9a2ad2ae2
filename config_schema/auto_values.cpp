#include "config_schema/auto_values.h"

#include <cmath>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {

bool is_auto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// The options that fill "auto", named as the CLI flag (`check-config` and `train` share them;
// AutoValues has a member of the same meaning for a program that embeds the engine).
constexpr const char* kMicro = "--micro-batch-size";
constexpr const char* kGas = "--gradient-accumulation-steps";
constexpr const char* kHidden = "--hidden-size (the model's hidden size; train takes it from the model)";
constexpr const char* kClip = "--gradient-clipping";
constexpr const char* kLr = "--lr";
constexpr const char* kEps = "--adam-eps";
constexpr const char* kWd = "--weight-decay";
constexpr const char* kBetas = "--adam-betas";
constexpr const char* kTotal = "--steps";
constexpr const char* kWarmup = "--warmup-steps";
constexpr const char* kPrecision = "--precision fp32|fp16|bf16";

class Resolver {
 public:
  Resolver(std::vector<std::string>& log, std::vector<Warning>* mismatches) : log_(log), mismatches_(mismatches) {}

  // Resolves object[key] if it is "auto"; otherwise reports a value that differs from the option.
  template <typename T>
  void fill(Json& object, const std::string& path, const std::string& key, const std::optional<T>& value, const char* source) {
    if (!object.is_object() || !object.contains(key)) return;
    if (!is_auto(object[key])) {
      if (value && mismatches_ != nullptr && !same(object[key], Json(*value)))
        mismatches_->push_back({join(path, key), fmt::format("{} is {} in the config but {} gives {}; the config value "
                                                             "is used (HF Trainer would refuse the mismatch)",
                                                             join(path, key), object[key].dump(), flag(source), Json(*value).dump())});
      return;
    }
    if (!value) fail("{} is \"auto\" and nothing was given to derive it: pass {}, or write a value in the config", join(path, key), source);
    object[key] = *value;
    log_.push_back(fmt::format("{}: auto -> {} (from {})", join(path, key), Json(*value).dump(), flag(source)));
  }

  static std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }
  // The CLI flag part of a source description, for the compact log line.
  static std::string flag(const char* source) {
    std::string s = source;
    const auto p = s.find(" (");
    return p == std::string::npos ? s : s.substr(0, p);
  }

 private:
  static bool same(const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    if (a.is_array() && b.is_array() && a.size() == b.size()) {
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!same(a[i], b[i])) return false;
      return true;
    }
    return a == b;
  }

  std::vector<std::string>& log_;
  std::vector<Warning>* mismatches_;
};

std::optional<std::int64_t> as_int(const Json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9.2e18)
    return static_cast<std::int64_t>(v.get<double>());
  return std::nullopt;
}

}  // namespace

Json resolve_auto_values(const Json& input, const AutoValues& a, std::int64_t w, std::vector<std::string>& log, std::vector<Warning>* mismatches) {
  Json root = input;
  if (!root.is_object()) return root;
  // A NaN or infinite option would become null (or a non-number) in the resolved config.
  const auto finite = [](const std::optional<double>& v, const char* flag) {
    if (v && !std::isfinite(*v)) fail("{} {}: not a finite number; give a number such as 1e-4", flag, *v);
  };
  finite(a.lr, kLr);
  finite(a.eps, kEps);
  finite(a.weight_decay, kWd);
  finite(a.gradient_clipping, kClip);
  if (a.betas) {
    finite(a.betas->first, kBetas);
    finite(a.betas->second, kBetas);
  }
  Resolver r(log, mismatches);

  // Batch triple (HF: micro from per_device_train_batch_size, TBS = world * micro * GAS).
  r.fill(root, "", "train_micro_batch_size_per_gpu", a.train_micro_batch_size_per_gpu, kMicro);
  r.fill(root, "", "gradient_accumulation_steps", a.gradient_accumulation_steps, kGas);
  if (root.contains("train_batch_size") && is_auto(root["train_batch_size"])) {
    std::optional<std::int64_t> micro = a.train_micro_batch_size_per_gpu, gas = a.gradient_accumulation_steps;
    if (root.contains("train_micro_batch_size_per_gpu")) micro = as_int(root["train_micro_batch_size_per_gpu"]);
    if (root.contains("gradient_accumulation_steps") && !root["gradient_accumulation_steps"].is_null())
      gas = as_int(root["gradient_accumulation_steps"]);
    else if (!gas)
      gas = 1;  // HF's default gradient_accumulation_steps
    if (!micro)
      fail(
          "train_batch_size is \"auto\": it is derived as micro batch * gradient accumulation steps * world size, "
          "but the micro batch size is unknown; pass {} or write train_micro_batch_size_per_gpu",
          kMicro);
    std::int64_t tbs = 0;
    if (__builtin_mul_overflow(*micro, *gas, &tbs) || __builtin_mul_overflow(tbs, w, &tbs))
      fail(
          "train_batch_size is \"auto\": micro batch {} * gradient accumulation steps {} * world size {} does not fit in a 64-bit "
          "integer (at most 2^63 - 1); give smaller values",
          *micro, *gas, w);
    root["train_batch_size"] = tbs;
    log.push_back(fmt::format("train_batch_size: auto -> {} (= {} * {} * data-parallel world size {})", tbs, *micro, *gas, w));
  }
  r.fill(root, "", "gradient_clipping", a.gradient_clipping, kClip);

  if (root.contains("optimizer") && root["optimizer"].is_object() && root["optimizer"].contains("params")) {
    Json& p = root["optimizer"]["params"];
    r.fill(p, "optimizer.params", "lr", a.lr, kLr);
    r.fill(p, "optimizer.params", "eps", a.eps, kEps);
    r.fill(p, "optimizer.params", "weight_decay", a.weight_decay, kWd);
    std::optional<Json> betas;
    if (a.betas) betas = Json::array({a.betas->first, a.betas->second});
    r.fill(p, "optimizer.params", "betas", betas, kBetas);
  }
  if (root.contains("scheduler") && root["scheduler"].is_object() && root["scheduler"].contains("params")) {
    Json& p = root["scheduler"]["params"];
    // HF always fills warmup_min_lr with 0.
    Resolver(log, nullptr).fill(p, "scheduler.params", "warmup_min_lr", std::optional<double>(0.0), "HF's fixed value 0");
    std::optional<double> lr = a.lr;
    const char* lr_source = kLr;
    if (!lr && root.contains("optimizer") && root["optimizer"].is_object() && root["optimizer"].contains("params") &&
        root["optimizer"]["params"].is_object() && root["optimizer"]["params"].contains("lr") && root["optimizer"]["params"]["lr"].is_number()) {
      lr = root["optimizer"]["params"]["lr"].get<double>();
      lr_source = "optimizer.params.lr";
    }
    // Only the lr option is compared with an explicit warmup_max_lr (as HF does with learning_rate).
    (a.lr ? r : Resolver(log, nullptr)).fill(p, "scheduler.params", "warmup_max_lr", lr, lr_source);
    r.fill(p, "scheduler.params", "total_num_steps", a.total_num_steps, kTotal);
    r.fill(p, "scheduler.params", "warmup_num_steps", a.warmup_num_steps, kWarmup);
  }

  // Precision (HF: fp16.enabled = --fp16, bf16.enabled = --bf16).
  if (a.precision && *a.precision != "fp32" && *a.precision != "fp16" && *a.precision != "bf16")
    fail("precision option is \"{}\": expected fp32, fp16 or bf16", *a.precision);
  std::optional<bool> fp16_on, bf16_on;
  if (a.precision) {
    fp16_on = *a.precision == "fp16";
    bf16_on = *a.precision == "bf16";
  }
  for (const char* key : {"fp16", "bf16", "bfloat16"}) {
    if (root.contains(key) && root[key].is_object()) r.fill(root[key], key, "enabled", std::string(key) == "fp16" ? fp16_on : bf16_on, kPrecision);
  }
  // Apex AMP: HF enables it only with its apex backend, which dstrain does not have.
  if (root.contains("amp") && root["amp"].is_object())
    Resolver(log, nullptr).fill(root["amp"], "amp", "enabled", std::optional<bool>(false), "dstrain has no Apex backend");

  // ZeRO sizes derived from the hidden size (HF: h^2, int(0.9 h^2), 10 h).
  if (root.contains("zero_optimization") && root["zero_optimization"].is_object()) {
    Json& z = root["zero_optimization"];
    Resolver derived(log, nullptr);  // HF does not compare these with the hidden size
    std::optional<std::int64_t> h = a.hidden_size;
    std::optional<std::int64_t> hh, prefetch, persist;
    if (h) {
      hh = *h * *h;
      prefetch = static_cast<std::int64_t>(0.9 * static_cast<double>(*h * *h));
      persist = 10 * *h;
    }
    derived.fill(z, "zero_optimization", "reduce_bucket_size", hh, kHidden);
    derived.fill(z, "zero_optimization", "stage3_prefetch_bucket_size", prefetch, kHidden);
    derived.fill(z, "zero_optimization", "prefetch_bucket_size", prefetch, kHidden);
    derived.fill(z, "zero_optimization", "stage3_param_persistence_threshold", persist, kHidden);
    derived.fill(z, "zero_optimization", "param_persistence_threshold", persist, kHidden);
  }
  return root;
}

std::vector<Warning> unused_auto_options(const Json& root, const AutoValues& a) {
  std::vector<Warning> out;
  if (!root.is_object()) return out;
  const auto has = [](const Json& object, const char* key) { return object.is_object() && object.contains(key); };
  const auto section = [&](const char* name, const char* sub) -> const Json& {
    static const Json none;
    if (!has(root, name)) return none;
    if (sub == nullptr) return root[name];
    return has(root[name], sub) ? root[name][sub] : none;
  };
  const auto warn = [&](const std::string& path, const std::string& given, const std::string& what_applies, const std::string& fix) {
    out.push_back({path, fmt::format("{} is not used: {}; {}", given, what_applies, fix)});
  };
  const bool tbs_auto = has(root, "train_batch_size") && is_auto(root["train_batch_size"]);
  if (a.train_micro_batch_size_per_gpu && !has(root, "train_micro_batch_size_per_gpu") && !tbs_auto)
    warn("train_micro_batch_size_per_gpu", fmt::format("{} {}", kMicro, *a.train_micro_batch_size_per_gpu),
         "the config has no train_micro_batch_size_per_gpu, so it is derived from train_batch_size",
         "set \"train_micro_batch_size_per_gpu\": \"auto\" in the config to take the flag");
  if (a.gradient_accumulation_steps && !has(root, "gradient_accumulation_steps") && !tbs_auto)
    warn("gradient_accumulation_steps", fmt::format("{} {}", kGas, *a.gradient_accumulation_steps),
         "the config has no gradient_accumulation_steps, so it is derived from train_batch_size (or DeepSpeed's default 1)",
         "set \"gradient_accumulation_steps\": \"auto\" in the config to take the flag");
  if (a.gradient_clipping && !has(root, "gradient_clipping"))
    warn("gradient_clipping", fmt::format("{} {}", kClip, *a.gradient_clipping),
         "the config has no gradient_clipping, so DeepSpeed's default applies", "set \"gradient_clipping\": \"auto\" in the config to take the flag");

  // The optimizer options: the config's optimizer.params (or, for --lr, a scheduler's warmup_max_lr).
  // A config with no "optimizer" block takes them all: `train` builds its default AdamW from them.
  if (has(root, "optimizer") && !root["optimizer"].is_null()) {
    const Json& params = section("optimizer", "params");
    const auto check = [&](const char* key, const std::string& flag_and_value) {
      warn(std::string("optimizer.params.") + key, flag_and_value,
           fmt::format("the config's optimizer has no params.{}, so the optimizer's default applies", key),
           fmt::format("set \"{}\": \"auto\" in the config's optimizer.params to take the flag", key));
    };
    if (a.lr && !has(params, "lr") && !has(section("scheduler", "params"), "warmup_max_lr")) check("lr", fmt::format("{} {}", kLr, *a.lr));
    if (a.eps && !has(params, "eps")) check("eps", fmt::format("{} {}", kEps, *a.eps));
    if (a.weight_decay && !has(params, "weight_decay")) check("weight_decay", fmt::format("{} {}", kWd, *a.weight_decay));
    if (a.betas && !has(params, "betas")) check("betas", fmt::format("{} ({}, {})", kBetas, a.betas->first, a.betas->second));
  }
  if (a.warmup_num_steps && !has(section("scheduler", "params"), "warmup_num_steps"))
    warn("scheduler.params.warmup_num_steps", fmt::format("{} {}", kWarmup, *a.warmup_num_steps),
         has(root, "scheduler") ? "the config's scheduler has no params.warmup_num_steps, so the scheduler's default applies"
                                : "the config has no \"scheduler\", so the learning rate has no warmup",
         "set \"warmup_num_steps\": \"auto\" in the config's scheduler.params to take the flag");

  // Precision: fp32 unless an fp16 / bf16 block says "enabled", so --precision fp32 agrees with a
  // config that has none.
  if (a.precision && *a.precision != "fp32" && !has(section("fp16", nullptr), "enabled") && !has(section("bf16", nullptr), "enabled") &&
      !has(section("bfloat16", nullptr), "enabled"))
    warn(*a.precision, fmt::format("--precision {}", *a.precision),
         "the config has no fp16 or bf16 \"enabled\" key, so the run is fp32 (DeepSpeed's default)",
         fmt::format("set \"{}\": {{\"enabled\": \"auto\"}} in the config to take the flag", *a.precision));

  // The hidden size only derives "auto" ZeRO bucket sizes (HF does not compare it with explicit ones).
  if (a.hidden_size && !a.hidden_size_from_model) {
    bool derives = false;
    for (const char* key : {"reduce_bucket_size", "stage3_prefetch_bucket_size", "prefetch_bucket_size", "stage3_param_persistence_threshold",
                            "param_persistence_threshold"})
      derives = derives || (has(section("zero_optimization", nullptr), key) && is_auto(root["zero_optimization"][key]));
    if (!derives)
      warn("zero_optimization", fmt::format("--hidden-size {}", *a.hidden_size),
           "no ZeRO bucket size in the config is \"auto\", so the config's values (or DeepSpeed's defaults) of reduce_bucket_size, "
           "stage3_prefetch_bucket_size and stage3_param_persistence_threshold apply",
           "set them to \"auto\" in zero_optimization to derive them from the flag");
  }
  return out;
}

}  // namespace dstrain::config
