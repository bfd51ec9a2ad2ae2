// write_deepspeed_checkpoint (formats/deepspeed_checkpoint_writer.h): a known state — parameters of
// odd sizes, so that DeepSpeed's alignment padding is there, in two param groups — written for ZeRO
// stages 0-3 x fp32 / fp16 / bf16 x DP 1, 2, 4 and read back with read_deepspeed_checkpoint: masters
// and Adam's moments bit for bit, the counters, step, loss scaler, schedule and groups. With
// /usr/bin/python3 and torch: the same folders compared object by object with those
// deepspeed_checkpoint_fixture.py writes for the state as DeepSpeed lays them out
// (deepspeed_layout_check.py), and consolidated by a reimplementation of DeepSpeed's zero_to_fp32.py
// (zero_to_fp32_reader.py) into the masters — a folder with a padding where DeepSpeed has none must
// not. The universal form (write_universal_checkpoint) likewise: read back, and compared with what
// the fixture's ds_to_universal (to_universal) makes of its folder. And the refusals: each an Error
// before any file is written.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed_checkpoint.h"
#include "formats/deepspeed_checkpoint_writer.h"
#include "ops/error.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

// Odd sizes: group 0 holds 28 + 12 + 9 = 49 values, group 1 5 + 1 + 3 = 9, so every DP size pads
// (49 -> 50, 52, 56; 9 -> 10, 12, 16), and a stage-3 piece of a 1- or 5-value parameter too.
DeepSpeedTrainingState known_state() {
  DeepSpeedTrainingState st;
  st.tag = "global_step10";
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> params = {
      {"transformer.wte.weight", {7, 4}},     {"transformer.h.0.attn.c_attn.weight", {4, 3}}, {"transformer.h.0.mlp.c_fc.weight", {3, 3}},
      {"transformer.h.0.ln_1.weight", {5}},   {"transformer.h.0.ln_1.bias", {1}},             {"transformer.h.0.attn.c_attn.bias", {3}}};
  std::mt19937 gen(1234);
  std::normal_distribution<float> nd(0.0F, 1.0F);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto& [n, s] = params[k];
    std::int64_t numel = 1;
    for (const auto d : s) numel *= d;
    st.names.push_back(n);
    st.shapes[n] = s;
    for (std::int64_t i = 0; i < numel; ++i) {
      st.master[n].push_back(nd(gen));  // not representable in 16 bits: masters must stay fp32
      st.optimizer_states["exp_avg"][n].push_back(nd(gen) * 1e-2F);
      st.optimizer_states["exp_avg_sq"][n].push_back(std::abs(nd(gen)) * 1e-4F);
    }
  }
  st.groups = {DeepSpeedParamGroup{{params[0].first, params[1].first, params[2].first}, 0.01},
               DeepSpeedParamGroup{{params[3].first, params[4].first, params[5].first}, 0.0}};
  st.optimizer_step = 9;
  st.optimizer_type = "adamw";
  st.param_group = {{"lr", 3e-4}, {"betas0", 0.9}, {"betas1", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.01}};
  st.global_steps = 10;
  st.global_samples = 80;
  st.skipped_steps = 1;
  st.loss_scaler = DeepSpeedLossScaler{32768.0, 10, 4, 1, true};
  st.lr_scheduler_json = R"({"last_batch_iteration": 9, "warmup_min_lr": 0.0, "warmup_max_lr": 0.0003, "warmup_num_steps": 100, "warmup_type": "log"})";
  return st;
}

