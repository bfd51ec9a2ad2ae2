// The checkpoint writers (docs/checkpoints.md "Writers"): RankFileWriter's files, whatever the
// writer ("fast": O_DIRECT from aligned staging buffers, through the offload layer's io_uring
// engine or pwrite; "python": buffered) and staging layout
// (one or two buffers, buffers smaller than a piece, an element straddling two buffers), hold the
// pieces' bytes as safetensors reads them back, are cut to their exact size, and carry CRC-32Cs
// equal to a bit-at-a-time reference; the config keys of checkpoint.writer are checked as
// DeepSpeed defines them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "formats/safetensors.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

// CRC-32C one bit at a time, straight from the definition (reflected 0x82F63B78, ~0 in and out).
std::uint32_t crc32c_bitwise(const std::byte* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= static_cast<std::uint8_t>(p[i]);
    for (int b = 0; b < 8; ++b) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

// ops/crc32c.cpp runs three interleaved chains over each 3 x 8192-byte block and joins them by a
// shift through 8192 zero bytes: every length, alignment and split point must still give the
// definition's value.
TEST(Crc32c, EqualsTheBitwiseDefinitionAcrossLanesAlignmentsAndSplits) {
  std::mt19937_64 rng(3);
  std::vector<std::byte> b(4 * 3 * 8192 + 1000);
  for (std::byte& x : b) x = static_cast<std::byte>(rng());
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{24575}, std::size_t{24576},
                              std::size_t{24577}, std::size_t{49152 + 13}, b.size() - 5}) {
    for (const std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
      EXPECT_EQ(crc32c(b.data() + off, n), crc32c_bitwise(b.data() + off, n)) << n << " bytes at " << off;
    }
  }
  const std::uint32_t whole = crc32c_bitwise(b.data(), b.size());
  for (const std::size_t m : {std::size_t{1}, std::size_t{8191}, std::size_t{24576}, std::size_t{30001}}) {
    EXPECT_EQ(crc32c(b.data() + m, b.size() - m, crc32c(b.data(), m)), whole) << "split at " << m;
  }
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct WriterCase {
  const char* name;
  RankFileWriterOptions options;
};

// A bf16 piece of odd length first, so that every later fp32 piece starts 2 bytes off a 4-byte
// boundary and, with 4096-byte buffers, one of its elements straddles two buffers.
const std::vector<CheckpointPiece> kPieces = {
    {"param", "a", 0, 1001, DType::bf16}, {"master", "a", 0, 3000, DType::fp32}, {"master", "b", 8, 7, DType::fp32},
    {"exp_avg", "a", 0, 0, DType::fp32},  {"param", "b", 0, 5, DType::bf16},     {"master", "c", 0, 2049, DType::fp32},
};

std::vector<std::vector<std::byte>> random_pieces() {
  std::mt19937 rng(7);
  std::vector<std::vector<std::byte>> data;
  for (const CheckpointPiece& p : kPieces) {
    std::vector<std::byte> b(static_cast<std::size_t>(p.numel) * dtype_size(p.dtype));
    for (std::byte& x : b) x = static_cast<std::byte>(rng());
    data.push_back(std::move(b));
  }
  return data;
}

config::Json write_file(const fs::path& path, const RankFileWriterOptions& o, const std::vector<std::vector<std::byte>>& data, bool* direct = nullptr,
                        bool* io_uring = nullptr) {
  RankFileWriter w(path, kPieces, o);
  for (std::size_t i = 0; i < kPieces.size(); ++i) {
    if (i % 2 == 0) {
      w.write(i, data[i].data());
    } else {
      // Through the source callback, as the engine writes from the optimizer partition.
      const std::size_t esize = dtype_size(kPieces[i].dtype);
      w.write(i, [&, i, esize](std::int64_t first, std::int64_t count, void* dst) {
        std::memcpy(dst, data[i].data() + static_cast<std::size_t>(first) * esize, static_cast<std::size_t>(count) * esize);
      });
    }
  }
  config::Json index = w.finish();
  if (direct != nullptr) *direct = w.direct();
  if (io_uring != nullptr) *io_uring = w.io_uring();
  return index;
}

