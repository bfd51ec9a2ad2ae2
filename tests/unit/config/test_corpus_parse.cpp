// The reader against the corpus of real DeepSpeed configs (../shared/ds_configs, see its INDEX.md).
//
//   strict (top level, shell_heredoc/): parse_hjson gives the tree nlohmann::json::parse gives —
//     same keys in the same order, same strings, same integers — except where hjson-py turns a
//     whole float below 1e10 into an int (1.0 -> 1), which we copy on purpose;
//   fragments/, nonstrict/: parse, and load as a config (root object, no duplicate keys);
//   nonstrict/unparseable/: fail with an Error that has line:column;
//   nonstrict/ vs hjson-cli (Debian package hjson-go), an independent Hjson parser, when installed.
//     hjson-go keeps every number as a float64 and prints keys sorted, so that comparison is by
//     numeric value and ignores key order.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/config_source.h"
#include "config_schema/hjson_reader.h"
#include "ops/error.h"

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

fs::path corpus_dir() {
  if (const char* env = std::getenv("DSTRAIN_DS_CONFIGS"); env != nullptr && *env != '\0') return env;
  return fs::path(DSTRAIN_SOURCE_DIR) / ".." / "shared" / "ds_configs";
}

#define REQUIRE_CORPUS(dir)                                                                                            \
  const fs::path dir = corpus_dir();                                                                                   \
  if (!fs::is_directory(dir)) {                                                                                        \
    GTEST_SKIP() << "corpus folder " << dir << " not found (a user's clone has no ../shared); set DSTRAIN_DS_CONFIGS"; \
  }

// The *.json files directly inside `dir`, sorted so failures read in a stable order.
std::vector<fs::path> json_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Json parse_file(const fs::path& p) {
  dstrain::HjsonOptions opts;
  opts.source_name = p.filename().string();
  return dstrain::parse_hjson(read_file(p), opts);
}

