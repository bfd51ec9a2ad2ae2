// csv_monitor files against text written by hand in DeepSpeed's layout (csv_monitor.py with
// Python's csv.writer: "\r\n" line ends, str(float) values).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train/monitor/csv_monitor.h"
#include "train/monitor/monitor_master.h"
#include "train/monitor/train_events.h"
#include "monitor_test_util.h"
#include "ops/error.h"

namespace dstrain {
namespace {

TEST(CsvLayout, NamesAsDeepSpeedDerivesThem) {
  EXPECT_EQ(csv_file_stem("Train/Samples/lr"), "Train_Samples_lr");
  EXPECT_EQ(csv_file_stem("Train/Samples/elapsed_time_ms_forward"), "Train_Samples_elapsed_time_ms_forward");
  EXPECT_EQ(csv_file_stem("my metric/x y"), "my_metric_x_y");
  EXPECT_EQ(csv_header_name("Train/Samples/loss_scale"), "loss_scale");
  EXPECT_EQ(csv_header_name("plain"), "plain");
  EXPECT_EQ(csv_row("step", "lr"), "step,lr\r\n");
  EXPECT_EQ(csv_row("step", "a,b"), "step,\"a,b\"\r\n");
  EXPECT_EQ(csv_row("step", "say \"hi\""), "step,\"say \"\"hi\"\"\"\r\n");
}

TEST(CsvMonitor, WritesDeepSpeedsFilesAndRows) {
  test::TempDir tmp;
  config::CsvMonitorConfig cfg{.enabled = true, .output_path = (tmp.path() / "logs").string(), .job_name = "gpt2"};
  CsvMonitor csv(cfg);
  const std::filesystem::path dir = tmp.path() / "logs" / "gpt2";
  EXPECT_EQ(csv.log_dir(), dir);

  const std::vector<MonitorEvent> step1 = {{"Train/Samples/lr", 0.0001, 8}, {"Train/Samples/loss_scale", 65536.0, 8}};
  csv.write_events(step1);
  const std::vector<MonitorEvent> step2 = {{"Train/Samples/lr", 6e-05, 16}, {"Train/Samples/loss_scale", 32768.0, 16}};
  csv.write_events(step2);
  const std::vector<MonitorEvent> step3 = {{"Train/Samples/train_loss", 10.957, 24}};
  csv.write_events(step3);

  // Flushed: readable while the monitor is still open.
  EXPECT_EQ(test::read_file(dir / "Train_Samples_lr.csv"), "step,lr\r\n8,0.0001\r\n16,6e-05\r\n");
  EXPECT_EQ(test::read_file(dir / "Train_Samples_loss_scale.csv"), "step,loss_scale\r\n8,65536.0\r\n16,32768.0\r\n");
  EXPECT_EQ(test::read_file(dir / "Train_Samples_train_loss.csv"), "step,train_loss\r\n24,10.957\r\n");
  EXPECT_EQ(csv.file_path("Train/Samples/lr"), dir / "Train_Samples_lr.csv");
}

TEST(CsvMonitor, ASecondRunAppendsWithAFreshHeaderAsDeepSpeedDoes) {
  test::TempDir tmp;
  config::CsvMonitorConfig cfg{.enabled = true, .output_path = tmp.path().string(), .job_name = "j"};
  const std::vector<MonitorEvent> a = {{"Train/Samples/lr", 0.5, 1}};
  const std::vector<MonitorEvent> b = {{"Train/Samples/lr", 0.25, 2}};
  { CsvMonitor(cfg).write_events(a); }
  { CsvMonitor(cfg).write_events(b); }
  EXPECT_EQ(test::read_file(tmp.path() / "j" / "Train_Samples_lr.csv"), "step,lr\r\n1,0.5\r\nstep,lr\r\n2,0.25\r\n");
}

TEST(CsvMonitor, EmptyOutputPathMeansJobNameUnderTheCurrentDirectory) {
  test::TempDir tmp;
  const auto old = std::filesystem::current_path();
  std::filesystem::current_path(tmp.path());
  {
    CsvMonitor csv(config::CsvMonitorConfig{.enabled = true, .output_path = "", .job_name = "DeepSpeedJobName"});
    EXPECT_EQ(csv.log_dir(), std::filesystem::path("DeepSpeedJobName"));
    const std::vector<MonitorEvent> e = {{"x", 1.0, 0}};
    csv.write_events(e);
  }
  std::filesystem::current_path(old);
  EXPECT_EQ(test::read_file(tmp.path() / "DeepSpeedJobName" / "x.csv"), "step,x\r\n0,1.0\r\n");
}

TEST(CsvMonitor, UnwritableOutputPathFailsAtStartNamingPathAndFix) {
  test::TempDir tmp;
  std::ofstream(tmp.path() / "not_a_dir") << "x";
  config::CsvMonitorConfig cfg{.enabled = true, .output_path = (tmp.path() / "not_a_dir").string(), .job_name = "j"};
  try {
    CsvMonitor csv(cfg);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("not_a_dir"), std::string::npos) << msg;
    EXPECT_NE(msg.find("csv_monitor.output_path"), std::string::npos) << msg;
  }
}

TEST(MonitorMaster, FansOutOnRankZeroOnly) {
  test::TempDir tmp;
  config::TensorboardConfig tb{.enabled = true, .output_path = (tmp.path() / "tb").string(), .job_name = "j"};
  config::CsvMonitorConfig csv{.enabled = true, .output_path = (tmp.path() / "csv").string(), .job_name = "j"};

  MonitorMaster other(tb, csv, /*global_rank=*/1);
  EXPECT_FALSE(other.enabled());
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "csv"));  // rank 1 creates nothing

  MonitorMaster master(tb, csv, /*global_rank=*/0);
  EXPECT_TRUE(master.enabled());
  EXPECT_EQ(master.size(), 2u);
  const std::vector<MonitorEvent> e = {{"Train/Samples/lr", 0.5, 4}};
  master.write_events(e);
  EXPECT_EQ(test::read_file(tmp.path() / "csv" / "j" / "Train_Samples_lr.csv"), "step,lr\r\n4,0.5\r\n");
  int event_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path() / "tb" / "j"))
    event_files += entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(event_files, 1);

  csv.enabled = false;
  tb.enabled = false;
  EXPECT_FALSE(MonitorMaster(tb, csv, 0).enabled());
}

