// Llama-family weights in the Hugging Face layout: export and import round trips (single file,
// sharded with an index, fp32/bf16/fp16 on disk), the HF names and shapes (q/k/v split out of the
// fused qkv_proj, the real vocabulary only), and errors naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "ops/error.h"
#include "models/llama/llama_model.h"
#include "formats/hf_weights_file.h"
#include "models/llama/llama_weights.h"
#include "formats/safetensors.h"

using namespace dstrain;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("dstrain_llama_weights." + std::to_string(::getpid()) + "." + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

LlamaConfig small(bool tied) {
  LlamaConfig c = llama_config_from_spec(tied ? "llama:L2-C32-H4-KV2-I48-V50-T8-tied" : "llama:L2-C32-H4-KV2-I48-V50-T8");
  c.model_type = "qwen2";
  c.qkv_bias = true;
  return c;
}

void randomize(LlamaModel& m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const auto& p : m.params()) {
    float* v = static_cast<float*>(p.value.data);
    for (std::int64_t i = 0; i < p.value.numel(); ++i) v[i] = d(rng);
    if (p.spec.name == "model.embed_tokens.weight" || p.spec.name == "lm_head.weight") {
      for (std::int64_t i = m.config().vocab_size * m.config().n_embd; i < p.value.numel(); ++i) v[i] = 0.0f;  // padded rows
    }
  }
}

void expect_same_params(const LlamaModel& a, const LlamaModel& b, double tol) {
  for (std::size_t i = 0; i < a.params().size(); ++i) {
    const auto& pa = a.params()[i];
    const auto& pb = b.params()[i];
    const float* x = static_cast<const float*>(pa.value.data);
    const float* y = static_cast<const float*>(pb.value.data);
    for (std::int64_t k = 0; k < pa.value.numel(); ++k) ASSERT_NEAR(x[k], y[k], tol * (1 + std::abs(x[k]))) << pa.spec.name << " " << k;
  }
}

}  // namespace

TEST(LlamaWeights, SingleFileRoundTripWithHfNamesAndShapes) {
  const fs::path dir = fresh_dir("single");
  const LlamaConfig cfg = small(false);
  LlamaModel a(cfg, DType::fp32, 1, 8), b(cfg, DType::fp32, 1, 8);
  randomize(a, 1);
  export_llama_weights(dir / "model.safetensors", cfg, [&](const std::string& n) { return a.param(n); });
  const SafetensorsFile f(dir / "model.safetensors");
  const auto* q = f.find("model.layers.1.self_attn.q_proj.weight");
  const auto* k = f.find("model.layers.1.self_attn.k_proj.weight");
  const auto* vb = f.find("model.layers.1.self_attn.v_proj.bias");
  const auto* e = f.find("model.embed_tokens.weight");
  ASSERT_TRUE(q && k && vb && e && f.find("lm_head.weight") && f.find("model.norm.weight"));
  EXPECT_EQ(q->shape, (std::vector<std::int64_t>{32, 32}));
  EXPECT_EQ(k->shape, (std::vector<std::int64_t>{16, 32}));
  EXPECT_EQ(vb->shape, (std::vector<std::int64_t>{16}));
  EXPECT_EQ(e->shape, (std::vector<std::int64_t>{50, 32}));
  EXPECT_EQ(f.find("model.layers.0.self_attn.qkv_proj.weight"), nullptr);
  // k_proj is rows [32, 48) of the fused qkv_proj.
  const std::vector<float> kv = f.read_fp32(*k);
  const float* fused = static_cast<const float*>(a.param("model.layers.1.self_attn.qkv_proj.weight").data);
  for (std::size_t i = 0; i < kv.size(); ++i) ASSERT_EQ(kv[i], fused[32 * 32 + i]);
  import_llama_weights(dir / "model.safetensors", cfg, [&](const std::string& n) { return b.param(n); });
  expect_same_params(a, b, 0.0);
  import_llama_weights(dir, cfg, [&](const std::string& n) { return b.param(n); });  // the folder
  fs::remove_all(dir);
}