// The state as deepspeed_checkpoint_fixture.py --from-state reads it (ordered: the schedule's and
// the config's keys keep their order, as Python's json keeps it).
nlohmann::ordered_json state_json(const DeepSpeedTrainingState& st) {
  nlohmann::ordered_json j;
  j["tag"] = st.tag;
  j["names"] = st.names;
  for (const auto& n : st.names) {
    j["shapes"][n] = st.shapes.at(n);
    j["master"][n] = st.master.at(n);
    j["exp_avg"][n] = st.optimizer_states.at("exp_avg").at(n);
    j["exp_avg_sq"][n] = st.optimizer_states.at("exp_avg_sq").at(n);
  }
  for (const auto& g : st.groups) j["groups"].push_back({{"names", g.names}, {"weight_decay", g.weight_decay}});
  j["optimizer_step"] = *st.optimizer_step;
  j["optimizer_type"] = st.optimizer_type;
  j["param_group"] = st.param_group;
  j["global_steps"] = st.global_steps;
  j["global_samples"] = st.global_samples;
  j["skipped_steps"] = st.skipped_steps;
  const auto& ls = *st.loss_scaler;
  j["loss_scaler"] = {{"cur_scale", ls.cur_scale}, {"cur_iter", ls.cur_iter}, {"last_overflow_iter", ls.last_overflow_iter},
                      {"cur_hysteresis", ls.cur_hysteresis}, {"dynamic", ls.dynamic}};
  j["lr_scheduler"] = nlohmann::ordered_json::parse(*st.lr_scheduler_json);
  if (st.ds_config_json) j["ds_config"] = nlohmann::ordered_json::parse(*st.ds_config_json);
  return j;
}

bool have_torch() {
  static const bool yes = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return yes;
}

class DeepSpeedWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dstrain_ds_writer_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string layout_name(const DeepSpeedSaveLayout& l) {
    return "s" + std::to_string(l.zero_stage) + "_" + l.dtype + "_dp" + std::to_string(l.dp_world_size);
  }
  static std::vector<DeepSpeedSaveLayout> every_layout() {
    std::vector<DeepSpeedSaveLayout> out;
    for (const int stage : {0, 1, 2, 3})
      for (const std::string dtype : {"fp32", "fp16", "bf16"})
        for (const int dp : {1, 2, 4}) out.push_back(DeepSpeedSaveLayout{stage, dp, dtype});
    return out;
  }
  fs::path dir_;
};

void expect_bits(const std::map<std::string, std::vector<float>>& got, const std::map<std::string, std::vector<float>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [n, v] : want) {
    ASSERT_TRUE(got.count(n)) << what << " " << n;
    ASSERT_EQ(got.at(n).size(), v.size()) << what << " " << n;
    for (std::size_t k = 0; k < v.size(); ++k) ASSERT_EQ(got.at(n)[k], v[k]) << what << " " << n << "[" << k << "]";
  }
}

