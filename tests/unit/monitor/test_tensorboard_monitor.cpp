// TensorBoard event files against protobuf and TFRecord bytes encoded by hand in this file.
// Constants marked (py) were computed with a separate bit-at-a-time CRC-32C written in Python.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "train/monitor/tensorboard_monitor.h"
#include "monitor_test_util.h"
#include "ops/error.h"

namespace dstrain {
namespace {

std::vector<std::byte> bytes(std::initializer_list<int> list) {
  std::vector<std::byte> out;
  for (int b : list) out.push_back(static_cast<std::byte>(b));
  return out;
}
void append(std::vector<std::byte>& out, std::string_view s) {
  for (char c : s) out.push_back(static_cast<std::byte>(c));
}
void append(std::vector<std::byte>& out, const std::vector<std::byte>& more) { out.insert(out.end(), more.begin(), more.end()); }

// wall_time 1.5, step 300, tag "Train/Samples/lr", simple_value 0.25.
std::vector<std::byte> hand_encoded_scalar_event() {
  std::vector<std::byte> ev = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F});  // field 1, fixed64: 1.5
  append(ev, bytes({0x10, 0xAC, 0x02}));                                    // field 2, varint: 300
  append(ev, bytes({0x2A, 0x19}));                                          // field 5 (Summary), 25 bytes
  append(ev, bytes({0x0A, 0x17}));                                          //   Summary.value, 23 bytes
  append(ev, bytes({0x0A, 0x10}));                                          //     Value.tag, 16 bytes
  append(ev, "Train/Samples/lr");
  append(ev, bytes({0x15, 0x00, 0x00, 0x80, 0x3E}));  //     Value.simple_value, fixed32: 0.25f
  return ev;
}

TEST(TensorBoardEncoding, ScalarEventMatchesHandEncodedBytes) {
  EXPECT_EQ(encode_scalar_event(1.5, 300, "Train/Samples/lr", 0.25f), hand_encoded_scalar_event());
}

TEST(TensorBoardEncoding, StepZeroIsOmittedAndZeroValueKept) {
  std::vector<std::byte> ev = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F});  // 1.0
  append(ev, bytes({0x2A, 0x0B, 0x0A, 0x09, 0x0A, 0x02}));
  append(ev, "ab");
  append(ev, bytes({0x15, 0, 0, 0, 0}));
  EXPECT_EQ(encode_scalar_event(1.0, 0, "ab", 0.0f), ev);
}

TEST(TensorBoardEncoding, NegativeStepIsTenByteVarint) {
  std::vector<std::byte> ev = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F});
  append(ev, bytes({0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
  append(ev, bytes({0x2A, 0x0A, 0x0A, 0x08, 0x0A, 0x01}));
  append(ev, "x");
  append(ev, bytes({0x15, 0x00, 0x00, 0x80, 0x3F}));
  EXPECT_EQ(encode_scalar_event(1.0, -1, "x", 1.0f), ev);
}

TEST(TensorBoardEncoding, FileVersionEvent) {
  std::vector<std::byte> ev = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x1A, 0x0D});
  append(ev, "brain.Event:2");
  EXPECT_EQ(encode_file_version_event(1.5), ev);
}

TEST(TensorBoardEncoding, TfRecordFraming) {
  const std::vector<std::byte> data = hand_encoded_scalar_event();
  std::vector<std::byte> expected = bytes({39, 0, 0, 0, 0, 0, 0, 0});  // uint64 length 39
  append(expected, bytes({0xBB, 0xE1, 0xB1, 0x46}));                   // masked crc of length (py) 0x46b1e1bb
  append(expected, data);
  append(expected, bytes({0xD5, 0x8D, 0x22, 0xAF}));  // masked crc of data (py) 0xaf228dd5
  EXPECT_EQ(frame_tfrecord(data), expected);
}

// Reads TFRecords back with a CRC written independently of crc32c.cpp (bit by bit, no table).
std::uint32_t bitwise_masked_crc32c(const unsigned char* p, std::size_t n) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  crc ^= 0xFFFFFFFFu;
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  const auto* u = reinterpret_cast<const unsigned char*>(file.data());
  while (pos < file.size()) {
    EXPECT_GE(file.size() - pos, 12u);
    std::uint64_t len = 0;
    std::uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, u + pos, 8);
    std::memcpy(&len_crc, u + pos + 8, 4);
    EXPECT_EQ(len_crc, bitwise_masked_crc32c(u + pos, 8));
    EXPECT_GE(file.size() - pos - 12, len + 4);
    std::memcpy(&data_crc, u + pos + 12 + len, 4);
    EXPECT_EQ(data_crc, bitwise_masked_crc32c(u + pos + 12, len));
    out.emplace_back(file.substr(pos + 12, len));
    pos += 12 + len + 4;
  }
  return out;
}

double wall_time_of(const std::string& record) {
  EXPECT_EQ(static_cast<unsigned char>(record.at(0)), 0x09);
  double t = 0;
  std::memcpy(&t, record.data() + 1, 8);
  return t;
}

