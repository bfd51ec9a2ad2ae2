#include "data/hf_tokenizer.h"

#include <array>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/added_tokens.h"
#include "data/bpe_merges.h"
#include "data/byte_level_alphabet.h"
#include "data/hf_decoder.h"
#include "data/hf_normalizer.h"
#include "data/tokenizer_json.h"
#include "data/hf_pre_tokenizer.h"
#include "data/utf8.h"
#include "ops/error.h"
#include "ops/quoted_excerpt.h"
#include "formats/json_text.h"

namespace dstrain {
namespace {

using tokenizer_json::bool_or;
using tokenizer_json::member_or_null;
using tokenizer_json::string_or;

// Pieces repeat (Zipf), so caching piece -> ids saves most BPE work; the caps bound memory on corpora
// with endless distinct pieces, and keep out whole sections (Llama 2's files have no pre-tokenizer,
// so a section is one piece), which never repeat.
constexpr std::size_t kMaxCacheEntries = std::size_t{1} << 20;
constexpr std::size_t kMaxCachedPieceBytes = 256;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

nlohmann::json read_json(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail("cannot open {} {}: check the path ({})", what, path.string(), "a Hugging Face tokenizer.json with its tokenizer_config.json beside it");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), fmt::format("{} {}", what, path.string()));
}

// The BOS token a post-processor's template starts a document with, if any: TemplateProcessing's
// `single` begins with a SpecialToken before the Sequence; ByteLevel adds none; a Sequence holds
// either.
std::optional<std::string> template_bos_token(const nlohmann::json& post_processor, const std::string& where) {
  if (!post_processor.is_object()) fail("{} is {}: it should be null or an object with a \"type\"", where, json_excerpt(post_processor));
  std::vector<std::pair<const nlohmann::json*, std::string>> processors{{&post_processor, where}};
  if (string_or(post_processor, "type", "", where) == "Sequence") {
    const nlohmann::json& list = member_or_null(post_processor, "processors");
    if (!list.is_array()) fail("{}.processors is {}, not a list of post-processors", where, json_excerpt(list));
    processors.clear();
    for (std::size_t i = 0; i < list.size(); ++i) processors.emplace_back(&list[i], fmt::format("{}.processors[{}]", where, i));
  }
  std::optional<std::string> bos;
  for (const auto& [processor, at] : processors) {
    if (!processor->is_object()) fail("{} is {}, not an object with a \"type\"", at, json_excerpt(*processor));
    const std::string type = string_or(*processor, "type", "", at);
    if (type == "ByteLevel") continue;
    if (type != "TemplateProcessing") {
      fail(
          "{}.type is \"{}\"; dstrain reads ByteLevel, TemplateProcessing and Sequence post-processors (for the "
          "BOS a document starts with)",
          at, type);
    }
    const nlohmann::json& single = member_or_null(*processor, "single");
    if (single.is_null()) continue;
    if (!single.is_array()) fail("{}.single is {}, not a list of template pieces", at, json_excerpt(single));
    for (const nlohmann::json& piece : single) {
      if (!piece.is_object() || piece.contains("Sequence")) break;
      const nlohmann::json& special = member_or_null(piece, "SpecialToken");
      if (!special.is_object()) continue;
      const nlohmann::json& id = member_or_null(special, "id");
      if (!id.is_string()) fail("{}.single: a SpecialToken's id is {}, not a token string", at, json_excerpt(id));
      bos = id.get<std::string>();
    }
  }
  return bos;
}

// A token named in tokenizer_config.json: a string, or an AddedToken object {"content": ...}; null or
// absent: nullopt.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key, const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  fail("{}.{} is {}: give the token as a string", where, key, json_excerpt(*it));
}

}  // namespace

struct HfTokenizer::Impl {
  std::string name;
  std::vector<std::string> id_to_token;  // vocabulary strings (bytes for a byte-level vocabulary), added tokens' content
  std::vector<bool> id_used;
  StringMap<std::int32_t> token_to_id;  // the same strings -> id (vocabulary and added tokens)
  BpeMerges merges;
  AddedTokens added;
  HfNormalizer normalizer = HfNormalizer::parse(nullptr, "");
  std::optional<HfPreTokenizer> pre_tokenizer;
  std::optional<HfDecoder> decoder;
  bool byte_level = false;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::int32_t unk = -1;
  std::array<std::int32_t, 256> byte_token{};      // byte-level: the token of each byte
  std::array<std::int32_t, 256> fallback_token{};  // byte_fallback: the <0xXX> token of each byte
  std::optional<std::int32_t> bos;
  std::int32_t eos = -1;

  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<std::int32_t>> cache;

  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
};

