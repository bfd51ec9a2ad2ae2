// `dstrain estimate-memory` as a user runs it: the per-rank figures by purpose and location against
// the formulas of train/memory_estimate.h worked out by hand for a small GPT-2, DeepSpeed's table
// beside them with this config's row marked, and bad input refused with exit 2.
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli_runner.h"

using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

namespace {

// gpt2:L4-C64-H4-V1000-T64 stores Ψ = Vp·C + T·C + L·(12C² + 13C) + 2C with Vp = 1024:
// 65,536 + 4,096 + 4·50,688 + 128 = 269,696 parameters.
constexpr const char* kModel = "gpt2:L4-C64-H4-V1000-T64";

std::string config(const std::string& zero) {
  return shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "zero_optimization": )" +
                     zero + "}");
}

}  // namespace

TEST(CliEstimateMemory, FiguresByPurposeAndLocation) {
  // ZeRO-2 on 2 ranks in bf16: params 2Ψ = 539,392 B; grads 2Ψ / 2 = 269,696 B; optimizer (4Ψ fp32
  // masters + 8Ψ Adam moments) / 2 = 1,618,176 B; activations the logits B·T·Vp·2 = 262,144 B.
  auto r = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 2})") + " --model " + kModel + " --num-ranks 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("ZeRO stage 2, bf16, 2 rank(s), micro-batch 2 x T 64"));
  EXPECT_THAT(r.out, HasSubstr("  params         526.75 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  grads          263.38 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  optimizer        1.54 MiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  activations    256.00 KiB          0 B          0 B\n"));
  // DeepSpeed's ZeRO-2 table for the same model (268,160 parameters with the real vocabulary, tied once).
  EXPECT_THAT(r.out, HasSubstr("estimate_zero2_model_states_mem_needs_all_cold(total_params=268160, num_gpus_per_node=2, num_nodes=1)"));
  EXPECT_THAT(r.out, HasSubstr("| offload_optimizer=none  <- this config"));

  // ZeRO-3 with the optimizer in host memory: params 2Ψ / 2 on the device; the optimizer's
  // 1,618,176 B in host memory; DeepSpeed's ZeRO-3 row of this offload marked.
  r = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})") +
                  " --model " + kModel + " --num-ranks 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  params         263.38 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  optimizer             0 B     1.54 MiB          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("offload_param=none, offload_optimizer=cpu , zero_init=1  <- this config"));
  EXPECT_THAT(r.out, HasSubstr("largest_layer_params=65536"));  // wte: 1024 x 64
}

// The device mesh (docs/parallelism.md §1, §4 "Memory estimate"): --num-ranks 8 with
// tensor_parallel.autotp_size 2 and sequence_parallel_size 2 is data-parallel 2 x sequence-parallel 2
// x tensor-parallel 2, printed on one line, and the figures are one rank's of it. Tensor-parallel
// rank 0 of kModel stores Ψ_r = Vp/2·C + T·C + L·block + 2C = 512·64 + 64·64 + 4·25,184 + 128 =
// 137,728 parameters, a block being ln_1 2C + c_attn 3·32·C + 3·32 + attn.c_proj C·32 + C + ln_2 2C
// + c_fc 128·C + 128 + mlp.c_proj C·128 + C (2 of 4 heads of 16, 128 of 256 MLP features). ZeRO-2
// over the DP x SP = 4 ranks in bf16: params 2Ψ_r = 275,456 B; grads 2Ψ_r / 4 = 68,864 B;
// optimizer 12Ψ_r / 4 = 413,184 B; activations the logits of 2 x 64/2 tokens x 512 rows x 2 B =
// 65,536 B. Ignoring the mesh gave the whole model's params (526.75 KiB), grads over DP = 2 alone
// (263.38 KiB) and the logits of 64 tokens x 1024 rows (256 KiB).
TEST(CliEstimateMemory, FiguresAreOneRanksOfTheMesh) {
  const std::string cfg = shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "zero_optimization": {"stage": 2},
      "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2})");
  auto r = run_dstrain("estimate-memory --deepspeed_config " + cfg + " --model " + kModel + " --num-ranks 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("ZeRO stage 2, bf16, 8 rank(s), micro-batch 2 x T 64"));
  EXPECT_THAT(r.out, HasSubstr("\nmesh: world 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2"));
  EXPECT_THAT(r.out, HasSubstr("stores 137,728 of the 269,696 parameters"));
  EXPECT_THAT(r.out, HasSubstr("  params         269.00 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  grads           67.25 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  optimizer      403.50 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  activations     64.00 KiB          0 B          0 B\n"));
  // Without tensor or sequence parallelism no mesh line is printed.
  r = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 2})") + " --model " + kModel + " --num-ranks 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("mesh:")));
  // What train refuses of the mesh is refused here too, naming the key: 4 heads over 4 tensor-parallel
  // ranks leave one per rank, which 2 sequence-parallel ranks cannot split.
  const std::string bad = shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 4}, "sequence_parallel_size": 2})");
  r = run_dstrain("estimate-memory --deepspeed_config " + bad + " --model " + kModel + " --num-ranks 8");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("sequence_parallel_size 2"));
}

