#include "data/hf_decoder.h"

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "data/utf8.h"
#include "ops/error.h"

namespace dstrain {
namespace {

constexpr const char* kSupported = "ByteLevel, ByteFallback, Replace (String pattern), Fuse, Strip, Metaspace, Sequence";

// The byte of a "<0xXX>" token, or -1.
int fallback_byte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (const char c : token.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9')
      value += c - '0';
    else if (c >= 'A' && c <= 'F')
      value += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      value += c - 'a' + 10;
    else
      return -1;
  }
  return value;
}

}  // namespace

void HfDecoder::parse_into(const nlohmann::json& config, const std::string& where, HfDecoder& out, int depth) {
  // Real tokenizers nest a Sequence once or twice; a crafted file nesting 50,000 deep would exhaust
  // the stack (and the error paths' memory), so the depth is bounded.
  if (depth > kMaxTokenizerNesting) {
    fail("{}: decoder Sequences nest more than {} deep; no tokenizer needs that — this tokenizer.json is damaged or crafted", where.substr(0, 200),
         kMaxTokenizerNesting);
  }
  if (config.is_null()) return;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    fail("{} should be null or an object with a \"type\"", where);
  }
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    const auto list = config.find("decoders");
    if (list == config.end() || !list->is_array()) fail("{}.decoders should be a list", where);
    for (std::size_t i = 0; i < list->size(); ++i) parse_into((*list)[i], where + ".decoders[" + std::to_string(i) + "]", out, depth + 1);
    return;
  }
  Step step{Kind::fuse, {}, {}, 0, 0, false};
  if (type == "ByteLevel") {
    step.kind = Kind::byte_level;
    out.byte_level_ = true;
  } else if (type == "ByteFallback") {
    step.kind = Kind::byte_fallback;
  } else if (type == "Fuse") {
    step.kind = Kind::fuse;
  } else if (type == "Replace") {
    step.kind = Kind::replace;
    const auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object() || !pattern->contains("String") || !(*pattern)["String"].is_string() ||
        !config.contains("content") || !config["content"].is_string()) {
      fail("{}: dstrain's Replace decoder takes {{\"pattern\": {{\"String\": ...}}, \"content\": ...}} (supported decoders: {})", where, kSupported);
    }
    step.pattern = (*pattern)["String"].get<std::string>();
    step.content = config["content"].get<std::string>();
  } else if (type == "Strip") {
    step.kind = Kind::strip;
    step.pattern = tokenizer_json::string_or(config, "content", " ", where);
    step.start = tokenizer_json::size_or(config, "start", 0, where);
    step.stop = tokenizer_json::size_or(config, "stop", 0, where);
  } else if (type == "Metaspace") {
    step.kind = Kind::metaspace;
    step.pattern = tokenizer_json::string_or(config, "replacement", "\u2581", where);
    if (config.contains("prepend_scheme") && config["prepend_scheme"].is_string()) {
      step.strip_first_space = config["prepend_scheme"].get<std::string>() != "never";
    } else {
      step.strip_first_space = tokenizer_json::bool_or(config, "add_prefix_space", true, where);
    }
  } else {
    fail("{}.type is \"{}\", which dstrain does not implement; supported decoders: {}", where, type, kSupported);
  }
  out.steps_.push_back(std::move(step));
}

HfDecoder HfDecoder::parse(const nlohmann::json& config, std::string_view where) {
  HfDecoder d;
  parse_into(config, std::string(where), d);
  return d;
}

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::byte_level:
        break;  // the strings are bytes already
      case Kind::byte_fallback: {
        // Runs of <0xXX> tokens become their bytes, as one string.
        std::vector<std::string> out;
        std::string bytes;
        bool in_bytes = false;
        for (auto& token : tokens) {
          const int b = fallback_byte(token);
          if (b >= 0) {
            bytes.push_back(static_cast<char>(b));
            in_bytes = true;
            continue;
          }
          if (in_bytes) out.push_back(std::move(bytes));
          bytes.clear();
          in_bytes = false;
          out.push_back(std::move(token));
        }
        if (in_bytes) out.push_back(std::move(bytes));
        tokens.swap(out);
        break;
      }
      case Kind::replace:
        for (auto& token : tokens) replace_all(token, step.pattern, step.content);
        break;
      case Kind::fuse: {
        std::string joined;
        for (const auto& token : tokens) joined += token;
        tokens.assign(1, std::move(joined));
        break;
      }
      case Kind::strip:
        for (auto& token : tokens) {
          std::size_t begin = 0, end = token.size();
          for (std::size_t k = 0; k < step.start && token.compare(begin, step.pattern.size(), step.pattern) == 0; ++k) begin += step.pattern.size();
          for (std::size_t k = 0; k < step.stop && end >= begin + step.pattern.size() &&
                                  token.compare(end - step.pattern.size(), step.pattern.size(), step.pattern) == 0;
               ++k) {
            end -= step.pattern.size();
          }
          token = token.substr(begin, end - begin);
        }
        break;
      case Kind::metaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          replace_all(tokens[i], step.pattern, " ");
          if (i == 0 && step.strip_first_space && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
        }
        break;
    }
  }
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

}  // namespace dstrain