TEST(CheckpointWriter, EveryWriterWritesTheSameCheckedFile) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dstrain_ckpt_writer_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto data = random_pieces();
  const std::vector<WriterCase> cases = {
      {"fast-double-8k", {true, 8192, true, "checkpoint.writer.type", std::nullopt}},
      {"fast-single-4k", {true, 4096, false, "checkpoint.writer.type", std::nullopt}},
      {"fast-default", {}},
      {"fast-io_uring-8k", {true, 8192, true, "checkpoint.writer.type", IoOptions{}}},
      {"fast-io_uring-single-4k-small-blocks", {true, 4096, false, "checkpoint.writer.type", IoOptions{.block_size = 4096, .queue_depth = 2}}},
      {"python-double-8k", {false, 8192, true, "", std::nullopt}},
      {"python-single-64k", {false, 65536, false, "", std::nullopt}},
  };
  std::string reference;
  for (const WriterCase& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path path = dir / (std::string(c.name) + ".safetensors");
    bool direct = false, io_uring = false;
    const config::Json index = write_file(path, c.options, data, &direct, &io_uring);
    EXPECT_EQ(direct, c.options.direct);             // this test folder's file system takes O_DIRECT (ext4, xfs, tmpfs >= 6.6)
    EXPECT_EQ(io_uring, c.options.aio.has_value());  // the kernel has io_uring (the offload tests need it too)
    const std::string bytes = file_bytes(path);
    EXPECT_EQ(index.at("bytes").get<std::uint64_t>(), bytes.size());  // the padded tail cut off
    if (reference.empty()) reference = bytes;
    EXPECT_EQ(bytes, reference);
    const SafetensorsFile st(path);
    for (std::size_t i = 0; i < kPieces.size(); ++i) {
      const SafetensorsEntry* e = st.find(kPieces[i].tensor_name());
      ASSERT_NE(e, nullptr) << kPieces[i].tensor_name();
      const auto got = st.bytes(*e);
      ASSERT_EQ(got.size(), data[i].size());
      // memcmp on an empty piece would pass it a null pointer (undefined even for 0 bytes: UBSan).
      if (!got.empty()) {
        EXPECT_EQ(std::memcmp(got.data(), data[i].data(), got.size()), 0) << kPieces[i].tensor_name();
      }
      EXPECT_EQ(index.at("tensors")[i].at("crc32c").get<std::uint32_t>(), crc32c_bitwise(data[i].data(), data[i].size())) << kPieces[i].tensor_name();
    }
  }
  // A file system that refuses O_DIRECT (the test hook stands in for tmpfs on older kernels): the
  // same file through the page cache.
  ::setenv(kCheckpointNoDirectEnv, "1", 1);
  bool direct = true;
  write_file(dir / "refused.safetensors", {true, 8192, true, "checkpoint.writer.type", IoOptions{}}, data, &direct);
  ::unsetenv(kCheckpointNoDirectEnv);
  EXPECT_FALSE(direct);
  EXPECT_EQ(file_bytes(dir / "refused.safetensors"), reference);
  fs::remove_all(dir);
}

// ---- checkpoint.writer keys, as DeepSpeed's model_checkpointing/config.py reads them ----

config::CheckpointWriterConfig writer_of(const std::string& writer) {
  const std::string json = R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "checkpoint": {"writer": )" + writer + "}}";
  config::ConfigOptions o;
  o.world_size = 1;
  return config::parse_ds_config(config::Json::parse(json), o).checkpoint.writer_options;
}

