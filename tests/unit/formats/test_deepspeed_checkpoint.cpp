// read_deepspeed_checkpoint (formats/deepspeed_checkpoint.h) against folders written by torch.save
// in DeepSpeed's layout (tests/integration/deepspeed_checkpoint_fixture.py, /usr/bin/python3 with
// Debian's python3-torch): stages 0, 1, 2, 3 x fp32 / fp16 / bf16 x DP 1, 2, 4 of a GPT-2-like model,
// a few cells per stage of a Llama, and ds_to_universal's output of some of them, every value compared
// exactly with the whole values the script wrote; and hostile folders (truncated file, lying shape,
// missing rank file, `latest` / `latest_universal` naming another or an outside folder, a pickle
// asking for os.system, a universal folder missing fp32.pt or a parameter, an exp_avg of another
// shape, a model-parallel universal), each an Error naming the file. Plus the value tree (formats/torch_pickle.h) on its own.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed_checkpoint.h"
#include "formats/torch_pickle.h"
#include "ops/error.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

class DeepSpeedCheckpointTest : public ::testing::Test {
 protected:
  // One python3 run (importing torch takes seconds) writes every folder the tests read.
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("dstrain_ds_ckpt_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    have_torch_ = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (have_torch_) {
      const std::string cmd = "/usr/bin/python3 " DSTRAIN_SOURCE_DIR "/tests/integration/deepspeed_checkpoint_fixture.py '" + dir_.string() + "' --all";
      made_ = std::system(cmd.c_str()) == 0;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!have_torch_) GTEST_SKIP() << "/usr/bin/python3 with torch is not installed (scripts/setup.sh)";
    ASSERT_TRUE(made_) << "deepspeed_checkpoint_fixture.py failed";
  }
  // A fresh copy of a fixture folder, to damage.
  static fs::path copy_of(const std::string& name, const std::string& as) {
    const fs::path to = dir_ / as;
    fs::remove_all(to);
    fs::copy(dir_ / name, to, fs::copy_options::recursive);
    return to;
  }
  static std::string error_of(const fs::path& p, const std::string& tag = "") {
    try {
      (void)read_deepspeed_checkpoint(p, tag);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  static inline fs::path dir_;
  static inline bool have_torch_ = false, made_ = false;
};

void expect_values(const std::map<std::string, std::vector<float>>& got, const nlohmann::json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, values] : want.items()) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << " " << name;
    ASSERT_EQ(it->second.size(), values.size()) << what << " " << name;
    for (std::size_t k = 0; k < values.size(); ++k) {
      ASSERT_EQ(it->second[k], static_cast<float>(values[k].get<double>())) << what << " " << name << "[" << k << "]";
    }
  }
}

