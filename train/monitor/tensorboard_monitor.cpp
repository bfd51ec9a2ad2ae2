#include "train/monitor/tensorboard_monitor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "train/monitor/tfrecord_crc.h"
#include "train/monitor/monitor_log_dir.h"
#include "ops/error.h"

namespace dstrain {
namespace {

static_assert(std::endian::native == std::endian::little, "TFRecord and protobuf fixed fields are little-endian");

// Protobuf wire format, only what Event needs.
enum WireType : std::uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::vector<std::byte>& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::byte>(v));
}
void put_tag(std::vector<std::byte>& out, int field, WireType type) { put_varint(out, (static_cast<std::uint64_t>(field) << 3) | type); }
template <typename T>
void put_fixed(std::vector<std::byte>& out, T v) {
  // resize + memcpy rather than insert(p, p + n): GCC 12 warns falsely (-Wstringop-overflow) on
  // the insert into a freshly reserved vector.
  const std::size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}
void put_bytes(std::vector<std::byte>& out, int field, std::span<const std::byte> bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.insert(out.end(), bytes.begin(), bytes.end());
}
void put_string(std::vector<std::byte>& out, int field, std::string_view s) { put_bytes(out, field, std::as_bytes(std::span(s.data(), s.size()))); }

double unix_time_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// tensorboard's _global_uid: a per-process counter, so two writers opened in the same second get
// different files.
std::atomic<int> g_event_file_uid{0};

}  // namespace

std::vector<std::byte> encode_file_version_event(double wall_time) {
  std::vector<std::byte> out;
  put_tag(out, 1, kFixed64);
  put_fixed(out, wall_time);
  put_string(out, 3, "brain.Event:2");
  return out;
}

std::vector<std::byte> encode_scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  std::vector<std::byte> v;  // Summary.Value
  put_string(v, 1, tag);
  // simple_value sits in a oneof, so proto3 writes it even when it is 0.
  put_tag(v, 2, kFixed32);
  put_fixed(v, value);
  std::vector<std::byte> summary;
  put_bytes(summary, 1, v);

  std::vector<std::byte> out;
  put_tag(out, 1, kFixed64);
  put_fixed(out, wall_time);
  if (step != 0) {  // proto3 omits a scalar at its default; negative steps take 10 varint bytes
    put_tag(out, 2, kVarint);
    put_varint(out, static_cast<std::uint64_t>(step));
  }
  put_bytes(out, 5, summary);
  return out;
}

std::vector<std::byte> frame_tfrecord(std::span<const std::byte> data) {
  std::vector<std::byte> out;
  out.reserve(data.size() + 16);
  const std::uint64_t length = data.size();
  put_fixed(out, length);
  put_fixed(out, masked_crc32c(std::span(out.data(), 8)));
  out.insert(out.end(), data.begin(), data.end());
  put_fixed(out, masked_crc32c(data));
  return out;
}

TensorBoardMonitor::TensorBoardMonitor(const config::TensorboardConfig& cfg) : log_dir_(make_monitor_log_dir("tensorboard", cfg)) {
  const double now = unix_time_now();
  file_path_ = log_dir_ / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<long long>(now), host_name(), ::getpid(),
                                      g_event_file_uid.fetch_add(1));
  file_ = std::fopen(file_path_.c_str(), "wbx");
  if (file_ == nullptr) {
    const int err = errno;
    fail("tensorboard: cannot create the event file '{}': {}; set tensorboard.output_path to a writable folder", file_path_.string(),
         std::strerror(err));
  }
  write_record(encode_file_version_event(now));
  flush();
}

TensorBoardMonitor::~TensorBoardMonitor() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardMonitor::write_events(std::span<const MonitorEvent> events) {
  for (const MonitorEvent& e : events) write_record(encode_scalar_event(unix_time_now(), e.step, e.name, static_cast<float>(e.value)));
  flush();
}

void TensorBoardMonitor::write_record(std::span<const std::byte> data) {
  const std::vector<std::byte> record = frame_tfrecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    const int err = errno;
    fail("tensorboard: cannot write to '{}': {}; free space on that disk or point tensorboard.output_path elsewhere", file_path_.string(),
         std::strerror(err));
  }
}

void TensorBoardMonitor::flush() {
  if (std::fflush(file_) != 0) {
    const int err = errno;
    fail("tensorboard: cannot write to '{}': {}; free space on that disk or point tensorboard.output_path elsewhere", file_path_.string(),
         std::strerror(err));
  }
}

}  // namespace dstrain
