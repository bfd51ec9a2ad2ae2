#include "models/model_registry.h"

#include <filesystem>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/hf_config_json.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_family.h"
#include "ops/error.h"
#include "ops/quoted_excerpt.h"

namespace dstrain {
namespace {

// The built-in families: adding one is adding its line here (docs/design.md "Adding a model family").
// "moe" (moe: descriptors) shares the llama family's architecture and config.json reader.
std::vector<std::shared_ptr<const ModelFamily>> builtin_families() { return {gpt2_family_ptr(), llama_family_ptr(), moe_family_ptr()}; }

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<const ModelFamily>> families = builtin_families();
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string family_names(const std::vector<std::shared_ptr<const ModelFamily>>& families) {
  std::string s;
  for (const auto& f : families) s += (s.empty() ? "" : ", ") + f->name();
  return s;
}

std::string accepted_forms(const std::vector<std::shared_ptr<const ModelFamily>>& families) {
  std::string s;
  for (const auto& f : families) s += fmt::format("{}{}", s.empty() ? "" : "; ", f->spec_forms());
  return s;
}

// The config.json files the families read: "gpt2: \"gpt2\" (GPT2LMHeadModel); llama: ...".
std::string hf_config_forms(const std::vector<std::shared_ptr<const ModelFamily>>& families) {
  std::string s;
  for (const auto& f : families) {
    const std::string forms = f->hf_config_forms();
    if (!forms.empty()) s += fmt::format("{}{}: {}", s.empty() ? "" : "; ", f->name(), forms);
  }
  return s;
}

// A short, printable rendering of a JSON value from a user's file.
std::string quoted_value(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return "(none)";
  return excerpt(j[key].dump());
}

}  // namespace

void register_model_family(std::shared_ptr<const ModelFamily> family) {
  if (!family) fail("register_model_family: no family given");
  const std::string name = family->name();
  if (name.empty() || name.find(':') != std::string::npos) {
    fail("register_model_family: the family name '{}' must be non-empty and hold no ':' (its specs are '<name>:...')", name);
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& f : r.families) {
    if (f->name() == name) fail("register_model_family: a model family named '{}' is already registered; give yours another name", name);
  }
  r.families.push_back(std::move(family));
}

std::vector<std::shared_ptr<const ModelFamily>> model_families() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.families;
}

const ModelFamily& model_family(std::string_view name) {
  const auto families = model_families();
  for (const auto& f : families)
    if (f->name() == name) return *f;  // the registry keeps every family alive for the process
  fail("no model family named '{}'; the families are {}", name, family_names(families));
}

std::shared_ptr<const Architecture> model_architecture(std::string_view spec) {
  const auto families = model_families();
  if (const std::size_t colon = spec.find(':'); colon != std::string_view::npos) {
    for (const auto& f : families)
      if (spec.substr(0, colon) == f->name()) return f->from_spec(spec);
  }
  std::filesystem::path p{std::string(spec)};
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  if (spec.empty() || !std::filesystem::is_regular_file(p, ec)) {
    fail("model spec '{}' is neither a family's spec nor an existing config.json (or a folder holding one); accepted forms: {}", spec,
         accepted_forms(families));
  }
  const std::string text = read_model_config_file(p);
  const nlohmann::json j = parse_hf_config_json(text, p.string(), "a Hugging Face config.json");
  // A config.json that names no family (neither key) is GPT-2's when GPT-2's keys shape it, as in
  // configs written before transformers added model_type; when they do not, the reader's error
  // alone ("key 'n_layer' is missing") would leave the user guessing, so it says what was assumed
  // and which families dstrain knows.
  const bool names_no_family = !j.contains("model_type") && !j.contains("architectures");
  for (const auto& f : families) {
    if (!f->reads_hf_config(text)) continue;
    if (!names_no_family) return f->from_config_json(text, p.string());
    try {
      return f->from_config_json(text, p.string());
    } catch (const Error& e) {
      fail(
          "model config '{}' has neither \"model_type\" nor \"architectures\", so dstrain read it as a {} config.json, and that "
          "failed: {} — if it is another model's config, say which: add \"model_type\" (and \"architectures\") as Hugging Face "
          "writes them, e.g. \"model_type\": \"gpt2\"; dstrain knows {}",
          p.string(), f->name(), e.what(), hf_config_forms(families));
    }
  }
  fail("model config '{}': model_type {} / architectures {} is of no model family dstrain builds; the families are {} ({})", p.string(),
       quoted_value(j, "model_type"), quoted_value(j, "architectures"), family_names(families), accepted_forms(families));
}

Model make_model(std::string_view spec) { return make_model(model_architecture(spec)); }

}  // namespace dstrain