TEST(LlamaWeights, ShardedRoundTripInEveryDiskDtype) {
  const fs::path dir = fresh_dir("sharded");
  const LlamaConfig cfg = small(true);
  LlamaModel a(cfg, DType::fp32, 1, 8);
  randomize(a, 2);
  for (const DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    SCOPED_TRACE(dtype_name(dt));
    const fs::path sub = dir / std::string(dtype_name(dt));
    fs::create_directories(sub);
    export_llama_weights(
        sub / "model.safetensors", cfg, [&](const std::string& n) { return a.param(n); }, dt, 8192);
    EXPECT_FALSE(fs::exists(sub / "model.safetensors"));
    std::ifstream in(sub / "model.safetensors.index.json");
    const nlohmann::json idx = nlohmann::json::parse(in);
    const std::string first = idx["weight_map"]["model.embed_tokens.weight"];
    EXPECT_TRUE(first.starts_with("model-00001-of-000")) << first;
    EXPECT_FALSE(idx["weight_map"].contains("lm_head.weight"));  // tied
    std::set<std::string> shards;
    for (const auto& [n, file] : idx["weight_map"].items()) shards.insert(file.get<std::string>());
    EXPECT_GT(shards.size(), 2u);
    for (const auto& s : shards) EXPECT_LE(fs::file_size(sub / s), 8192u + 4096u) << s;  // + the header
    EXPECT_EQ(SafetensorsFile(sub / first).find("model.embed_tokens.weight")->dtype, std::string(safetensors_dtype_name(dt)));
    LlamaModel b(cfg, DType::fp32, 1, 8);
    import_llama_weights(sub, cfg, [&](const std::string& n) { return b.param(n); });
    expect_same_params(a, b, dt == DType::fp32 ? 0.0 : (dt == DType::bf16 ? 8e-3 : 1e-3));
  }
  fs::remove_all(dir);
}

TEST(LlamaWeights, ImportErrorsNameTheTensor) {
  const fs::path dir = fresh_dir("errors");
  const LlamaConfig cfg = small(false);
  LlamaModel a(cfg, DType::fp32, 1, 8);
  const auto look = [&](const std::string& n) { return a.param(n); };
  std::vector<float> z(32 * 32, 0.0f), inv(4, 1.0f);
  export_llama_weights(dir / "model.safetensors", cfg, look);
  // inv_freq buffers of older checkpoints are ignored; an unknown tensor is an error.
  {
    const SafetensorsFile f(dir / "model.safetensors");
    std::vector<std::vector<float>> keep;
    std::vector<SafetensorsWriteItem> items;
    for (const auto& e : f.entries()) {
      keep.push_back(f.read_fp32(e));
      items.push_back({e.name, Tensor(keep.back().data(), DType::fp32, Shape{static_cast<std::int64_t>(keep.back().size())}), e.shape});
    }
    items.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", Tensor(inv.data(), DType::fp32, Shape{4}), {}});
    write_safetensors(dir / "extra_ok.safetensors", items);
    import_llama_weights(dir / "extra_ok.safetensors", cfg, look);
    items.push_back({"model.layers.7.mlp.gate_proj.weight", Tensor(z.data(), DType::fp32, Shape{32, 32}), {}});
    write_safetensors(dir / "extra.safetensors", items);
    try {
      import_llama_weights(dir / "extra.safetensors", cfg, look);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.layers.7.mlp.gate_proj.weight"), std::string::npos) << e.what();
    }
  }
  // The tied config misses nothing, the untied one misses lm_head.weight in a tied export.
  LlamaConfig tied = cfg;
  tied.tie_word_embeddings = true;
  LlamaModel t(tied, DType::fp32, 1, 8);
  export_llama_weights(dir / "tied.safetensors", tied, [&](const std::string& n) { return t.param(n); });
  try {
    import_llama_weights(dir / "tied.safetensors", cfg, look);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tie_word_embeddings"), std::string::npos) << e.what();
  }
  // A config with another MLP width: the shape error names both shapes.
  LlamaConfig wide = cfg;
  wide.intermediate_size = 64;
  LlamaModel w(wide, DType::fp32, 1, 8);
  try {
    import_llama_weights(dir / "model.safetensors", wide, [&](const std::string& n) { return w.param(n); });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[48, 32]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[64, 32]"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(LlamaWeights, AFolderStandsForTheCheckpointItHolds) {
  const fs::path dir = fresh_dir("folder");
  // Neither file: the error names the folder and both names.
  try {
    (void)hf_weights_file(dir, "--init-from");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir.string()), std::string::npos) << m;
    EXPECT_NE(m.find("--init-from"), std::string::npos) << m;
    EXPECT_NE(m.find("model.safetensors.index.json"), std::string::npos) << m;
  }
  const LlamaConfig cfg = small(false);
  LlamaModel a(cfg, DType::fp32, 1, 8);
  try {
    import_llama_weights(dir, cfg, [&](const std::string& n) { return a.param(n); });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("neither model.safetensors.index.json nor model.safetensors"), std::string::npos) << e.what();
  }
  // A file is itself; a folder with the single file gives it; with an index too, the index.
  EXPECT_EQ(hf_weights_file(dir / "x.safetensors", "--init-from"), dir / "x.safetensors");
  export_llama_weights(dir / "model.safetensors", cfg, [&](const std::string& n) { return a.param(n); });
  EXPECT_EQ(hf_weights_file(dir, "--init-from"), dir / "model.safetensors");
  std::ofstream(dir / "model.safetensors.index.json") << "{}";
  EXPECT_EQ(hf_weights_file(dir, "--init-from"), dir / "model.safetensors.index.json");
  fs::remove_all(dir);
}