std::string as_string(const std::vector<std::byte>& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

TEST(TensorBoardMonitor, WritesAReadableEventFileUnderOutputPathJobName) {
  test::TempDir tmp;
  config::TensorboardConfig cfg{.enabled = true, .output_path = (tmp.path() / "tb").string(), .job_name = "run1"};
  TensorBoardMonitor tb(cfg);
  EXPECT_EQ(tb.log_dir(), tmp.path() / "tb" / "run1");
  const std::string name = tb.file_path().filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(tb.file_path().parent_path(), tmp.path() / "tb" / "run1");

  // The file_version record is on disk before any event: TensorBoard recognises an empty run.
  auto records = read_records(test::read_file(tb.file_path()));
  ASSERT_EQ(records.size(), 1u);
  std::string expected_version(records[0].substr(0, 9));
  expected_version +=
      "\x1A\x0D"
      "brain.Event:2";
  EXPECT_EQ(records[0], expected_version);

  const std::vector<MonitorEvent> step1 = {{"Train/Samples/lr", 0.25, 300}, {"Train/Samples/loss_scale", 65536.0, 300}};
  tb.write_events(step1);
  const std::vector<MonitorEvent> step2 = {{"Train/Samples/lr", 0.125, 600}};
  tb.write_events(step2);

  records = read_records(test::read_file(tb.file_path()));  // flushed: readable without closing
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[1].substr(9), as_string(hand_encoded_scalar_event()).substr(9));
  // loss_scale at 300: 65536 = 0x47800000 as float.
  std::string ls =
      "\x10\xAC\x02\x2A\x21\x0A\x1F\x0A\x18"
      "Train/Samples/loss_scale";
  ls += std::string("\x15\x00\x00\x80\x47", 5);
  EXPECT_EQ(records[2].substr(9), ls);
  std::string lr2 =
      "\x10\xD8\x04\x2A\x19\x0A\x17\x0A\x10"
      "Train/Samples/lr";                         // 600 = D8 04
  lr2 += std::string("\x15\x00\x00\x00\x3E", 5);  // 0.125f
  EXPECT_EQ(records[3].substr(9), lr2);
  const double t0 = wall_time_of(records[0]);
  EXPECT_GT(t0, 1.6e9);  // a unix time, in seconds
  EXPECT_GE(wall_time_of(records[3]), t0);
}

TEST(TensorBoardMonitor, TwoWritersInOneProcessGetDistinctFiles) {
  test::TempDir tmp;
  config::TensorboardConfig cfg{.enabled = true, .output_path = tmp.path().string(), .job_name = "j"};
  TensorBoardMonitor a(cfg), b(cfg);
  EXPECT_NE(a.file_path(), b.file_path());
}

TEST(TensorBoardMonitor, UnwritableOutputPathFailsAtConstructionNamingThePath) {
  test::TempDir tmp;
  std::ofstream(tmp.path() / "a_file") << "x";
  config::TensorboardConfig cfg{.enabled = true, .output_path = (tmp.path() / "a_file").string(), .job_name = "j"};
  try {
    TensorBoardMonitor tb(cfg);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("a_file"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensorboard.output_path"), std::string::npos) << msg;
  }
}

// Optional, independent reader: the protobuf library's own decoder (Debian python3-protobuf) parses
// our file through message types declared from TensorBoard's field numbers. Skips when absent.
TEST(TensorBoardMonitor, OfficialProtobufDecoderReadsOurFile) {
  if (std::system("/usr/bin/python3 -c 'import google.protobuf' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-protobuf is not installed (apt-get install python3-protobuf); independent check skipped";
  test::TempDir tmp;
  std::filesystem::path file;
  {
    TensorBoardMonitor tb(config::TensorboardConfig{.enabled = true, .output_path = tmp.path().string(), .job_name = "j"});
    const std::vector<MonitorEvent> events = {{"Train/Samples/lr", 0.25, 300},
                                              {"Train/Samples/loss_scale", 65536.0, 300},
                                              {"Train/Samples/train_loss", 0.0, 0},
                                              {"neg", -1.5, -7}};
    tb.write_events(events);
    file = tb.file_path();
  }
  const std::string out_path = (tmp.path() / "decoded.txt").string();
  const std::string cmd = std::string("/usr/bin/python3 ") + DSTRAIN_SOURCE_DIR + "/tests/unit/monitor/read_tfevents_with_protobuf.py '" +
                          file.string() + "' > '" + out_path + "'";
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "protobuf module not importable";
  ASSERT_EQ(rc, 0) << test::read_file(out_path);
  const std::string size = std::to_string(std::filesystem::file_size(file));
  EXPECT_EQ(test::read_file(out_path),
            "file_version brain.Event:2\n"
            "300 Train/Samples/lr 0.25\n"
            "300 Train/Samples/loss_scale 65536.0\n"
            "0 Train/Samples/train_loss 0.0\n"
            "-7 neg -1.5\n"
            "bytes " +
                size + " of " + size + "\n");
}

}  // namespace
}  // namespace dstrain