void expect_refused(const std::string& writer, const std::string& key) {
  try {
    writer_of(writer);
    ADD_FAILURE() << writer << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

TEST(CheckpointWriter, ConfigKeysAsDeepSpeedDefinesThem) {
  const config::CheckpointWriterConfig d = writer_of("{}");
  EXPECT_TRUE(d.present);
  EXPECT_EQ(d.type, config::CheckpointWriterType::fast);  // DeepSpeed's default once the block is there
  EXPECT_EQ(d.io_buffer_size, 64 << 20);
  EXPECT_TRUE(d.io_buffer_double);
  EXPECT_FALSE(d.decoupled);
  EXPECT_EQ(writer_of(R"({"type": "Python"})").type, config::CheckpointWriterType::python);  // any case
  EXPECT_EQ(writer_of(R"({"type": "FAST", "decoupled": true})").decoupled, true);
  EXPECT_EQ(writer_of(R"({"io_buffer_size": 8192})").io_buffer_size, 8192);
  EXPECT_EQ(writer_of(R"({"io_buffer_size": 4096, "io_buffer_double": false})").io_buffer_size, 4096);
  // 64e6 (DeepSpeed's documented example) is whole 4096-byte blocks, but not two halves of them.
  EXPECT_EQ(writer_of(R"({"io_buffer_size": 64e6, "io_buffer_double": false})").io_buffer_size, 64000000);
  expect_refused(R"({"io_buffer_size": 64e6})", "checkpoint.writer.io_buffer_size");
  expect_refused(R"({"io_buffer_size": 1000000})", "checkpoint.writer.io_buffer_size");  // not whole blocks
  expect_refused(R"({"io_buffer_size": 4096})", "checkpoint.writer.io_buffer_size");     // too small for two buffers
  expect_refused(R"({"io_buffer_size": 0, "io_buffer_double": false})", "checkpoint.writer.io_buffer_size");
  expect_refused(R"({"io_buffer_size": 8192.5})", "checkpoint.writer.io_buffer_size");
  expect_refused(R"({"io_buffer_size": "64M"})", "checkpoint.writer.io_buffer_size");
  expect_refused(R"({"type": "mock"})", "checkpoint.writer.type");  // writes nothing: no checkpoint to resume
  expect_refused(R"({"type": "nvme"})", "checkpoint.writer.type");
  expect_refused(R"({"io_buffer_double": 1})", "checkpoint.writer.io_buffer_double");
  expect_refused(R"({"decoupled": "yes"})", "checkpoint.writer.decoupled");
}

// ---- reading back: CheckpointReader::read_all (docs/checkpoints.md "Loading") ----

// A one-rank checkpoint folder holding `pieces` (random bytes, returned) as RankFileWriter writes
// them, with the index and a manifest as the engine commits them.
std::vector<std::vector<std::byte>> write_checkpoint(const fs::path& dir, const std::vector<CheckpointPiece>& pieces) {
  fs::create_directories(dir);
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::byte>> data;
  RankFileWriter w(dir / rank_file_name(0, ".safetensors"), pieces);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::vector<std::byte> b(static_cast<std::size_t>(pieces[i].numel) * dtype_size(pieces[i].dtype));
    for (std::size_t k = 0; k < b.size(); k += 8) {  // eight random bytes a draw: the stream test writes 100 MB
      const std::uint64_t r = rng();
      std::memcpy(b.data() + k, &r, std::min<std::size_t>(8, b.size() - k));
    }
    w.write(i, b.data());
    data.push_back(std::move(b));
  }
  const std::string index = w.finish().dump(1);
  std::ofstream(dir / rank_file_name(0, ".json"), std::ios::binary) << index;
  // Every field the reader checks (engine/checkpoint/checkpoint_manifest.h), for one fp32 rank at
  // step 0; the pieces are not parameters of a model, so the model lists none.
  const config::Json manifest = {{"format", kCheckpointFormat},
                                 {"version", kCheckpointVersion},
                                 {"tag", "t"},
                                 {"layout", {{"world_size", 1}, {"zero_stage", 0}, {"dtype", "fp32"}}},
                                 {"ranks",
                                  {{{"index", rank_file_name(0, ".json")},
                                    {"bytes", index.size()},
                                    {"crc32c", crc32c_bitwise(reinterpret_cast<const std::byte*>(index.data()), index.size())}}}},
                                 {"model", {{"parameter_count", 0}, {"params", config::Json::array()}}},
                                 {"optimizer", {{"type", "adamw"}, {"states", {"exp_avg", "exp_avg_sq"}}}},
                                 {"engine",
                                  {{"global_steps", 0},
                                   {"skipped_steps", 0},
                                   {"global_samples", 0},
                                   {"micro_steps", 0},
                                   {"gradient_accumulation_steps", 1},
                                   {"train_batch_size", 1},
                                   {"last_step_lr", 0.0},
                                   {"last_step_loss", 0.0}}},
                                 {"loss_scaler",
                                  {{"kind", "unscaled"}, {"cur_scale", 1.0}, {"cur_iter", 0}, {"last_overflow_iter", -1}, {"cur_hysteresis", 0}}},
                                 {"lr_scheduler", {{"last_batch_iteration", -1}}},
                                 {"seed", 42}};
  std::ofstream(dir / kCheckpointManifest, std::ios::binary) << manifest.dump();
  return data;
}

TEST(CheckpointReader, ReadAllStraightFromTheFileOrPieceByPiece) {
  const fs::path root = fs::temp_directory_path() / fmt::format("dstrain_ckpt_reader_{}", ::getpid());
  fs::remove_all(root);
  // 40 MB: more than one 32 MiB request, "master/b" straddling the first two; an empty piece; the
  // 16-bit params last, as the engine writes them.
  const std::vector<CheckpointPiece> pieces = {
      {"master", "a", 0, 5'000'000, DType::fp32}, {"master", "b", 0, 4'000'000, DType::fp32},  {"master", "b", 4'000'000, 7, DType::fp32},
      {"exp_avg", "c", 0, 0, DType::fp32},        {"exp_avg", "a", 0, 1'000'000, DType::fp32}, {"param", "a", 0, 1001, DType::bf16},
  };
  const auto data = write_checkpoint(root / "t", pieces);
  const auto want_of = [&](std::size_t i) { return CheckpointReader::Want{pieces[i].buffer, pieces[i].param, pieces[i].offset, pieces[i].numel}; };
  const auto expect_values = [&](const CheckpointReader::Loaded& got, const std::vector<std::size_t>& order) {
    ASSERT_EQ(got.at.size(), order.size());
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto& d = data[order[k]];
      if (!d.empty()) {  // memcmp: never a null pointer
        EXPECT_EQ(std::memcmp(got.at[k], d.data(), d.size()), 0) << pieces[order[k]].tensor_name();
      }
    }
  };
  const std::vector<std::size_t> file_order = {0, 1, 2, 3, 4, 5};
  {  // the saving layout, front to back: one span of the file, pieces back to back
    CheckpointReader rd(root, "t");
    std::vector<CheckpointReader::Want> want;
    for (std::size_t i : file_order) want.push_back(want_of(i));
    const auto got = rd.read_all(want);
    expect_values(got, file_order);
    // Read in place: the first piece sits at its file offset's place within a 4096-byte block
    // (the data section starts after the 8-byte length and the header).
    const std::string head = file_bytes(root / "t" / rank_file_name(0, ".safetensors")).substr(0, 8);
    std::uint64_t data_start = 8;
    for (int i = 7; i >= 0; --i) data_start += static_cast<std::uint64_t>(static_cast<std::uint8_t>(head[static_cast<std::size_t>(i)])) << (8 * i);
    ASSERT_NE(data_start % 4096, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(got.at[0]) % 4096, data_start % 4096);
  }
  {  // another order: piece by piece
    CheckpointReader rd(root, "t");
    const std::vector<std::size_t> order = {5, 2, 0, 3, 4, 1};
    std::vector<CheckpointReader::Want> want;
    for (std::size_t i : order) want.push_back(want_of(i));
    expect_values(rd.read_all(want), order);
  }
  {  // a reshard: part of a piece, across the two saved pieces of "master/b"
    CheckpointReader rd(root, "t");
    const auto got = rd.read_all({{"master", "b", 3'999'990, 15}});
    std::vector<std::byte> expect(data[1].end() - 40, data[1].end());
    expect.insert(expect.end(), data[2].begin(), data[2].begin() + 20);
    EXPECT_EQ(std::memcmp(got.at[0], expect.data(), expect.size()), 0);
  }
  // One flipped bit past the first 32 MiB request, in "master/b/0": its checksum, checked on the
  // requests already landed, names it.
  const fs::path file = root / "t" / rank_file_name(0, ".safetensors");
  std::string bytes = file_bytes(file);
  const std::size_t at = bytes.size() - data[5].size() - data[4].size() - data[2].size() - 1000;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x04);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  try {
    CheckpointReader rd(root, "t");
    std::vector<CheckpointReader::Want> want;
    for (std::size_t i : file_order) want.push_back(want_of(i));
    rd.read_all(want);
    ADD_FAILURE() << "a corrupt piece was read";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("master/b/0"), std::string::npos) << m;
    EXPECT_NE(m.find("checksum"), std::string::npos) << m;
  }
  fs::remove_all(root);
}

