// The corpus of real DeepSpeed configs (shared/ds_configs), read as DeepSpeed 0.19 reads them.
//
// The independent reference is the corpus's INDEX.md: its "features" column (ZeRO stage, precision,
// offload devices, which batch keys are present) was written from the files by the collector, and
// its "DS v0.19 check" column is what DeepSpeed's own pydantic models said of each file. For every
// file the test checks that:
//   - configs DeepSpeed accepts are accepted, and the resolved stage, precision, offload devices and
//     batch triple agree with the features column and the file's own batch values;
//   - configs DeepSpeed rejects are rejected with a message naming the key path — or accepted with a
//     warning naming the key where dstrain is deliberately more lenient (kLenient below);
//   - configs where dstrain is deliberately stricter than DeepSpeed are rejected with a message
//     naming the key (kStricter below, each with the reason);
//   - fragments/ parse as sections, and nonstrict/unparseable/ fail with line:column.
//
// Doc excerpts and fragments often carry no batch key; DeepSpeed needs one from its caller (the HF
// Trainer fills it), so the test supplies train_micro_batch_size_per_gpu = 1 there.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/config_source.h"
#include "config_schema/ds_config.h"
#include "ops/error.h"

namespace fs = std::filesystem;
using namespace dstrain;
using namespace dstrain::config;