TEST_F(DeepSpeedWriterTest, EveryStageDtypeAndDataParallelSizeReadsBackBitForBit) {
  const DeepSpeedTrainingState st = known_state();
  for (const DeepSpeedSaveLayout& l : every_layout()) {
    SCOPED_TRACE(layout_name(l));
    const fs::path out = dir_ / layout_name(l);
    write_deepspeed_checkpoint(out, st, l);
    const DeepSpeedTrainingState got = read_deepspeed_checkpoint(out);
    EXPECT_EQ(got.tag, st.tag);
    EXPECT_EQ(got.zero_stage, l.zero_stage);
    EXPECT_EQ(got.dp_world_size, l.dp_world_size);
    EXPECT_EQ(got.dtype, l.dtype);
    EXPECT_EQ(got.names.size(), st.names.size());
    EXPECT_EQ(got.shapes, st.shapes);
    expect_bits(got.master, st.master, "master");
    expect_bits(got.optimizer_states.at("exp_avg"), st.optimizer_states.at("exp_avg"), "exp_avg");
    expect_bits(got.optimizer_states.at("exp_avg_sq"), st.optimizer_states.at("exp_avg_sq"), "exp_avg_sq");
    ASSERT_EQ(got.groups.size(), st.groups.size());
    for (std::size_t g = 0; g < st.groups.size(); ++g) {
      EXPECT_EQ(got.groups[g].names, st.groups[g].names);
      EXPECT_EQ(got.groups[g].weight_decay, st.groups[g].weight_decay);
    }
    EXPECT_EQ(got.optimizer_step, st.optimizer_step);
    EXPECT_EQ(got.optimizer_type, "adamw");
    EXPECT_EQ(got.param_group, st.param_group);
    EXPECT_EQ(got.global_steps, 10);
    EXPECT_EQ(got.global_samples, 80);
    EXPECT_EQ(got.skipped_steps, 1);
    ASSERT_TRUE(got.lr_scheduler_json.has_value());
    EXPECT_EQ(nlohmann::json::parse(*got.lr_scheduler_json), nlohmann::json::parse(*st.lr_scheduler_json));
    // The module: the masters rounded to the layout's dtype (ZeRO-3's placeholders: the masters).
    for (const auto& n : st.names) {
      for (std::size_t k = 0; k < st.master.at(n).size(); ++k) {
        const float m = st.master.at(n)[k], w = got.module.at(n)[k];
        if (l.dtype == "fp32" || l.zero_stage == 3) {
          ASSERT_EQ(w, m) << n;
        } else {
          ASSERT_NEAR(w, m, std::abs(m) * (l.dtype == "bf16" ? 1.0 / 256 : 1.0 / 2048) + 1e-7) << n;
        }
      }
    }
    // The loss scaler as each optimizer saves it: FP16_Optimizer's fields at stage 0 under fp16
    // only (no hysteresis); the ZeRO optimizers' scaler object, LossScaler(1.0) but under fp16.
    if (l.zero_stage == 0 && l.dtype != "fp16") {
      EXPECT_FALSE(got.loss_scaler.has_value());
    } else {
      ASSERT_TRUE(got.loss_scaler.has_value());
      const DeepSpeedLossScaler& ls = *got.loss_scaler;
      if (l.dtype == "fp16") {
        EXPECT_EQ(ls.cur_scale, 32768.0);
        EXPECT_EQ(ls.cur_iter, 10);
        EXPECT_EQ(ls.last_overflow_iter, 4);
        EXPECT_EQ(ls.cur_hysteresis, l.zero_stage == 0 ? 0 : 1);
        EXPECT_TRUE(ls.dynamic);
      } else {
        EXPECT_EQ(ls.cur_scale, 1.0);
        EXPECT_FALSE(ls.dynamic);
      }
    }
  }
}

TEST_F(DeepSpeedWriterTest, Bf16OptimizerAtStage1WithFp32AccumulationAndNoGroupsGiven) {
  DeepSpeedTrainingState st = known_state();
  st.groups.clear();  // one group of every name, param_group's weight decay
  st.ds_config_json = R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "fp32"}, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}})";
  for (const int dp : {1, 2, 4}) {
    const fs::path out = dir_ / ("dp" + std::to_string(dp));
    write_deepspeed_checkpoint(out, st, DeepSpeedSaveLayout{1, dp, "bf16"});
    EXPECT_TRUE(fs::exists(out / st.tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"));
    const DeepSpeedTrainingState got = read_deepspeed_checkpoint(out);
    EXPECT_EQ(got.zero_stage, 1);
    EXPECT_FALSE(got.loss_scaler.has_value());  // BF16_Optimizer saves none
    expect_bits(got.master, st.master, "master");
    expect_bits(got.optimizer_states.at("exp_avg_sq"), st.optimizer_states.at("exp_avg_sq"), "exp_avg_sq");
    ASSERT_EQ(got.groups.size(), 1U);
    EXPECT_EQ(got.groups[0].names, st.names);
    EXPECT_EQ(got.groups[0].weight_decay, 0.01);
  }
}

TEST_F(DeepSpeedWriterTest, SameObjectTreesAsDeepSpeedLaysOut) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch is not installed (scripts/setup.sh)";
  for (const bool with_config : {false, true}) {
    DeepSpeedTrainingState st = known_state();
    if (with_config) {
      st.ds_config_json = R"({"train_batch_size": 16, "gradient_clipping": 1.0, "fp16": {"enabled": true, "loss_scale": 0, "hysteresis": 3,
        "loss_scale_window": 500, "min_loss_scale": 2}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 2}})";
    }
    const fs::path root = dir_ / (with_config ? "config" : "plain");
    DeepSpeedTrainingState universal = st;
    universal.tag = st.tag + "_universal";  // ds_to_universal's output folder beside the source
    for (const DeepSpeedSaveLayout& l : every_layout()) {
      write_deepspeed_checkpoint(root / layout_name(l), st, l);
      if (l.zero_stage > 0) write_universal_checkpoint(root / ("u_" + layout_name(l)), universal, l);
    }
    const fs::path state = root / "state.json";
    std::ofstream(state) << state_json(st).dump();
    const std::string cmd = "/usr/bin/python3 " DSTRAIN_SOURCE_DIR "/tests/integration/deepspeed_layout_check.py --state '" + state.string() + "' '" +
                            root.string() + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

