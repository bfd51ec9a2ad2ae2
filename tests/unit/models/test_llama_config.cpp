// LlamaConfig from descriptors and Hugging Face config.json: defaults, the keys of each family,
// refusals that name the key, and the config.json dstrain writes reading back the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/error.h"
#include "models/llama/llama_config.h"

using namespace dstrain;

namespace {

void expect_error_with(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

// SmolLM-135M's config.json (HuggingFaceTB/SmolLM-135M), as published.
constexpr const char* kSmolLm = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0,
  "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.02, "intermediate_size": 1536, "max_position_embeddings": 2048,
  "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": true, "torch_dtype": "float32",
  "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152})";

std::string with(const std::string& base, const std::string& extra) { return base.substr(0, base.rfind('}')) + ", " + extra + "}"; }

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(LlamaConfig, DescriptorFieldsAndDefaults) {
  const LlamaConfig c = llama_config_from_spec("llama:L4-C256-H4-KV2-I688");
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_embd, 256);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_kv_head, 2);
  EXPECT_EQ(c.intermediate_size, 688);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.padded_vocab_size, 32000);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  const LlamaConfig d = llama_config_from_spec("llama:L2-C64-H4-V97-T16-D24-tied");
  EXPECT_EQ(d.n_kv_head, 4);
  EXPECT_EQ(d.intermediate_size, 256);  // 8·64/3 = 171 rounded up to 256
  EXPECT_EQ(d.head_dim, 24);
  EXPECT_EQ(d.padded_vocab_size, 128);
  EXPECT_TRUE(d.tie_word_embeddings);
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-KV3"); }, {"num_key_value_heads = 3", "num_attention_heads = 4"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64"); }, {"llama:L2-C64", "H<heads>"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-X3"); }, {"X3", "KV"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-L3"); }, {"L is given twice"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-D130"); }, {"head_dim = 130", "128"});
}

// A zero size is a number, not "too large a number": the message names the config.json key and its letter.
TEST(LlamaConfig, ZeroSizesNameTheSize) {
  expect_error_with([] { llama_config_from_spec("llama:L0-C64-H4"); }, {"num_hidden_layers (L) must be at least 1 in llama:L0-C64-H4"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C0-H4"); }, {"hidden_size (C) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H0"); }, {"num_attention_heads (H) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-KV0"); }, {"num_key_value_heads (KV) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-I0"); }, {"intermediate_size (I) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-D0"); }, {"head_dim (D) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-V0"); }, {"vocab_size (V) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L2-C64-H4-T0"); }, {"max_position_embeddings (T) must be at least 1"});
  expect_error_with([] { llama_config_from_spec("llama:L99999999999999999999-C64-H4"); }, {"too large a number"});
}

TEST(LlamaConfig, SmolLmConfigJson) {
  const LlamaConfig c = llama_config_from_hf_json(kSmolLm, "smollm.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_kv_head, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(parameter_count(c), 134515008);  // SmolLM-135M
}

TEST(LlamaConfig, FamiliesSetTheirBiasesNormsAndWindows) {
  const std::string base = R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 96, "vocab_size": 100)";
  const LlamaConfig q2 = llama_config_from_hf_json(base + R"(, "model_type": "qwen2", "rope_theta": 1000000.0, "use_sliding_window": false,
    "sliding_window": 4096, "max_window_layers": 21})",
                                                   "q2");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_EQ(q2.sliding_window, 0);
  EXPECT_DOUBLE_EQ(q2.rope_theta, 1e6);
  const LlamaConfig q3 =
      llama_config_from_hf_json(base + R"(, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "attention_bias": true})", "q3");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_TRUE(q3.qkv_bias);
  EXPECT_TRUE(q3.o_bias);
  EXPECT_EQ(q3.head_dim, 32);
  const LlamaConfig q3d = llama_config_from_hf_json(base + R"(, "model_type": "qwen3"})", "q3d");
  EXPECT_EQ(q3d.head_dim, 128);  // Qwen3Config's default, not hidden_size / heads
  const LlamaConfig m = llama_config_from_hf_json(base + R"(, "model_type": "mistral"})", "m");
  EXPECT_EQ(m.sliding_window, 4096);  // MistralConfig's default
  const LlamaConfig mn = llama_config_from_hf_json(base + R"(, "model_type": "mistral", "sliding_window": null})", "mn");
  EXPECT_EQ(mn.sliding_window, 0);
  llama_check_sequence(m, 4096);
  llama_check_sequence(m, 4097);  // Mistral's window is computed (on the CPU)
  expect_error_with([&] { llama_check_sequence(m, 4097, /*cuda=*/true); }, {"sliding_window = 4096", "T = 4097", "--device cpu"});
  llama_check_sequence(m, 4096, /*cuda=*/true);  // T <= window: full causal attention is the same
  EXPECT_EQ(m.attention_window(), 4096);
  // Qwen's windows act from max_window_layers on only: refused where they would mask a key.
  const LlamaConfig q2w = llama_config_from_hf_json(base + R"(, "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 64,
    "max_window_layers": 1})",
                                                    "q2w");
  EXPECT_EQ(q2w.attention_window(), 0);
  llama_check_sequence(q2w, 64);
  expect_error_with([&] { llama_check_sequence(q2w, 65); }, {"sliding_window = 64", "T = 65", "qwen2", "use_sliding_window"});
  const LlamaConfig l3 = llama_config_from_hf_json(base + R"(, "model_type": "llama", "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
    "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0})",
                                                   "l3");
  EXPECT_EQ(l3.rope_scaling.kind, RopeScaling::Kind::llama3);
  EXPECT_DOUBLE_EQ(l3.rope_scaling.factor, 32.0);
  const LlamaConfig lin = llama_config_from_hf_json(base + R"(, "model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}})", "lin");
  EXPECT_EQ(lin.rope_scaling.kind, RopeScaling::Kind::linear);
}