namespace {

fs::path corpus_dir() {
  if (const char* env = std::getenv("DSTRAIN_DS_CONFIGS"); env != nullptr && *env != '\0') return env;
  return fs::path(DSTRAIN_SOURCE_DIR) / ".." / "shared" / "ds_configs";
}

struct IndexRow {
  std::string folder;  // "", "fragments", "nonstrict", "nonstrict/unparseable", "shell_heredoc"
  std::string file;
  std::set<std::string> features;
  std::string ds_check;  // empty = DeepSpeed 0.19's validation passes
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Parses the per-folder tables of INDEX.md: "## `folder` (N files)" then rows
// "| `file` | origin | features | DS v0.19 check | notes |".
std::vector<IndexRow> read_index(const fs::path& index) {
  std::ifstream in(index);
  std::vector<IndexRow> rows;
  std::string line, folder;
  bool in_folder_section = false;
  const std::regex heading(R"(^## `([^`]*)` \(\d+ files\))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, heading)) {
      folder = m[1] == "." ? "" : std::string(m[1]);
      in_folder_section = true;
      continue;
    }
    if (line.rfind("## ", 0) == 0) in_folder_section = false;
    if (!in_folder_section || line.rfind("| `", 0) != 0) continue;
    const auto cells = split(line, '|');
    if (cells.size() < 6) continue;
    IndexRow r;
    r.folder = folder;
    r.file = trim(cells[1]);
    r.file = r.file.substr(1, r.file.size() - 2);  // strip the backticks
    for (const auto& f : split(trim(cells[3]), ' '))
      if (!f.empty()) r.features.insert(f);
    r.ds_check = trim(cells[4]);
    rows.push_back(r);
  }
  return rows;
}

// Where dstrain is deliberately stricter than DeepSpeed 0.19: files DeepSpeed's validation passes
// that dstrain rejects, with the text the error must contain and why.
const std::map<std::string, std::string> kStricter = {
    // "auto" that nothing on dstrain's command line derives: DeepSpeed would silently use the
    // default (ZeRO off, no 16-bit gather, 1e9 live parameters); HF Accelerate fills these itself.
    {"accelerate__docs__source__usage_guides__deepspeed__2.json", "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    {"accelerate__examples__deepspeed_config_templates__zero_stage3_config.json", "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    {"accelerate__examples__deepspeed_config_templates__zero_stage3_offload_config.json",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    {"accelerate__tests__deepspeed__ds_config_zero3.json", "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    {"accelerate__docs__source__usage_guides__deepspeed__5.json", "zero_optimization.stage"},
    {"accelerate__docs__source__usage_guides__deepspeed_multiple_model__1.json", "zero_optimization.stage3_max_live_parameters"},
    // Checks DeepSpeed makes later, in the engine, are made at parse time here.
    {"DeepSpeed__tests__model__BingBertSquad__deepspeed_bsz24_fp16_eigenvalue_quantize_config.json",
     "eigenvalue.enabled"},  // DeepSpeed asserts "temporarily disabled" at initialize
    {"DeepSpeed__docs___tutorials__mixture-of-experts__2.json",
     "fp16.fp16_master_weights_and_grads"},  // a fragment without ZeRO: DeepSpeed asserts ZeRO 1-3
    {"DeepSpeed__docs___pages__config-json__30.json",
     "elasticity.max_train_batch_size"},  // the doc's placeholder "seqlen": DeepSpeed's arithmetic crashes
};

// Where dstrain is deliberately more lenient: DeepSpeed's check column flags the file, dstrain
// accepts it with a warning naming the key (DeepSpeed too accepts these; it just ignores the key).
bool lenient(const std::string& ds_check) { return ds_check.rfind("ignored-top-level:", 0) == 0 || ds_check.rfind("aio-ignored:", 0) == 0; }

// A template placeholder ("train_batch_size": CONFIG_BATCH_SIZE) reads as a string in hjson.
bool is_template(const IndexRow& r) { return r.file.find("TEMPLATE") != std::string::npos; }

std::int64_t num(const Json& j, const char* key) { return j.contains(key) && j.at(key).is_number_integer() ? j.at(key).get<std::int64_t>() : 0; }

struct Outcome {
  bool accepted = false;
  std::string error;
  DsConfig config;
  Json resolved;
  std::int64_t world = 1;
  Json raw;
};

Outcome run(const IndexRow& r) {
  Outcome o;
  const fs::path path = corpus_dir() / r.folder / r.file;
  try {
    ConfigText text = load_config_file(path);
    Json j = text.tree;
    o.raw = j;
    const bool has_batch = (j.contains("train_batch_size") && !j.at("train_batch_size").is_null()) ||
                           (j.contains("train_micro_batch_size_per_gpu") && !j.at("train_micro_batch_size_per_gpu").is_null());
    if (!has_batch) j["train_micro_batch_size_per_gpu"] = 1;

    // The world size the config was written for: the data-parallel size that makes its own triple
    // consistent, times the ranks of a model replica (sequence_parallel_size x
    // tensor_parallel.autotp_size: the mesh must divide the world, docs/batch.md §1).
    ConfigOptions options;
    const std::int64_t tbs = num(j, "train_batch_size"), mbs = num(j, "train_micro_batch_size_per_gpu"), gas = num(j, "gradient_accumulation_steps");
    if (tbs > 0 && mbs > 0 && gas > 0 && tbs % (mbs * gas) == 0) options.world_size = tbs / (mbs * gas);
    const std::int64_t sp = std::max<std::int64_t>(1, num(j, "sequence_parallel_size"));
    const std::int64_t tp = j.contains("tensor_parallel") && j.at("tensor_parallel").is_object()
                                ? std::max<std::int64_t>(1, num(j.at("tensor_parallel"), "autotp_size"))
                                : 1;
    // expert_parallel.autoep_size splits the data-parallel ranks: it must divide them.
    const std::int64_t ep = j.contains("expert_parallel") && j.at("expert_parallel").is_object() &&
                                    j.at("expert_parallel").contains("enabled") && j.at("expert_parallel").at("enabled") == true
                                ? std::max<std::int64_t>(1, num(j.at("expert_parallel"), "autoep_size"))
                                : 1;
    if (options.world_size % ep != 0) options.world_size *= ep;
    options.world_size *= sp * tp;
    o.world = options.world_size;

    // What the HF Trainer would pass for "auto" values (precision from the features column).
    AutoValues& a = options.autos;
    a.train_micro_batch_size_per_gpu = 2;
    a.gradient_accumulation_steps = 1;
    a.hidden_size = 1024;
    a.gradient_clipping = 1.0;
    a.lr = 1e-4;
    a.eps = 1e-8;
    a.weight_decay = 0.0;
    a.betas = std::make_pair(0.9, 0.999);
    a.total_num_steps = 1000;
    a.warmup_num_steps = 100;
    a.precision = r.features.count("fp16=auto") ? "fp16" : "bf16";

    o.config = parse_ds_config(j, options);
    o.resolved = o.config.to_json();
    o.accepted = true;
  } catch (const Error& e) {
    o.error = e.what();
  }
  return o;
}

class Corpus : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::is_directory(corpus_dir()))
      GTEST_SKIP() << "corpus folder " << corpus_dir() << " not found (a user's clone has no ../shared); set DSTRAIN_DS_CONFIGS";
    rows_ = read_index(corpus_dir() / "INDEX.md");
    ASSERT_GT(rows_.size(), 250u) << "INDEX.md tables not found or changed format";
  }
  std::vector<IndexRow> rows_;
};

}  // namespace

TEST_F(Corpus, EveryIndexedFileExists) {
  for (const auto& r : rows_) EXPECT_TRUE(fs::is_regular_file(corpus_dir() / r.folder / r.file)) << r.folder << "/" << r.file;
}

