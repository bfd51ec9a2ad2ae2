#include "data/hf_normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "formats/json_text.h"
#include "ops/error.h"

namespace dstrain {
namespace {

constexpr const char* kSupported = "NFC, NFD, NFKC, NFKD, Prepend, Replace (String pattern), Sequence";

// Unicode normalisation through ICU (UTF-8 -> UTF-16 -> normalised -> UTF-8). Input is valid UTF-8
// here (the tokenizer replaced invalid bytes before).
std::string icu_normalize(std::string_view text, const UNormalizer2* normalizer) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length16 = 0;
  u_strFromUTF8(nullptr, 0, &length16, text.data(), static_cast<int32_t>(text.size()), &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) fail("ICU cannot read the text as UTF-8: {}", u_errorName(status));
  status = U_ZERO_ERROR;
  std::u16string utf16(static_cast<std::size_t>(length16), u'\0');
  u_strFromUTF8(reinterpret_cast<UChar*>(utf16.data()), length16, nullptr, text.data(), static_cast<int32_t>(text.size()), &status);
  if (U_FAILURE(status)) fail("ICU cannot read the text as UTF-8: {}", u_errorName(status));
  const auto* source = reinterpret_cast<const UChar*>(utf16.data());
  if (unorm2_isNormalized(normalizer, source, length16, &status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const int32_t length_out = unorm2_normalize(normalizer, source, length16, nullptr, 0, &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) fail("ICU normalisation failed: {}", u_errorName(status));
  status = U_ZERO_ERROR;
  std::u16string normalized(static_cast<std::size_t>(length_out), u'\0');
  unorm2_normalize(normalizer, source, length16, reinterpret_cast<UChar*>(normalized.data()), length_out, &status);
  if (U_FAILURE(status)) fail("ICU normalisation failed: {}", u_errorName(status));
  int32_t length8 = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &length8, reinterpret_cast<const UChar*>(normalized.data()), length_out, &status);
  status = U_ZERO_ERROR;
  std::string out(static_cast<std::size_t>(length8), '\0');
  u_strToUTF8(out.data(), length8, nullptr, reinterpret_cast<const UChar*>(normalized.data()), length_out, &status);
  if (U_FAILURE(status)) fail("ICU cannot write the normalised text as UTF-8: {}", u_errorName(status));
  return out;
}

const UNormalizer2* icu_instance(const char* name, UNormalization2Mode mode) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* n = unorm2_getInstance(nullptr, name, mode, &status);
  if (U_FAILURE(status) || n == nullptr) fail("ICU has no {} normaliser: {}", name, u_errorName(status));
  return n;
}

}  // namespace

void HfNormalizer::parse_into(const nlohmann::json& config, const std::string& where, std::vector<Step>& steps, int depth) {
  // Real tokenizers nest a Sequence once or twice; a crafted file nesting 50,000 deep would exhaust
  // the stack (and the error paths' memory), so the depth is bounded.
  if (depth > kMaxTokenizerNesting) {
    fail("{}: normalizer Sequences nest more than {} deep; no tokenizer needs that — this tokenizer.json is damaged or crafted", where.substr(0, 200),
         kMaxTokenizerNesting);
  }
  if (config.is_null()) return;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    fail("{} should be null or an object with a \"type\"", where);
  }
  const std::string type = config["type"].get<std::string>();
  if (type == "NFC")
    steps.push_back({Kind::nfc, {}, {}});
  else if (type == "NFD")
    steps.push_back({Kind::nfd, {}, {}});
  else if (type == "NFKC")
    steps.push_back({Kind::nfkc, {}, {}});
  else if (type == "NFKD")
    steps.push_back({Kind::nfkd, {}, {}});
  else if (type == "Prepend")
    steps.push_back({Kind::prepend, tokenizer_json::required_string(config, "prepend", where), {}});
  else if (type == "Replace") {
    const auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object() || !pattern->contains("String") || !(*pattern)["String"].is_string()) {
      fail(
          "{}.pattern is {}: dstrain's Replace normalizer takes a {{\"String\": ...}} pattern only (supported "
          "normalizers: {})",
          where, pattern == config.end() ? "missing" : json_excerpt(*pattern), kSupported);
    }
    std::string from = (*pattern)["String"].get<std::string>();
    if (from.empty()) fail("{}.pattern.String is empty: nothing to replace", where);
    steps.push_back({Kind::replace, std::move(from), tokenizer_json::required_string(config, "content", where)});
  } else if (type == "Sequence") {
    const auto list = config.find("normalizers");
    if (list == config.end() || !list->is_array()) fail("{}.normalizers should be a list", where);
    for (std::size_t i = 0; i < list->size(); ++i) parse_into((*list)[i], where + ".normalizers[" + std::to_string(i) + "]", steps, depth + 1);
  } else {
    fail(
        "{}.type is \"{}\", which dstrain does not implement; supported normalizers: {}. Tokenising without it "
        "would give other ids than the model was trained with",
        where, type, kSupported);
  }
}

HfNormalizer HfNormalizer::parse(const nlohmann::json& config, std::string_view where) {
  HfNormalizer n;
  parse_into(config, std::string(where), n.steps_);
  return n;
}

std::string HfNormalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::nfc:
        s = icu_normalize(s, icu_instance("nfc", UNORM2_COMPOSE));
        break;
      case Kind::nfd:
        s = icu_normalize(s, icu_instance("nfc", UNORM2_DECOMPOSE));
        break;
      case Kind::nfkc:
        s = icu_normalize(s, icu_instance("nfkc", UNORM2_COMPOSE));
        break;
      case Kind::nfkd:
        s = icu_normalize(s, icu_instance("nfkc", UNORM2_DECOMPOSE));
        break;
      case Kind::prepend:
        if (!s.empty()) s.insert(0, step.pattern);
        break;
      case Kind::replace: {
        std::string out;
        out.reserve(s.size());
        for (std::size_t i = 0;;) {
          const std::size_t at = s.find(step.pattern, i);
          if (at == std::string::npos) {
            out.append(s, i, std::string::npos);
            break;
          }
          out.append(s, i, at - i);
          out += step.content;
          i = at + step.pattern.size();
        }
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

}  // namespace dstrain
