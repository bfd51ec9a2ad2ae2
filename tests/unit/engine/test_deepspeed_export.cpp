// hf_tensors_of (engine/checkpoint/deepspeed_export.h): dstrain's whole tensors under their Hugging
// Face names and shapes, the other direction of map_hf_tensors — checked against the definition of
// each layout rather than against map_hf_tensors alone:
//   - GPT-2: a Conv1D weight is the transpose of dstrain's (HF (i, o) = dstrain (o, i)); wte has the
//     real vocabulary's rows (100 of the padded 128); lm_head is tied: saved with wte's values and
//     marked tied (the module's state dict holds it, named_parameters does not);
//   - Llama (GQA): q_proj / k_proj / v_proj are qkv_proj's row blocks, in order, at their own shapes;
//     untied lm_head is a parameter of its own;
//   - the round trip map_hf_tensors(hf_tensors_of(w)) == w (padding rows zero);
//   - check_deepspeed_exportable and the Errors name the parameter.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint/deepspeed_export.h"
#include "engine/checkpoint/deepspeed_resume.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_family.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using Params = std::map<std::string, std::vector<float>>;

// Every untied parameter whole, element k of the p-th parameter = p * 1000 + k (distinct across
// parameters), except the padded vocabulary rows past `vocab`, which are zero (dstrain's own).
Params whole_of(const Architecture& arch, std::int64_t vocab) {
  Params w;
  float p = 0;
  for (const auto& layer : arch.make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      p += 1;
      std::vector<float> v(static_cast<std::size_t>(ps.shape.numel()));
      const std::int64_t cols = ps.shape.rank == 2 ? ps.shape[1] : 1;
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = p * 1000.0f + static_cast<float>(k);
      if (ps.shape.rank == 2 && ps.shape[0] > vocab && (ps.name.find("wte") != std::string::npos || ps.name.find("embed") != std::string::npos ||
                                                        ps.name.find("lm_head") != std::string::npos))
        std::fill(v.begin() + vocab * cols, v.end(), 0.0f);
      w[ps.name] = std::move(v);
    }
  }
  return w;
}

