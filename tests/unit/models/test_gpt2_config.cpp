// Presets, descriptors and Hugging Face config.json parsing; parameter counts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "ops/error.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_layers.h"

namespace dstrain {
namespace {

// Throws Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// Independent count: 12 C² + 13 C per block, (V + maxT) C embeddings, 2 C for ln_f.
std::int64_t formula(std::int64_t L, std::int64_t C, std::int64_t V, std::int64_t maxT) { return L * (12 * C * C + 13 * C) + (V + maxT) * C + 2 * C; }

std::int64_t spec_sum(const Gpt2Config& c) {
  std::int64_t n = 0;
  for (const auto& layer : make_gpt2_layers(c))
    for (const auto& p : layer->params())
      if (!p.tied()) n += p.shape.numel();
  return n;
}

TEST(Gpt2Config, ParameterCountsOfGpt2Small) {
  const Gpt2Config c = model_config_from_spec("gpt2:d12");
  EXPECT_EQ(parameter_count(c), 124'439'808);
  EXPECT_EQ(parameter_count_padded(c), 124'475'904);
  EXPECT_EQ(spec_sum(c), 124'475'904);
}

TEST(Gpt2Config, PresetsAsLlmcDescriptors) {
  struct Row {
    const char* spec;
    std::int64_t L, C, NH, published;  // published: HF's GPT-2 sizes (0: none published)
  };
  for (const Row& r : {Row{"gpt2:d6", 6, 384, 6, 0}, Row{"gpt2:d12", 12, 768, 12, 124'439'808}, Row{"gpt2:d24", 24, 1024, 16, 354'823'168},
                       Row{"gpt2:d36", 36, 1280, 20, 774'030'080}, Row{"gpt2:d48", 48, 1600, 25, 1'557'611'200}}) {
    const Gpt2Config c = model_config_from_spec(r.spec);
    EXPECT_EQ(c.n_layer, r.L) << r.spec;
    EXPECT_EQ(c.n_embd, r.C) << r.spec;
    EXPECT_EQ(c.n_head, r.NH) << r.spec;
    EXPECT_EQ(c.vocab_size, 50257) << r.spec;
    EXPECT_EQ(c.padded_vocab_size, 50304) << r.spec;
    EXPECT_EQ(c.n_positions, 1024) << r.spec;
    EXPECT_EQ(parameter_count(c), formula(r.L, r.C, 50257, 1024)) << r.spec;
    EXPECT_EQ(parameter_count_padded(c), formula(r.L, r.C, 50304, 1024)) << r.spec;
    EXPECT_EQ(spec_sum(c), parameter_count_padded(c)) << r.spec;
    if (r.published != 0) {
      EXPECT_EQ(parameter_count(c), r.published) << r.spec;
    }
  }
}

TEST(Gpt2Config, Descriptors) {
  const Gpt2Config t = model_config_from_spec("gpt2:tiny");
  EXPECT_EQ(t.n_layer, 2);
  EXPECT_EQ(t.n_embd, 16);
  EXPECT_EQ(t.padded_vocab_size, 128);
  const Gpt2Config c = model_config_from_spec("gpt2:L4-C128-H4-V512-T64");
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_embd, 128);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.padded_vocab_size, 512);
  EXPECT_EQ(c.n_positions, 64);
  const Gpt2Config d = model_config_from_spec("gpt2:L1-C8-H2");
  EXPECT_EQ(d.vocab_size, 50257);
  EXPECT_EQ(d.n_positions, 1024);
  EXPECT_EQ(model_config_from_spec("gpt2:L1-C8-H2-V129").padded_vocab_size, 256);
  expect_error([] { model_config_from_spec("gpt2:L2-C10-H3"); }, {"n_embd = 10", "n_head = 3"});
  expect_error([] { model_config_from_spec("gpt2:d13"); }, {"gpt2:d13", "gpt2:d12"});
  expect_error([] { model_config_from_spec("gpt2:L2-C16"); }, {"H<heads>"});
  expect_error([] { model_config_from_spec("gpt2:L2-X5-C16-H2"); }, {"X5"});
  expect_error([] { model_config_from_spec("gpt2:L2-C-H2"); }, {"'C'"});
  expect_error([] { model_config_from_spec("/no/such/config.json"); }, {"/no/such/config.json"});
}

// A zero size is a number, not "too large a number": the message names the size and its letter.
TEST(Gpt2Config, ZeroSizesNameTheSize) {
  expect_error([] { model_config_from_spec("gpt2:L0-C8-H2"); }, {"n_layer (L) must be at least 1 in gpt2:L0-C8-H2"});
  expect_error([] { model_config_from_spec("gpt2:L1-C0-H2"); }, {"n_embd (C) must be at least 1"});
  expect_error([] { model_config_from_spec("gpt2:L1-C8-H00"); }, {"n_head (H) must be at least 1"});
  expect_error([] { model_config_from_spec("gpt2:L1-C8-H2-V0"); }, {"vocab_size (V) must be at least 1"});
  expect_error([] { model_config_from_spec("gpt2:L1-C8-H2-T0"); }, {"n_positions (T) must be at least 1"});
  expect_error([] { model_config_from_spec("gpt2:L1-C8-H2-X0"); }, {"'X0' is not a letter L, C, H, V or T"});
  expect_error([] { model_config_from_spec("gpt2:L99999999999999999999-C8-H2"); }, {"too large a number"});
}

constexpr const char* kGpt2ConfigJson = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

TEST(Gpt2Config, HuggingFaceConfigJson) {
  const Gpt2Config c = gpt2_config_from_hf_json(kGpt2ConfigJson, "config.json");
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_head, 12);
  EXPECT_EQ(c.n_embd, 768);
  EXPECT_EQ(c.n_positions, 1024);
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.padded_vocab_size, 50304);
  EXPECT_FLOAT_EQ(c.layer_norm_epsilon, 1e-5f);
  EXPECT_FLOAT_EQ(c.resid_pdrop, 0.1f);
  EXPECT_FLOAT_EQ(c.embd_pdrop, 0.1f);
  EXPECT_FLOAT_EQ(c.attn_pdrop, 0.1f);
  EXPECT_EQ(parameter_count(c), 124'439'808);

