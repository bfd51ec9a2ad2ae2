// Where the training state lives (config_schema/state_placement.h), against DeepSpeed's rules as
// docs/offload.md §5-7 writes them: a table of stages and offload sections, each row's homes,
// ratio, masters and pinning written out by hand.
#include <gtest/gtest.h>

#include <string>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::parse;

struct Row {
  const char* zero;  // the zero_optimization body
  bool fp16;
  StateHome optimizer, params;
  double ratio;
  bool masters_apart, pinned, optimizer_ignored, nvme_as_cpu, params_ignored;
};

StatePlacement placement_of(const Row& r) {
  const std::string json = std::string(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {}},)") +
                           (r.fp16 ? R"("fp16": {"enabled": true},)" : "") + R"("zero_optimization": {)" + r.zero + "}}";
  return parse(json).placement();
}

TEST(StatePlacement, DeepSpeedsStageRulesForOffload) {
  constexpr auto D = StateHome::device, H = StateHome::host, N = StateHome::nvme;
  const std::string cpu_opt = R"("offload_optimizer": {"device": "cpu"})";
  const std::string nvme_opt = R"("offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"})";
  const std::string cpu_par = R"("offload_param": {"device": "cpu"})";
  const std::string nvme_par = R"("offload_param": {"device": "nvme", "nvme_path": "/tmp"})";
  const std::string rows_text[] = {
      R"("stage": 0)",
      R"("stage": 2)",
      R"("stage": 0, )" + cpu_opt,  // ignored at stage 0
      R"("stage": 1, )" + cpu_opt,
      R"("stage": 2, )" + nvme_opt,  // nvme acts as cpu below stage 3
      R"("stage": 3, )" + nvme_opt,
      R"("stage": 2, )" + cpu_par,  // param offload ignored below stage 3
      R"("stage": 3, )" + cpu_par,
      R"("stage": 3, )" + nvme_par,
      R"("stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.25, "pin_memory": false})",
      R"("stage": 3, "offload_param": {"device": "cpu", "pin_memory": false})",
      R"("stage": 1, "offload_param": {"device": "cpu", "pin_memory": false})",  // ignored: its pinning too
  };
  const Row rows[] = {
      {"", false, D, D, 0.0, false, true, false, false, false}, {"", true, D, D, 0.0, true, true, false, false, false},  // fp16: masters apart
      {"", false, D, D, 0.0, false, true, true, false, false},  {"", false, H, D, 1.0, true, true, false, false, false},
      {"", false, H, D, 1.0, true, true, false, true, false},   {"", false, N, D, 1.0, true, true, false, false, false},
      {"", false, D, D, 0.0, false, true, false, false, true},  {"", false, D, H, 0.0, true, true, false, false, false},
      {"", false, D, N, 0.0, true, true, false, false, false},  {"", false, H, D, 0.25, true, false, false, false, false},
      {"", false, D, H, 0.0, true, false, false, false, false}, {"", false, D, D, 0.0, false, true, false, false, true},
  };
  for (std::size_t i = 0; i < std::size(rows); ++i) {
    Row r = rows[i];
    r.zero = rows_text[i].c_str();
    const StatePlacement p = placement_of(r);
    SCOPED_TRACE(rows_text[i] + (r.fp16 ? " fp16" : ""));
    EXPECT_EQ(p.optimizer, r.optimizer);
    EXPECT_EQ(p.params, r.params);
    EXPECT_DOUBLE_EQ(p.offload_ratio, r.ratio);
    EXPECT_EQ(p.masters_apart, r.masters_apart);
    EXPECT_EQ(p.pin_host_memory, r.pinned);
    EXPECT_EQ(p.optimizer_offload_ignored, r.optimizer_ignored);
    EXPECT_EQ(p.nvme_optimizer_as_cpu, r.nvme_as_cpu);
    EXPECT_EQ(p.param_offload_ignored, r.params_ignored);
    EXPECT_EQ(p.offloads(), r.optimizer != D || r.params != D);
    EXPECT_EQ(p.uses_nvme(), r.optimizer == N || r.params == N);
  }
}

// The config layer's warnings are the placement's flags, one warning each.
TEST(StatePlacement, WarningsFollowThePlacement) {
  const DsConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  int optimizer = 0, param = 0;
  for (const Warning& w : c.warnings) {
    optimizer += w.path == "zero_optimization.offload_optimizer";
    param += w.path == "zero_optimization.offload_param";
  }
  EXPECT_EQ(optimizer, 1);
  EXPECT_EQ(param, 1);
  EXPECT_EQ(c.placement().optimizer, StateHome::device);
}

}  // namespace
}  // namespace dstrain::config
