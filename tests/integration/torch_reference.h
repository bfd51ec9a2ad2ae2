// What the comparisons against a PyTorch reference share (test_llama_vs_pytorch.cpp,
// test_moe_vs_pytorch.cpp): running the reference script on a folder, and the five AdamW steps on
// one batch that the script repeats with torch.optim.AdamW (train.json).
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

#include "models/layer_stack.h"
#include "ops/kernels/adamw.h"

namespace dstrain::torch_reference {

// /usr/bin/python3 (Debian's, with python3-torch) on `script` (relative to the source tree) with
// `dir`; its output, and "(exit status N)" appended when it did not exit 0.
inline std::string run_python(const char* script, const std::filesystem::path& dir) {
  return dstrain::testing::run_shell_output(std::string("/usr/bin/python3 " DSTRAIN_SOURCE_DIR "/") + script + " '" + dir.string() + "'");
}

// Five AdamW steps of `m` on one batch (fp32 parameters), decay on the parameters whose spec asks
// for it; returns train.json's object (lr, betas, eps, weight_decay, the five losses). eps = 1e-3:
// Adam's first steps move each weight by about lr·sign(g), so a gradient at fp32 noise level
// (|g| ~ 1e-9) could flip a weight's step between the fp32 and float64 runs; a larger eps makes
// such weights move by ~lr·g/eps instead.
inline nlohmann::json train_five_adamw_steps(LayerStack& m, const Tensor& tokens, const Tensor& targets) {
  AdamWConfig ac;
  ac.lr = 1e-2f;
  ac.eps = 1e-3f;
  const float wd = 0.1f;
  std::vector<std::vector<float>> mom, var;
  for (const auto& p : m.params()) {
    mom.emplace_back(static_cast<std::size_t>(p.value.numel()), 0.0f);
    var.emplace_back(static_cast<std::size_t>(p.value.numel()), 0.0f);
  }
  nlohmann::json losses = nlohmann::json::array();
  for (int step = 1; step <= 5; ++step) {
    m.zero_grad();
    losses.push_back(m.forward(tokens, targets));
    m.backward();
    ac.step = step;
    for (std::size_t i = 0; i < m.params().size(); ++i) {
      const auto& p = m.params()[i];
      ac.weight_decay = p.spec.weight_decay ? wd : 0.0f;
      const Shape s{p.value.numel()};
      adamw_update(Tensor(p.value.data, DType::fp32, s), Tensor(p.grad.data, DType::fp32, s), Tensor(mom[i].data(), DType::fp32, s),
                   Tensor(var[i].data(), DType::fp32, s), Tensor{}, ac);
    }
  }
  return {{"lr", ac.lr}, {"beta1", ac.beta1}, {"beta2", ac.beta2}, {"eps", ac.eps}, {"weight_decay", wd}, {"losses", losses}};
}

}  // namespace dstrain::torch_reference