  // n_ctx alone sets the positions; dropouts default as HF's GPT2Config.
  const Gpt2Config d = gpt2_config_from_hf_json(
      R"({"n_layer": 2, "n_head": 4, "n_embd": 64, "n_ctx": 128, "vocab_size": 1000, "resid_pdrop": 0.0, "layer_norm_epsilon": 1e-6})", "x");
  EXPECT_EQ(d.n_positions, 128);
  EXPECT_EQ(d.padded_vocab_size, 1024);
  EXPECT_FLOAT_EQ(d.resid_pdrop, 0.0f);
  EXPECT_FLOAT_EQ(d.attn_pdrop, 0.1f);
  EXPECT_FLOAT_EQ(d.layer_norm_epsilon, 1e-6f);
}

TEST(Gpt2Config, HuggingFaceConfigErrors) {
  const std::string base = R"("n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 1000)";
  expect_error([&] { gpt2_config_from_hf_json("{" + base + R"(, "model_type": "llama"})", "cfg.json"); }, {"cfg.json", "model_type", "llama"});
  expect_error([&] { gpt2_config_from_hf_json("{" + base + R"(, "activation_function": "relu"})", "cfg.json"); }, {"cfg.json", "relu", "gelu_new"});
  expect_error([&] { gpt2_config_from_hf_json(R"({"n_layer": 2, "n_head": 12, "n_embd": 770, "n_positions": 8, "vocab_size": 10})", "cfg.json"); },
               {"cfg.json", "770", "12"});
  expect_error([&] { gpt2_config_from_hf_json(R"({"n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 1000})", "cfg.json"); },
               {"cfg.json", "n_layer", "missing"});
  expect_error([&] { gpt2_config_from_hf_json(R"({"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 1000})", "cfg.json"); },
               {"n_positions", "n_ctx"});
  expect_error([&] { gpt2_config_from_hf_json("{" + base + R"(, "n_inner": 100})", "cfg.json"); }, {"n_inner", "256"});
  expect_error(
      [&] { gpt2_config_from_hf_json(R"({"n_layer": "2", "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 1000})", "cfg.json"); },
      {"n_layer", "integer"});
  // A key given twice is an error (which value a reader keeps differs between readers).
  expect_error([&] { gpt2_config_from_hf_json("{" + base + R"(, "n_layer": 3})", "cfg.json"); }, {"cfg.json", "n_layer", "twice"});
  expect_error([&] { gpt2_config_from_hf_json("{" + base, "cfg.json"); }, {"cfg.json", "JSON"});
  // gelu_pytorch_tanh is the same function as gelu_new.
  EXPECT_NO_THROW(gpt2_config_from_hf_json("{" + base + R"(, "activation_function": "gelu_pytorch_tanh"})", "cfg.json"));
}

TEST(Gpt2Config, SpecFromFileOrFolder) {
  const auto dir = std::filesystem::temp_directory_path() / ("dstrain_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "config.json") << kGpt2ConfigJson; }
  EXPECT_EQ(model_config_from_spec((dir / "config.json").string()).n_embd, 768);
  EXPECT_EQ(model_config_from_spec(dir.string()).n_layer, 12);
  std::filesystem::remove_all(dir);
}

TEST(Gpt2Config, DescribeSaysHowPaddingIsCounted) {
  const std::string s = describe(model_config_from_spec("gpt2:d12"));
  EXPECT_NE(s.find("124,439,808"), std::string::npos) << s;
  EXPECT_NE(s.find("124,475,904"), std::string::npos) << s;
  EXPECT_NE(s.find("47 padding rows"), std::string::npos) << s;
  EXPECT_NE(s.find("50304"), std::string::npos) << s;
}

}  // namespace
}  // namespace dstrain