TEST_F(DeepSpeedWriterTest, DeepSpeedsZeroToFp32ConsolidatesTheMasters) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch is not installed (scripts/setup.sh)";
  const DeepSpeedTrainingState st = known_state();
  std::vector<std::string> dirs;
  for (const DeepSpeedSaveLayout& l : every_layout()) {
    if (l.zero_stage == 0) continue;  // zero_to_fp32 reads ZeRO folders
    write_deepspeed_checkpoint(dir_ / layout_name(l), st, l);
    dirs.push_back((dir_ / layout_name(l)).string());
  }
  // A padding where DeepSpeed has none: rank 0's lean partition of group 0 two values longer, which
  // shifts every later value of the group.
  const fs::path bad = dir_ / "bad_padding";
  write_deepspeed_checkpoint(bad, st, DeepSpeedSaveLayout{2, 2, "fp32"});
  const fs::path rank0 = bad / st.tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
  const std::string damage = "/usr/bin/python3 -c \"import sys, torch; sys.path.insert(0, '" DSTRAIN_SOURCE_DIR
                             "/tests/integration'); import deepspeed_checkpoint_fixture; p = '" +
                             rank0.string() +
                             "'; sd = torch.load(p); g = sd['optimizer_state_dict']['single_partition_of_fp32_groups']; "
                             "g[0] = torch.cat([torch.zeros(2), g[0]]); torch.save(sd, p)\"";
  ASSERT_EQ(std::system(damage.c_str()), 0) << damage;
  const fs::path out = dir_ / "zero_to_fp32.json";
  std::string cmd = "/usr/bin/python3 " DSTRAIN_SOURCE_DIR "/tests/integration/zero_to_fp32_reader.py '" + out.string() + "'";
  for (const auto& d : dirs) cmd += " '" + d + "'";
  cmd += " '" + bad.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const nlohmann::json got = nlohmann::json::parse(in);
  for (const std::string& d : dirs) {
    SCOPED_TRACE(d);
    const nlohmann::json& sd = got.at(d);
    ASSERT_FALSE(sd.contains("error")) << sd.at("error");
    ASSERT_EQ(sd.size(), st.names.size());
    for (const auto& n : st.names) {
      const auto v = sd.at(n).get<std::vector<double>>();
      ASSERT_EQ(v.size(), st.master.at(n).size()) << n;
      for (std::size_t k = 0; k < v.size(); ++k) ASSERT_EQ(static_cast<float>(v[k]), st.master.at(n)[k]) << n << "[" << k << "]";
    }
  }
  // The damaged folder: zero_to_fp32's consumed-numel check refuses it, or its values are not the masters.
  const nlohmann::json& b = got.at(bad.string());
  bool same = !b.contains("error");
  for (const auto& n : st.names) {
    if (!same) break;
    const auto v = b.at(n).get<std::vector<double>>();
    for (std::size_t k = 0; k < v.size() && same; ++k) same = static_cast<float>(v[k]) == st.master.at(n)[k];
  }
  EXPECT_FALSE(same) << "a padding where DeepSpeed has none went unnoticed";
}