const HfTensor& find(const std::vector<HfTensor>& ts, const std::string& name) {
  for (const HfTensor& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// The untied tensors by name, and their shapes, as a DeepSpeed checkpoint holds them.
void as_saved(const std::vector<HfTensor>& ts, Params& values, std::map<std::string, std::vector<std::int64_t>>& shapes) {
  for (const HfTensor& t : ts) {
    if (t.tied) continue;
    values[t.name] = t.values;
    shapes[t.name] = t.shape;
  }
}

TEST(DeepSpeedExport, Gpt2ConvTransposedVocabularyCutHeadTied) {
  const auto arch = gpt2_family().from_spec("gpt2:L2-C32-H4-V100-T16");
  const Params w = whole_of(*arch, 100);
  ASSERT_EQ(w.at("wte.weight").size(), 128u * 32u) << "the test assumes the vocabulary padded to 128 rows";
  const std::vector<HfTensor> ts = hf_tensors_of(*arch, w, "master");
  // Conv1D: (in 32, out 96), HF(i, o) = dstrain(o, i).
  const HfTensor& c = find(ts, "transformer.h.1.attn.c_attn.weight");
  ASSERT_EQ(c.shape, (std::vector<std::int64_t>{32, 96}));
  const std::vector<float>& d = w.at("h.1.attn.c_attn.weight");
  for (std::int64_t i = 0; i < 32; ++i)
    for (std::int64_t o = 0; o < 96; ++o) ASSERT_EQ(c.values[static_cast<std::size_t>(i * 96 + o)], d[static_cast<std::size_t>(o * 32 + i)]) << i << "," << o;
  EXPECT_FALSE(c.tied);
  // wte: the first 100 rows; lm_head: the same values, tied.
  const HfTensor& wte = find(ts, "transformer.wte.weight");
  EXPECT_EQ(wte.shape, (std::vector<std::int64_t>{100, 32}));
  EXPECT_EQ(wte.values, std::vector<float>(w.at("wte.weight").begin(), w.at("wte.weight").begin() + 100 * 32));
  const HfTensor& head = find(ts, "lm_head.weight");
  EXPECT_TRUE(head.tied);
  EXPECT_EQ(head.values, wte.values);
  // A bias is as it is.
  EXPECT_EQ(find(ts, "transformer.h.0.mlp.c_fc.bias").values, w.at("h.0.mlp.c_fc.bias"));
  // Back: the same whole tensors.
  Params saved;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  as_saved(ts, saved, shapes);
  EXPECT_FALSE(saved.contains("lm_head.weight"));
  EXPECT_TRUE(map_hf_tensors(*arch, saved, shapes, "round trip", "master") == w);
}

TEST(DeepSpeedExport, LlamaQkvBlocksAndUntiedHead) {
  for (const char* spec : {"llama:L2-C32-H4-KV2-I48-V96-T16", "llama:L2-C32-H4-KV2-I48-V96-T16-tied"}) {
    SCOPED_TRACE(spec);
    const auto arch = llama_family().from_spec(spec);
    const Params w = whole_of(*arch, 96);
    const std::vector<HfTensor> ts = hf_tensors_of(*arch, w, "exp_avg");
    // qkv_proj (4 + 2 + 2 heads of 8) = q_proj 32 rows | k_proj 16 | v_proj 16, each (rows, 32).
    const std::vector<float>& qkv = w.at("model.layers.1.self_attn.qkv_proj.weight");
    std::size_t at = 0;
    for (const auto& [name, rows] : std::vector<std::pair<std::string, std::int64_t>>{{"q_proj", 32}, {"k_proj", 16}, {"v_proj", 16}}) {
      const HfTensor& t = find(ts, "model.layers.1.self_attn." + name + ".weight");
      EXPECT_EQ(t.shape, (std::vector<std::int64_t>{rows, 32})) << name;
      EXPECT_EQ(t.values, std::vector<float>(qkv.begin() + static_cast<std::ptrdiff_t>(at), qkv.begin() + static_cast<std::ptrdiff_t>(at + rows * 32)))
          << name;
      at += static_cast<std::size_t>(rows * 32);
    }
    EXPECT_EQ(at, qkv.size());
    const HfTensor& head = find(ts, "lm_head.weight");
    EXPECT_EQ(head.tied, std::string(spec).ends_with("tied"));
    Params saved;
    std::map<std::string, std::vector<std::int64_t>> shapes;
    as_saved(ts, saved, shapes);
    EXPECT_TRUE(map_hf_tensors(*arch, saved, shapes, "round trip", "exp_avg") == w);
  }
}

TEST(DeepSpeedExport, ErrorsNameTheParameter) {
  const auto arch = gpt2_family().from_spec("gpt2:L2-C32-H4-V100-T16");
  EXPECT_NO_THROW(check_deepspeed_exportable(*arch, "AdamW"));
  EXPECT_NO_THROW(check_deepspeed_exportable(*arch, "Adam"));
  try {
    check_deepspeed_exportable(*arch, "Lamb");
    FAIL() << "Lamb was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"Lamb\""), std::string::npos) << e.what();
  }
  Params w = whole_of(*arch, 100);
  Params missing = w;
  missing.erase("h.0.ln_1.bias");
  try {
    (void)hf_tensors_of(*arch, missing, "exp_avg_sq");
    FAIL() << "a missing parameter was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg_sq of parameter 'h.0.ln_1.bias'"), std::string::npos) << e.what();
  }
  w.at("h.1.mlp.c_proj.weight").pop_back();
  try {
    (void)hf_tensors_of(*arch, w, "master");
    FAIL() << "a short parameter was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'h.1.mlp.c_proj.weight'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dstrain

namespace dstrain {
namespace {

// A mixture of experts (Mixtral's names: each expert's w1 / w2 / w3 its own Hugging Face tensor,
// dstrain's the stacked (E, I, C) / (E, C, I) weights): expert e is the e-th block of the stack —
// block_sparse_moe.experts.2.w1 is elements [2·I·C, 3·I·C) of mlp.experts.gate_proj — and the round
// trip through map_hf_tensors gives the stacks back.
TEST(DeepSpeedExport, MixtureOfExpertsAreBlocksOfTheStackedWeights) {
  const auto arch = moe_family_ptr()->from_spec("moe:L2-C32-H4-KV2-E4-K2-I16-V96-T16");
  EXPECT_NO_THROW(check_deepspeed_exportable(*arch, "AdamW"));
  const Params w = whole_of(*arch, 96);
  const std::vector<HfTensor> ts = hf_tensors_of(*arch, w, "master");
  bool saw_expert = false;
  for (const HfTensor& t : ts) {
    if (t.name.find("experts.2.w1.weight") == std::string::npos) continue;
    saw_expert = true;
    const std::string layer = t.name.substr(0, t.name.find("block_sparse_moe"));
    const std::vector<float>& stack = w.at(layer + "mlp.experts.gate_proj.weight");
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{16, 32})) << t.name;
    EXPECT_EQ(t.values, std::vector<float>(stack.begin() + 2 * 16 * 32, stack.begin() + 3 * 16 * 32)) << t.name;
  }
  ASSERT_TRUE(saw_expert) << "the spec names no Mixtral expert tensors";
  Params saved;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  as_saved(ts, saved, shapes);
  EXPECT_TRUE(map_hf_tensors(*arch, saved, shapes, "round trip", "master") == w);
}

}  // namespace
}  // namespace dstrain
