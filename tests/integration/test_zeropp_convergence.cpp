// ZeRO++ and MiCS train as plain ZeRO-3 does (docs/zero.md §10): a Llama shape, 200 steps on the
// Brown corpus (byte tokens, so that a run takes seconds), 4 local ranks as 2 nodes of 2, bf16; each
// feature's train losses against plain ZeRO-3's at the same steps. On demand (CTest label matrix).
//
// The tolerance comes from the size of each feature's quantization error, measured against a
// perturbation whose effect the test also measures: bf16 itself. The bf16 run is the fp32 run with
// every weight and gradient rounded to an 8-bit significand (relative rms error of round-to-nearest:
// 2^-7·√(E[1/m²])/√12 ≈ 0.0016 over mantissas m ∈ [1, 2)). Over steps 151-200, D(x) = the mean of
// |loss_x(t) − loss_plain(t)|; D(fp32) measures what a bf16-sized perturbation does to this training.
// A feature whose error is r times bf16's may move the losses by r·D(fp32):
//   qwZ    int8 weights, blocks of absmax m ≈ 3.7σ (thousands of Gaussian weights): rms error
//          (m/128)/√12 ≈ 0.0084σ, r = 5.2
//   qgZ    int4 gradients, blocks of 512 (m ≈ 3σ): rms (m/8)/√12 ≈ 0.11σ, r = 68
//   all    qwZ + qgZ (hpZ adds nothing): r = 73
//   MiCS   the gradients averaged twice in bf16 (shard group, then replicas): one extra bf16
//          rounding, plus a different summation order, r = 2
//   hpZ, MiCS hierarchical: the same bits (the secondary shards hold the gathered weights; the
//          two-level gather moves the same values): D = 0 exactly.
// Each feature must also change something where it quantizes (D > 0), or it was not on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

fs::path work_dir() { return fs::temp_directory_path() / ("dstrain_test_zeropp_convergence." + std::to_string(::getpid())); }

std::vector<double> train_losses(const std::string& name, const std::string& precision, const std::string& keys) {
  const fs::path dir = work_dir();
  const fs::path cfg = dir / (name + ".json"), summary = dir / (name + "_summary.json");
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 50, "gradient_clipping": 1.0, )" << precision << R"(
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
      "zero_optimization": {)"
                     << keys << R"( "stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}})";
  const auto q = [](const fs::path& p) { return shell_quote(p.string()); };
  const CliResult r =
      run_dstrain("train --deepspeed_config " + q(cfg) + " --model llama:L2-C64-H4-KV2-I172-V256-T64 --data " + q(dir / "brown_train.bin") +
                  " --sequence-length 64 --steps 200 --sample-tokens 0 --num-ranks 4" + " --ranks-per-node 2 --seed 7 --summary-json " + q(summary));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(read_file_text(summary))["train_losses"].get<std::vector<double>>();
}

double mean_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t t = 150; t < 200; ++t) s += std::abs(a[t] - b[t]);
  return s / 50.0;
}

TEST(ZeroPlusPlusConvergence, LossesWithinTheQuantizationErrorOfZero3) {
  const fs::path corpus = dstrain::testing::brown_corpus_dir();
  if (corpus.empty()) GTEST_SKIP() << "the Brown corpus is not there (bash scripts/setup.sh puts it under $DSTRAIN_CACHE or .cache)";
  const fs::path dir = work_dir();
  fs::remove_all(dir);
  const CliResult prep = dstrain::testing::prepare_brown_bytes(corpus, dir);
  ASSERT_EQ(prep.exit_code, 0) << prep.err;

  const std::string bf16 = R"("bf16": {"enabled": true},)";
  const std::vector<double> plain = train_losses("plain", bf16, "");
  const std::vector<double> fp32 = train_losses("fp32", "", "");
  ASSERT_EQ(plain.size(), 200u);
  ASSERT_EQ(fp32.size(), 200u);
  const double unit = mean_gap(fp32, plain);  // what a bf16-sized perturbation does
  ASSERT_GT(unit, 0.0);
  std::printf("D(fp32) = %.5f (bf16 vs fp32, mean |loss gap| over steps 151-200)\n", unit);
  struct Variant {
    const char* name;
    const char* stem;  // its files' names
    const char* keys;
    double ratio;  // < 0: bit-identical
  };
  const Variant variants[] = {
      {"qwZ", "qwz", R"("zero_quantized_weights": true,)", 5.2},
      {"qgZ", "qgz", R"("zero_quantized_gradients": true,)", 68.0},
      {"qwZ+hpZ+qgZ", "all", R"("zero_quantized_weights": true, "zero_hpz_partition_size": 2, "zero_quantized_gradients": true,)", 73.0},
      {"MiCS", "mics", R"("mics_shard_size": 2,)", 2.0},
      {"hpZ", "hpz", R"("zero_hpz_partition_size": 2,)", -1.0},
      {"MiCS hierarchical", "mics_hierarchical", R"("mics_shard_size": 4, "mics_hierarchical_params_gather": true,)", -1.0},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    const std::vector<double> losses = train_losses(v.stem, bf16, v.keys);
    ASSERT_EQ(losses.size(), 200u);
    const double gap = mean_gap(losses, plain);
    if (v.ratio < 0) {
      std::printf("%-18s D = %.5f (bound: 0, bit-identical)\n", v.name, gap);
    } else {
      std::printf("%-18s D = %.5f = %.2f x D(fp32) (bound %.1f x)\n", v.name, gap, gap / unit, v.ratio);
    }
    if (v.ratio < 0) {
      EXPECT_EQ(losses, plain);
    } else {
      EXPECT_GT(gap, 0.0);
      EXPECT_LE(gap, v.ratio * unit);
    }
    EXPECT_LT(losses.back(), plain.front() - 2.0);  // it trained (5.5 -> ~2.2)
  }
  fs::remove_all(dir);
}

}  // namespace
