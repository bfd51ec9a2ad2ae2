// Mixture-of-experts weights in the Hugging Face layout: export and import round trips through a
// safetensors file for Mixtral, Qwen2-MoE (gated shared expert, a dense layer), Qwen3-MoE (DeepSeek's
// ungated shared experts) and OLMoE (whole-projection q/k norms), with parameters held in a plain
// map under dstrain's fixed internal names (no layer); each Hugging Face expert tensor checked to be
// the e-th block of its stacked parameter; refusals naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "formats/safetensors.h"
#include "models/llama/llama_config.h"
#include "models/llama/llama_weights.h"
#include "ops/error.h"

using namespace dstrain;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("dstrain_moe_weights." + std::to_string(::getpid()) + "." + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void expect_error_with(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

std::string common(const char* model_type, const char* arch) {
  return fmt::format(R"("model_type": "{}", "architectures": ["{}"], "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 200, "max_position_embeddings": 64)",
                     model_type, arch);
}

// Small configs of each family, as config.json text.
LlamaConfig mixtral() {
  return llama_config_from_hf_json("{" + common("mixtral", "MixtralForCausalLM") + R"(, "intermediate_size": 24, "num_local_experts": 4,
    "num_experts_per_tok": 2})",
                                   "mixtral");
}
LlamaConfig qwen2_moe() {
  return llama_config_from_hf_json("{" + common("qwen2_moe", "Qwen2MoeForCausalLM") + R"(, "intermediate_size": 40, "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 20, "num_experts": 3, "num_experts_per_tok": 2, "mlp_only_layers": [1], "tie_word_embeddings": true})",
                                   "qwen2_moe");
}
LlamaConfig qwen3_moe() {
  return llama_config_from_hf_json("{" + common("qwen3_moe", "Qwen3MoeForCausalLM") + R"(, "head_dim": 8, "intermediate_size": 40,
    "moe_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1,
    "scoring_func": "sigmoid", "n_group": 2, "topk_group": 1})",
                                   "qwen3_moe");
}
LlamaConfig olmoe() {
  return llama_config_from_hf_json("{" + common("olmoe", "OlmoeForCausalLM") + R"(, "intermediate_size": 16, "num_experts": 4,
    "num_experts_per_tok": 2})",
                                   "olmoe");
}

struct Expected {
  std::map<std::string, Shape> params;  // dstrain's MoE / OLMoE-norm parameters
  // HF tensor -> (param, block index e or -1 for the whole, block elements)
  struct Block {
    std::string param;
    std::int64_t e;
    std::vector<std::int64_t> shape;
  };
  std::map<std::string, Block> hf;
};

// Written from the naming rules (llama_weights.h), independently of llama_weights.cpp.
Expected expected(const LlamaConfig& c) {
  Expected x;
  const std::int64_t C = c.n_embd;
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    if (c.model_type == "olmoe") {
      x.params[p + "self_attn.q_norm.weight"] = Shape{c.n_head * c.head_dim};
      x.params[p + "self_attn.k_norm.weight"] = Shape{c.n_kv_head * c.head_dim};
      x.hf[p + "self_attn.q_norm.weight"] = {p + "self_attn.q_norm.weight", -1, {c.n_head * c.head_dim}};
      x.hf[p + "self_attn.k_norm.weight"] = {p + "self_attn.k_norm.weight", -1, {c.n_kv_head * c.head_dim}};
    }
    const bool sparse = (c.model_type != "qwen2_moe" || l != 1) && (c.model_type != "qwen3_moe" || l != 0);
    if (!sparse) continue;
    const std::int64_t E = c.moe.num_experts, I = c.moe.expert_intermediate_size, S = c.moe.shared_expert_intermediate_size;
    x.params[p + "mlp.gate.weight"] = Shape{E, C};
    x.params[p + "mlp.experts.gate_proj.weight"] = Shape{E, I, C};
    x.params[p + "mlp.experts.up_proj.weight"] = Shape{E, I, C};
    x.params[p + "mlp.experts.down_proj.weight"] = Shape{E, C, I};
    const bool mx = c.model_type == "mixtral";
    x.hf[p + (mx ? "block_sparse_moe.gate.weight" : "mlp.gate.weight")] = {p + "mlp.gate.weight", -1, {E, C}};
    for (std::int64_t e = 0; e < E; ++e) {
      const std::string ex = fmt::format("{}{}experts.{}.", p, mx ? "block_sparse_moe." : "mlp.", e);
      x.hf[ex + (mx ? "w1.weight" : "gate_proj.weight")] = {p + "mlp.experts.gate_proj.weight", e, {I, C}};
      x.hf[ex + (mx ? "w3.weight" : "up_proj.weight")] = {p + "mlp.experts.up_proj.weight", e, {I, C}};
      x.hf[ex + (mx ? "w2.weight" : "down_proj.weight")] = {p + "mlp.experts.down_proj.weight", e, {C, I}};
    }
    if (S > 0) {
      x.params[p + "mlp.shared_expert.gate_proj.weight"] = Shape{S, C};
      x.params[p + "mlp.shared_expert.up_proj.weight"] = Shape{S, C};
      x.params[p + "mlp.shared_expert.down_proj.weight"] = Shape{C, S};
      const std::string sh = p + (c.model_type == "qwen2_moe" ? "mlp.shared_expert." : "mlp.shared_experts.");
      x.hf[sh + "gate_proj.weight"] = {p + "mlp.shared_expert.gate_proj.weight", -1, {S, C}};
      x.hf[sh + "up_proj.weight"] = {p + "mlp.shared_expert.up_proj.weight", -1, {S, C}};
      x.hf[sh + "down_proj.weight"] = {p + "mlp.shared_expert.down_proj.weight", -1, {C, S}};
      if (c.model_type == "qwen2_moe") {
        x.params[p + "mlp.shared_expert_gate.weight"] = Shape{1, C};
        x.hf[p + "mlp.shared_expert_gate.weight"] = {p + "mlp.shared_expert_gate.weight", -1, {1, C}};
      }
    }
  }
  return x;
}