// ds_to_universal's form of every ZeRO layout's folder, read back by the reader's universal path.
TEST_F(DeepSpeedWriterTest, UniversalFormOfEveryZeroLayoutReadsBack) {
  DeepSpeedTrainingState st = known_state();
  st.tag = "global_step10_universal";
  for (const DeepSpeedSaveLayout& l : every_layout()) {
    if (l.zero_stage == 0) continue;
    SCOPED_TRACE(layout_name(l));
    const fs::path out = dir_ / ("u_" + layout_name(l));
    write_universal_checkpoint(out, st, l);
    EXPECT_TRUE(fs::exists(out / "latest_universal"));
    EXPECT_FALSE(fs::exists(out / "latest"));
    const DeepSpeedTrainingState got = read_deepspeed_checkpoint(out);
    EXPECT_EQ(got.tag, st.tag);
    EXPECT_EQ(got.zero_stage, l.zero_stage);
    expect_bits(got.master, st.master, "master");
    expect_bits(got.optimizer_states.at("exp_avg"), st.optimizer_states.at("exp_avg"), "exp_avg");
    expect_bits(got.optimizer_states.at("exp_avg_sq"), st.optimizer_states.at("exp_avg_sq"), "exp_avg_sq");
    EXPECT_EQ(got.optimizer_step, st.optimizer_step);
    EXPECT_EQ(got.global_steps, 10);
    EXPECT_EQ(got.global_samples, 80);
    EXPECT_EQ(got.skipped_steps, 1);
    ASSERT_EQ(got.groups.size(), st.groups.size());
    for (std::size_t g = 0; g < st.groups.size(); ++g) {
      EXPECT_EQ(got.groups[g].names, st.groups[g].names);
      EXPECT_EQ(got.groups[g].weight_decay, st.groups[g].weight_decay);
    }
    ASSERT_TRUE(got.lr_scheduler_json.has_value());
    EXPECT_EQ(nlohmann::json::parse(*got.lr_scheduler_json), nlohmann::json::parse(*st.lr_scheduler_json));
    if (l.dtype == "fp16") {
      ASSERT_TRUE(got.loss_scaler.has_value());
      EXPECT_EQ(got.loss_scaler->cur_scale, 32768.0);
      EXPECT_EQ(got.loss_scaler->cur_hysteresis, 1);
    }
  }
  // Stage 0 has no universal form; nothing is written.
  const fs::path s0 = dir_ / "u_s0";
  fs::create_directories(s0);
  EXPECT_THROW(write_universal_checkpoint(s0, st, DeepSpeedSaveLayout{0, 1, "fp32"}), Error);
  EXPECT_TRUE(fs::is_empty(s0));
}