TEST_F(Corpus, AcceptedOrRejectedAsDeepSpeedDoes) {
  int accepted = 0, rejected = 0;
  for (const auto& r : rows_) {
    if (r.folder == "nonstrict/unparseable") continue;
    SCOPED_TRACE(r.folder + "/" + r.file);
    const Outcome o = run(r);
    if (auto s = kStricter.find(r.file); s != kStricter.end()) {
      EXPECT_FALSE(o.accepted) << "expected dstrain's stricter rejection";
      EXPECT_NE(o.error.find(s->second), std::string::npos) << o.error;
      ++rejected;
      continue;
    }
    if (r.ds_check.empty() && !is_template(r)) {
      EXPECT_TRUE(o.accepted) << "DeepSpeed accepts this config; dstrain said: " << o.error;
      accepted += o.accepted;
      continue;
    }
    if (lenient(r.ds_check)) {
      // "ignored-top-level:cuda_visible_devices" / "aio-ignored:thread_count": accepted, with a
      // warning that names the key.
      const std::string key = r.ds_check.substr(r.ds_check.find(':') + 1);
      ASSERT_TRUE(o.accepted) << o.error;
      bool named = false;
      for (const auto& w : o.config.warnings) named |= (w.path + " " + w.message).find(key) != std::string::npos;
      EXPECT_TRUE(named) << "no warning names " << key;
      ++accepted;
      continue;
    }
    // DeepSpeed rejects it (or it is a template with unfilled placeholders): so do we, naming the
    // key path of the first problem DeepSpeed names.
    EXPECT_FALSE(o.accepted) << "DeepSpeed rejects this config (" << r.ds_check << ")";
    if (r.ds_check.find("optimizer.params.max_grad_norm") != std::string::npos) {
      EXPECT_NE(o.error.find("optimizer.params.max_grad_norm"), std::string::npos) << o.error;
    } else if (r.ds_check.rfind("zero:", 0) == 0 && !is_template(r)) {
      EXPECT_NE(o.error.find("zero_optimization."), std::string::npos) << o.error;
    } else if (is_template(r)) {
      // The first placeholder is named with its key, e.g. train_batch_size: "CONFIG_BATCH_SIZE,".
      EXPECT_TRUE(std::regex_search(o.error, std::regex(R"(^[a-z_.]+: invalid value ")"))) << o.error;
    }
    ++rejected;
  }
  // Counts at the time of writing, so a silent change in either direction shows up here.
  EXPECT_EQ(accepted, 215);
  EXPECT_EQ(rejected, 38);
}

TEST_F(Corpus, ResolvedValuesAgreeWithTheFeaturesColumn) {
  int checked = 0, stage_checks = 0, precision_checks = 0, offload_checks = 0;
  for (const auto& r : rows_) {
    if (r.folder == "nonstrict/unparseable" || kStricter.count(r.file) || is_template(r)) continue;
    if (!r.ds_check.empty() && !lenient(r.ds_check)) continue;
    SCOPED_TRACE(r.folder + "/" + r.file);
    const Outcome o = run(r);
    ASSERT_TRUE(o.accepted) << o.error;
    const Json& z = o.resolved.at("zero_optimization");
    for (const auto& f : r.features) {
      if (f.size() == 5 && f.rfind("zero", 0) == 0 && std::isdigit(static_cast<unsigned char>(f[4]))) {
        EXPECT_EQ(z.at("stage"), f[4] - '0') << f;
        ++stage_checks;
      }
      if (f == "zero=true(depr)") {
        EXPECT_EQ(z.at("stage"), 1);
      }
      if (f == "fp16") {
        EXPECT_EQ(o.config.precision(), Precision::fp16);
        ++precision_checks;
      }
      if (f == "bf16" || f == "bfloat16(old)") {
        EXPECT_EQ(o.config.precision(), Precision::bf16);
        ++precision_checks;
      }
      if (f == "cpu_offload(depr)") {
        EXPECT_EQ(z.at("offload_optimizer").at("device"), "cpu");
      }
      for (const char* prefix : {"off_optimizer=", "off_param="}) {
        const std::string p(prefix);
        if (f.rfind(p, 0) != 0) continue;
        const std::string device = f.substr(p.size());
        if (device == "auto") continue;  // Accelerate's "auto" device: dropped to the default by DeepSpeed
        const char* key = p == "off_optimizer=" ? "offload_optimizer" : "offload_param";
        ASSERT_TRUE(z.contains(key) && z.at(key).is_object()) << key;
        EXPECT_EQ(z.at(key).at("device"), device) << f;
        ++offload_checks;
      }
    }
    // The batch triple: consistent, and equal to every value the file itself gives.
    const std::int64_t tbs = o.config.train_batch_size, mbs = o.config.train_micro_batch_size_per_gpu, gas = o.config.gradient_accumulation_steps;
    EXPECT_EQ(tbs, mbs * gas * o.config.data_parallel_world_size);
    for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
      if (o.raw.contains(key) && o.raw.at(key).is_number_integer()) {
        EXPECT_EQ(o.resolved.at(key), o.raw.at(key)) << key;
      }
    ++checked;
  }
  EXPECT_GT(checked, 200);
  // The spot checks really ran (counts of tagged files at the time of writing).
  EXPECT_GT(stage_checks, 100);
  EXPECT_GT(precision_checks, 80);
  EXPECT_GT(offload_checks, 20);
  std::printf("corpus: %d configs, %d stage, %d precision, %d offload spot checks\n", checked, stage_checks, precision_checks, offload_checks);
}

TEST_F(Corpus, UnparseableFilesFailWithLineAndColumn) {
  int n = 0;
  for (const auto& r : rows_) {
    if (r.folder != "nonstrict/unparseable") continue;
    SCOPED_TRACE(r.file);
    const Outcome o = run(r);
    EXPECT_FALSE(o.accepted);
    EXPECT_TRUE(std::regex_search(o.error, std::regex(R"(:\d+:\d+: )"))) << o.error;
    ++n;
  }
  EXPECT_EQ(n, 15);
}
