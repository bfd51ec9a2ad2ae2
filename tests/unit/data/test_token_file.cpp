// Token files against llm.c's format, byte by byte, and the reader's and writer's failure modes.
#include <signal.h>
#include <sys/resource.h>

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/token_file.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::HasSubstr;

namespace {

std::int32_t int32_at(const std::string& bytes, std::size_t offset) {
  // Little-endian by hand, independent of the host.
  const auto b = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[offset + i])); };
  return static_cast<std::int32_t>(b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24));
}

void put_int32(std::string& bytes, std::size_t offset, std::int32_t value) {
  const auto v = static_cast<std::uint32_t>(value);
  for (int i = 0; i < 4; ++i) bytes[offset + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

std::string open_error(const std::filesystem::path& path) {
  try {
    (void)TokenFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

bool only_file_in(const std::filesystem::path& dir, const std::filesystem::path& file) {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path() != file) return false;
    ++count;
  }
  return count == 1;
}

}  // namespace

TEST(TokenFile, HeaderAndBodyBytesFollowTheFormat) {
  TempDir dir;
  const auto path = dir / "t.bin";
  const std::vector<std::int32_t> tokens{0, 1, 65535, 50256, 258};
  write_token_file(path, tokens);
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2u * 5u);
  EXPECT_EQ(int32_at(bytes, 0), 20240520);  // magic
  EXPECT_EQ(int32_at(bytes, 4), 1);         // version
  EXPECT_EQ(int32_at(bytes, 8), 5);         // token count
  for (std::size_t offset = 12; offset < 1024; offset += 4) ASSERT_EQ(int32_at(bytes, offset), 0) << offset;
  // uint16 little-endian: 0 -> 00 00, 1 -> 01 00, 65535 -> FF FF, 50256 = 0xC450 -> 50 C4, 258 = 0x0102 -> 02 01.
  const unsigned char body[] = {0x00, 0x00, 0x01, 0x00, 0xFF, 0xFF, 0x50, 0xC4, 0x02, 0x01};
  EXPECT_EQ(std::memcmp(bytes.data() + 1024, body, sizeof(body)), 0);
  EXPECT_TRUE(only_file_in(dir.path(), path)) << "the temporary file should be gone";
}

TEST(TokenFile, ReaderMapsWhatTheWriterWrote) {
  TempDir dir;
  const auto path = dir / "t.bin";
  std::vector<std::int32_t> tokens;
  for (std::int32_t i = 0; i < 100000; ++i) tokens.push_back((i * 7919) % 65536);
  write_token_file(path, tokens);
  TokenFile file = TokenFile::open(path);
  ASSERT_EQ(file.size(), tokens.size());
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.width(), TokenWidth::uint16);
  const std::vector<std::uint32_t> all = file.read_all();
  for (std::size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(all[i], static_cast<std::uint32_t>(tokens[i])) << i;

  TokenFile moved = std::move(file);
  EXPECT_EQ(moved.size(), tokens.size());
  EXPECT_EQ(file.size(), 0u);  // NOLINT(bugprone-use-after-move): a moved-from file is empty
  EXPECT_TRUE(file.read_all().empty());
  TokenFile other = TokenFile::open(path);
  other = std::move(moved);
  EXPECT_EQ(other.read_all()[1], 7919);
}

TEST(TokenFile, EmptyFileHoldsJustTheHeader) {
  TempDir dir;
  write_token_file(dir / "empty.bin", {});
  EXPECT_EQ(read_bytes(dir / "empty.bin").size(), 1024u);
  EXPECT_EQ(TokenFile::open(dir / "empty.bin").size(), 0u);
}

