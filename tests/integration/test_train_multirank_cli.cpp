// `dstrain train --num-ranks N` through the built binary: N local ranks (threads of one process)
// train like one rank with the same global batch (docs/design.md "Correctness contract"): for ZeRO stages
// 0-3, 2 ranks with gradient_accumulation_steps g give the losses of 1 rank with 2g, and the same
// val loss. --summary-json's "zero" object holds every rank's ZeroReport, whose bytes show what each
// stage partitions. Rank 0 alone prints. Bad --num-ranks, a train_batch_size that does not fit the
// world size, and threads under a launcher's WORLD_SIZE > 1 exit non-zero naming the cause.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

// fp32 on the CPU: W ranks differ from one rank only in the order of reductions.
constexpr double kLossTolerance = 2e-4;

class TrainMultirankCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_train_multirank_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string q(const fs::path& p) { return shell_quote(p.string()); }

  // A config of ZeRO `stage` with micro-batch 2 and `gas` accumulation steps. Stage 3 partitions
  // every parameter (threshold 0: the tiny model's tensors are all below DeepSpeed's 1e5 default)
  // and gathers them for --save-weights.
  static fs::path config(int stage, int gas) {
    const fs::path p = dir_ / ("zero" + std::to_string(stage) + "_gas" + std::to_string(gas) + ".json");
    std::ofstream(p) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" << gas << R"(, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
      "zero_optimization": {"stage": )"
                     << stage << R"(, "stage3_param_persistence_threshold": 0, "stage3_gather_16bit_weights_on_model_save": true}})";
    return p;
  }

  // --num-ranks `ranks` (as the shell word given), samples of `sample_tokens` tokens.
  static std::string train_args(const fs::path& cfg, const std::string& ranks, int sample_tokens = 8) {
    return "train --deepspeed_config " + q(cfg) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           " --val-data " + q(dir_ / "t_val.bin") + " --val-batches 4 --seed 5 --sample-tokens " + std::to_string(sample_tokens) + " --num-ranks " +
           ranks;
  }
  static nlohmann::json summary(const fs::path& p) { return nlohmann::json::parse(read_file_text(p)); }

  static std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  static fs::path dir_;
};
fs::path TrainMultirankCli::dir_;