// Every value of the folder `name` as its expected.json says: names, shapes, masters, module weights,
// moments, step, optimizer, param groups, counters, schedule, ds_config, loss scaler.
DeepSpeedTrainingState expect_cell(const fs::path& folder, const std::string& dtype, int stage, int dp) {
  std::ifstream in(folder / "expected.json");
  const nlohmann::json want = nlohmann::json::parse(in);
  EXPECT_TRUE(is_deepspeed_checkpoint(folder));
  const DeepSpeedTrainingState st = read_deepspeed_checkpoint(folder);
  EXPECT_EQ(st.tag, want["tag"].get<std::string>());
  EXPECT_EQ(st.dir, folder / want["tag"].get<std::string>());
  EXPECT_EQ(st.zero_stage, stage);
  EXPECT_EQ(st.dp_world_size, dp);
  EXPECT_EQ(st.dtype, dtype);
  EXPECT_EQ(st.names, want["names"].get<std::vector<std::string>>());
  for (const auto& [n, s] : want["shapes"].items()) EXPECT_EQ(st.shapes.at(n), s.get<std::vector<std::int64_t>>()) << n;
  expect_values(st.master, want["master"], "master");
  expect_values(st.module, want["module"], "module");
  EXPECT_EQ(st.optimizer_states.size(), 2u);
  if (st.optimizer_states.size() != 2u) return st;
  expect_values(st.optimizer_states.at("exp_avg"), want["exp_avg"], "exp_avg");
  expect_values(st.optimizer_states.at("exp_avg_sq"), want["exp_avg_sq"], "exp_avg_sq");
  EXPECT_EQ(st.optimizer_step, want["step"].get<std::int64_t>());
  EXPECT_EQ(st.optimizer_type, want["optimizer_type"].get<std::string>());
  for (const auto& [k, v] : want["param_group"].items()) EXPECT_EQ(st.param_group.at(k), v.get<double>()) << k;
  EXPECT_EQ(st.groups.size(), want["groups"].size());
  for (std::size_t g = 0; g < st.groups.size() && g < want["groups"].size(); ++g) {
    EXPECT_EQ(st.groups[g].names, want["groups"][g]["names"].get<std::vector<std::string>>()) << "group " << g;
    EXPECT_EQ(st.groups[g].weight_decay, want["groups"][g]["weight_decay"].get<double>()) << "group " << g;
  }
  EXPECT_EQ(st.global_steps, want["global_steps"].get<std::int64_t>());
  EXPECT_EQ(st.global_samples, want["global_samples"].get<std::int64_t>());
  EXPECT_EQ(st.skipped_steps, want["skipped_steps"].get<std::int64_t>());
  EXPECT_TRUE(st.lr_scheduler_json.has_value());
  if (st.lr_scheduler_json) {
    EXPECT_EQ(nlohmann::json::parse(*st.lr_scheduler_json), want["lr_scheduler"]);
  }
  EXPECT_TRUE(st.ds_config_json.has_value());
  if (st.ds_config_json) {
    EXPECT_EQ(nlohmann::json::parse(*st.ds_config_json), want["ds_config"]);
  }
  if (want["loss_scaler"].is_null()) {
    EXPECT_FALSE(st.loss_scaler.has_value());
  } else if (st.loss_scaler) {
    const nlohmann::json& ls = want["loss_scaler"];
    EXPECT_EQ(st.loss_scaler->cur_scale, ls["cur_scale"].get<double>());
    EXPECT_EQ(st.loss_scaler->cur_iter, ls["cur_iter"].get<std::int64_t>());
    EXPECT_EQ(st.loss_scaler->last_overflow_iter, ls["last_overflow_iter"].get<std::int64_t>());
    EXPECT_EQ(st.loss_scaler->cur_hysteresis, ls["cur_hysteresis"].get<std::int64_t>());
    EXPECT_EQ(st.loss_scaler->dynamic, ls["dynamic"].get<bool>());
  } else {
    ADD_FAILURE() << "no loss scaler read";
  }
  // The tag folder itself, and the tag named explicitly, read the same.
  EXPECT_EQ(read_deepspeed_checkpoint(st.dir).master, st.master);
  EXPECT_EQ(read_deepspeed_checkpoint(folder, st.tag).optimizer_states, st.optimizer_states);
  return st;
}

TEST_F(DeepSpeedCheckpointTest, EveryStageDtypeAndDataParallelSizeGivesTheSavedValues) {
  for (const int stage : {0, 1, 2, 3}) {
    for (const std::string dtype : {"fp32", "fp16", "bf16"}) {
      for (const int dp : {1, 2, 4}) {
        // Appended piece by piece: g++ 12 warns (-Wrestrict, falsely) on "s" + std::to_string(...) here.
        std::string name = "s";
        name += std::to_string(stage) + "_" + dtype + "_dp" + std::to_string(dp);
        SCOPED_TRACE(name);
        (void)expect_cell(dir_ / name, dtype, stage, dp);
      }
    }
  }
}

struct CellName {
  int stage;
  std::string dtype;
  int dp;
  std::string name(const std::string& prefix) const { return prefix + "s" + std::to_string(stage) + "_" + dtype + "_dp" + std::to_string(dp); }
};

// A Llama (GQA: k_proj / v_proj of fewer rows than q_proj; SwiGLU; untied lm_head) saved without
// "module." — the names DeepSpeed's engine.param_names really has — at every stage x dtype x DP.
TEST_F(DeepSpeedCheckpointTest, LlamaCellsGiveTheSavedValues) {
  std::vector<CellName> cells;
  for (const int stage : {0, 1, 2, 3})
    for (const char* dtype : {"fp32", "fp16", "bf16"})
      for (const int dp : {1, 2, 4}) cells.push_back({stage, dtype, dp});
  for (const CellName& c : cells) {
    SCOPED_TRACE(c.name("llama_"));
    const DeepSpeedTrainingState st = expect_cell(dir_ / c.name("llama_"), c.dtype, c.stage, c.dp);
    EXPECT_EQ(st.shapes.at("model.layers.0.self_attn.k_proj.weight"), (std::vector<std::int64_t>{4, 8}));
    EXPECT_EQ(st.names.front(), "model.embed_tokens.weight");
  }
}

