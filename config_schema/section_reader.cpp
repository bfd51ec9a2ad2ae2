#include "config_schema/section_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

std::string join_path(const std::string& section, const std::string& key) { return section.empty() ? key : section + "." + key; }

std::string show(const Json& value) {
  std::string s = value.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(const std::string& key_in, const std::vector<std::string>& candidates) {
  // Case differences count as typos too ("sgd" -> "SGD"): compare lower-cased.
  auto low = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  const std::string key = low(key_in);
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(key, low(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // A typo changes a few characters; a third of the name is the most we call plausible. Names that
  // only differ by a stage3_ prefix or a suffix are caught by the containment test.
  const std::size_t limit = std::max<std::size_t>(2, key.size() / 3);
  if (best_d <= limit) return best;
  for (const auto& c : candidates)
    if (c.size() >= 4 && key.size() >= 4 && (low(c).find(key) != std::string::npos || key.find(low(c)) != std::string::npos)) return c;
  return "";
}

namespace {

// Explanations for keys that are unknown for a known reason (renamed, misplaced, documented but
// never implemented). Keyed by full path first, then by bare key.
const std::map<std::string, std::string>& key_hints() {
  static const std::map<std::string, std::string> hints = {
      {"aio.thread_count",
       "`thread_count` was renamed `intra_op_parallelism` in DeepSpeed v0.16.4 and the old name is silently "
       "ignored there; write \"intra_op_parallelism\" instead"},
      {"zero_optimization.aio",
       "the `aio` block belongs at the top level of the config, not inside zero_optimization (DeepSpeed issue "
       "#2721)"},
      {"zero_optimization.grad_hooks", "`grad_hooks` appears in DeepSpeed's documentation but was never a field; remove it"},
      {"bf16.check_overflow", "the field is called `check_grad_overflow`"},
      {"bfloat16.check_overflow", "the field is called `check_grad_overflow`"},
      {"cuda_visible_devices",
       "DeepSpeed never reads it; choose GPUs with the launcher (--include) or the CUDA_VISIBLE_DEVICES "
       "environment variable"},
      {"tensorboard.outdir", "the field is called `output_path`"},
  };
  return hints;
}

std::string unknown_key_detail(const std::string& section, const std::string& key, const std::vector<std::string>& known) {
  const auto& hints = key_hints();
  if (auto it = hints.find(join_path(section, key)); it != hints.end()) return it->second;
  std::string guess = closest_key(key, known);
  if (!guess.empty()) return fmt::format("did you mean \"{}\"?", guess);
  return "";
}

bool is_auto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Where HF Accelerate takes the value of an "auto" that dstrain has no option for, so the user
// knows what to write instead.
std::string accelerate_source(const std::string& path) {
  static const std::map<std::string, std::string> sources = {
      {"zero_optimization.stage", "its zero_stage setting"},
      {"zero_optimization.gather_16bit_weights_on_model_save", "its zero3_save_16bit_model setting"},
      {"zero_optimization.offload_optimizer.device", "its offload_optimizer_device setting"},
      {"zero_optimization.offload_param.device", "its offload_param_device setting"},
      {"zero_optimization.offload_optimizer.nvme_path", "its offload_optimizer_nvme_path setting"},
      {"zero_optimization.offload_param.nvme_path", "its offload_param_nvme_path setting"},
  };
  auto it = sources.find(path);
  return it == sources.end() ? "" : "; HF Accelerate fills it from " + it->second;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string quoted_list(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + fmt::format("\"{}\"", v[i]);
  return out;
}

[[noreturn]] void type_error(const FieldSpec& f, const Json& v, const std::string& why = "") {
  fail("{}: invalid value {}{}; expected {}", f.path(), show(v), why.empty() ? "" : " (" + why + ")", expected_text(f));
}

void check_range(const FieldSpec& f, double x, const Json& original) {
  if (f.minimum && x < *f.minimum) type_error(f, original);
  if (f.maximum && x > *f.maximum) type_error(f, original);
}

// Enum check for string fields; returns the canonical spelling.
Json check_enum(const FieldSpec& f, const Json& v) {
  if (f.enum_values.empty()) return v;
  const std::string s = v.get<std::string>();
  for (const auto& e : f.enum_values) {
    if (s == e || (f.enum_case_insensitive && lower(s) == lower(e))) return e;
  }
  type_error(f, v, f.enum_case_insensitive ? "" : "values are case-sensitive");
}

// pydantic's str -> int: optional sign and digits (surrounding blanks allowed); no exponent.
std::optional<std::int64_t> parse_int_string(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return std::nullopt;
  for (std::size_t j = i; j < s.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return std::nullopt;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<std::int64_t>(x);
}

std::optional<double> parse_float_string(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return x;
}

// An integral float converts to int64 (5e8 -> 500000000); anything else does not.
std::optional<std::int64_t> integral(double x) {
  if (!std::isfinite(x) || std::floor(x) != x || std::fabs(x) > 9.2e18) return std::nullopt;
  return static_cast<std::int64_t>(x);
}

// A whole number beyond int64 (2^63 as an unsigned JSON integer, 1e30 as a float) is reported as
// the user wrote it, never wrapped to a negative or small value.
void check_int64_range(const FieldSpec& f, const Json& v) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    type_error(f, v, "too large for a 64-bit integer (at most 2^63 - 1)");
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (std::isfinite(x) && std::floor(x) == x && std::fabs(x) > 9.2e18) type_error(f, v, "too large for a 64-bit integer (at most 2^63 - 1)");
  }
}

Json finish_int(const FieldSpec& f, std::int64_t x, const Json& original) {
  check_range(f, static_cast<double>(x), original);
  if (!f.enum_values.empty()) {
    const std::string s = std::to_string(x);
    if (std::find(f.enum_values.begin(), f.enum_values.end(), s) == f.enum_values.end()) type_error(f, original);
  }
  return x;
}

}  // namespace

std::string expected_text(const FieldSpec& f) {
  std::string base;
  switch (f.kind) {
    case FieldKind::boolean:
      base = f.regime == Regime::validated ? "a boolean (true/false; DeepSpeed also accepts \"yes\"/\"no\", \"on\"/\"off\", 1/0)"
                                           : "a boolean (true or false, without quotes)";
      break;
    case FieldKind::integer:
      if (!f.enum_values.empty()) {
        std::string v;
        for (std::size_t i = 0; i < f.enum_values.size(); ++i) v += (i ? (i + 1 == f.enum_values.size() ? " or " : ", ") : "") + f.enum_values[i];
        base = "one of " + v;
      } else {
        base = "an integer";
      }
      break;
    case FieldKind::number:
      base = "a number";
      break;
    case FieldKind::string:
      base = f.enum_values.empty() ? "a string" : "one of " + quoted_list(f.enum_values) + (f.enum_case_insensitive ? " (any case)" : "");
      break;
    case FieldKind::object:
      base = "an object";
      break;
    case FieldKind::array:
      base = "a list";
      break;
    case FieldKind::any:
      base = "a value";
      break;
  }
  if (f.enum_values.empty()) {
    if (f.minimum && f.maximum)
      base += fmt::format(" between {} and {}", *f.minimum, *f.maximum);
    else if (f.minimum)
      base += fmt::format(" >= {}", *f.minimum);
    else if (f.maximum)
      base += fmt::format(" <= {}", *f.maximum);
  }
  if (f.nullable) base += " or null";
  return base;
}

// Strings (enum-checked), objects, arrays and untyped values: both regimes take these as given,
// only the scalar kinds differ between DeepSpeed's pydantic models and its dict lookups.
Json check_structured(const FieldSpec& f, const Json& v) {
  switch (f.kind) {
    case FieldKind::string:
      if (!v.is_string()) type_error(f, v);
      return check_enum(f, v);
    case FieldKind::object:
      if (!v.is_object()) type_error(f, v);
      return v;
    case FieldKind::array:
      if (!v.is_array()) type_error(f, v);
      return v;
    default:
      return v;
  }
}

Json coerce_validated(const Json& v, const FieldSpec& f) {
  if (v.is_null()) {
    if (f.nullable) return nullptr;
    type_error(f, v, "null is only allowed for optional fields; remove the key to get the default");
  }
  switch (f.kind) {
    case FieldKind::boolean: {
      if (v.is_boolean()) return v;
      if (v.is_number_integer()) {
        const auto x = v.get<std::int64_t>();
        if (x == 0 || x == 1) return x == 1;
      }
      if (v.is_number_float()) {
        const double x = v.get<double>();
        if (x == 0.0 || x == 1.0) return x == 1.0;
      }
      if (v.is_string()) {
        const std::string s = lower(trim(v.get<std::string>()));
        for (const char* t : {"true", "yes", "on", "1", "t", "y"})
          if (s == t) return true;
        for (const char* t : {"false", "no", "off", "0", "f", "n"})
          if (s == t) return false;
      }
      type_error(f, v);
    }
    case FieldKind::integer: {
      if (v.is_boolean()) return finish_int(f, v.get<bool>() ? 1 : 0, v);
      check_int64_range(f, v);
      if (v.is_number_integer()) return finish_int(f, v.get<std::int64_t>(), v);
      if (v.is_number_float()) {
        if (auto x = integral(v.get<double>())) return finish_int(f, *x, v);
        type_error(f, v, "a fractional number is not an integer");
      }
      if (v.is_string()) {
        if (auto x = parse_int_string(v.get<std::string>())) return finish_int(f, *x, v);
        type_error(f, v, "a string must contain plain digits; exponents such as \"5e8\" are not accepted");
      }
      type_error(f, v);
    }
    case FieldKind::number: {
      double x = 0;
      if (v.is_number())
        x = v.get<double>();
      else if (v.is_boolean())
        x = v.get<bool>() ? 1.0 : 0.0;
      else if (v.is_string()) {
        auto p = parse_float_string(v.get<std::string>());
        if (!p) type_error(f, v);
        x = *p;
      } else {
        type_error(f, v);
      }
      check_range(f, x, v);
      return x;
    }
    case FieldKind::string:
    case FieldKind::object:
    case FieldKind::array:
    case FieldKind::any:
      return check_structured(f, v);
  }
  return v;
}

bool truthy(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<std::int64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();
}

Json check_dict_lookup(const Json& v, const FieldSpec& f, ParseContext& ctx) {
  if (v.is_null()) {
    if (f.nullable) return nullptr;
    // dict.get returns None for an explicit null, not the default; for a non-optional key that is
    // a crash (or a silent misread) later in DeepSpeed.
    type_error(f, v,
               fmt::format("DeepSpeed would use None here, not the default {}; remove the key to get the "
                           "default",
                           show(f.default_value)));
  }
  switch (f.kind) {
    case FieldKind::boolean:
      if (v.is_boolean()) return v;
      if (v.is_number_integer() && (v.get<std::int64_t>() == 0 || v.get<std::int64_t>() == 1)) return v.get<std::int64_t>() == 1;
      if (v.is_string() || v.is_number()) {
        const bool t = truthy(v);
        ctx.warn(f.path(), fmt::format("{} is {}, not a boolean; DeepSpeed applies no conversion in this section and "
                                       "reads any non-empty string or non-zero number as true, so it is read as {}. "
                                       "Write {} without quotes.",
                                       f.path(), show(v), t ? "true" : "false", t ? "true" : "false"));
        return t;
      }
      type_error(f, v);
    case FieldKind::integer:
      check_int64_range(f, v);
      if (v.is_number_integer()) return finish_int(f, v.get<std::int64_t>(), v);
      if (v.is_number_float()) {
        // hjson reads 5e8 as a float; DeepSpeed's arithmetic works with integral floats.
        if (auto x = integral(v.get<double>())) return finish_int(f, *x, v);
        type_error(f, v, "a fractional number is not an integer");
      }
      type_error(f, v,
                 v.is_string() ? "DeepSpeed does not convert strings in this section and would fail later "
                                 "with a TypeError; write the number without quotes"
                               : "");
    case FieldKind::number:
      if (v.is_number()) {
        check_range(f, v.get<double>(), v);
        return v.get<double>();
      }
      type_error(f, v,
                 v.is_string() ? "DeepSpeed does not convert strings in this section and would fail later "
                                 "with a TypeError; write the number without quotes"
                               : "");
    case FieldKind::string:
    case FieldKind::object:
    case FieldKind::array:
    case FieldKind::any:
      return check_structured(f, v);
  }
  return v;
}

void check_unknown_keys(const Json& object, const std::string& section, Regime regime, const std::vector<std::string>& known, ParseContext& ctx) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string detail = unknown_key_detail(section, key, known);
    const std::string path = join_path(section, key);
    if (regime == Regime::validated) {
      std::vector<std::string> sorted = known;
      fail("{}: unknown key{} (DeepSpeed rejects it: \"Extra inputs are not permitted\"); valid keys of {} are: {}", path,
           detail.empty() ? "" : "; " + detail, section.empty() ? "the config" : section, fmt::format("{}", fmt::join(sorted, ", ")));
    }
    ctx.warn(path, fmt::format("unknown key {} is ignored (DeepSpeed ignores it silently){}", path, detail.empty() ? "" : "; " + detail));
  }
}

Json read_section(const Json& object, const SectionSpec& spec, ParseContext& ctx, const std::vector<std::string>& handled_elsewhere) {
  const std::string where = spec.path.empty() ? "the config" : spec.path;
  if (!object.is_object()) fail("{} must be a JSON object, got {}", where, show(object));

  std::vector<std::string> known = handled_elsewhere;
  for (const auto& f : spec.fields) {
    known.push_back(f.key);
    known.insert(known.end(), f.aliases.begin(), f.aliases.end());
  }
  check_unknown_keys(object, spec.path, spec.regime, known, ctx);

  Json out = Json::object();
  for (const auto& f : spec.fields) {
    if (!f.replaced_by.empty()) continue;  // deprecated names are mapped by the section's parser
    std::vector<std::string> present;
    if (object.contains(f.key)) present.push_back(f.key);
    for (const auto& a : f.aliases)
      if (object.contains(a)) present.push_back(a);
    if (present.size() > 1)
      fail(
          "{}: both \"{}\" and \"{}\" are given; they are two spellings of the same field (DeepSpeed rejects "
          "this too); keep one",
          where, present[0], present[1]);
    if (present.empty()) {
      out[f.key] = f.default_value;
      continue;
    }
    const Json& v = object.at(present[0]);
    FieldSpec given = f;  // messages name the spelling the user wrote
    given.key = present[0];
    // "auto" as one of the field's own values (expert_parallel.score_func: DeepSpeed's default) is
    // that value, not the HF integration's placeholder.
    const bool auto_is_a_value = std::find(f.enum_values.begin(), f.enum_values.end(), "auto") != f.enum_values.end();
    if (is_auto(v) && !auto_is_a_value) {
      fail("{} is \"auto\": nothing in dstrain derives it ({}{}); write {}", join_path(spec.path, present[0]),
           spec.regime == Regime::validated ? fmt::format("DeepSpeed would silently use its default {}", show(f.default_value))
                                            : std::string("DeepSpeed would fail on the string with a TypeError"),
           accelerate_source(f.path()), expected_text(f));
    }
    out[f.key] = spec.regime == Regime::validated ? coerce_validated(v, given) : check_dict_lookup(v, given, ctx);
  }
  return out;
}

}  // namespace dstrain::config