// (a) For every stage: 2 ranks x GAS 2 trains like 1 rank x GAS 4 (the same 8 sequences a step),
// step losses and val loss; rank 0 alone prints. Stages 1 and 3 also save the weights (collective;
// stage 3 gathers them), which a fresh 1-rank run loads to the same val loss.
TEST_F(TrainMultirankCli, TwoRanksTrainLikeOneRankWithTheSameGlobalBatch) {
  constexpr int kSteps = 4;
  const CliResult one = run_dstrain(train_args(config(0, 4), "1") + " --steps " + std::to_string(kSteps) + " --summary-json " + q(dir_ / "one.json"));
  ASSERT_EQ(one.exit_code, 0) << one.err << one.out;
  const nlohmann::json s1 = summary(dir_ / "one.json");
  const auto ref = s1["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(s1["zero"]["world_size"], 1);
  ASSERT_EQ(s1["zero"]["ranks"].size(), 1u);

  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const fs::path json = dir_ / ("two_stage" + std::to_string(stage) + ".json");
    const bool save = stage == 1 || stage == 3;
    const fs::path weights = dir_ / ("w" + std::to_string(stage) + ".safetensors");
    std::string extra;  // built by append: GCC 12 warns (-Wrestrict, a false positive) on "literal" + std::string here
    if (save) {
      extra = " --save-weights ";
      extra += q(weights);
    }
    const CliResult two =
        run_dstrain(train_args(config(stage, 2), "2") + " --steps " + std::to_string(kSteps) + " --summary-json " + q(json) + extra);
    ASSERT_EQ(two.exit_code, 0) << two.err << two.out;
    EXPECT_NE(two.out.find("train_batch_size 8 = micro-batch 2 x gradient_accumulation_steps 2 x world size 2"), std::string::npos) << two.out;
    EXPECT_NE(two.out.find("zero: stage " + std::to_string(stage) + " on 2 ranks"), std::string::npos) << two.out;
    // Rank 0 alone prints: one progress line per step, one val loss, one sample, one summary.
    EXPECT_EQ(count(two.out, "step 1/4 | loss"), 1u) << two.out;
    EXPECT_EQ(count(two.out, "| val loss"), 1u) << two.out;
    EXPECT_EQ(count(two.out, "| sample ("), 1u) << two.out;
    EXPECT_EQ(count(two.out, "final train loss"), 1u) << two.out;
    EXPECT_EQ(count(two.out, "model gpt2:"), 1u) << two.out;

    const nlohmann::json s2 = summary(json);
    EXPECT_EQ(s2["steps"], kSteps);
    EXPECT_EQ(s2["tokens"], kSteps * 8 * 32);
    EXPECT_EQ(s2["train_batch_size"], 8);
    const auto losses = s2["train_losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), ref.size());
    for (std::size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(losses[k], ref[k], kLossTolerance) << "step " << k + 1;
    EXPECT_LT(losses.back(), losses.front());
    // --val-batches 4 counts batches over all ranks: each rank evaluates 2, together the 4 one rank does.
    ASSERT_TRUE(s2["final_val_loss"].is_number());
    EXPECT_NEAR(s2["final_val_loss"].get<double>(), s1["final_val_loss"].get<double>(), kLossTolerance);

    EXPECT_EQ(s2["zero"]["stage"], stage);
    EXPECT_EQ(s2["zero"]["world_size"], 2);
    ASSERT_EQ(s2["zero"]["ranks"].size(), 2u);

    if (save) {
      ASSERT_TRUE(fs::is_regular_file(weights));
      EXPECT_NE(two.out.find("weights saved to"), std::string::npos);
      const fs::path back = dir_ / ("back" + std::to_string(stage) + ".json");
      const CliResult c = run_dstrain(train_args(config(0, 4), "1") + " --steps 0 --init-from " + q(weights) + " --summary-json " + q(back));
      ASSERT_EQ(c.exit_code, 0) << c.err;
      EXPECT_NEAR(summary(back)["final_val_loss"].get<double>(), s2["final_val_loss"].get<double>(), kLossTolerance);
    }
  }
}

// (b) The "zero" object of --summary-json: every rank's report, and the bytes each stage partitions
// over 2 ranks against stage 0's whole copies, computed from padded_param_elements (fp32: 4 bytes).
TEST_F(TrainMultirankCli, SummaryJsonReportsEveryRanksZeroState) {
  std::vector<nlohmann::json> ranks;  // rank 0's report per stage
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const fs::path json = dir_ / ("report" + std::to_string(stage) + ".json");
    const CliResult r = run_dstrain(train_args(config(stage, 2), "2", 0) + " --steps 2 --summary-json " + q(json));
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    const nlohmann::json z = summary(json)["zero"];
    ASSERT_EQ(z["ranks"].size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const nlohmann::json& rk = z["ranks"][static_cast<std::size_t>(i)];
      EXPECT_EQ(rk["rank"], i);
      for (const char* key :
           {"param_bytes", "grad_bytes", "optimizer_bytes", "peak_bytes", "padded_param_elements", "peak_gathered_param_elements"}) {
        EXPECT_TRUE(rk.contains(key)) << key;
      }
      for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"}) {
        ASSERT_TRUE(rk["step_comm"].contains(kind)) << kind;
        EXPECT_TRUE(rk["step_comm"][kind]["bytes"].is_number_unsigned()) << kind;
        EXPECT_TRUE(rk["step_comm"][kind]["calls"].is_number_unsigned()) << kind;
      }
      EXPECT_GT(rk["step_comm"]["total"]["bytes"].get<double>(), 0.0);  // 2 ranks always communicate
      EXPECT_GT(rk["peak_bytes"].get<double>(), 0.0);
      // Both ranks hold the same amounts (the padded layout splits evenly).
      EXPECT_EQ(rk["padded_param_elements"], z["ranks"][0]["padded_param_elements"]);
      EXPECT_EQ(rk["grad_bytes"], z["ranks"][0]["grad_bytes"]);
    }
    ranks.push_back(z["ranks"][0]);
  }
  const double psi = ranks[0]["padded_param_elements"].get<double>();
  ASSERT_GT(psi, 0.0);
  for (const auto& r : ranks) EXPECT_EQ(r["padded_param_elements"].get<double>(), psi);
  const auto bytes = [&](int stage, const char* key) { return ranks[static_cast<std::size_t>(stage)][key].get<double>(); };
  const auto near = [](double got, double want) { return std::abs(got - want) <= 0.05 * want; };  // views are 64-byte aligned
  // Stage 0: whole params, grads and Adam m + v.
  EXPECT_PRED2(near, bytes(0, "param_bytes"), 4 * psi);
  EXPECT_PRED2(near, bytes(0, "grad_bytes"), 4 * psi);
  EXPECT_PRED2(near, bytes(0, "optimizer_bytes"), 8 * psi);
  // Stage 1: optimizer states partitioned.
  EXPECT_PRED2(near, bytes(1, "optimizer_bytes"), 8 * psi / 2);
  EXPECT_PRED2(near, bytes(1, "param_bytes"), 4 * psi);
  // Stage 2: + gradients: half of stage 0's.
  EXPECT_PRED2(near, bytes(2, "grad_bytes"), 4 * psi / 2);
  EXPECT_PRED2(near, bytes(2, "grad_bytes"), bytes(0, "grad_bytes") / 2);
  EXPECT_PRED2(near, bytes(2, "optimizer_bytes"), 8 * psi / 2);
  // Stage 3: + parameters (every one partitioned: threshold 0), gathered layer by layer.
  EXPECT_PRED2(near, bytes(3, "param_bytes"), 4 * psi / 2);
  EXPECT_GT(ranks[3]["peak_gathered_param_elements"].get<double>(), 0.0);
  EXPECT_LE(ranks[3]["peak_gathered_param_elements"].get<double>(), psi);
  EXPECT_GT(ranks[3]["step_comm"]["all_gather"]["calls"].get<double>(), 0.0);

  // The step's collectives against the ring volumes of zero/communicator.h for W = 2 (a
  // reduce-scatter or all-gather sends half the buffer, an all-reduce all of it), with the model's
  // Ψ = padded_param_elements · 4 bytes, GAS 2, plus the step's all-reduce of 3 fp64 values (24 B).
  // The training loop's stop agreement between steps (docs/checkpoints.md) is left out of the
  // step's figures (Engine::all_reduce_host_sum), as the checkpoint collectives are:
  //   stage 0: all-reduce of the gradients once per step (2Ψ·1/2 = Ψ)
  //   stage 1: reduce-scatter Ψ/2 at the boundary + all-gather Ψ/2 of the updated params
  //   stage 2: reduce-scatter Ψ/2 every micro-step (×2) + all-gather Ψ/2
  //   stage 3: reduce-scatter Ψ/2 every micro-step (×2); all-gathers of at least Ψ/2 (each layer once)
  constexpr double small = 24.0;
  const auto comm = [&](int stage, const char* kind) { return ranks[static_cast<std::size_t>(stage)]["step_comm"][kind]["bytes"].get<double>(); };
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("step_comm, stage " + std::to_string(stage));
    const double P = 4.0 * bytes(stage, "padded_param_elements");
    EXPECT_EQ(comm(stage, "all_reduce"), (stage == 0 ? P : 0.0) + small);
    EXPECT_EQ(comm(stage, "reduce_scatter"), stage == 0 ? 0.0 : stage == 1 ? P / 2 : P);
    if (stage <= 2) {
      EXPECT_EQ(comm(stage, "all_gather"), stage == 0 ? 0.0 : P / 2);
    }
    if (stage == 3) {
      EXPECT_GE(comm(stage, "all_gather"), P / 2);  // at least every layer once
    }
    EXPECT_EQ(comm(stage, "broadcast"), 0.0);
    EXPECT_EQ(comm(stage, "barrier"), 0.0);
    EXPECT_EQ(ranks[static_cast<std::size_t>(stage)]["step_comm"]["total"]["bytes"].get<double>(),
              comm(stage, "all_reduce") + comm(stage, "reduce_scatter") + comm(stage, "all_gather"));
    // Stages 1-3 all-reduce only the step's (norm², overflow, loss) triple.
    if (stage >= 1) {
      EXPECT_EQ(ranks[static_cast<std::size_t>(stage)]["step_comm"]["all_reduce"]["calls"].get<double>(), 1.0);
    }
  }
}

