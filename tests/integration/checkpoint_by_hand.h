// A dstrain checkpoint's latest tag read by hand, independently of the engine's reader
// (docs/checkpoints.md "Files"): the manifest, and every rank file's pieces (`<buffer>/<param>/<offset>`
// in its safetensors header) placed at their offsets into whole fp32 tensors — for the CLI tests that
// compare a resumed run's state with the one it came from byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace dstrain::testing {

struct SavedState {
  nlohmann::json manifest;
  std::map<std::string, std::map<std::string, std::string>> whole;  // buffer -> param -> whole tensor's bytes
};

inline SavedState read_checkpoint_by_hand(const std::filesystem::path& dir) {
  SavedState s;
  const std::filesystem::path tag = dir / read_file_text(dir / "latest");
  s.manifest = nlohmann::json::parse(read_file_text(tag / "checkpoint.json"));
  std::map<std::string, std::size_t> numel;
  for (const auto& p : s.manifest["model"]["params"]) {
    std::size_t n = 1;
    for (const auto& d : p["shape"]) n *= d.get<std::size_t>();
    numel[p["name"].get<std::string>()] = n;
  }
  std::map<std::string, std::map<std::string, std::size_t>> covered;
  for (const auto& r : s.manifest["ranks"]) {
    const nlohmann::json index = nlohmann::json::parse(read_file_text(tag / r["index"].get<std::string>()));
    const std::string data = read_file_text(tag / index["file"].get<std::string>());
    std::uint64_t hlen = 0;
    std::memcpy(&hlen, data.data(), 8);  // little-endian, as the tests' hosts are
    const nlohmann::json header = nlohmann::json::parse(data.substr(8, hlen));
    for (const auto& [key, e] : header.items()) {
      if (key == "__metadata__") continue;
      const auto slash1 = key.find('/'), slash2 = key.rfind('/');
      const std::string buffer = key.substr(0, slash1), param = key.substr(slash1 + 1, slash2 - slash1 - 1);
      if (buffer != "master" && buffer != "exp_avg" && buffer != "exp_avg_sq") continue;
      EXPECT_EQ(e["dtype"], "F32") << key;
      const std::size_t off = std::stoul(key.substr(slash2 + 1)), lo = e["data_offsets"][0], hi = e["data_offsets"][1];
      std::string& w = s.whole[buffer][param];
      if (w.empty()) w.assign(numel.at(param) * 4, '\0');
      EXPECT_LE(off * 4 + (hi - lo), w.size()) << key;
      if (off * 4 + (hi - lo) > w.size()) continue;
      std::memcpy(w.data() + off * 4, data.data() + 8 + hlen + lo, hi - lo);
      covered[buffer][param] += (hi - lo) / 4;
    }
  }
  for (const auto& [buffer, params] : covered)
    for (const auto& [param, n] : params) EXPECT_EQ(n, numel.at(param)) << dir << ": " << buffer << "/" << param << " not saved whole";
  return s;
}

// Every master, exp_avg and exp_avg_sq of `b` is `a`'s byte for byte (`params` of each), and the
// counters and the schedule's position are the same; `what` names the comparison in failures.
inline void expect_same_training_state(const SavedState& a, const SavedState& b, std::size_t params, const std::string& what) {
  for (const char* buffer : {"master", "exp_avg", "exp_avg_sq"}) {
    ASSERT_TRUE(a.whole.contains(buffer) && b.whole.contains(buffer)) << what << ": " << buffer;
    const auto& pa = a.whole.at(buffer);
    const auto& pb = b.whole.at(buffer);
    ASSERT_EQ(pa.size(), params) << what << ": " << buffer;
    ASSERT_EQ(pa.size(), pb.size()) << what << ": " << buffer;
    for (const auto& [param, bytes] : pa) {
      ASSERT_TRUE(pb.contains(param)) << what << ": " << buffer << "/" << param;
      EXPECT_TRUE(bytes == pb.at(param)) << what << ": " << buffer << "/" << param << " differs";
    }
  }
  for (const char* key : {"global_steps", "global_samples", "skipped_steps"}) EXPECT_EQ(b.manifest["engine"][key], a.manifest["engine"][key]) << what << ": " << key;
  EXPECT_EQ(b.manifest["lr_scheduler"], a.manifest["lr_scheduler"]) << what;
}

}  // namespace dstrain::testing
