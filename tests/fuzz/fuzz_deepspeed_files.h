// How fuzz_deepspeed_checkpoint's input maps to a DeepSpeed checkpoint folder, shared by the fuzz
// target (unpack: input -> folder) and the test that generates its seeds from the project's writer
// (pack: folder -> input, tests/unit/formats/test_deepspeed_checkpoint_seeds.cpp), so the two
// cannot disagree on the layout.
//
// The first byte picks the layout (its low two bits) and whether the optimizer files carry the
// "bf16_" prefix (bit 2; universal: whether its model states file is ZeRO-3's rank-0 one); the rest is the folder's files joined by kSeparator, in the layout's
// order. `latest` / `latest_universal` is the harness's own (it names the tag folder "t"): the tag's
// resolution is text checks, the folder's contents are what is fuzzed. A part left empty is a file
// not written (stage 0 is the save_checkpoint layout with the model states alone).
//   save1:     mp_rank_00_model_states.pt, zero_pp_rank_0_mp_rank_00_optim_states.pt
//   save2:     the same with rank 1's optimizer file after rank 0's
//   zero3:     zero_pp_rank_0_mp_rank_00_model_states.pt, the optimizer files of ranks 0 and 1
//   universal: mp_rank_00_model_states.pt (bit 2: zero_pp_rank_0_mp_rank_00_model_states.pt, as
//              converted from ZeRO-3), zero/optimizer_state.pt, then per parameter five parts:
//              its folder's name and zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt, step.pt
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::fuzz {

constexpr std::string_view kDeepSpeedSeparator = "\n@@dstrain-fuzz-file@@\n";
enum DeepSpeedFuzzLayout : std::uint8_t { kSave1 = 0, kSave2 = 1, kZero3 = 2, kUniversal = 3 };
constexpr std::uint8_t kBf16Prefix = 4;
constexpr const char* kDeepSpeedFuzzTag = "t";

// The tag folder's files of a save_checkpoint layout (every layout but universal), in input order.
inline std::vector<std::string> deepspeed_fuzz_files(std::uint8_t first) {
  const std::string prefix = (first & kBf16Prefix) != 0 ? "bf16_" : "";
  const auto optim = [&prefix](int r) { return prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt"; };
  switch (first & 3) {
    case kSave1: return {"mp_rank_00_model_states.pt", optim(0)};
    case kSave2: return {"mp_rank_00_model_states.pt", optim(0), optim(1)};
    case kZero3: return {"zero_pp_rank_0_mp_rank_00_model_states.pt", optim(0), optim(1)};
    default:
      return {(first & kBf16Prefix) != 0 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt", "zero/optimizer_state.pt"};
  }
}

// A universal parameter's folder name as the harness creates it: one plain path component (the
// reader's handling of other names is fuzzed through param_shapes, not through the harness's mkdir).
inline bool deepspeed_fuzz_folder_name(std::string_view n) {
  if (n.empty() || n.size() > 128 || n == "." || n == "..") return false;
  for (const char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

constexpr const char* kUniversalParamFiles[] = {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt"};

inline std::string deepspeed_fuzz_slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// pack: the input for `first`'s layout from the tag folder `tag_dir`; `params`: universal's
// parameter names, in param_shapes order. A file that is not there is an empty part.
inline std::string deepspeed_fuzz_pack(std::uint8_t first, const std::filesystem::path& tag_dir, const std::vector<std::string>& params = {}) {
  std::string out(1, static_cast<char>(first));
  std::vector<std::string> parts;
  for (const std::string& f : deepspeed_fuzz_files(first)) parts.push_back(std::filesystem::exists(tag_dir / f) ? deepspeed_fuzz_slurp(tag_dir / f) : "");
  if ((first & 3) == kUniversal) {
    for (const std::string& n : params) {
      parts.push_back(n);
      for (const char* f : kUniversalParamFiles) {
        const std::filesystem::path p = tag_dir / "zero" / n / f;
        parts.push_back(std::filesystem::exists(p) ? deepspeed_fuzz_slurp(p) : "");
      }
    }
  }
  while (!parts.empty() && parts.back().empty()) parts.pop_back();
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (k > 0) out += kDeepSpeedSeparator;
    out += parts[k];
  }
  return out;
}

// unpack: writes the input's folder under `root` (emptied first): root/latest or
// root/latest_universal naming root/t/. Returns false for an input without a layout byte.
inline bool deepspeed_fuzz_unpack(std::string_view in, const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  if (in.empty()) return false;
  const auto first = static_cast<std::uint8_t>(in[0]);
  in.remove_prefix(1);
  std::vector<std::string_view> parts;
  for (std::size_t at = 0;;) {
    const std::size_t k = in.find(kDeepSpeedSeparator, at);
    parts.push_back(in.substr(at, k == std::string_view::npos ? std::string_view::npos : k - at));
    if (k == std::string_view::npos) break;
    at = k + kDeepSpeedSeparator.size();
  }
  fs::remove_all(root);
  const fs::path tag = root / kDeepSpeedFuzzTag;
  fs::create_directories(tag);
  const auto write = [](const fs::path& p, std::string_view bytes) {
    if (bytes.empty()) return;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  const std::vector<std::string> files = deepspeed_fuzz_files(first);
  std::size_t k = 0;
  for (; k < files.size() && k < parts.size(); ++k) write(tag / files[k], parts[k]);
  if ((first & 3) == kUniversal) {
    fs::create_directories(tag / "zero");  // what makes the tag folder a universal one
    for (; k < parts.size(); k += 5) {  // a last parameter cut short: the files there are
      if (!deepspeed_fuzz_folder_name(parts[k])) continue;
      const fs::path folder = tag / "zero" / std::string(parts[k]);
      fs::create_directories(folder);
      for (std::size_t f = 0; f < 4 && k + 1 + f < parts.size(); ++f) write(folder / kUniversalParamFiles[f], parts[k + 1 + f]);
    }
  }
  std::ofstream((root / ((first & 3) == kUniversal ? "latest_universal" : "latest")).string()) << kDeepSpeedFuzzTag;
  return true;
}

}  // namespace dstrain::fuzz
