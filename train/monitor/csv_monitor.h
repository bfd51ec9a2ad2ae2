// CsvMonitor: DeepSpeed's csv_monitor (deepspeed/monitor/csv_monitor.py), byte for byte.
//
//   folder:  output_path/job_name            (created; "" output_path = the current directory)
//   file:    the metric name with '/' and ' ' replaced by '_', plus ".csv"
//            ("Train/Samples/lr" -> Train_Samples_lr.csv)
//   rows:    "step,<header>" the first time this monitor writes that file, then "step,value" per
//            event, where header is the part of the name after its last '/' ("lr"), value is
//            Python's str(float) ("0.0001", "65536.0", "1e-05"), and rows end in "\r\n" (Python's
//            csv.writer default); fields with ',', '"' or line breaks are quoted as csv.writer does.
//
// Files are opened in append mode, like DeepSpeed's open(fname, 'a+'), so a resumed run appends to
// the old file, and, like DeepSpeed, writes a fresh header line first. Every write_events call is
// flushed to the OS before it returns, so a crash of the process loses no row already written.
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "config_schema/monitor_config.h"
#include "train/monitor/monitor.h"

namespace dstrain {

// The pieces of DeepSpeed's layout, exposed for tests and for tools that read the files back.
std::string csv_file_stem(std::string_view metric_name);    // "Train/Samples/lr" -> "Train_Samples_lr"
std::string csv_header_name(std::string_view metric_name);  // "Train/Samples/lr" -> "lr"
// One csv.writer row of two fields, with its "\r\n".
std::string csv_row(std::string_view first, std::string_view second);

class CsvMonitor final : public Monitor {
 public:
  // Creates and probes output_path/job_name; throws Error naming the folder and the fix.
  explicit CsvMonitor(const config::CsvMonitorConfig& cfg);
  ~CsvMonitor() override;
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;

  void write_events(std::span<const MonitorEvent> events) override;

  const std::filesystem::path& log_dir() const { return log_dir_; }
  std::filesystem::path file_path(std::string_view metric_name) const;

 private:
  std::FILE* open_metric(const std::string& stem, std::string_view metric_name);

  std::filesystem::path log_dir_;
  // Kept open between steps (DeepSpeed reopens per event; the bytes are the same, the syscalls not).
  std::map<std::string, std::FILE*> files_;
};

}  // namespace dstrain