TEST(CliEstimateMemory, BadInputExits2NamingIt) {
  auto r = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 2})") + " --model bogus");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("model spec 'bogus'"));
  EXPECT_THAT(r.err, HasSubstr("llama:L<n>"));
  r = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 2})") + " --model " + kModel + " --sequence-length 65");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("n_positions"));
  r = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 2})"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--model"));
}

// With pipeline stages (--pipeline-stages, as train's) the figures are the heaviest stage's rank:
// its layers' states only, fewer than the whole model's; ZeRO-3 is refused as train refuses it.
TEST(CliEstimateMemory, PipelineStagesGiveTheHeaviestStagesRank) {
  const auto params_row = [](const std::string& out) {
    const std::size_t at = out.find("  params ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  const std::string cfg = config(R"({"stage": 1})");
  const auto whole = run_dstrain(std::string("estimate-memory --deepspeed_config ") + cfg + " --model " + kModel + " --num-ranks 2");
  const auto piped = run_dstrain(std::string("estimate-memory --deepspeed_config ") + cfg + " --model " + kModel + " --num-ranks 2 --pipeline-stages 2");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_NE(piped.out.find("pipeline: 2 stages"), std::string::npos) << piped.out;
  EXPECT_NE(piped.out.find("mesh: world 2 = pipeline 2 x data-parallel 1"), std::string::npos) << piped.out;
  EXPECT_NE(params_row(piped.out), params_row(whole.out)) << piped.out;
  const auto z3 = run_dstrain(std::string("estimate-memory --deepspeed_config ") + config(R"({"stage": 3})") + " --model " + kModel +
                              " --num-ranks 2 --pipeline-stages 2");
  EXPECT_NE(z3.exit_code, 0);
  EXPECT_NE(z3.err.find("zero_optimization.stage 3"), std::string::npos) << z3.err;
}

// Expert parallelism (expert_parallel.autoep_size 2 over --num-ranks 4): the mesh says its split, and
// a rank stores half the experts. moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16 (untied, Vp = 128) stores
// Ψ = 2·128·32 + 2·(2·32 + 64·32 + 32·32 + 4·32 + 4·3·24·32) + 32 = 8,192 + 2·12,480 + 32 = 33,184
// parameters, of them 2·9,216 = 18,432 in the experts; rank 0 of EP 2 stores 33,184 - 9,216 = 23,968,
// 9,216 of them its experts. bf16 at stage 1: params 2 x 23,968 = 47,936 B (46.81 KiB; the whole
// model's would be 64.81 KiB); the optimizer (4 + 8 B per element) over ZeRO's share, the 14,752
// other parameters / 4 + its 9,216 experts / 2 (the expert-data group) = 8,296: 99,552 B = 97.22 KiB.
TEST(CliEstimateMemory, ExpertParallelRanksHoldTheirExperts) {
  const std::string cfg = shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "expert_parallel": {"enabled": true, "autoep_size": 2}})");
  auto r = run_dstrain("estimate-memory --deepspeed_config " + cfg + " --model moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16 --num-ranks 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("mesh: world 4 = data-parallel 4 (expert-parallel 2 x expert-data-parallel 2); ZeRO partitions over the 4 "
                               "data-parallel x sequence-parallel ranks of a tensor-parallel index, the experts over the 2 ranks holding the same ones\n"));
  EXPECT_THAT(r.out, HasSubstr("expert-parallel rank 0 stores 1/2 of the experts (9,216 parameters) and the rest whole: 23,968 of the 33,184 parameters"));
  EXPECT_THAT(r.out, HasSubstr("  params          46.81 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  grads           46.81 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("  optimizer       97.22 KiB          0 B          0 B\n"));
  EXPECT_THAT(r.out, HasSubstr("dstrain's estimate per rank of the mesh"));

  // The section's routing keys are read as train reads them, and what train refuses is refused.
  r = run_dstrain("estimate-memory --deepspeed_config " +
                  shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "expert_parallel": {"enabled": true, "autoep_size": 2, "top_k": 1}})") +
                  " --model moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16 --num-ranks 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("expert_parallel: routing as the section asks: top_k 1 (the model's 2)"));
  r = run_dstrain("estimate-memory --deepspeed_config " + shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "expert_parallel": {"enabled": true, "autoep_size": 4}})") +
                  " --model moe:L2-C32-H4-KV2-E6-K2-I24-V96-T16 --num-ranks 4");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("expert_parallel.autoep_size 4"));
  r = run_dstrain("estimate-memory --deepspeed_config " + shell_quote(R"({"train_micro_batch_size_per_gpu": 2, "expert_parallel": {"enabled": true, "autoep_size": 2}})") +
                  " --model " + kModel + " --num-ranks 4");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("expert_parallel.enabled is true"));
}