// CheckpointReader::stream: the saving layout's span handed on range by range through three
// reused slots, in file order, each piece's checksum checked when its last range is in.
TEST(CheckpointReader, StreamHandsOnEveryRangeInFileOrderCheckingEachPiece) {
  const fs::path root = fs::temp_directory_path() / fmt::format("dstrain_ckpt_stream_{}", ::getpid());
  fs::remove_all(root);
  // 102 MB: four 32 MiB requests, so the three slots are each reused; pieces straddling requests,
  // an empty one, the 16-bit params last.
  const std::vector<CheckpointPiece> pieces = {
      {"master", "a", 0, 10'000'000, DType::fp32}, {"master", "b", 0, 9'000'001, DType::fp32}, {"exp_avg", "c", 0, 0, DType::fp32},
      {"exp_avg", "a", 0, 6'000'000, DType::fp32}, {"param", "a", 0, 1'000'001, DType::bf16},
  };
  const auto data = write_checkpoint(root / "t", pieces);
  std::vector<CheckpointReader::Want> want;
  for (const CheckpointPiece& p : pieces) want.push_back({p.buffer, p.param, p.offset, p.numel});
  // Copies each range where it belongs; checks that the ranges come in file order, each piece's
  // front to back without gap or repeat.
  struct Received {
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::int64_t> next;
    std::size_t last = 0, calls = 0;
  };
  const auto receiver = [&](Received& r) {
    r.bytes.resize(pieces.size());
    for (std::size_t i = 0; i < pieces.size(); ++i) r.bytes[i].assign(data[i].size(), std::byte{0});
    r.next.assign(pieces.size(), 0);
    return [&](std::size_t i, std::int64_t first, std::int64_t count, const std::byte* d) {
      ASSERT_LT(i, pieces.size());
      EXPECT_GE(i, r.last) << "out of file order";
      r.last = i;
      EXPECT_EQ(first, r.next[i]) << pieces[i].tensor_name();
      ASSERT_LE(first + count, pieces[i].numel);
      const std::size_t es = dtype_size(pieces[i].dtype);
      std::memcpy(r.bytes[i].data() + static_cast<std::size_t>(first) * es, d, static_cast<std::size_t>(count) * es);
      r.next[i] = first + count;
      ++r.calls;
    };
  };
  {
    CheckpointReader rd(root, "t");
    Received r;
    ASSERT_TRUE(rd.stream(want, receiver(r)));
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(r.next[i], pieces[i].numel) << pieces[i].tensor_name();
      EXPECT_TRUE(r.bytes[i] == data[i]) << pieces[i].tensor_name();
    }
    EXPECT_GE(r.calls, 6u);  // 4 non-empty pieces, at least two of them straddling a request
  }
  {  // another order is not the file's span: nothing read, nothing handed on
    CheckpointReader rd(root, "t");
    std::vector<CheckpointReader::Want> other = {want[1], want[0]};
    bool called = false;
    EXPECT_FALSE(rd.stream(other, [&](std::size_t, std::int64_t, std::int64_t, const std::byte*) { called = true; }));
    EXPECT_FALSE(called);
  }
  // One flipped bit in "exp_avg/a/0", in the third request: the pieces before it were handed on
  // whole, then its checksum fails naming it.
  const fs::path file = root / "t" / rank_file_name(0, ".safetensors");
  std::string bytes = file_bytes(file);
  const std::size_t at = bytes.size() - data[4].size() - 1000;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  Received r;
  try {
    CheckpointReader rd(root, "t");
    rd.stream(want, receiver(r));
    ADD_FAILURE() << "a corrupt piece was streamed without an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("exp_avg/a/0"), std::string::npos) << m;
    EXPECT_NE(m.find("checksum"), std::string::npos) << m;
  }
  EXPECT_EQ(r.next[0], pieces[0].numel);
  EXPECT_EQ(r.next[1], pieces[1].numel);
  EXPECT_EQ(r.next[4], 0);  // nothing after the corrupt piece
  fs::remove_all(root);
}

}  // namespace
}  // namespace dstrain
