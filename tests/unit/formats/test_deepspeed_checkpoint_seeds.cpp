// The seeds tests/fuzz/corpus/deepspeed_checkpoint/writer_*.bin (fuzz_deepspeed_checkpoint's corpus)
// are the project's DeepSpeed writer's folders (formats/deepspeed_checkpoint_writer.h) for a model of
// three small parameters in two groups, packed as the fuzz target unpacks them
// (tests/fuzz/fuzz_deepspeed_files.h): ZeRO 1 fp16 on 2 ranks, ZeRO 2 bf16 on 1, ZeRO 3 fp32 on 2,
// stage 0 fp16 and fp32, and the universal forms of a ZeRO 2 and a ZeRO 3 folder. This test writes them again and
// compares byte for byte, so the corpus cannot drift from the writer, and unpacks each seed and
// reads it back, so a seed is a folder the reader takes. To regenerate after a deliberate change
// of the format:
//   DSTRAIN_WRITE_FUZZ_SEEDS=tests/fuzz/corpus/deepspeed_checkpoint build/tests/unit/test_torch_save
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "formats/deepspeed_checkpoint.h"
#include "formats/deepspeed_checkpoint_writer.h"
#include "tests/fuzz/fuzz_deepspeed_files.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

// Small on purpose (each seed a few KB): a 4x2 matrix in the decayed group, a norm's weight and bias
// of 3 in the other — odd sizes, so that 2 ranks pad, and the matrices-then-the-rest grouping stage
// 0's reader infers. Values are exact in 16 bits, so no rounding depends on the writer's.
DeepSpeedTrainingState seed_state() {
  DeepSpeedTrainingState st;
  st.tag = "global_step2";
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> params = {
      {"transformer.wte.weight", {4, 2}}, {"transformer.ln_f.weight", {3}}, {"transformer.ln_f.bias", {3}}};
  float x = 0.25F;
  for (const auto& [n, s] : params) {
    st.names.push_back(n);
    st.shapes[n] = s;
    for (std::int64_t i = 0; i < s[0] * (s.size() > 1 ? s[1] : 1); ++i, x += 0.5F) {
      st.master[n].push_back(x);
      st.optimizer_states["exp_avg"][n].push_back(x / 64);
      st.optimizer_states["exp_avg_sq"][n].push_back(x / 1024);
    }
  }
  st.groups = {DeepSpeedParamGroup{{params[0].first}, 0.01}, DeepSpeedParamGroup{{params[1].first, params[2].first}, 0.0}};
  st.optimizer_step = 2;
  st.optimizer_type = "adamw";
  st.param_group = {{"lr", 1e-3}, {"betas0", 0.9}, {"betas1", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}};
  st.global_steps = 2;
  st.global_samples = 16;
  st.loss_scaler = DeepSpeedLossScaler{1024.0, 2, -1, 2, true};
  return st;
}

struct Seed {
  const char* name;
  std::uint8_t layout;
  DeepSpeedSaveLayout save;
  bool universal = false;
};

TEST(DeepSpeedCheckpointSeeds, TheFuzzSeedsAreThisWritersOutputAndReadBack) {
  using namespace dstrain::fuzz;
  const fs::path dir = fs::temp_directory_path() / fmt::format("dstrain_ds_seeds_{}", ::getpid());
  fs::remove_all(dir);
  const fs::path corpus = fs::path(DSTRAIN_SOURCE_DIR) / "tests/fuzz/corpus/deepspeed_checkpoint";
  const char* regenerate = std::getenv("DSTRAIN_WRITE_FUZZ_SEEDS");
  const DeepSpeedTrainingState st = seed_state();
  const std::vector<Seed> seeds = {
      {"writer_zero1_fp16_dp2.bin", kSave2, {1, 2, "fp16"}},
      {"writer_zero2_bf16_dp1.bin", static_cast<std::uint8_t>(kSave1 | kBf16Prefix), {2, 1, "bf16"}},
      {"writer_zero3_fp32_dp2.bin", kZero3, {3, 2, "fp32"}},
      {"writer_stage0_fp16.bin", kSave1, {0, 1, "fp16"}},
      {"writer_universal_zero2.bin", kUniversal, {2, 1, "fp32"}, true},
      // Beyond those, the two other code paths of the reader: stage 0's torch optimizer (fp32, no
      // flat groups) and universal's flat ZeRO-3 tensors.
      {"writer_stage0_fp32.bin", kSave1, {0, 1, "fp32"}},
      {"writer_universal_zero3_dp2.bin", static_cast<std::uint8_t>(kUniversal | kBf16Prefix), {3, 2, "fp32"}, true},
  };
  for (const Seed& s : seeds) {
    SCOPED_TRACE(s.name);
    const fs::path out = dir / s.name;
    if (s.universal) {
      write_universal_checkpoint(out, st, s.save);
    } else {
      write_deepspeed_checkpoint(out, st, s.save);
    }
    const std::string bytes = deepspeed_fuzz_pack(s.layout, out / st.tag, st.names);
    EXPECT_LT(bytes.size(), 16384u);  // a torch.save file is ~1 KB of zip around its pickle: universal, 14 files, is the largest
    // Each file of the folder in the seed (nothing the layout leaves out is one the reader needs:
    // checked by reading the unpacked seed below) and none holding the separator.
    for (const auto& e : fs::recursive_directory_iterator(out / st.tag))
      if (e.is_regular_file()) EXPECT_EQ(deepspeed_fuzz_slurp(e.path()).find(kDeepSpeedSeparator), std::string::npos) << e.path();
    if (regenerate != nullptr && *regenerate != '\0') std::ofstream(fs::path(regenerate) / s.name, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_TRUE(deepspeed_fuzz_slurp(corpus / s.name) == bytes) << "the committed seed differs from the writer's output (regenerate it: see this test)";

    const fs::path unpacked = dir / (std::string(s.name) + ".unpacked");
    ASSERT_TRUE(deepspeed_fuzz_unpack(bytes, unpacked));
    const DeepSpeedTrainingState got = read_deepspeed_checkpoint(unpacked);
    EXPECT_EQ(got.zero_stage, s.save.zero_stage);
    EXPECT_EQ(got.names, st.names);
    EXPECT_EQ(got.master, st.master);
    EXPECT_EQ(got.optimizer_states, st.optimizer_states);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dstrain