// Host parameters by name.
struct Params {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, Shape> shapes;
  LlamaParamLookup lookup() {
    return [this](const std::string& n) -> Tensor {
      const auto it = values.find(n);
      if (it == values.end()) throw std::runtime_error("no parameter " + n);
      return Tensor(it->second.data(), DType::fp32, shapes.at(n));
    };
  }
};

// The model's parameters: the MoE ones from the expected list, the others (embeddings, attention,
// norms, dense MLPs) as llama_hf_tensors lists them.
Params make_params(const LlamaConfig& c, const Expected& x, std::uint64_t seed) {
  Params p;
  for (const auto& [n, s] : x.params) p.shapes[n] = s;
  for (const LlamaHfTensor& t : llama_hf_tensors(c)) {
    if (x.params.count(t.ours) != 0) {
      EXPECT_TRUE(t.ours_shape == x.params.at(t.ours)) << t.ours;
      continue;
    }
    p.shapes[t.ours] = t.ours_shape;
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const auto& [n, s] : p.shapes) {
    auto& v = p.values[n];
    v.resize(static_cast<std::size_t>(s.numel()));
    for (float& f : v) f = d(rng);
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight")
      for (std::size_t i = static_cast<std::size_t>(c.vocab_size * c.n_embd); i < v.size(); ++i) v[i] = 0.0f;  // padded rows
  }
  return p;
}

Params zeros_like(const Params& a) {
  Params p = a;
  for (auto& [n, v] : p.values) std::fill(v.begin(), v.end(), 0.0f);
  return p;
}

void round_trip(const LlamaConfig& c, const std::string& name, std::size_t shard_bytes = kDefaultMaxShardBytes) {
  SCOPED_TRACE(name);
  const Expected x = expected(c);
  Params p = make_params(c, x, 7);
  // The MoE tensors llama_hf_tensors lists are exactly the expected ones.
  std::set<std::string> listed;
  for (const LlamaHfTensor& t : llama_hf_tensors(c))
    if (llama_param_from_config(c, t.ours)) listed.insert(t.name);
  std::set<std::string> want;
  for (const auto& [n, b] : x.hf) want.insert(n);
  EXPECT_EQ(listed, want);

  const fs::path dir = fresh_dir(name);
  export_llama_weights(dir / "model.safetensors", c, p.lookup(), DType::fp32, shard_bytes);
  // Each HF tensor is the block of its parameter (read from the files directly).
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") files.push_back(std::make_unique<SafetensorsFile>(f.path()));
  if (shard_bytes != kDefaultMaxShardBytes) {
    EXPECT_GT(files.size(), 1u);
  }
  std::size_t found = 0;
  for (const auto& [hf, b] : x.hf) {
    for (const auto& f : files) {
      const SafetensorsEntry* e = f->find(hf);
      if (e == nullptr) continue;
      ++found;
      EXPECT_EQ(e->shape, b.shape) << hf;
      const std::vector<float> v = f->read_fp32(*e);
      const std::vector<float>& whole = p.values.at(b.param);
      const std::size_t off = b.e < 0 ? 0 : static_cast<std::size_t>(b.e) * v.size();
      ASSERT_LE(off + v.size(), whole.size()) << hf;
      for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], whole[off + i]) << hf << " " << i;
    }
  }
  EXPECT_EQ(found, x.hf.size());
  // No dense MLP tensor in a sparse layer.
  for (const auto& f : files) {
    for (const auto& e : f->entries()) {
      if (e.name.find(".mlp.gate_proj.") != std::string::npos) {
        EXPECT_EQ(x.params.count(e.name.substr(0, e.name.find("mlp.")) + "mlp.gate.weight"), 0u) << e.name;
      }
    }
  }

  Params q = zeros_like(p);
  const fs::path from = shard_bytes != kDefaultMaxShardBytes ? dir : dir / "model.safetensors";
  import_llama_weights(from, c, q.lookup());
  for (const auto& [n, v] : p.values) EXPECT_EQ(q.values.at(n), v) << n;
  fs::remove_all(dir);
}

