// The whole GPT-2 against an independent implementation, as llm.c checks its model against
// PyTorch: a tiny GPT-2 (3 layers, random weights large enough that every part matters) runs
// forward and backward here; its weights (dstrain's Hugging Face export), gradients, logits and
// loss go to a folder that tests/integration/gpt2_vs_pytorch.py reads into a GPT-2 written in
// PyTorch (Debian's python3-torch, /usr/bin/python3, installed by scripts/setup.sh), float64, and
// compares within the tolerance that script states (logits 1e-4 + 1e-4|b|, gradients 1e-4 of each
// tensor's largest). The logits come from the model's generation path (the last position of each
// prefix), the gradients from Gpt2Model::backward of the mean loss.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_model.h"
#include "models/gpt2/gpt2_weights.h"
#include "formats/safetensors.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

TEST(Gpt2VsPytorch, LogitsLossAndGradientsMatch) {
  const fs::path dir = fs::temp_directory_path() / ("dstrain_gpt2_vs_pytorch." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  Gpt2Config cfg = model_config_from_spec("gpt2:L3-C64-H4-V97-T16");
  cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0f;
  constexpr std::int64_t B = 2, T = 16;
  Gpt2Model m(cfg, DType::fp32, B, T);
  // Weights ~ N(0, 1/sqrt(fan_in)), LN weights 1 + N(0, 0.2), biases N(0, 0.1), embeddings N(0, 0.5):
  // at GPT-2's init scale the logits would be ~0 and hardly depend on the layers.
  std::mt19937_64 rng(2024);
  for (const auto& p : m.params()) {
    const std::string& n = p.spec.name;
    double mean = 0.0, sd = 0.1;
    if (n.find("ln_") != std::string::npos && n.ends_with(".weight")) {
      mean = 1.0;
      sd = 0.2;
    } else if (n == "wte.weight" || n == "wpe.weight") {
      sd = 0.5;
    } else if (n.ends_with(".weight")) {
      sd = 1.0 / std::sqrt(static_cast<double>(p.spec.shape[1]));
    }
    std::normal_distribution<double> d(mean, sd);
    float* v = static_cast<float*>(p.value.data);
    for (std::int64_t i = 0; i < p.value.numel(); ++i) v[i] = static_cast<float>(d(rng));
  }
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(cfg.vocab_size - 1));
  std::vector<std::int32_t> seq(B * T + 1);
  for (auto& s : seq) s = tok(rng);
  std::vector<std::int32_t> tokens(seq.begin(), seq.end() - 1), targets(seq.begin() + 1, seq.end());
  targets[5] = -1;  // an ignored position

  m.zero_grad();
  const float loss = m.forward(Tensor(tokens.data(), DType::int32, Shape{B, T}), Tensor(targets.data(), DType::int32, Shape{B, T}));
  m.backward();

  // Logits (B, T, V): position t's are the last position's of the prefix tokens[0..t].
  std::vector<float> logits;
  {
    LayerStackGenerationViews views(m, m.config().vocab_size, m.config().n_positions);
    Generator g(views.model());
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        const auto l = g.next_token_logits(std::span<const std::int32_t>(tokens.data() + b * T, static_cast<std::size_t>(t + 1)));
        logits.insert(logits.end(), l.begin(), l.end());
      }
  }

  save_gpt2_weights(m, dir / "weights.safetensors");
  export_gpt2_safetensors(dir / "grads.safetensors", cfg, [&](const std::string& n) { return m.grad(n); });
  std::vector<float> tokens_f(tokens.begin(), tokens.end()), targets_f(targets.begin(), targets.end());
  float loss_v = loss;
  const std::vector<SafetensorsWriteItem> items{
      {"tokens", Tensor(tokens_f.data(), DType::fp32, Shape{B, T}), {}},
      {"targets", Tensor(targets_f.data(), DType::fp32, Shape{B, T}), {}},
      {"logits", Tensor(logits.data(), DType::fp32, Shape{B, T, cfg.vocab_size}), {}},
      {"loss", Tensor(&loss_v, DType::fp32, Shape{1}), {}},
  };
  write_safetensors(dir / "outputs.safetensors", items);
  std::ofstream(dir / "config.json") << "{\"n_layer\": " << cfg.n_layer << ", \"n_embd\": " << cfg.n_embd << ", \"n_head\": " << cfg.n_head
                                     << ", \"vocab_size\": " << cfg.vocab_size << ", \"layer_norm_epsilon\": " << cfg.layer_norm_epsilon << "}";

  const std::string cmd = "/usr/bin/python3 " DSTRAIN_SOURCE_DIR "/tests/integration/gpt2_vs_pytorch.py '" + dir.string() + "' 2>&1";
  std::string output;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = ::pclose(pipe);
  std::printf("%s", output.c_str());
  EXPECT_EQ(status, 0) << "the PyTorch comparison failed (/usr/bin/python3 with torch: Debian's python3-torch, installed by "
                          "scripts/setup.sh):\n"
                       << output;
  EXPECT_NE(output.find("gpt2_vs_pytorch: L=3"), std::string::npos) << output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dstrain