TEST(LlamaConfig, KeysThatChangeTheModelAreRefusedByName) {
  const std::string base = kSmolLm;
  expect_error_with([&] { llama_config_from_hf_json(replaced(base, R"("hidden_act": "silu")", R"("hidden_act": "gelu")"), "x"); },
                    {"hidden_act", "gelu", "silu"});
  expect_error_with([&] { llama_config_from_hf_json(with(base, R"("partial_rotary_factor": 0.5)"), "x"); }, {"partial_rotary_factor"});
  expect_error_with([&] { llama_config_from_hf_json(with(base, R"("quantization_config": {"bits": 4})"), "x"); }, {"quantization_config", "refused"});
  expect_error_with([&] { llama_config_from_hf_json(R"({"model_type": "gpt2", "n_layer": 2})", "x"); }, {"gpt2", "LlamaForCausalLM"});
  expect_error_with(
      [&] { llama_config_from_hf_json(replaced(base, R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"), "x"); },
      {"rope_scaling", "yarn"});
  expect_error_with(
      [&] {
        llama_config_from_hf_json(replaced(base, R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "linear", "factor": 2.0, "extra": 1})"),
                                  "x");
      },
      {"rope_scaling.extra"});
  expect_error_with([&] { llama_config_from_hf_json(R"({"model_type": "llama", "hidden_size": 64, "hidden_size": 32})", "dup.json"); },
                    {"dup.json", "hidden_size", "twice"});
  expect_error_with(
      [&] {
        llama_config_from_hf_json(R"({"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100, "attention_bias": true})",
                                  "m.json");
      },
      {"attention_bias", "MistralForCausalLM"});
  expect_error_with([&] { llama_config_from_hf_json(R"({"model_type": "llama", "num_hidden_layers": 2})", "m.json"); },
                    {"num_attention_heads", "missing"});
  expect_error_with([&] { llama_config_from_hf_json(R"({"architectures": ["MistralForCausalLM"], "model_type": "llama"})", "m.json"); },
                    {"architectures", "llama"});
}