// (c) Bad input exits non-zero naming the cause.
TEST_F(TrainMultirankCli, BadNumRanksAndWorldSizes) {
  for (const char* bad : {"0", "-1"}) {
    const CliResult r = run_dstrain(train_args(config(0, 2), bad) + " --steps 1");
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.err.find("--num-ranks"), std::string::npos) << bad << ": " << r.err;
  }
  const CliResult word = run_dstrain(train_args(config(0, 2), "two") + " --steps 1");
  EXPECT_NE(word.exit_code, 0);
  EXPECT_NE(word.err.find("--num-ranks"), std::string::npos) << word.err;

  // train_batch_size 8 = micro 2 x GAS 2 x world 2 does not fit 3 ranks: the config layer's error.
  const fs::path tbs = dir_ / "tbs8.json";
  std::ofstream(tbs) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  const CliResult fits = run_dstrain(train_args(tbs, "2", 0) + " --steps 1");
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  const CliResult misfit = run_dstrain(train_args(tbs, "3") + " --steps 1");
  EXPECT_EQ(misfit.exit_code, 2);
  EXPECT_NE(misfit.err.find("train_batch_size"), std::string::npos) << misfit.err;

  // Started by a launcher as one of 2 processes (they join over Gloo on the cpu: docs/elastic.md):
  // threads of their own as well, or alone by --comm local, are refused before any training.
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  const CliResult threads = run_dstrain(train_args(config(0, 2), "2") + " --steps 1");
  const CliResult alone = run_dstrain(train_args(config(0, 2), "1") + " --steps 1 --comm local");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(threads.exit_code, 2);
  EXPECT_NE(threads.err.find("--num-ranks 2 with a launcher"), std::string::npos) << threads.err;
  EXPECT_NE(threads.err.find("drop --num-ranks"), std::string::npos) << threads.err;
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_NE(alone.err.find("--comm local but a launcher started this process as one of 2 ranks"), std::string::npos) << alone.err;
  EXPECT_EQ(alone.out.find("| loss"), std::string::npos) << alone.out;

  // --device: an unknown device, and a GPU this machine cannot have (no driver in CI; no 100th GPU
  // anywhere): exit 2 naming it, before any training.
  const CliResult tpu = run_dstrain(train_args(config(0, 2), "1") + " --steps 1 --device tpu");
  EXPECT_EQ(tpu.exit_code, 2);
  EXPECT_NE(tpu.err.find("tpu"), std::string::npos) << tpu.err;
  const CliResult gpu99 = run_dstrain(train_args(config(0, 2), "1") + " --steps 1 --device cuda:99");
  EXPECT_EQ(gpu99.exit_code, 2);
  EXPECT_NE(gpu99.err.find("99"), std::string::npos) << gpu99.err;
}

}  // namespace