// The exported file's tensors, for rewriting with one changed.
std::vector<std::pair<SafetensorsEntry, std::vector<float>>> read_all(const fs::path& f) {
  SafetensorsFile sf(f);
  std::vector<std::pair<SafetensorsEntry, std::vector<float>>> out;
  for (const auto& e : sf.entries()) out.emplace_back(e, sf.read_fp32(e));
  return out;
}

void write_all(const fs::path& f, std::vector<std::pair<SafetensorsEntry, std::vector<float>>>& tensors) {
  std::vector<SafetensorsWriteItem> items;
  for (auto& [e, v] : tensors) items.push_back({e.name, Tensor(v.data(), DType::fp32, Shape{static_cast<std::int64_t>(v.size())}), e.shape});
  write_safetensors(f, items, {{"format", "pt"}});
}

}  // namespace

TEST(MoeWeights, MixtralRoundTrip) { round_trip(mixtral(), "mixtral"); }
TEST(MoeWeights, Qwen2MoeRoundTripWithSharedExpertAndDenseLayer) { round_trip(qwen2_moe(), "qwen2_moe"); }
TEST(MoeWeights, Qwen3MoeRoundTripWithDeepSeekSharedExperts) { round_trip(qwen3_moe(), "qwen3_moe"); }
TEST(MoeWeights, OlmoeRoundTripWithWholeProjectionNorms) { round_trip(olmoe(), "olmoe"); }
TEST(MoeWeights, ShardedRoundTrip) { round_trip(mixtral(), "mixtral_sharded", 40'000); }

TEST(MoeWeights, ImportRefusesWhatDoesNotMatch) {
  const LlamaConfig c = mixtral();
  const Expected x = expected(c);
  Params p = make_params(c, x, 3);
  const fs::path dir = fresh_dir("refusals");
  const fs::path f = dir / "model.safetensors";
  export_llama_weights(f, c, p.lookup());
  const auto good = read_all(f);

  // DeepSeek-V3's score-correction bias: refused by name.
  auto extra = good;
  SafetensorsEntry bias;
  bias.name = "model.layers.0.mlp.gate.e_score_correction_bias";
  bias.shape = {4};
  extra.emplace_back(bias, std::vector<float>(4, 0.5f));
  write_all(f, extra);
  expect_error_with([&] { import_llama_weights(f, c, p.lookup()); }, {"model.layers.0.mlp.gate.e_score_correction_bias", "score-correction"});

  // A missing expert.
  auto missing = good;
  std::erase_if(missing, [](const auto& t) { return t.first.name == "model.layers.2.block_sparse_moe.experts.3.w2.weight"; });
  write_all(f, missing);
  expect_error_with([&] { import_llama_weights(f, c, p.lookup()); }, {"model.layers.2.block_sparse_moe.experts.3.w2.weight", "missing"});

  // An expert of the wrong width (w1 transposed).
  auto wrong = good;
  for (auto& [e, v] : wrong)
    if (e.name == "model.layers.1.block_sparse_moe.experts.0.w1.weight") e.shape = {e.shape[1], e.shape[0]};
  write_all(f, wrong);
  expect_error_with([&] { import_llama_weights(f, c, p.lookup()); }, {"model.layers.1.block_sparse_moe.experts.0.w1.weight", "[24, 32]"});

  // An expert the config does not have, and a Qwen-style name in a Mixtral checkpoint.
  for (const char* n : {"model.layers.0.block_sparse_moe.experts.4.w1.weight", "model.layers.0.mlp.experts.0.gate_proj.weight"}) {
    auto more = good;
    SafetensorsEntry e;
    e.name = n;
    e.shape = {24, 32};
    more.emplace_back(e, std::vector<float>(24 * 32, 0.0f));
    write_all(f, more);
    expect_error_with([&] { import_llama_weights(f, c, p.lookup()); }, {n, "not part of this mixtral model"});
  }
  fs::remove_all(dir);
}
