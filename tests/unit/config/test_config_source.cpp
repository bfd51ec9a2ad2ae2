// Config sources: base64 decoding (RFC 4648 vectors), files, and --deepspeed_config arguments.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config_schema/base64.h"
#include "config_schema/config_source.h"
#include "ops/error.h"

using dstrain::ConfigText;
using dstrain::decode_base64;
using dstrain::Error;
using dstrain::load_config_argument;
using dstrain::load_config_file;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// Encoder for the tests only (the library decodes; DeepSpeed's launcher encodes).
std::string encode_base64(std::string_view bytes, bool url_safe, bool pad) {
  const char* alphabet = url_safe ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                                  : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const unsigned v =
        (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) | static_cast<unsigned char>(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += alphabet[(v >> k) & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    if (rest == 2) out += alphabet[(v >> 6) & 63];
    if (pad) out.append(3 - rest, '=');
  }
  return out;
}

// A fresh directory per test, removed afterwards.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("dstrain_cfg_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, std::string_view text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  fs::path dir_;
};

std::string error_of_file(const fs::path& p) {
  try {
    load_config_file(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string error_of_argument(std::string_view arg) {
  try {
    load_config_argument(arg);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// '?' and '>' make the encoder emit '/' and '+' (or '_' and '-'), so both alphabets are exercised.
const std::string kConfig = R"({"train_batch_size": 8, "comment": "???>>>", "fp16": {"enabled": true}})";

}  // namespace

// ---- base64 ----

TEST(Base64, Rfc4648TestVectors) {
  EXPECT_EQ(decode_base64(""), "");
  EXPECT_EQ(decode_base64("Zg=="), "f");
  EXPECT_EQ(decode_base64("Zm8="), "fo");
  EXPECT_EQ(decode_base64("Zm9v"), "foo");
  EXPECT_EQ(decode_base64("Zm9vYg=="), "foob");
  EXPECT_EQ(decode_base64("Zm9vYmE="), "fooba");
  EXPECT_EQ(decode_base64("Zm9vYmFy"), "foobar");
}

TEST(Base64, PaddingMayBeLeftOut) {
  EXPECT_EQ(decode_base64("Zg"), "f");
  EXPECT_EQ(decode_base64("Zm8"), "fo");
  EXPECT_EQ(decode_base64("Zm9vYg"), "foob");
}

TEST(Base64, BothAlphabets) {
  EXPECT_EQ(decode_base64("+/8="), std::string("\xFB\xFF", 2));
  EXPECT_EQ(decode_base64("-_8="), std::string("\xFB\xFF", 2));
  EXPECT_EQ(decode_base64("-_8"), std::string("\xFB\xFF", 2));
}

TEST(Base64, WhitespaceIsIgnored) { EXPECT_EQ(decode_base64(" Zm9v\nYmFy\r\n"), "foobar"); }

TEST(Base64, RejectsWhatNoEncoderWrites) {
  EXPECT_FALSE(decode_base64("Z"));         // 6 bits left over
  EXPECT_FALSE(decode_base64("Zg="));       // padding that does not complete the group
  EXPECT_FALSE(decode_base64("Zg==="));     // too much padding
  EXPECT_FALSE(decode_base64("Zg==Zg=="));  // padding in the middle
  EXPECT_FALSE(decode_base64("Zm9v!"));     // outside both alphabets
  EXPECT_FALSE(decode_base64("ds_config.json"));
}

TEST(Base64, RoundTripOfEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  for (bool url : {false, true}) {
    for (bool pad : {false, true}) {
      for (size_t n = 0; n <= 5; ++n) {
        const std::string part = all.substr(100, n);
        EXPECT_EQ(decode_base64(encode_base64(part, url, pad)), part) << url << pad << n;
      }
      EXPECT_EQ(decode_base64(encode_base64(all, url, pad)), all);
    }
  }
}

// ---- load_config_argument: base64 and JSON strings ----

TEST(ConfigArgument, Base64ConfigInEveryVariant) {
  const nlohmann::ordered_json expected = nlohmann::ordered_json::parse(kConfig);
  for (bool url : {true, false}) {
    for (bool pad : {true, false}) {
      const std::string arg = encode_base64(kConfig, url, pad);
      ASSERT_NE(arg.find_first_of(url ? "-_" : "+/"), std::string::npos) << arg;
      ASSERT_EQ(arg.back() == '=', pad) << arg;  // kConfig's length is not a multiple of 3
      const ConfigText c = load_config_argument(arg);
      EXPECT_EQ(c.origin, "base64 string");
      EXPECT_EQ(c.tree.dump(), expected.dump());
    }
  }
}

TEST(ConfigArgument, Base64IsNotCheckedForDuplicateKeysLikeDeepSpeed) {
  const ConfigText c = load_config_argument(encode_base64(R"({"a": 1, "b": 2, "a": 3})", true, true));
  EXPECT_EQ(c.tree.dump(), R"({"a":3,"b":2})");
}

TEST(ConfigArgument, Base64OfHjsonText) {
  const ConfigText c = load_config_argument(encode_base64("# launcher\ntrain_batch_size: 8\n", true, false));
  EXPECT_EQ(c.tree.dump(), R"({"train_batch_size":8})");
}

TEST(ConfigArgument, JsonString) {
  const ConfigText c = load_config_argument("  {\"train_batch_size\": 8, fp16: {enabled: true}}");
  EXPECT_EQ(c.origin, "JSON string");
  EXPECT_EQ(c.tree.dump(), R"({"train_batch_size":8,"fp16":{"enabled":true}})");
}

TEST(ConfigArgument, JsonStringIsCheckedForDuplicateKeys) {
  EXPECT_THAT(error_of_argument(R"({"a": 1, "a": 2})"), HasSubstr("<JSON string>:1:10: duplicate key \"a\" (also at line 1)"));
}

TEST(ConfigArgument, JsonStringSyntaxErrorHasLineAndColumn) {
  EXPECT_EQ(error_of_argument(R"({"a" 1})"), "<JSON string>:1:6: expected ':' after the key \"a\" but found '1'; write \"a\": value");
}

TEST(ConfigArgument, NeitherPathNorJsonNorBase64) {
  EXPECT_EQ(error_of_argument("configs/ds_config.json"),
            "expected a path to an existing DeepSpeed config file, a JSON string, or base64 of one; "
            "got 'configs/ds_config.json' (no file by that name exists, and it is not base64)");
  EXPECT_THAT(error_of_argument(""), HasSubstr("got an empty string"));
}

TEST(ConfigArgument, Base64ThatDecodesToSomethingElse) {
  // Valid base64 by accident: a mistyped file name made only of base64 characters.
  EXPECT_THAT(error_of_argument("dsconfig"), HasSubstr("got 'dsconfig' (no file by that name exists, and its base64 decoding is not a config"));
  EXPECT_THAT(error_of_argument(encode_base64("[1, 2]", true, true)), HasSubstr("its base64 decoding is an array, not a JSON object"));
}

TEST(ConfigArgument, LongInputIsShortened) {
  const std::string arg(500, '!');
  const std::string message = error_of_argument(arg);
  EXPECT_THAT(message, HasSubstr("got '" + std::string(80, '!') + "... (500 characters)'"));
  EXPECT_LT(message.size(), 300u);
}

// ---- files ----

TEST_F(ConfigFiles, LoadsAFile) {
  const fs::path p = write("ds_config.json", "{\n  // comment\n  train_batch_size: 8,\n}\n");
  const ConfigText c = load_config_file(p);
  EXPECT_EQ(c.origin, "file " + p.string());
  EXPECT_EQ(c.tree.dump(), R"({"train_batch_size":8})");
}

TEST_F(ConfigFiles, LineEndingsAreTranslatedLikePythonTextMode) {
  // Python's open(path, "r") turns a lone '\r' into '\n', so this file has three lines for hjson
  // (and a root object without braces) even though it holds no '\n'.
  const fs::path p = write("mac.json", "# comment\rtrain_batch_size: 8\rfp16: true\r");
  EXPECT_EQ(load_config_file(p).tree.dump(), R"({"train_batch_size":8,"fp16":true})");
  const fs::path crlf = write("crlf.json", "{\r\n  \"a\": 1,\r\n  \"b\" 2\r\n}\r\n");
  EXPECT_THAT(error_of_file(crlf), HasSubstr(crlf.string() + ":3:7: expected ':' after the key \"b\""));
}

TEST_F(ConfigFiles, AnExistingPathWinsOverOtherReadings) {
  // "Zm9v" is valid base64, but a file of that name exists, so it is read as a file (as DeepSpeed).
  const fs::path p = write("Zm9v", R"({"a": 1})");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  const ConfigText c = load_config_argument("Zm9v");
  fs::current_path(cwd);
  EXPECT_EQ(c.origin, "file Zm9v");
  EXPECT_EQ(c.tree.dump(), R"({"a":1})");
  EXPECT_EQ(load_config_argument(p.string()).origin, "file " + p.string());
}

TEST_F(ConfigFiles, FileDuplicatesAreRejectedWithThePath) {
  const fs::path p = write("dup.json", "{\n \"zero_optimization\": {\n  \"stage\": 1,\n  \"stage\": 2\n }\n}\n");
  EXPECT_EQ(error_of_file(p), p.string() +
                                  ":4:3: duplicate key \"stage\" (also at line 3) in object at "
                                  "\"zero_optimization\"; DeepSpeed rejects duplicate keys — keep one");
  EXPECT_THAT(error_of_argument(p.string()), HasSubstr("duplicate key \"stage\""));
}

TEST_F(ConfigFiles, SyntaxErrorNamesTheFile) {
  const fs::path p = write("bad.json", "{\n  \"a\": 1\n");
  EXPECT_THAT(error_of_file(p), HasSubstr(p.string() + ":3:1: the input ends inside the object"));
}

TEST_F(ConfigFiles, MissingFile) {
  const fs::path p = dir_ / "nope.json";
  EXPECT_THAT(error_of_file(p), HasSubstr("DeepSpeed config file '" + p.string() + "' not found"));
}

TEST_F(ConfigFiles, Directory) {
  EXPECT_THAT(error_of_file(dir_), HasSubstr(dir_.string() + "' is a directory"));
  EXPECT_THAT(error_of_argument(dir_.string()), HasSubstr("is a directory"));
}

TEST_F(ConfigFiles, EmptyFile) {
  EXPECT_THAT(error_of_file(write("empty.json", "")), HasSubstr("empty.json' is empty"));
  EXPECT_THAT(error_of_file(write("blank.json", " \n\t\n")), HasSubstr("blank.json' is empty"));
}

TEST_F(ConfigFiles, RootMustBeAnObject) {
  const fs::path p = write("list.json", "[1, 2]\n");
  EXPECT_EQ(error_of_file(p), "file " + p.string() +
                                  ": the top-level value of a DeepSpeed config must be a JSON object "
                                  "{...}, but it is an array; wrap the settings in { }");
  EXPECT_THAT(error_of_file(write("str.json", "\"text\"")), HasSubstr("but it is a string"));
}

// A FIFO that no program writes to blocked the open forever. The watchdog opens it for writing
// after 2 s, so that a reader that blocks ends (reading nothing) rather than hanging the test.
TEST_F(ConfigFiles, FifoWithoutAWriterTimesOutNamingThePipe) {
  const fs::path p = dir_ / "fifo.json";
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const int fd = ::open(p.c_str(), O_WRONLY | O_NONBLOCK);  // fails (ENXIO) when no one reads any more
    if (fd >= 0) ::close(fd);
  });
  std::string error;
  try {
    load_config_file(p, std::chrono::milliseconds(200));
  } catch (const Error& e) {
    error = e.what();
  }
  watchdog.join();
  EXPECT_THAT(error, HasSubstr("'" + p.string() + "' is a named pipe (FIFO) and nothing was written to it within 0.2 s"));
}

// A pipe whose writer is slower than the open (`--deepspeed_config <(python make_config.py)`) is read.
TEST_F(ConfigFiles, FifoWithASlowWriterIsRead) {
  const fs::path p = dir_ / "slow_fifo.json";
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(p) << kConfig;
  });
  const ConfigText c = load_config_file(p);
  writer.join();
  EXPECT_EQ(c.tree["train_batch_size"], 8);
}