// (d) --ranks-per-node: the node layout of the world (docs/parallelism.md "Nodes"). A value that
// does not divide the world is refused before step 1 naming the option; 2 ranks per node on 4
// local ranks at stage 3 count cross-node bytes in --summary-json's step_comm — for a rank with
// o = 2 of its 3 peers on the other node, 2/3 of the ring bytes of every all-reduce, reduce-scatter
// and all-gather (the pairwise model, zero/communicator.h) — while 4 per node (one node) count none.
TEST_F(TrainMultirankCli, RanksPerNodeSetsTheNodesAndCountsCrossNodeBytes) {
  const CliResult bad = run_dstrain(train_args(config(3, 1), "4", 0) + " --steps 1 --ranks-per-node 3");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--ranks-per-node 3"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("divisors: 1, 2, 4"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out.find("step 1/"), std::string::npos) << bad.out;
  const CliResult zero = run_dstrain(train_args(config(3, 1), "4", 0) + " --steps 1 --ranks-per-node 0");
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.err.find("--ranks-per-node"), std::string::npos) << zero.err;

  for (const int per_node : {2, 4}) {
    SCOPED_TRACE("--ranks-per-node " + std::to_string(per_node));
    const fs::path json = dir_ / ("nodes" + std::to_string(per_node) + ".json");
    const CliResult r =
        run_dstrain(train_args(config(3, 1), "4", 0) + " --steps 2 --ranks-per-node " + std::to_string(per_node) + " --summary-json " + q(json));
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    EXPECT_EQ(r.out.find("world 4 ranks on 2 nodes of 2 ranks (from --ranks-per-node)") != std::string::npos, per_node == 2) << r.out;
    const nlohmann::json z = summary(json)["zero"];
    ASSERT_EQ(z["ranks"].size(), 4u);
    for (const nlohmann::json& rk : z["ranks"]) {
      const nlohmann::json& c = rk["step_comm"];
      ASSERT_TRUE(c["total"].contains("cross_node_bytes")) << c.dump();
      const auto cross = [&](const char* kind) { return c[kind]["cross_node_bytes"].get<std::uint64_t>(); };
      const auto ring = [&](const char* kind) { return c[kind]["bytes"].get<std::uint64_t>(); };
      std::uint64_t sum = 0;
      for (const auto& [kind, v] : c.items()) {
        if (kind != "total") sum += v["cross_node_bytes"].get<std::uint64_t>();
      }
      EXPECT_EQ(c["total"]["cross_node_bytes"].get<std::uint64_t>(), sum);
      if (per_node == 4) {
        EXPECT_EQ(sum, 0u);
        continue;
      }
      EXPECT_GT(cross("all_gather"), 0u);
      EXPECT_GT(cross("reduce_scatter"), 0u);
      for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"}) EXPECT_EQ(3 * cross(kind), 2 * ring(kind)) << kind;
    }
  }
}
