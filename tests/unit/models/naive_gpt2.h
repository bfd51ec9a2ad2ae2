// A plain double-precision GPT-2 forward pass, written straight from the definition (Radford et
// al. 2019; Hugging Face GPT2LMHeadModel), independent of dstrain's kernels and layers: the
// reference the model tests compare against (loss directly, gradients by central differences).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/gpt2/gpt2_config.h"

namespace dstrain::test {

struct NaiveGpt2 {
  Gpt2Config cfg;
  // Parameters by Hugging Face name, in dstrain's layout (linear weights (out, in)); wte has the
  // padded Vp rows, of which only the first V are ever read.
  std::map<std::string, std::vector<double>> p;

  const std::vector<double>& at(const std::string& name) const { return p.at(name); }

  // x (N, C) -> layernorm(x) with biased variance.
  std::vector<double> layernorm(const std::vector<double>& x, const std::string& prefix) const {
    const std::int64_t C = cfg.n_embd, N = static_cast<std::int64_t>(x.size()) / C;
    const auto& w = at(prefix + ".weight");
    const auto& b = at(prefix + ".bias");
    std::vector<double> out(x.size());
    for (std::int64_t i = 0; i < N; ++i) {
      double mean = 0, var = 0;
      for (std::int64_t c = 0; c < C; ++c) mean += x[i * C + c];
      mean /= C;
      for (std::int64_t c = 0; c < C; ++c) var += (x[i * C + c] - mean) * (x[i * C + c] - mean);
      var /= C;
      const double rstd = 1.0 / std::sqrt(var + cfg.layer_norm_epsilon);
      for (std::int64_t c = 0; c < C; ++c) out[i * C + c] = (x[i * C + c] - mean) * rstd * w[c] + b[c];
    }
    return out;
  }

  // x (N, IN) -> x · Wᵀ + b, W (OUT, IN).
  std::vector<double> linear(const std::vector<double>& x, const std::string& prefix, std::int64_t IN, std::int64_t OUT) const {
    const auto& w = at(prefix + ".weight");
    const auto& b = at(prefix + ".bias");
    const std::int64_t N = static_cast<std::int64_t>(x.size()) / IN;
    std::vector<double> out(static_cast<std::size_t>(N * OUT));
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t o = 0; o < OUT; ++o) {
        double s = b[o];
        for (std::int64_t k = 0; k < IN; ++k) s += x[i * IN + k] * w[o * IN + k];
        out[i * OUT + o] = s;
      }
    return out;
  }

  static double gelu(double x) {
    const double k = std::sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }

  // Mean cross-entropy over the targets that are not -1.
  double loss(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets, std::int64_t B, std::int64_t T) const {
    const std::int64_t C = cfg.n_embd, NH = cfg.n_head, HS = C / NH, V = cfg.vocab_size;
    const auto& wte = at("wte.weight");
    const auto& wpe = at("wpe.weight");
    std::vector<double> x(static_cast<std::size_t>(B * T * C));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t c = 0; c < C; ++c) x[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];

    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      const auto qkv = linear(layernorm(x, h + "ln_1"), h + "attn.c_attn", C, 3 * C);
      std::vector<double> y(x.size(), 0.0);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t hd = 0; hd < NH; ++hd)
          for (std::int64_t t = 0; t < T; ++t) {
            const double* q = &qkv[(b * T + t) * 3 * C + hd * HS];
            std::vector<double> att(static_cast<std::size_t>(t + 1));
            double mx = -1e300;
            for (std::int64_t s = 0; s <= t; ++s) {
              const double* k = &qkv[(b * T + s) * 3 * C + C + hd * HS];
              double d = 0;
              for (std::int64_t i = 0; i < HS; ++i) d += q[i] * k[i];
              att[s] = d / std::sqrt(static_cast<double>(HS));
              mx = std::max(mx, att[s]);
            }
            double sum = 0;
            for (auto& a : att) sum += (a = std::exp(a - mx));
            for (std::int64_t s = 0; s <= t; ++s) {
              const double* v = &qkv[(b * T + s) * 3 * C + 2 * C + hd * HS];
              for (std::int64_t i = 0; i < HS; ++i) y[(b * T + t) * C + hd * HS + i] += att[s] / sum * v[i];
            }
          }
      const auto a = linear(y, h + "attn.c_proj", C, C);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
      auto f = linear(layernorm(x, h + "ln_2"), h + "mlp.c_fc", C, 4 * C);
      for (auto& v : f) v = gelu(v);
      const auto m = linear(f, h + "mlp.c_proj", 4 * C, C);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
    }
    const auto hf = layernorm(x, "ln_f");
    double total = 0;
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < B * T; ++i) {
      if (targets[i] < 0) continue;
      std::vector<double> logits(static_cast<std::size_t>(V));
      double mx = -1e300;
      for (std::int64_t v = 0; v < V; ++v) {
        double d = 0;
        for (std::int64_t c = 0; c < C; ++c) d += hf[i * C + c] * wte[v * C + c];
        logits[v] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double lg : logits) sum += std::exp(lg - mx);
      total += mx + std::log(sum) - logits[targets[i]];
      ++n;
    }
    return n > 0 ? total / static_cast<double>(n) : 0.0;
  }
};

}  // namespace dstrain::test