// ds_to_universal's output (the fixture's to_universal, from the save_checkpoint folders above):
// the same state as its source folder, every value; the module weights are the masters.
TEST_F(DeepSpeedCheckpointTest, UniversalCheckpointsGiveTheSavedValues) {
  for (const auto& [prefix, c] : std::vector<std::pair<std::string, CellName>>{{"", {1, "bf16", 2}},
                                                                               {"", {1, "fp16", 4}},
                                                                               {"", {2, "fp32", 2}},
                                                                               {"", {2, "bf16", 1}},
                                                                               {"", {3, "bf16", 4}},
                                                                               {"", {3, "fp32", 2}},
                                                                               {"", {3, "fp16", 1}},
                                                                               {"llama_", {2, "bf16", 4}},
                                                                               {"llama_", {3, "fp16", 4}}}) {
    const std::string src = c.name(prefix);
    SCOPED_TRACE("u_" + src);
    const fs::path u = dir_ / ("u_" + src);
    ASSERT_TRUE(fs::is_directory(u / "global_step10_universal" / "zero"));
    ASSERT_FALSE(fs::exists(u / "latest"));  // read through latest_universal
    const DeepSpeedTrainingState st = expect_cell(u, c.dtype, c.stage, c.dp);
    const DeepSpeedTrainingState orig = read_deepspeed_checkpoint(dir_ / src);
    EXPECT_EQ(st.master, orig.master);
    EXPECT_EQ(st.optimizer_states, orig.optimizer_states);
    EXPECT_EQ(st.optimizer_step, orig.optimizer_step);
    EXPECT_EQ(st.lr_scheduler_json, orig.lr_scheduler_json);
  }
}

// A vocabulary parameter (universal_checkpoint_info's vocabulary_parameter_patterns): ds_to_universal
// cut wte to original_vocab_size 5 rows ("vocab_tensor": True) while param_shapes keep 7; the state
// holds the real vocabulary.
TEST_F(DeepSpeedCheckpointTest, AUniversalVocabularyTensorKeepsTheRealVocabulary) {
  const DeepSpeedTrainingState st = expect_cell(dir_ / "u_vocab", "fp32", 2, 2);
  EXPECT_EQ(st.shapes.at("transformer.wte.weight"), (std::vector<std::int64_t>{5, 4}));
  EXPECT_EQ(st.master.at("transformer.wte.weight").size(), 20u);
  EXPECT_EQ(st.optimizer_states.at("exp_avg").at("transformer.wte.weight").size(), 20u);
}

