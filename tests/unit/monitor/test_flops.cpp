// FLOP and parameter counts against hand calculations (worked out in the comments), GPT-2 124M's
// known parameter counts, llm.c's d12 flops per token, and DeepSpeed's profiler formatting.
#include <gtest/gtest.h>

#include <filesystem>

#include "train/monitor/flops.h"
#include "models/gpt2/gpt2_flops.h"
#include "monitor_test_util.h"
#include "ops/error.h"

namespace dstrain {
namespace {

// B=2, T=4, C=8, NH=2, V=16, L=1 (maxT = T): BT = 8 tokens.
Gpt2FlopsShape tiny() { return {.batch = 2, .seq_len = 4, .channels = 8, .heads = 2, .vocab = 16, .layers = 1}; }

const ModuleFlops& child(const ModuleFlops& m, const std::string& name) {
  for (const auto& c : m.children)
    if (c.name == name) return c;
  ADD_FAILURE() << "no child " << name << " in " << m.type;
  return m;
}

TEST(Gpt2Flops, TinyModelByHand) {
  const ModuleFlops model = gpt2_forward_flops(tiny());
  const ModuleFlops& block = child(child(model, "h"), "0");
  const ModuleFlops& attn = child(block, "attn");
  const ModuleFlops& mlp = child(block, "mlp");

  // c_attn: 8 tokens x 8 -> 24: MACs 8*8*24 = 1536, flops 2*1536 + 8*24 (bias) = 3264, params 8*24 + 24 = 216.
  EXPECT_EQ(child(attn, "c_attn").macs, 1536);
  EXPECT_EQ(child(attn, "c_attn").flops, 3264);
  EXPECT_EQ(child(attn, "c_attn").params, 216);
  // c_proj: MACs 8*8*8 = 512, flops 1024 + 64 = 1088, params 72.
  EXPECT_EQ(child(attn, "c_proj").flops, 1088);
  // Attention's own: QK^T and AV, B*T*T*C = 2*16*8 = 256 MACs each -> 512 MACs, 1024 flops;
  // softmax B*NH*T*T = 64. Total MACs 1536 + 512 + 512 = 2560, flops 3264 + 1088 + 1088 = 5440.
  EXPECT_EQ(attn.own_macs, 512);
  EXPECT_EQ(attn.own_flops, 1088);
  EXPECT_EQ(attn.macs, 2560);
  EXPECT_EQ(attn.flops, 5440);
  EXPECT_EQ(attn.params, 288);
  // MLP: c_fc 8*8*32 = 2048 MACs, 4096 + 256 = 4352 flops; gelu 8*32 = 256; c_proj 2048 MACs,
  // 4096 + 64 = 4160 flops. Params 288 + 264 = 552.
  EXPECT_EQ(mlp.macs, 4096);
  EXPECT_EQ(mlp.flops, 4352 + 256 + 4160);
  EXPECT_EQ(mlp.params, 552);
  // LayerNorm: 5 * 8 * 8 = 320 flops, 16 params.
  EXPECT_EQ(child(block, "ln_1").flops, 320);
  EXPECT_EQ(child(block, "ln_1").params, 16);
  // Block: 320 + 5440 + 320 + 8768 + residual adds 2*64 = 14976 flops; 6656 MACs; 872 = 12C^2 + 13C params.
  EXPECT_EQ(block.flops, 14976);
  EXPECT_EQ(block.macs, 6656);
  EXPECT_EQ(block.params, 872);
  // Matmul flops of a block: 24*BT*C^2 + 4*B*T^2*C = 12288 + 1024 = 13312 = 2 * MACs.
  EXPECT_EQ(2 * block.macs, 13312);
  // lm_head: 8*8*16 = 1024 MACs, 2048 flops, tied (0 params).
  EXPECT_EQ(child(model, "lm_head").flops, 2048);
  EXPECT_EQ(child(model, "lm_head").params, 0);
  // Model: 14976 + ln_f 320 + lm_head 2048 + embedding add 64 = 17408 flops; 7680 MACs;
  // params wte 128 + wpe 32 + 872 + ln_f 16 = 1048.
  EXPECT_EQ(model.flops, 17408);
  EXPECT_EQ(model.macs, 7680);
  EXPECT_EQ(model.params, 1048);
  EXPECT_EQ(gpt2_num_parameters(tiny()), 1048);
}

TEST(Gpt2Flops, Gpt2SmallParameterCounts) {
  Gpt2FlopsShape s{.batch = 1, .seq_len = 1024, .channels = 768, .heads = 12, .vocab = 50257, .layers = 12};
  // 50257*768 + 1024*768 + 12*(12*768^2 + 13*768) + 2*768 = 38597376 + 786432 + 85054464 + 1536.
  EXPECT_EQ(gpt2_num_parameters(s), 124439808);
  EXPECT_EQ(gpt2_forward_flops(s).params, 124439808);
  s.vocab = 50304;  // llm.c's padded vocabulary
  EXPECT_EQ(gpt2_num_parameters(s), 124475904);
}

TEST(Gpt2Flops, LlmcD12FlopsPerToken) {
  // 6 * 124475904 + 6 * 12 * 768 * 1024 = 746855424 + 56623104.
  EXPECT_DOUBLE_EQ(model_flops_per_token(124475904, 12, 768, 1024), 803478528.0);
  // 6N is the weight-matmul part: forward matmul flops of the weights are 2N per token when every
  // parameter multiplies once per token (wte via the tied lm_head; wpe, biases, LN aside).
  EXPECT_DOUBLE_EQ(mfu(1e9, 1e5, 1e15), 0.1);
  EXPECT_THROW(mfu(1e9, 1e5, 0.0), Error);
}

TEST(Gpt2Flops, ForwardMatmulsMatchTheClosedForm) {
  // B=4, T=1024, d12: MACs per forward = L*(12*BT*C^2 + 2*B*T^2*C) + BT*C*V.
  const Gpt2FlopsShape s{.batch = 4, .seq_len = 1024, .channels = 768, .heads = 12, .vocab = 50304, .layers = 12};
  const std::int64_t BT = 4 * 1024, C = 768, T = 1024;
  EXPECT_EQ(gpt2_forward_flops(s).macs, 12 * (12 * BT * C * C + 2 * 4 * T * T * C) + BT * C * 50304);
}

TEST(Gpt2Flops, RejectsImpossibleShapes) {
  Gpt2FlopsShape s = tiny();
  s.heads = 3;
  EXPECT_THROW(gpt2_forward_flops(s), Error);
  s = tiny();
  s.batch = 0;
  EXPECT_THROW(gpt2_forward_flops(s), Error);
}

TEST(FlopsFormatting, DeepSpeedsNumberStrings) {
  EXPECT_EQ(flops_params_to_string(124439808), "124.44 M");
  EXPECT_EQ(flops_params_to_string(1.5e9), "1.5 B");
  EXPECT_EQ(flops_params_to_string(872), "872");
  EXPECT_EQ(flops_macs_to_string(7680), "7.68 KMACs");
  EXPECT_EQ(flops_number_to_string(17408), "17.41 K");
  EXPECT_EQ(flops_number_to_string(0), "0 ");
  EXPECT_EQ(flops_flops_to_string(2.5e12), "2.5 TFLOPS");
  EXPECT_EQ(flops_duration_to_string(0.0123), "12.3 ms");
  EXPECT_EQ(flops_duration_to_string(2.0), "2 s");
}

std::string pad_line(const std::string& label, const std::string& value) {
  std::string s = label + std::string(70 - label.size(), ' ') + "  " + value;
  if (value.size() < 8) s += std::string(8 - value.size(), ' ');
  return s + "\n";
}

TEST(FlopsProfile, SummaryLinesAndAggregatesAsDeepSpeedPrintsThem) {
  const ModuleFlops model = gpt2_forward_flops(tiny());
  config::FlopsProfilerConfig cfg;  // defaults: module_depth -1, top_modules 1, detailed true
  FlopsProfileInput in{.model = &model,
                       .profile_step = 5,
                       .world_size = 2,
                       .data_parallel_size = 2,
                       .micro_batch_per_gpu = 2,
                       .fwd_ms = 10.0,
                       .bwd_ms = 20.0,
                       .step_ms = 5.0};
  const std::string text = format_flops_profile(in, cfg);
  auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("Profile Summary at step 5:\n"));
  EXPECT_TRUE(has(pad_line("world size: ", "2")));
  EXPECT_TRUE(has(pad_line("params per GPU: ", "1.05 K")));
  EXPECT_TRUE(has(pad_line("fwd MACs per GPU: ", "7.68 KMACs")));
  EXPECT_TRUE(has(pad_line("fwd flops per GPU: ", "17.41 K")));
  EXPECT_TRUE(has(pad_line("fwd latency: ", "10 ms")));
  // 17408 / 0.01 s = 1.7408 MFLOPS; bwd 2 * 17408 / 0.02 = 1.7408 M; iter 3 * 17408 / 0.035 = 1.49 M.
  EXPECT_TRUE(has(pad_line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", "1.74 MFLOPS")));
  EXPECT_TRUE(has(pad_line("bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: ", "1.74 MFLOPS")));
  EXPECT_TRUE(has(pad_line("FLOPS per GPU = 3 * fwd flops per GPU / iter latency: ", "1.49 MFLOPS")));
  // 2 * 2 samples / 0.035 s = 114.285... -> 114.29
  EXPECT_TRUE(has(pad_line("samples/second: ", "114.29")));
  // Depth 1: ModuleList (872 params, 6656 MACs) leads Embedding (160), LayerNorm, Linear.
  EXPECT_TRUE(has("depth 0:\n    params      - {'GPT2': '1.05 K'}\n    MACs        - {'GPT2': '7.68 KMACs'}\n"));
  EXPECT_TRUE(has("depth 1:\n    params      - {'ModuleList': '872'}\n    MACs        - {'ModuleList': '6.66 KMACs'}\n"));
  // -1 shows depths 0..3 of 0..4, as DeepSpeed's range(len(info) - 1) does.
  EXPECT_TRUE(has("depth 3:\n"));
  EXPECT_FALSE(has("depth 4:\n"));
  // Detailed tree: the attention row with its share of the model.
  EXPECT_TRUE(has("      (attn): Attention(\n        288 = 27.48% Params, 2.56 KMACs = 33.33% MACs, 5.44 Kflops = 31.25% flops\n"));
  EXPECT_TRUE(has("(lm_head): Linear(0 = 0% Params, 1.02 KMACs = 13.33% MACs, 2.05 Kflops = 11.76% flops, weight tied to wte)"));

  cfg.module_depth = 1;
  cfg.top_modules = 2;
  cfg.detailed = false;
  cfg.recompute_fwd_factor = 1.0;
  const std::string brief = format_flops_profile(in, cfg);
  EXPECT_EQ(brief.find("depth 1:"), std::string::npos);
  EXPECT_NE(brief.find("Top 2 modules"), std::string::npos);
  EXPECT_EQ(brief.find("Detailed Profile"), std::string::npos);
  EXPECT_NE(brief.find("bwd FLOPS per GPU = 3 * fwd flops"), std::string::npos);
}

TEST(FlopsProfile, WritesOutputFileAndFailsClearlyWhenItCannot) {
  test::TempDir tmp;
  config::FlopsProfilerConfig cfg;
  cfg.output_file = (tmp.path() / "sub" / "profile.txt").string();
  emit_flops_profile("hello\n", cfg);
  EXPECT_EQ(test::read_file(tmp.path() / "sub" / "profile.txt"), "hello\n");
  std::ofstream(tmp.path() / "file") << "x";
  cfg.output_file = (tmp.path() / "file" / "profile.txt").string();
  try {
    emit_flops_profile("x", cfg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flops_profiler.output_file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dstrain