// "" when `mine` is `ref` exactly (order, types, values), allowing only hjson-py's collapse of a
// whole float below 1e10 to an int; otherwise where and how they differ.
std::string strict_difference(const Json& mine, const Json& ref, const std::string& at) {
  const std::string where = at.empty() ? "(root)" : at;
  if (ref.is_number_float()) {
    const double v = ref.get<double>();
    if (std::trunc(v) == v && std::fabs(v) < 1e10) {
      if (mine.is_number_integer() && mine.get<double>() == v) return "";
      return where + ": expected the int " + ref.dump() + " (hjson-py collapses whole floats), got " + mine.dump();
    }
    if (mine.is_number_float() && mine.get<double>() == v) return "";
    return where + ": expected the float " + ref.dump() + ", got " + mine.dump();
  }
  if (mine.type() != ref.type()) return where + ": expected " + ref.dump() + ", got " + mine.dump();
  if (ref.is_object()) {
    if (mine.size() != ref.size()) return where + ": " + std::to_string(mine.size()) + " keys, expected " + std::to_string(ref.size());
    auto m = mine.begin();
    for (auto r = ref.begin(); r != ref.end(); ++r, ++m) {
      if (m.key() != r.key()) return where + ": key \"" + m.key() + "\" where \"" + r.key() + "\" was expected";
      if (auto d = strict_difference(*m, *r, at.empty() ? r.key() : at + "." + r.key()); !d.empty()) return d;
    }
    return "";
  }
  if (ref.is_array()) {
    if (mine.size() != ref.size()) return where + ": array sizes differ";
    for (size_t i = 0; i < ref.size(); ++i) {
      if (auto d = strict_difference(mine[i], ref[i], at + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    }
    return "";
  }
  return mine == ref ? "" : where + ": expected " + ref.dump() + ", got " + mine.dump();
}

// "" when the trees hold the same keys and values, numbers compared as doubles, key order ignored.
std::string numeric_difference(const Json& mine, const Json& ref, const std::string& at) {
  const std::string where = at.empty() ? "(root)" : at;
  if (mine.is_number() && ref.is_number()) {
    return mine.get<double>() == ref.get<double>() ? "" : where + ": " + mine.dump() + " vs " + ref.dump();
  }
  if (mine.type() != ref.type()) return where + ": " + mine.dump() + " vs " + ref.dump();
  if (ref.is_object()) {
    if (mine.size() != ref.size()) return where + ": different key sets";
    for (auto r = ref.begin(); r != ref.end(); ++r) {
      if (!mine.contains(r.key())) return where + ": missing key \"" + r.key() + "\"";
      if (auto d = numeric_difference(mine[r.key()], *r, at.empty() ? r.key() : at + "." + r.key()); !d.empty()) return d;
    }
    return "";
  }
  if (ref.is_array()) {
    if (mine.size() != ref.size()) return where + ": array sizes differ";
    for (size_t i = 0; i < ref.size(); ++i) {
      if (auto d = numeric_difference(mine[i], ref[i], at + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    }
    return "";
  }
  return mine == ref ? "" : where + ": " + mine.dump() + " vs " + ref.dump();
}

bool have_hjson_cli() { return std::system("command -v hjson-cli >/dev/null 2>&1") == 0; }

// hjson-cli's compact JSON for `p`, or nullopt when it rejects the file.
std::optional<Json> hjson_go(const fs::path& p) {
  std::string quoted = "'";
  for (const char c : p.string()) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  FILE* pipe = ::popen(("hjson-cli -c " + quoted + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  if (::pclose(pipe) != 0) return std::nullopt;
  return Json::parse(out);
}

}  // namespace

TEST(CorpusParse, StrictFilesGiveTheSameTreeAsAJsonParser) {
  REQUIRE_CORPUS(dir);
  std::vector<fs::path> files = json_files(dir);
  const std::vector<fs::path> heredocs = json_files(dir / "shell_heredoc");
  files.insert(files.end(), heredocs.begin(), heredocs.end());
  ASSERT_GT(files.size(), 100u) << "the corpus at " << dir << " looks incomplete";
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string text = read_file(f);
    Json mine, ref;
    ASSERT_NO_THROW(mine = parse_file(f));
    ASSERT_NO_THROW(ref = Json::parse(text));
    EXPECT_EQ(strict_difference(mine, ref, ""), "");
    EXPECT_NO_THROW(dstrain::load_config_file(f));  // an object, no duplicate keys
  }
}

TEST(CorpusParse, FragmentsParse) {
  REQUIRE_CORPUS(dir);
  const auto files = json_files(dir / "fragments");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    EXPECT_NO_THROW(dstrain::load_config_file(f));
  }
}

TEST(CorpusParse, NonstrictFilesParseAsHjson) {
  REQUIRE_CORPUS(dir);
  const auto files = json_files(dir / "nonstrict");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    EXPECT_NO_THROW(dstrain::load_config_file(f));
    EXPECT_ANY_THROW(Json::parse(read_file(f)));  // they are in nonstrict/ because JSON rejects them
  }
  // The template hazard: a bare placeholder is a string that keeps its comma.
  const fs::path tpl = dir / "nonstrict" / "Megatron-DeepSpeed__examples_deepspeed__rebase__ds_config_gpt_TEMPLATE.json";
  if (fs::exists(tpl)) {
    const Json t = parse_file(tpl);
    EXPECT_EQ(t["train_batch_size"], "GBSIZE,");
    EXPECT_EQ(t["zero_optimization"]["stage"], "ZERO_STAGE");
    EXPECT_EQ(t["gradient_clipping"].dump(), "1");  // written 1.0; hjson-py gives the int 1
  }
}

TEST(CorpusParse, UnparseableFilesFailWithLineAndColumn) {
  REQUIRE_CORPUS(dir);
  const auto files = json_files(dir / "nonstrict" / "unparseable");
  ASSERT_FALSE(files.empty());
  const std::regex located(R"(^[^\n]*\.json:[0-9]+:[0-9]+: )");
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    try {
      parse_file(f);
      ADD_FAILURE() << "parsed, but hjson rejects this file";
    } catch (const dstrain::Error& e) {
      EXPECT_TRUE(std::regex_search(e.what(), located)) << e.what();
    }
  }
}

TEST(CorpusParse, NonstrictFilesMatchHjsonGo) {
  REQUIRE_CORPUS(dir);
  if (!have_hjson_cli()) {
    GTEST_SKIP() << "hjson-cli not found (Debian package hjson-go); skipped the comparison with an "
                    "independent Hjson parser";
  }
  const auto files = json_files(dir / "nonstrict");
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::optional<Json> reference = hjson_go(f);
    ASSERT_TRUE(reference.has_value()) << "hjson-cli rejected it";
    EXPECT_EQ(numeric_difference(parse_file(f), *reference, ""), "");
  }
  for (const auto& f : json_files(dir / "nonstrict" / "unparseable")) {
    EXPECT_FALSE(hjson_go(f).has_value()) << f << ": hjson-cli accepts a file we reject";
  }
}
