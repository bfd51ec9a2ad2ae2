#include "train/monitor/csv_monitor.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "train/monitor/monitor_log_dir.h"
#include "train/monitor/python_format.h"
#include "ops/error.h"

namespace dstrain {
namespace {

// csv.writer's QUOTE_MINIMAL for the excel dialect: quote a field holding the delimiter, the quote
// character or a line-terminator character; double the quotes inside.
std::string csv_field(std::string_view field) {
  if (field.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(field);
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

[[noreturn]] void fail_write(const std::filesystem::path& path, int err) {
  fail("csv_monitor: cannot write to '{}': {}; free space on that disk or point csv_monitor.output_path elsewhere", path.string(),
       std::strerror(err));
}

}  // namespace

std::string csv_file_stem(std::string_view metric_name) {
  std::string stem(metric_name);
  for (char& c : stem)
    if (c == '/' || c == ' ') c = '_';
  return stem;
}

std::string csv_header_name(std::string_view metric_name) {
  const auto slash = metric_name.rfind('/');
  return std::string(slash == std::string_view::npos ? metric_name : metric_name.substr(slash + 1));
}

std::string csv_row(std::string_view first, std::string_view second) { return csv_field(first) + "," + csv_field(second) + "\r\n"; }

CsvMonitor::CsvMonitor(const config::CsvMonitorConfig& cfg) : log_dir_(make_monitor_log_dir("csv_monitor", cfg)) {}

CsvMonitor::~CsvMonitor() {
  for (auto& [stem, file] : files_) std::fclose(file);
}

std::filesystem::path CsvMonitor::file_path(std::string_view metric_name) const { return log_dir_ / (csv_file_stem(metric_name) + ".csv"); }

std::FILE* CsvMonitor::open_metric(const std::string& stem, std::string_view metric_name) {
  if (auto it = files_.find(stem); it != files_.end()) return it->second;
  const std::filesystem::path path = log_dir_ / (stem + ".csv");
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) {
    const int err = errno;
    fail("csv_monitor: cannot open '{}': {}; set csv_monitor.output_path to a writable folder", path.string(), std::strerror(err));
  }
  files_.emplace(stem, f);
  const std::string header = csv_row("step", csv_header_name(metric_name));
  if (std::fwrite(header.data(), 1, header.size(), f) != header.size()) fail_write(path, errno);
  return f;
}

void CsvMonitor::write_events(std::span<const MonitorEvent> events) {
  std::map<std::FILE*, std::string> touched;  // file -> its name, for the flush error message
  for (const MonitorEvent& e : events) {
    const std::string stem = csv_file_stem(e.name);
    std::FILE* f = open_metric(stem, e.name);
    const std::string row = csv_row(fmt::format("{}", e.step), python_float_repr(e.value));
    if (std::fwrite(row.data(), 1, row.size(), f) != row.size()) fail_write(log_dir_ / (stem + ".csv"), errno);
    touched.emplace(f, stem);
  }
  for (const auto& [f, stem] : touched)
    if (std::fflush(f) != 0) fail_write(log_dir_ / (stem + ".csv"), errno);
}

}  // namespace dstrain