TEST(LlamaConfig, WrittenConfigJsonReadsBackTheSame) {
  for (const char* mt : {"llama", "mistral", "qwen2", "qwen3"}) {
    SCOPED_TRACE(mt);
    LlamaConfig c = llama_config_from_spec("llama:L3-C96-H6-KV2-I200-V300-T64-tied");
    c.model_type = mt;
    c.qkv_bias = std::string(mt) != "mistral" && std::string(mt) != "llama";
    c.o_bias = std::string(mt) == "qwen3";
    c.qk_norm = std::string(mt) == "qwen3";
    c.rope_scaling.kind = RopeScaling::Kind::llama3;
    c.rope_scaling.factor = 8;
    c.rope_theta = 500000.0;
    if (std::string(mt) == "mistral") c.sliding_window = 4096;
    const LlamaConfig r = llama_config_from_hf_json(llama_hf_config_json(c), "written");
    EXPECT_EQ(r.n_layer, c.n_layer);
    EXPECT_EQ(r.n_kv_head, c.n_kv_head);
    EXPECT_EQ(r.head_dim, c.head_dim);
    EXPECT_EQ(r.intermediate_size, c.intermediate_size);
    EXPECT_EQ(r.vocab_size, c.vocab_size);
    EXPECT_EQ(r.max_position_embeddings, c.max_position_embeddings);
    EXPECT_EQ(r.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(r.qkv_bias, c.qkv_bias);
    EXPECT_EQ(r.o_bias, c.o_bias);
    EXPECT_EQ(r.qk_norm, c.qk_norm);
    EXPECT_EQ(r.sliding_window, c.sliding_window);
    EXPECT_EQ(r.rope_scaling.kind, c.rope_scaling.kind);
    EXPECT_DOUBLE_EQ(r.rope_theta, c.rope_theta);
    EXPECT_FLOAT_EQ(r.rms_norm_eps, c.rms_norm_eps);
  }
}

namespace {

// Which layers a Qwen2/Qwen3 config.json windows, as Hugging Face's Qwen2Config / Qwen3Config read
// it (written here from their rules, independently of dstrain's reader): sliding_window counts only
// with use_sliding_window; layer_types, when given, names each layer, otherwise layer i is
// "sliding_attention" iff the window counts and i >= max_window_layers (default 28).
std::vector<bool> hf_windowed_layers(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  const auto n = j.at("num_hidden_layers").get<std::int64_t>();
  const bool window = j.value("use_sliding_window", false) && !(j.contains("sliding_window") && j["sliding_window"].is_null());
  const auto first = j.value("max_window_layers", std::int64_t{28});
  std::vector<bool> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool sliding = j.contains("layer_types") ? j["layer_types"][static_cast<std::size_t>(i)] == "sliding_attention" : i >= first;
    out.push_back(window && sliding);
  }
  return out;
}

}  // namespace

// Exporting an imported Qwen config keeps which layers are windowed: max_window_layers and
// layer_types as read (the writer once wrote max_window_layers 0, windowing every layer).
TEST(LlamaConfig, WrittenQwenConfigWindowsTheLayersTheImportedOneDid) {
  const std::string base = R"({"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 96, "vocab_size": 100, )";
  struct Case {
    const char* name;
    std::string json;
    std::vector<bool> windowed;  // what Hugging Face windows, by hand
  };
  const std::vector<Case> cases{
      {"from layer 2",
       base + R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 64, "max_window_layers": 2})",
       {false, false, true, true}},
      {"default max_window_layers 28 >= 4 layers",
       base + R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 64})",
       {false, false, false, false}},
      {"layer_types",
       base + R"("model_type": "qwen3", "use_sliding_window": true, "sliding_window": 64, "max_window_layers": 0,
        "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]})",
       {false, true, false, true}},
      {"off",
       base + R"("model_type": "qwen2", "use_sliding_window": false, "sliding_window": 64, "max_window_layers": 1})",
       {false, false, false, false}},
      {"layer_types, off",
       base + R"("model_type": "qwen3", "use_sliding_window": false, "sliding_window": 64,
        "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]})",
       {false, false, false, false}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    ASSERT_EQ(hf_windowed_layers(k.json), k.windowed);
    const LlamaConfig c = llama_config_from_hf_json(k.json, "imported");
    // No layer windowed: no window to refuse a long sequence for (T = 128 > 64).
    const bool any = std::find(k.windowed.begin(), k.windowed.end(), true) != k.windowed.end();
    EXPECT_EQ(c.sliding_window != 0, any);
    if (!any) {
      EXPECT_NO_THROW(llama_check_sequence(c, 128, false));
    }
    const std::string written = llama_hf_config_json(c);
    EXPECT_EQ(hf_windowed_layers(written), k.windowed) << written;
    const LlamaConfig r = llama_config_from_hf_json(written, "written");
    EXPECT_EQ(r.sliding_window, c.sliding_window);
    EXPECT_EQ(r.use_sliding_window, c.use_sliding_window);
    EXPECT_EQ(r.max_window_layers, c.max_window_layers);
    EXPECT_EQ(r.layer_types, c.layer_types);
    EXPECT_EQ(llama_hf_config_json(r), written);
  }
  // A window set in code (no JSON read) acts on every layer, and is written so.
  LlamaConfig spec = llama_config_from_spec("llama:L3-C96-H6-KV2-I200-V300-T64");
  spec.model_type = "qwen2";
  spec.qkv_bias = true;
  spec.sliding_window = 32;
  const std::string written = llama_hf_config_json(spec);
  EXPECT_EQ(hf_windowed_layers(written), std::vector<bool>(3, true)) << written;
  EXPECT_EQ(llama_config_from_hf_json(written, "written").sliding_window, 32);
}