TEST(MonitorMaster, BuildsFromAParsedDsConfig) {
  test::TempDir tmp;
  config::DsConfig cfg;
  cfg.csv_monitor = {.enabled = true, .output_path = tmp.path().string(), .job_name = "from_config"};
  MonitorMaster master(cfg, 0);
  EXPECT_EQ(master.size(), 1u);
  EXPECT_TRUE(std::filesystem::is_directory(tmp.path() / "from_config"));
}

}  // namespace
}  // namespace dstrain

namespace dstrain {
namespace {

TEST(TrainEvents, DeepSpeedNamesIntoCsv) {
  test::TempDir tmp;
  CsvMonitor csv(config::CsvMonitorConfig{.enabled = true, .output_path = tmp.path().string(), .job_name = "j"});
  csv.write_events(step_events(6e-4, std::nullopt, 512));  // bf16/fp32: no loss_scale
  csv.write_events(step_events(3e-4, 1024.0, 1024));
  const std::vector<MonitorEvent> loss = {train_loss_event(4.25, 1024)};
  csv.write_events(loss);
  EXPECT_EQ(test::read_file(tmp.path() / "j" / "Train_Samples_lr.csv"), "step,lr\r\n512,0.0006\r\n1024,0.0003\r\n");
  EXPECT_EQ(test::read_file(tmp.path() / "j" / "Train_Samples_loss_scale.csv"), "step,loss_scale\r\n1024,1024.0\r\n");
  EXPECT_EQ(test::read_file(tmp.path() / "j" / "Train_Samples_train_loss.csv"), "step,train_loss\r\n1024,4.25\r\n");
}

}  // namespace
}  // namespace dstrain