void HfTokenizer::Impl::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.size() <= kMaxCachedPieceBytes) {
    std::lock_guard lock(cache_mutex);
    if (const auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::int32_t> result;
  if (const auto whole = token_to_id.find(piece); ignore_merges && whole != token_to_id.end()) {
    result.push_back(whole->second);
  } else {
    // Initial symbols: bytes (byte-level) or UTF-8 characters; a character outside the vocabulary is
    // -1 - (its index in `unknown`) and never merges.
    std::vector<std::int32_t> word;
    std::vector<std::string_view> unknown;
    if (byte_level) {
      for (const char c : piece) word.push_back(byte_token[static_cast<unsigned char>(c)]);
    } else {
      for (std::size_t i = 0; i < piece.size();) {
        const std::size_t n = std::min(utf8_sequence_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
        const std::string_view ch = piece.substr(i, n);
        const auto it = token_to_id.find(ch);
        if (it != token_to_id.end()) {
          word.push_back(it->second);
        } else {
          word.push_back(-1 - static_cast<std::int32_t>(unknown.size()));
          unknown.push_back(ch);
        }
        i += n;
      }
    }
    merges.apply(word);
    for (const std::int32_t id : word) {
      if (id >= 0) {
        result.push_back(id);
        continue;
      }
      const std::string_view ch = unknown[static_cast<std::size_t>(-1 - id)];
      if (byte_fallback) {
        for (const char c : ch) result.push_back(fallback_token[static_cast<unsigned char>(c)]);
      } else if (unk >= 0) {
        if (!(fuse_unk && !result.empty() && result.back() == unk)) result.push_back(unk);
      } else {
        fail(
            "tokenizer {}: the character {:?} is not in the vocabulary, and the model has neither byte_fallback nor an "
            "unk_token to stand for it",
            name, std::string(ch));
      }
    }
  }
  out.insert(out.end(), result.begin(), result.end());
  if (piece.size() > kMaxCachedPieceBytes) return;
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(piece), std::move(result));
}

void HfTokenizer::Impl::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  const std::optional<std::string> replaced = replace_invalid_utf8(text);
  if (replaced) text = *replaced;
  std::vector<std::string> pieces;
  for (const AddedTokens::Section& section : added.split(text)) {
    if (section.id >= 0) {
      out.push_back(section.id);
      continue;
    }
    const std::string normalized = normalizer.apply(section.text);
    if (normalized.empty()) continue;
    pieces.clear();
    pre_tokenizer->split(normalized, section.text.data() == text.data(), pieces);
    for (const std::string& piece : pieces) bpe(piece, out);
  }
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::load(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::path file = std::filesystem::is_directory(path, error) ? path / "tokenizer.json" : path;
  const std::filesystem::path config_file = file.parent_path() / "tokenizer_config.json";
  const nlohmann::json json = read_json(file, "tokenizer file");
  if (!std::filesystem::exists(config_file, error)) {
    fail(
        "{} has no tokenizer_config.json beside it ({}): dstrain reads add_bos_token and eos_token from it; copy the "
        "model's tokenizer_config.json there",
        file.string(), config_file.string());
  }
  const nlohmann::json config = read_json(config_file, "tokenizer config");
  if (!json.is_object()) fail("tokenizer file {} is not a JSON object", file.string());
  if (!config.is_object()) fail("tokenizer config {} is not a JSON object", config_file.string());
  const std::string where = file.string();
  const std::string config_where = config_file.string();

  auto impl = std::make_unique<Impl>();
  impl->name = path.string();
  impl->normalizer = HfNormalizer::parse(member_or_null(json, "normalizer"), where + ": normalizer");
  impl->pre_tokenizer.emplace(HfPreTokenizer::parse(member_or_null(json, "pre_tokenizer"), where + ": pre_tokenizer"));
  impl->decoder.emplace(HfDecoder::parse(member_or_null(json, "decoder"), where + ": decoder"));
  impl->byte_level = impl->pre_tokenizer->byte_level();
  if (impl->decoder->byte_level() != impl->byte_level) {
    fail(
        "{}: the {} is ByteLevel but the {} is not; dstrain reads a vocabulary as byte-level (Llama 3, Qwen, GPT-2) "
        "or not (Llama 2, Mistral) for both",
        where, impl->byte_level ? "pre_tokenizer" : "decoder", impl->byte_level ? "decoder" : "pre_tokenizer");
  }

  // ---- the model ----
  if (!json.contains("model") || !json["model"].is_object()) fail("{}: \"model\" is missing or not an object", where);
  const nlohmann::json& model = json["model"];
  const std::string model_where = where + ": model";
  const std::string type = string_or(model, "type", model.contains("merges") ? "BPE" : "", model_where);
  if (type != "BPE") {
    fail(
        "{}.type is \"{}\"; dstrain implements BPE models (byte-level as Llama 3 / Qwen / GPT-2, or with byte fallback "
        "as Llama 2 / Mistral), not WordPiece, WordLevel or Unigram",
        model_where, type);
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    fail("{}.dropout is {}: BPE dropout randomises tokenisation for training a tokenizer; set it to null", model_where,
         json_excerpt(model["dropout"]));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && !(model[key].is_string() && model[key].get<std::string>().empty())) {
      fail(
          "{}.{} is {}; dstrain implements BPE without word prefixes or suffixes (those are for WordPiece-like "
          "vocabularies, not the Llama family)",
          model_where, key, json_excerpt(model[key]));
    }
  }
  impl->ignore_merges = bool_or(model, "ignore_merges", false, model_where);
  impl->byte_fallback = bool_or(model, "byte_fallback", false, model_where);
  impl->fuse_unk = bool_or(model, "fuse_unk", false, model_where);
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("{}.vocab is missing or not an object of token -> id", model_where);

  const auto internal = [&](const std::string& token, const std::string& at) -> std::string {
    if (!impl->byte_level) return token;
    std::optional<std::string> bytes = byte_level_to_bytes(token);
    if (!bytes) fail("{}: token {} uses a character outside the byte-level alphabet", at, quoted_excerpt(token));
    return std::move(*bytes);
  };
  const auto set_token = [&](std::int64_t id, std::string token, const std::string& at) {
    if (id < 0 || id >= std::numeric_limits<std::int32_t>::max()) fail("{}: id {} is outside 0..2^31-2", at, id);
    const auto i = static_cast<std::size_t>(id);
    if (i >= impl->id_to_token.size()) {
      impl->id_to_token.resize(i + 1);
      impl->id_used.resize(i + 1, false);
    }
    impl->id_to_token[i] = token;
    impl->id_used[i] = true;
    impl->token_to_id[std::move(token)] = static_cast<std::int32_t>(id);
  };
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) fail("{}.vocab: token {} has id {}, not an integer", model_where, quoted_excerpt(token), json_excerpt(id));
    set_token(id.get<std::int64_t>(), internal(token, model_where + ".vocab"), model_where + ".vocab");
  }
  if (impl->byte_level) {
    for (int b = 0; b < 256; ++b) {
      const auto it = impl->token_to_id.find(std::string(1, static_cast<char>(b)));
      if (it == impl->token_to_id.end()) fail("{}.vocab lacks the token of byte {}, which byte-level BPE starts from", model_where, b);
      impl->byte_token[static_cast<std::size_t>(b)] = it->second;
    }
  }
  if (impl->byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      const std::string name = fmt::format("<0x{:02X}>", b);
      const auto it = impl->token_to_id.find(name);
      if (it == impl->token_to_id.end()) fail("{}.byte_fallback is true but the vocabulary lacks the token {}", model_where, name);
      impl->fallback_token[static_cast<std::size_t>(b)] = it->second;
    }
  }
  if (const auto unk = config_token(model, "unk_token", model_where)) {
    const auto it = impl->token_to_id.find(*unk);
    if (it == impl->token_to_id.end()) fail("{}.unk_token {} is not in the vocabulary", model_where, quoted_excerpt(*unk));
    impl->unk = it->second;
  }

  if (!model.contains("merges") || !model["merges"].is_array()) fail("{}.merges is missing or not a list", model_where);
  const nlohmann::json& merges = model["merges"];
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const nlohmann::json& m = merges[rank];
    std::string first, second;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        fail("{}.merges[{}] is {}, not two tokens separated by one space", model_where, rank, quoted_excerpt(line));
      }
      first = line.substr(0, space);
      second = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      first = m[0].get<std::string>();
      second = m[1].get<std::string>();
    } else {
      fail("{}.merges[{}] is {}, neither \"first second\" nor [\"first\", \"second\"]", model_where, rank, json_excerpt(m));
    }
    const std::string at = fmt::format("{}.merges[{}]", model_where, rank);
    first = internal(first, at);
    second = internal(second, at);
    const auto a = impl->token_to_id.find(first);
    const auto b = impl->token_to_id.find(second);
    const auto joined = impl->token_to_id.find(first + second);
    if (a == impl->token_to_id.end() || b == impl->token_to_id.end() || joined == impl->token_to_id.end()) {
      fail("{} merges {} into a token that the vocabulary lacks (or from one): the file is damaged", at, json_excerpt(m));
    }
    impl->merges.add(a->second, b->second, joined->second, static_cast<std::int32_t>(rank));
  }

  // ---- added tokens ----
  if (json.contains("added_tokens") && !json["added_tokens"].is_null()) {
    const nlohmann::json& added = json["added_tokens"];
    if (!added.is_array()) fail("{}: added_tokens is not a list", where);
    for (std::size_t i = 0; i < added.size(); ++i) {
      const std::string at = fmt::format("{}: added_tokens[{}]", where, i);
      const nlohmann::json& t = added[i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") || !t["content"].is_string()) {
        fail("{} should be an object with an integer \"id\" and a string \"content\"", at);
      }
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (bool_or(t, flag, false, at)) {
          fail(
              "{}.{} is true; dstrain matches added tokens exactly as written (the flags of the Llama family's "
              "tokenizers are all false)",
              at, flag);
        }
      }
      if (bool_or(t, "normalized", false, at) && !impl->normalizer.empty()) {
        fail(
            "{}.normalized is true with a normalizer present; dstrain matches added tokens in the text before "
            "normalisation (\"normalized\": false, as the Llama family's tokenizers have it)",
            at);
      }
      const std::string content = t["content"].get<std::string>();
      set_token(t["id"].get<std::int64_t>(), content, at);
      impl->added.add(content, t["id"].get<std::int32_t>());
    }
  }

  // ---- document markers: tokenizer_config.json, else the post-processor's template ----
  std::optional<std::string> template_bos;
  if (const nlohmann::json& post_processor = member_or_null(json, "post_processor"); !post_processor.is_null()) {
    template_bos = template_bos_token(post_processor, where + ": post_processor");
  }
  const auto id_of = [&](const std::string& token, const std::string& what) {
    const auto it = impl->token_to_id.find(impl->byte_level && impl->added.find(token) < 0 ? internal(token, what) : token);
    if (it == impl->token_to_id.end()) fail("{} {} is neither an added token nor in the vocabulary", what, quoted_excerpt(token));
    return it->second;
  };
  const std::optional<std::string> config_bos = config_token(config, "bos_token", config_where);
  bool add_bos = template_bos.has_value();
  if (config.contains("add_bos_token") && !config["add_bos_token"].is_null()) add_bos = bool_or(config, "add_bos_token", false, config_where);
  if (add_bos) {
    const std::optional<std::string> bos = config_bos ? config_bos : template_bos;
    if (!bos) fail("{}: add_bos_token is true but no bos_token is given", config_where);
    impl->bos = id_of(*bos, config_where + ": bos_token");
  }
  const std::optional<std::string> eos = config_token(config, "eos_token", config_where);
  if (!eos) {
    fail(
        "{} gives no eos_token: prepare-data ends every document with it (and generation stops at it); add the "
        "model's \"eos_token\"",
        config_where);
  }
  impl->eos = id_of(*eos, config_where + ": eos_token");
  return HfTokenizer(std::move(impl));
}

void HfTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const { impl_->encode(text, out); }

void HfTokenizer::encode_document(std::string_view text, std::vector<std::int32_t>& out) const {
  if (impl_->bos) out.push_back(*impl_->bos);
  impl_->encode(text, out);
  out.push_back(impl_->eos);
}

std::string HfTokenizer::decode(std::span<const std::int32_t> tokens) const {
  std::vector<std::string> strings;
  strings.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t id = tokens[i];
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_to_token.size() || !impl_->id_used[static_cast<std::size_t>(id)]) {
      fail("token {} at position {} is not in the vocabulary of {} (ids 0..{})", id, i, impl_->name, impl_->id_to_token.size() - 1);
    }
    strings.push_back(impl_->id_to_token[static_cast<std::size_t>(id)]);
  }
  return impl_->decoder->decode(std::move(strings));
}

std::int32_t HfTokenizer::eot_token() const { return impl_->eos; }
std::int32_t HfTokenizer::vocab_size() const { return static_cast<std::int32_t>(impl_->id_to_token.size()); }
std::string_view HfTokenizer::name() const { return impl_->name; }
std::optional<std::int32_t> HfTokenizer::bos_token() const { return impl_->bos; }

std::optional<std::int32_t> HfTokenizer::token_id(std::string_view token) const {
  const std::int32_t added = impl_->added.find(token);
  if (added >= 0) return added;
  std::string key(token);
  if (impl_->byte_level) {
    std::optional<std::string> bytes = byte_level_to_bytes(token);
    if (!bytes) return std::nullopt;
    key = std::move(*bytes);
  }
  const auto it = impl_->token_to_id.find(key);
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

}  // namespace dstrain
