// A training checkpoint (`--resume`, `dstrain consolidate`): the manifest, a rank's index and its
// data file, opened by CheckpointReader and every piece the index lists read back, one by one
// (read), all together (read_all) and streamed (stream).
//
// The input is the three files joined by kSeparator: checkpoint.json, rank_00000.json,
// rank_00000.safetensors (the seed corpus holds real ones, corpus/checkpoint/). The manifest records
// the index's size and checksum; a mutated index would almost never match them, so when the first
// byte of the input is odd the harness writes the true size and checksum into a manifest it can
// parse — to reach the index and data readers behind that check — and otherwise leaves the input as
// it is, so the check itself is fuzzed too.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "engine/checkpoint/checkpoint_files.h"
#include "ops/crc32c.h"
#include "ops/error.h"

namespace {
constexpr std::string_view kSeparator = "\n@@dstrain-fuzz-file@@\n";

void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  static const fs::path root = fs::temp_directory_path() / ("dstrain_fuzz_ckpt_" + std::to_string(::getpid()));
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  std::size_t at = 0;
  while (parts.size() < 2) {
    const std::size_t k = in.find(kSeparator, at);
    if (k == std::string_view::npos) break;
    parts.push_back(in.substr(at, k - at));
    at = k + kSeparator.size();
  }
  parts.push_back(in.substr(at));
  while (parts.size() < 3) parts.emplace_back();

  std::string manifest(parts[0]);
  if (size > 0 && (data[0] & 1) != 0) {
    try {
      dstrain::config::Json m = dstrain::config::Json::parse(manifest);
      if (m.is_object() && m.contains("ranks") && m["ranks"].is_array() && !m["ranks"].empty() && m["ranks"][0].is_object()) {
        m["ranks"][0]["bytes"] = parts[1].size();
        m["ranks"][0]["crc32c"] = dstrain::crc32c(parts[1].data(), parts[1].size());
        manifest = m.dump();
      }
    } catch (const std::exception&) {
    }
  }
  const fs::path dir = root / "t";
  fs::remove_all(root);
  fs::create_directories(dir);
  write_file(dir / dstrain::kCheckpointManifest, manifest);
  write_file(dir / "rank_00000.json", parts[1]);
  write_file(dir / "rank_00000.safetensors", parts[2]);
  try {
    dstrain::CheckpointReader rd(root, "t");
    dstrain::config::Json idx;
    try {
      idx = dstrain::config::Json::parse(parts[1]);
    } catch (const std::exception&) {
      return 0;  // the reader accepted an index this harness cannot parse: nothing more to read
    }
    std::vector<std::byte> out;
    for (const auto& t : idx.at("tensors")) {
      const auto numel = t.at("numel").get<std::int64_t>();
      if (numel < 0 || numel > (1 << 20)) continue;  // the harness's buffer bound; the reader refused such pieces already
      out.resize(static_cast<std::size_t>(numel) * 8);
      rd.read(t.at("buffer").get<std::string>(), t.at("param").get<std::string>(), t.at("offset").get<std::int64_t>(), numel, out.data());
    }
  } catch (const dstrain::Error&) {
  }
  // The same pieces in the index's order through read_all, as a load at the saving layout asks
  // for them: the file's span read in place when they lie back to back, else piece by piece.
  try {
    dstrain::CheckpointReader rd(root, "t");
    std::vector<dstrain::CheckpointReader::Want> want;
    std::int64_t total = 0;
    const dstrain::config::Json idx = dstrain::config::Json::parse(parts[1]);
    for (const auto& t : idx.at("tensors")) {
      const auto numel = t.at("numel").get<std::int64_t>();
      if (numel < 0 || numel > (1 << 20) || (total += numel) > (1 << 22)) break;  // the harness's memory bound
      want.push_back({t.at("buffer").get<std::string>(), t.at("param").get<std::string>(), t.at("offset").get<std::int64_t>(), numel});
    }
    (void)rd.read_all(want);
    // And streamed, as a load into an engine in its initial state reads them: every range handed
    // on must lie within its piece (the harness's bounds check).
    dstrain::CheckpointReader rs(root, "t");
    (void)rs.stream(want, [&want](std::size_t i, std::int64_t first, std::int64_t count, const std::byte* bytes) {
      if (i >= want.size() || first < 0 || count <= 0 || first + count > want[i].numel || bytes == nullptr) __builtin_trap();
      volatile std::byte sink = bytes[0];  // the range is readable memory (ASan checks the accesses)
      sink = bytes[static_cast<std::size_t>(count) - 1];
      (void)sink;
    });
  } catch (const dstrain::Error&) {  // (the reader parsed and checked the index the loop reads)
  }
  return 0;
}
