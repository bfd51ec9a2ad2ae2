// TensorBoardMonitor: what DeepSpeed's tensorboard monitor writes through torch's SummaryWriter,
// without TensorFlow or protobuf: one event file under output_path/job_name, named
// events.out.tfevents.<10-digit unix time>.<hostname>.<pid>.<uid> (tensorboard's EventFileWriter),
// holding TFRecords of Event protobufs:
//
//   record   = uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
//              (all little-endian)
//   Event    = wall_time (1, double) | step (2, int64; omitted when 0, proto3) |
//              file_version (3, string "brain.Event:2", first record only) | summary (5, Summary)
//   Summary  = value (1, repeated Value);  Value = tag (1, string) | simple_value (2, float)
//
// One event per scalar, as SummaryWriter.add_scalar writes it, and a flush after every
// write_events call (DeepSpeed flushes each call; torch would otherwise buffer up to 120 s).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config_schema/monitor_config.h"
#include "train/monitor/monitor.h"

namespace dstrain {

// The protobuf bytes of one Event, exposed so tests can compare them with bytes encoded by hand.
std::vector<std::byte> encode_file_version_event(double wall_time);
std::vector<std::byte> encode_scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value);
// One TFRecord around `data`.
std::vector<std::byte> frame_tfrecord(std::span<const std::byte> data);

class TensorBoardMonitor final : public Monitor {
 public:
  // Creates output_path/job_name (output_path "" = the current directory, as DeepSpeed's
  // os.path.join gives) and the event file with its file_version record. Throws Error naming the
  // folder or file and the fix when either cannot be created or written.
  explicit TensorBoardMonitor(const config::TensorboardConfig& cfg);
  ~TensorBoardMonitor() override;
  TensorBoardMonitor(const TensorBoardMonitor&) = delete;
  TensorBoardMonitor& operator=(const TensorBoardMonitor&) = delete;

  // Values are stored as float (simple_value), as SummaryWriter.add_scalar stores them.
  void write_events(std::span<const MonitorEvent> events) override;

  const std::filesystem::path& log_dir() const { return log_dir_; }
  const std::filesystem::path& file_path() const { return file_path_; }

 private:
  void write_record(std::span<const std::byte> data);
  void flush();

  std::filesystem::path log_dir_;
  std::filesystem::path file_path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dstrain
