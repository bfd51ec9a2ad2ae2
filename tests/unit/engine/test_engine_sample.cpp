// Samples from the engine's own weights: a Generator over Engine::generation_model() reads the
// engine's parameter storage in place, and its greedy continuation equals the argmax of logits
// computed independently by a Gpt2Model holding a copy of the engine's weights (logit differences
// recovered from the cross-entropy of each candidate target, as test_generate.cpp does).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "models/gpt2/gpt2_model.h"
#include "ops/kernels/tensor_ops.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

// argmax over v of logit_v, from a Gpt2Model of exactly T = context length: the loss with the last
// target v is lse - logit_v, so the smallest loss is the largest logit (lowest id on ties).
std::int32_t reference_argmax(const Engine& e, const Gpt2Config& cfg, const std::vector<std::int32_t>& context) {
  const auto T = static_cast<std::int64_t>(context.size());
  Gpt2Model m(cfg, DType::fp32, 1, T);
  for (const auto& p : m.params()) copy_tensor(p.value, e.param(p.spec.name));
  std::vector<std::int32_t> tokens = context, targets(context.size(), -1);
  const Tensor tok(tokens.data(), DType::int32, Shape{1, T});
  const Tensor tgt(targets.data(), DType::int32, Shape{1, T});
  std::int32_t best = 0;
  double best_loss = 0.0;
  for (std::int32_t v = 0; v < cfg.vocab_size; ++v) {
    targets.back() = v;
    const double loss = m.forward(tok, tgt, {.train = false});
    if (v == 0 || loss < best_loss) {
      best = v;
      best_loss = loss;
    }
  }
  return best;
}

TEST(EngineSample, GreedySampleFromTheEnginesWeightsIsTheIndependentArgmax) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");  // V 61, n_positions 8
  Engine e =
      initialize(make_gpt2_model(cfg),
                 config::parse_ds_config(config::Json::parse(
                                             R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})"),
                                         {}),
                 {.seed = 5, .sequence_length = 8});
  // Larger weights than the init, so the logits are far apart and argmax is well defined.
  for (const auto& name : e.param_names()) {
    const Tensor p = e.param(name);
    for (std::int64_t i = 0; i < p.numel(); ++i) p.as<float>()[i] *= 20.0f;
  }
  const GenerationModel gm = e.generation_model();
  ASSERT_EQ(gm.layers.size(), e.model().layers.size());
  EXPECT_EQ(gm.params(0)[0].data, e.param("wte.weight").data);  // in place, no copy
  EXPECT_EQ(gm.vocab_size, 61);
  EXPECT_EQ(gm.n_positions, 8);

  Generator gen(gm);
  SamplingOptions opt;
  opt.max_new_tokens = 10;  // 1 + 10 tokens: past n_positions, the window slides
  opt.temperature = 0.0f;
  const std::vector<std::int32_t> prompt{7};
  const std::vector<std::int32_t> out = gen.generate(prompt, opt);
  ASSERT_EQ(out.size(), 10u);
  std::vector<std::int32_t> seq = prompt;
  for (std::size_t n = 0; n < out.size(); ++n) {
    const std::vector<std::int32_t> window(seq.end() - std::min<std::ptrdiff_t>(8, static_cast<std::ptrdiff_t>(seq.size())), seq.end());
    EXPECT_EQ(out[n], reference_argmax(e, cfg, window)) << "token " << n;
    seq.push_back(out[n]);
  }

  // The sample follows the engine's weights as they change (views, not a snapshot): zeroing the
  // head (tied to wte) makes every logit equal, and greedy then picks id 0.
  zero_tensor(e.param("wte.weight"));
  opt.max_new_tokens = 2;
  EXPECT_EQ(gen.generate(prompt, opt), (std::vector<std::int32_t>{0, 0}));
}

}  // namespace
}  // namespace dstrain