TEST_F(DeepSpeedWriterTest, RefusesBeforeWritingAnything) {
  const auto error_of = [&](const DeepSpeedTrainingState& st, const DeepSpeedSaveLayout& l) {
    std::string what = "(no error)";
    try {
      write_deepspeed_checkpoint(dir_, st, l);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_TRUE(fs::is_empty(dir_)) << what;
    return what;
  };
  const DeepSpeedTrainingState good = known_state();
  EXPECT_NE(error_of(good, {5, 2, "fp32"}).find("ZeRO stage 5"), std::string::npos);
  EXPECT_NE(error_of(good, {2, 0, "fp32"}).find("world size 0"), std::string::npos);
  EXPECT_NE(error_of(good, {2, 2, "fp8"}).find("dtype 'fp8'"), std::string::npos);
  DeepSpeedTrainingState st = good;
  st.master["transformer.h.0.ln_1.weight"].pop_back();
  EXPECT_NE(error_of(st, {2, 2, "fp32"}).find("'transformer.h.0.ln_1.weight' has 4 fp32 master values, its shape 5"), std::string::npos);
  st = good;
  st.tag = "global_step10/../../x";
  EXPECT_NE(error_of(st, {1, 2, "fp16"}).find("not one folder name"), std::string::npos);
  st = good;
  st.optimizer_states["exp_avg_sq"].erase("transformer.h.0.ln_1.bias");
  EXPECT_NE(error_of(st, {3, 4, "bf16"}).find("'transformer.h.0.ln_1.bias' has no optimizer state 'exp_avg_sq'"), std::string::npos);
  st = good;
  st.groups[1].names.pop_back();
  EXPECT_NE(error_of(st, {0, 1, "fp32"}).find("is in no param group"), std::string::npos);
  st = good;
  st.lr_scheduler_json = "{not json";
  EXPECT_NE(error_of(st, {0, 1, "fp32"}).find("lr_scheduler_json is not JSON"), std::string::npos);
}


// A universal checkpoint's parameter names are folders under zero/: a param_shapes name that is a
// path ("../x", its folder beside zero/, inside the tag folder) is refused by the reader instead of
// read from outside zero/. A save_checkpoint folder's names are refused alike: its state may be
// written as a universal folder (dstrain export), whose folders they name. The writer writes no such
// name, so the folders are written with "outside.bias" and torch renames it in param_shapes.
TEST_F(DeepSpeedWriterTest, AParameterNameThatIsAPathIsRefused) {
  DeepSpeedTrainingState st = known_state();
  const std::string from = st.names.back(), to = "outside.bias";
  std::replace(st.names.begin(), st.names.end(), from, to);
  for (auto& g : st.groups) std::replace(g.names.begin(), g.names.end(), from, to);
  const auto rename = [&](auto& m) { m[to] = m.at(from), m.erase(from); };
  rename(st.shapes);
  rename(st.master);
  for (auto& [key, m] : st.optimizer_states) rename(m);
  DeepSpeedTrainingState bad = st;
  bad.names.back() = "../outside.bias";
  try {
    write_universal_checkpoint(dir_ / "u_bad", bad, DeepSpeedSaveLayout{2, 1, "fp32"});
    ADD_FAILURE() << "the writer wrote a parameter named by a path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter name '../outside.bias' is not one folder name"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "u_bad" / "outside.bias"));
  write_universal_checkpoint(dir_ / "u", st, DeepSpeedSaveLayout{2, 1, "fp32"});
  fs::rename(dir_ / "u" / st.tag / "zero" / "outside.bias", dir_ / "u" / st.tag / "outside.bias");
  write_deepspeed_checkpoint(dir_ / "s2", st, DeepSpeedSaveLayout{2, 2, "fp16"});
  for (const char* folder : {"u", "s2"}) {
    const fs::path ms = dir_ / folder / st.tag / "mp_rank_00_model_states.pt";
    const std::string rename_in_shapes =
        "/usr/bin/python3 -c \"import sys, torch, collections; sys.path.insert(0, '" DSTRAIN_SOURCE_DIR
        "/tests/integration'); import deepspeed_checkpoint_fixture; p = '" +
        ms.string() +
        "'; sd = torch.load(p); sd['param_shapes'] = [collections.OrderedDict(('../outside.bias' if k == 'outside.bias' else k, v) for k, v in "
        "g.items()) for g in sd['param_shapes']]; torch.save(sd, p)\"";
    ASSERT_EQ(std::system(rename_in_shapes.c_str()), 0) << rename_in_shapes;
  }
  for (const char* folder : {"u", "s2"}) {
    SCOPED_TRACE(folder);
    try {
      (void)read_deepspeed_checkpoint(dir_ / folder);
      ADD_FAILURE() << "read a parameter named by a path";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the parameter name '../outside.bias' is not one folder name"), std::string::npos) << e.what();
    }
  }
}

// A rank file whose rank number does not fit an int (a stray file beside the real ones) is an Error
// naming it, not an exception of another kind.
TEST_F(DeepSpeedWriterTest, ARankFileNumberPastIntIsAnError) {
  write_deepspeed_checkpoint(dir_ / "s1", known_state(), DeepSpeedSaveLayout{1, 1, "fp32"});
  const fs::path stray = dir_ / "s1" / "global_step10" / "zero_pp_rank_99999999999_mp_rank_00_optim_states.pt";
  std::ofstream(stray) << "x";
  try {
    (void)read_deepspeed_checkpoint(dir_ / "s1");
    ADD_FAILURE() << "read a folder with a rank file past int";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_pp_rank_99999999999_mp_rank_00_optim_states.pt' has a rank number out of range"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dstrain
