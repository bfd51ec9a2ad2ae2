// Helpers shared by the transformer tests: moving parameters between a Gpt2Model and doubles.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "naive_gpt2.h"
#include "ops/dtype.h"
#include "ops/tensor.h"
#include "models/gpt2/gpt2_model.h"

namespace dstrain::test {

inline std::vector<double> to_doubles(const Tensor& t) {
  std::vector<float> f(static_cast<std::size_t>(t.numel()));
  convert(t.data, t.dtype, f.data(), DType::fp32, f.size());
  return {f.begin(), f.end()};
}

inline void from_doubles(Tensor t, const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  convert(f.data(), DType::fp32, t.data, t.dtype, f.size());
}

// Parameters large enough that every part of the network matters (at GPT-2's init scale of 0.02
// the logits are ~0 and the loss hardly depends on anything): weights ~ N(0, 1/sqrt(fan_in)), LN
// weights 1 + N(0, 0.2), biases N(0, 0.1), embeddings N(0, 0.5). The padded rows of wte get
// random values too: the loss must not see them.
inline void fill_test_params(Gpt2Model& m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (const auto& p : m.params()) {
    const std::string& n = p.spec.name;
    std::vector<double> v(static_cast<std::size_t>(p.value.numel()));
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
    for (auto& x : v) x = d(rng);
    from_doubles(p.value, v);
  }
}

// The naive model with the model's parameters as stored (after any 16-bit rounding).
inline NaiveGpt2 naive_from(const Gpt2Model& m) {
  NaiveGpt2 n;
  n.cfg = m.config();
  for (const auto& p : m.params()) n.p[p.spec.name] = to_doubles(p.value);
  return n;
}

struct TokenBatch {
  std::vector<std::int32_t> tokens, targets;
  Tensor tokens_tensor() { return Tensor(tokens.data(), DType::int32, Shape{B, T}); }
  Tensor targets_tensor() { return Tensor(targets.data(), DType::int32, Shape{B, T}); }
  std::int64_t B = 0, T = 0;
};

// Random tokens; targets are the next tokens, with one ignored (-1) position when `ignore_one`.
inline TokenBatch random_batch(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t seed, bool ignore_one = true) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(V - 1));
  TokenBatch b;
  b.B = B;
  b.T = T;
  std::vector<std::int32_t> seq(static_cast<std::size_t>(B * T + 1));
  for (auto& s : seq) s = d(rng);
  b.tokens.assign(seq.begin(), seq.end() - 1);
  b.targets.assign(seq.begin() + 1, seq.end());
  if (ignore_one) b.targets[3] = -1;
  return b;
}

}  // namespace dstrain::test