TEST(TokenFile, ReaderRejectsDamagedFiles) {
  TempDir dir;
  const auto good = dir / "good.bin";
  write_token_file(good, std::vector<std::int32_t>{1, 2, 3});
  const std::string bytes = read_bytes(good);
  const auto bad = dir / "bad.bin";

  std::string magic = bytes;
  put_int32(magic, 0, 20240521);
  write_bytes(bad, magic);
  EXPECT_THAT(open_error(bad), HasSubstr("magic 20240521"));
  EXPECT_THAT(open_error(bad), HasSubstr(bad.string()));
  EXPECT_THAT(open_error(bad), HasSubstr("prepare-data"));

  std::string version = bytes;
  put_int32(version, 4, 3);
  write_bytes(bad, version);
  EXPECT_THAT(open_error(bad), HasSubstr("version 3"));

  // Version 2 with a width that is neither 2 nor 4; and with width 4, a body sized for uint16.
  std::string width = bytes;
  put_int32(width, 4, 2);
  put_int32(width, 12, 3);
  write_bytes(bad, width);
  EXPECT_THAT(open_error(bad), HasSubstr("3 bytes per token"));
  put_int32(width, 12, 4);
  write_bytes(bad, width);
  EXPECT_THAT(open_error(bad), HasSubstr("3 tokens need 1036 (1024 + 4 per token)"));

  write_bytes(bad, bytes.substr(0, bytes.size() - 1));
  EXPECT_THAT(open_error(bad), HasSubstr("truncated"));
  EXPECT_THAT(open_error(bad), HasSubstr("1029 bytes"));

  write_bytes(bad, bytes + "xx");
  EXPECT_THAT(open_error(bad), HasSubstr("longer than its header says"));

  std::string count = bytes;
  put_int32(count, 8, 4);
  write_bytes(bad, count);
  EXPECT_THAT(open_error(bad), HasSubstr("4 tokens need 1032"));

  std::string negative = bytes;
  put_int32(negative, 8, -3);
  write_bytes(bad, negative);
  EXPECT_THAT(open_error(bad), HasSubstr("negative"));

  write_bytes(bad, bytes.substr(0, 100));
  EXPECT_THAT(open_error(bad), HasSubstr("less than its 1024-byte header"));

  EXPECT_THAT(open_error(dir / "missing.bin"), HasSubstr((dir / "missing.bin").string()));
  EXPECT_THAT(open_error(dir.path()), HasSubstr("not a regular file"));
}