TEST_F(DeepSpeedCheckpointTest, AHostileUniversalCheckpointIsRefusedNamingFileAndCause) {
  const std::string p = "module.transformer.h.0.mlp.c_fc.weight";
  // param_shapes one row longer than fp32.pt.
  std::string e = error_of(dir_ / "u_lie");
  EXPECT_NE(e.find("global_step10_universal/zero/" + p + "/fp32.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("is 3x3, but param_shapes of"), std::string::npos) << e;
  EXPECT_NE(e.find("say 4x3"), std::string::npos) << e;
  // An exp_avg of another shape than its fp32.pt.
  e = error_of(dir_ / "u_bad_moment");
  EXPECT_NE(e.find(p + "/exp_avg.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("is 2x3, but param_shapes"), std::string::npos) << e;
  // A missing fp32.pt; a missing parameter folder; a folder param_shapes does not name.
  fs::path d = copy_of("u_s2_fp32_dp2", "u_no_fp32");
  const fs::path zero = d / "global_step10_universal" / "zero";
  fs::remove(zero / p / "fp32.pt");
  e = error_of(d);
  EXPECT_NE(e.find((zero / p / "fp32.pt").string() + "' is missing"), std::string::npos) << e;
  fs::remove_all(zero / p);
  e = error_of(d);
  EXPECT_NE(e.find("the parameter folder '" + (zero / p).string() + "' is missing"), std::string::npos) << e;
  fs::copy(zero / "module.transformer.h.0.ln_1.bias", zero / p, fs::copy_options::recursive);
  fs::copy(zero / "module.transformer.h.0.ln_1.bias", zero / "module.extra.weight", fs::copy_options::recursive);
  e = error_of(d);
  EXPECT_NE(e.find("'" + (zero / "module.extra.weight").string() + "' is not in the param_shapes"), std::string::npos) << e;
  // No optimizer_state.pt.
  d = copy_of("u_s3_fp32_dp2", "u_no_opt");
  fs::remove(d / "global_step10_universal" / "zero" / "optimizer_state.pt");
  e = error_of(d);
  EXPECT_NE(e.find("zero/optimizer_state.pt' is missing"), std::string::npos) << e;
}

// latest_universal is a tag like latest: a folder that is not there, a path out of the folder, a
// link to a folder elsewhere — each refused naming the file.
TEST_F(DeepSpeedCheckpointTest, ALatestUniversalNamingAnAbsentOrEscapingFolderIsRefused) {
  const fs::path d = copy_of("u_s1_bf16_dp2", "u_bad_latest");
  const std::string named = "'" + (d / "latest_universal").string() + "'";
  std::ofstream(d / "latest_universal", std::ios::trunc) << "global_step99_universal";
  std::string e = error_of(d);
  EXPECT_NE(e.find(named + " names the tag 'global_step99_universal', but the folder"), std::string::npos) << e;
  std::ofstream(d / "latest_universal", std::ios::trunc) << "../u_s2_fp32_dp2/global_step10_universal";
  e = error_of(d);
  EXPECT_NE(e.find(named + " names the tag '../u_s2_fp32_dp2/global_step10_universal', which is not the name of a folder inside"), std::string::npos) << e;
  fs::create_directory_symlink(dir_ / "u_s2_fp32_dp2" / "global_step10_universal", d / "elsewhere");
  std::ofstream(d / "latest_universal", std::ios::trunc) << "elsewhere";
  e = error_of(d);
  EXPECT_NE(e.find("lies outside"), std::string::npos) << e;
  std::ofstream(d / "latest_universal", std::ios::trunc) << "global_step10_universal";
  EXPECT_EQ(read_deepspeed_checkpoint(d).tag, "global_step10_universal");
  // With both, `latest` is read (the save_checkpoint folder: exact, module weights as saved).
  fs::copy(dir_ / "s1_bf16_dp2" / "global_step10", d / "global_step10", fs::copy_options::recursive);
  std::ofstream(d / "latest") << "global_step10";
  EXPECT_EQ(read_deepspeed_checkpoint(d).tag, "global_step10");
}

// A universal checkpoint converted from a model-parallel run: refused naming the reason.
TEST_F(DeepSpeedCheckpointTest, AModelParallelUniversalCheckpointIsRefused) {
  const fs::path d = copy_of("u_s2_fp32_dp2", "u_mp2");
  fs::copy_file(d / "global_step10_universal" / "mp_rank_00_model_states.pt", d / "global_step10_universal" / "mp_rank_01_model_states.pt");
  const std::string e = error_of(d);
  EXPECT_NE(e.find("mp_rank_01_model_states.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("model-parallel size 1 only"), std::string::npos) << e;
}

TEST_F(DeepSpeedCheckpointTest, AShapeThatDoesNotAddUpWithThePartitionsIsRefused) {
  const std::string e = error_of(dir_ / "lie");
  EXPECT_NE(e.find("do not add up"), std::string::npos) << e;
  EXPECT_NE(e.find("zero_pp_rank_0_mp_rank_00_optim_states.pt"), std::string::npos) << e;
}

// ZeRO-3: a param_shapes entry one row too long no longer adds up with ceil(numel / W) per rank.
TEST_F(DeepSpeedCheckpointTest, AStage3ShapeThatDoesNotAddUpWithThePartitionsIsRefused) {
  const std::string e = error_of(dir_ / "lie3");
  EXPECT_NE(e.find("do not add up"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("zero_pp_rank_0_mp_rank_00_model_states.pt"), std::string::npos) << e;
}

// A param_shapes entry of 2^70 elements or a negative size is refused where it is read, naming the
// file and the parameter (not later, in a message naming neither).
TEST_F(DeepSpeedCheckpointTest, AnImpossibleShapeIsRefusedNamingFileAndParameter) {
  for (const char* cell : {"huge", "negative"}) {
    const std::string e = error_of(dir_ / cell);
    EXPECT_NE(e.find((dir_ / cell / "global_step10" / "mp_rank_00_model_states.pt").string()), std::string::npos) << cell << ": " << e;
    EXPECT_NE(e.find("transformer.wte.weight' has the shape ("), std::string::npos) << cell << ": " << e;
  }
}

// Stage 0: a tied weight saved a second time with other values is one parameter more in 'module'
// than in the optimizer's groups; the error names the suspect.
TEST_F(DeepSpeedCheckpointTest, ATiedWeightSavedTwiceWithOtherValuesIsNamed) {
  const std::string e = error_of(dir_ / "tied_twice");
  EXPECT_NE(e.find("param_groups hold"), std::string::npos) << e;
  EXPECT_NE(e.find("lm_head.weight' (shaped as '"), std::string::npos) << e;
}

// DeepSpeed's constants name a bf16_ and an fp16_ prefix of the optimizer files: a folder of either
// reads the same values; a folder mixing them holds two saves' files and is refused.
TEST_F(DeepSpeedCheckpointTest, TheFp16PrefixReadsAndMixedPrefixesAreRefused) {
  const fs::path d = copy_of("s1_fp16_dp2", "fp16_prefix");
  const fs::path step = d / "global_step10";
  for (int r = 0; r < 2; ++r) {
    const std::string f = "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
    fs::rename(step / f, step / ("fp16_" + f));
  }
  expect_cell(d, "fp16", 1, 2);
  fs::rename(step / "fp16_zero_pp_rank_1_mp_rank_00_optim_states.pt", step / "zero_pp_rank_1_mp_rank_00_optim_states.pt");
  const std::string e = error_of(d);
  EXPECT_NE(e.find("mix prefixes"), std::string::npos) << e;
}

TEST_F(DeepSpeedCheckpointTest, AMissingRankFileIsNamed) {
  const fs::path d = copy_of("s2_bf16_dp4", "missing_rank");
  fs::remove(d / "global_step10" / "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt");
  std::string e = error_of(d);
  EXPECT_NE(e.find("bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt' is missing"), std::string::npos) << e;
  fs::remove(d / "global_step10" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt");
  e = error_of(d);
  EXPECT_NE(e.find("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt' is missing"), std::string::npos) << e;
}

// Layouts spread over files this reader does not take apart are refused by name, not read as a
// model with missing or smaller tensors: another model-parallel rank, pipeline-layer files, expert files.
TEST_F(DeepSpeedCheckpointTest, ModelParallelPipelineAndExpertFilesAreRefusedByName) {
  for (const char* extra : {"mp_rank_01_model_states.pt", "layer_01-model_states.pt", "expert_0_mp_rank_00_model_states.pt"}) {
    SCOPED_TRACE(extra);
    const fs::path d = copy_of("s1_fp32_dp2", std::string("extra_") + extra);
    fs::copy_file(d / "global_step10" / "mp_rank_00_model_states.pt", d / "global_step10" / extra);
    const std::string e = error_of(d);
    EXPECT_NE(e.find(extra), std::string::npos) << e;
    EXPECT_NE(e.find("does not read"), std::string::npos) << e;
  }
}

TEST_F(DeepSpeedCheckpointTest, ATruncatedFileIsNamed) {
  const fs::path d = copy_of("s1_fp16_dp2", "truncated");
  const fs::path f = d / "global_step10" / "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  fs::resize_file(f, fs::file_size(f) / 2);
  const std::string e = error_of(d);
  EXPECT_NE(e.find(f.string()), std::string::npos) << e;
}

TEST_F(DeepSpeedCheckpointTest, ALatestNamingAnotherOrAnOutsideFolderIsRefused) {
  const fs::path d = copy_of("s0_fp32_dp1", "bad_latest");
  std::ofstream(d / "latest", std::ios::trunc) << "global_step99";
  std::string e = error_of(d);
  EXPECT_NE(e.find("'global_step99', but the folder"), std::string::npos) << e;
  EXPECT_NE(e.find((d / "latest").string()), std::string::npos) << e;
  std::ofstream(d / "latest", std::ios::trunc) << "../s0_fp32_dp1/global_step10";
  e = error_of(d);
  EXPECT_NE(e.find("not the name of a folder inside"), std::string::npos) << e;
  std::ofstream(d / "latest", std::ios::trunc) << "..";
  e = error_of(d);
  EXPECT_NE(e.find("not the name of a folder inside"), std::string::npos) << e;
  // A tag folder that is a link to a folder elsewhere.
  fs::create_directory_symlink(dir_ / "s0_fp32_dp2" / "global_step10", d / "global_step7");
  std::ofstream(d / "latest", std::ios::trunc) << "global_step7\n";
  e = error_of(d);
  EXPECT_NE(e.find("lies outside"), std::string::npos) << e;
  EXPECT_NE(error_of(d, "../x").find("not the name of a folder inside"), std::string::npos);
  fs::remove(d / "latest");
  EXPECT_NE(error_of(d).find("has no 'latest' or 'latest_universal' file"), std::string::npos);
  EXPECT_EQ(read_deepspeed_checkpoint(d, "global_step10").global_steps, 10);
}

TEST_F(DeepSpeedCheckpointTest, APickleAskingForOsSystemIsRefusedBeforeItRuns) {
  const std::string e = error_of(dir_ / "evil");
  EXPECT_NE(e.find("zero_pp_rank_1_mp_rank_00_optim_states.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("posix.system"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir_ / "pwned"));
}

TEST_F(DeepSpeedCheckpointTest, TheValueTreeNamesTheFileAndPathOnAWrongKindOrMissingKey) {
  const fs::path f = dir_ / "s2_fp16_dp2" / "global_step10" / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
  const TorchPickle p(f);
  const TorchValue& osd = p.root().at("optimizer_state_dict");
  const TorchValue& ls = osd.at("loss_scaler");
  EXPECT_EQ(ls.object_name(), "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler");
  ASSERT_TRUE(ls.state);
  EXPECT_EQ(ls.state->at("cur_scale").as_double(), 32768.0);
  EXPECT_EQ(ls.state->at("dtype").object_name(), "torch.float16");
  EXPECT_EQ(osd.at("zero_stage").object_name(), "deepspeed.runtime.zero.config.ZeroStageEnum");
  EXPECT_EQ(osd.at("param_slice_mappings")[0].pairs.front().second.object_name(), "deepspeed.utils.tensor_fragment.fragment_address");
  EXPECT_EQ(osd.at("base_optimizer_state").at("state").at(std::int64_t{0}).at("step").as_int(), 10);
  try {
    (void)osd.at("base_optimizer_state").at("nope");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(f.string()), std::string::npos) << m;
    EXPECT_NE(m.find("'optimizer_state_dict.base_optimizer_state' has no key 'nope'"), std::string::npos) << m;
  }
  try {
    (void)osd.at("group_paddings").as_string();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'optimizer_state_dict.group_paddings' is a list, not a string"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)osd.at("group_paddings")[9], Error);
  EXPECT_EQ(p.read_fp32(osd.at("single_partition_of_fp32_groups")[0]).size(), osd.at("single_partition_of_fp32_groups")[0].as_tensor().shape[0]);
}

// The fuzz regressions of the torch reader (tests/fuzz/regressions/torch_state_dict/: 100,000-deep
// nesting, wrapping strides, a zip64 offset near 2^64, a self-referencing container) read as a
// value tree: each an Error or a tree, the process lives on. No PyTorch needed.
TEST(TorchPickleCrafted, TheTorchReadersRegressionsAreErrorsOrTrees) {
  const fs::path dir = fs::path(DSTRAIN_SOURCE_DIR) / "tests/fuzz/regressions/torch_state_dict";
  int errors = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".pt") continue;
    try {
      const TorchPickle p(e.path());
      (void)p.root().kind_name();
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GE(errors, 6);
  // A list holding itself, and 20 levels of lists each holding the level below 8 times (8^20 nodes
  // once copied into a tree): bounded by the tree's depth and its node budget.
  for (const auto& [file, cause] : {std::pair{"self_referencing_list_tree.pt", "nests deeper than 32"},
                                    std::pair{"shared_references_8_pow_20_tree.pt", "more than 1048576 values"}}) {
    try {
      (void)TorchPickle(dir / file);
      ADD_FAILURE() << file;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
    }
  }
  try {
    (void)TorchPickle(dir / "nested_dicts_100k.pt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dstrain