// Version 2, uint32: the width in header[3], four little-endian bytes per id, ids past 65535 intact.
TEST(TokenFile, WideFileHeaderAndBodyBytesFollowTheFormat) {
  TempDir dir;
  const auto path = dir / "wide.bin";
  const std::vector<std::int32_t> tokens{0, 65535, 65536, 128255, 151935, 0x7FFFFFFF};
  write_token_file(path, tokens, TokenWidth::uint32);
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 4u * 6u);
  EXPECT_EQ(int32_at(bytes, 0), 20240520);
  EXPECT_EQ(int32_at(bytes, 4), 2);   // version
  EXPECT_EQ(int32_at(bytes, 8), 6);   // token count
  EXPECT_EQ(int32_at(bytes, 12), 4);  // bytes per token
  for (std::size_t offset = 16; offset < 1024; offset += 4) ASSERT_EQ(int32_at(bytes, offset), 0) << offset;
  for (std::size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(int32_at(bytes, 1024 + 4 * i), tokens[i]) << i;
  EXPECT_TRUE(only_file_in(dir.path(), path)) << "the temporary file should be gone";

  const TokenFile file = TokenFile::open(path);
  EXPECT_EQ(file.width(), TokenWidth::uint32);
  const std::vector<std::uint32_t> all = file.read_all();
  ASSERT_EQ(all.size(), tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(all[i], static_cast<std::uint32_t>(tokens[i])) << i;
  std::vector<std::uint32_t> middle(2);
  file.read(2, middle);
  EXPECT_EQ(middle[0], 65536u);
  EXPECT_EQ(middle[1], 128255u);
}

// A version 2 file may also say 2 bytes per token; the reader takes it like version 1.
TEST(TokenFile, VersionTwoWithTwoByteIdsReads) {
  TempDir dir;
  const auto path = dir / "v2narrow.bin";
  std::string bytes(1024 + 2 * 3, '\0');
  put_int32(bytes, 0, 20240520);
  put_int32(bytes, 4, 2);
  put_int32(bytes, 8, 3);
  put_int32(bytes, 12, 2);
  const unsigned char body[] = {0x01, 0x00, 0xFF, 0xFF, 0x50, 0xC4};
  std::memcpy(bytes.data() + 1024, body, sizeof(body));
  write_bytes(path, bytes);
  const TokenFile file = TokenFile::open(path);
  EXPECT_EQ(file.width(), TokenWidth::uint16);
  EXPECT_EQ(file.read_all(), (std::vector<std::uint32_t>{1, 65535, 50256}));
}

TEST(TokenFile, WidthForAVocabulary) {
  EXPECT_EQ(token_width_for_vocab(256), TokenWidth::uint16);
  EXPECT_EQ(token_width_for_vocab(50257), TokenWidth::uint16);
  EXPECT_EQ(token_width_for_vocab(65536), TokenWidth::uint16);  // ids 0..65535
  EXPECT_EQ(token_width_for_vocab(65537), TokenWidth::uint32);
  EXPECT_EQ(token_width_for_vocab(128256), TokenWidth::uint32);
  EXPECT_EQ(token_width_for_vocab(151936), TokenWidth::uint32);
  EXPECT_THROW((void)token_width_for_vocab(0), Error);
}

TEST(TokenFile, WriterRejectsIdsThatDoNotFitUint16) {
  TempDir dir;
  const auto path = dir / "t.bin";
  try {
    write_token_file(path, std::vector<std::int32_t>{1, 65536});
    FAIL() << "65536 should not fit";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("65536"));
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
  EXPECT_THROW(write_token_file(path, std::vector<std::int32_t>{-1}), Error);
  EXPECT_THROW(write_token_file(path, std::vector<std::int32_t>{5, -1}, TokenWidth::uint32), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a rejected write must leave no file";
}

TEST(TokenFile, FailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  TempDir dir;
  const auto path = dir / "t.bin";
  write_token_file(path, std::vector<std::int32_t>{7, 8, 9});
  const std::string old_bytes = read_bytes(path);

  // A file size limit makes write() fail with EFBIG part-way, as a full disk would with ENOSPC.
  struct sigaction ignore {};
  struct sigaction previous {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &previous), 0);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_token_file(path, std::vector<std::int32_t>(100000, 5));
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &previous, nullptr);

  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("too large"));
  EXPECT_EQ(read_bytes(path), old_bytes);
  EXPECT_TRUE(only_file_in(dir.path(), path)) << "the temporary file should be removed";
}

TEST(TokenFile, WriteIntoAMissingFolderNamesThePath) {
  TempDir dir;
  const auto path = dir / "no" / "such" / "t.bin";
  try {
    write_token_file(path, std::vector<std::int32_t>{1});
    FAIL() << "writing into a missing folder should throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
    EXPECT_THAT(e.what(), HasSubstr("create the folder"));
  }
}

// A file truncated while a run reads it (another job regenerating it in place, a full disk): the
// next read is an Error naming the file. Through a memory mapping it was SIGBUS, which killed the
// process (and this test with it).
TEST(TokenFile, AFileTruncatedWhileReadIsAnErrorNotASignal) {
  TempDir dir;
  const auto path = dir / "t.bin";
  std::vector<std::int32_t> tokens(100000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i % 50000);
  write_token_file(path, tokens);
  const TokenFile file = TokenFile::open(path);
  std::vector<std::uint32_t> window(64);
  file.read(90000, window);
  EXPECT_EQ(window[0], 40000);
  std::filesystem::resize_file(path, kTokenFileHeaderBytes + 2 * 1000);  // in place: the same inode
  std::string message;
  try {
    file.read(90000, window);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("shrank while this run reads it"));
  // Reads of what is still there go on working; a range past the header's count is an Error.
  file.read(10, window);
  EXPECT_EQ(window[0], 10);
  std::vector<std::uint32_t> past(2);
  EXPECT_THROW(file.read(tokens.size() - 1, past), Error);
}
