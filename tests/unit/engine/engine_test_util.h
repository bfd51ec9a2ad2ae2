// Helpers shared by the engine tests: parse a config literal, make token batches, read tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "ops/dtype.h"
#include "ops/tensor.h"
#include "models/layer.h"

namespace dstrain::engine_testing {

inline config::DsConfig ds(const std::string& json) { return config::parse_ds_config(config::Json::parse(json), {}); }

// Token ids (B, T) with next-token targets, viewed as an engine Batch.
struct Tokens {
  std::vector<std::int32_t> tokens, targets;
  std::int64_t B = 0, T = 0;
  Batch batch() { return Batch{Tensor(tokens.data(), DType::int32, Shape{B, T}), Tensor(targets.data(), DType::int32, Shape{B, T})}; }
};

// A deterministic pseudo-random sequence of B·T + 1 ids below V (LCG), cut into inputs and
// next-token targets; `ignored_target`, when given, is set to -1 (no loss, no gradient).
inline Tokens random_tokens(std::int64_t B, std::int64_t T, std::int32_t V, std::uint32_t seed,
                            std::optional<std::size_t> ignored_target = std::nullopt) {
  Tokens t{{}, {}, B, T};
  std::uint32_t s = seed * 2654435761u + 12345u;
  std::vector<std::int32_t> seq(static_cast<std::size_t>(B * T + 1));
  for (auto& x : seq) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(V));
  }
  t.tokens.assign(seq.begin(), seq.end() - 1);
  t.targets.assign(seq.begin() + 1, seq.end());
  if (ignored_target) t.targets[*ignored_target] = -1;
  return t;
}

// GPT recipes' weight-decay rule, written independently of the layers' ParamSpecs (the naive
// optimizer references use it): matrices and embeddings decay; biases and LayerNorm parameters do not.
inline bool decays(const std::string& name) { return name.ends_with(".weight") && name.find("ln_") == std::string::npos; }

// An fp32 tensor's elements.
inline std::vector<float> values(const Tensor& t) {
  const float* p = t.as<float>();
  return {p, p + t.numel()};
}

// Any fp32 / fp16 / bf16 tensor as doubles.
inline std::vector<double> widen(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype) {
      case DType::fp32:
        out[static_cast<std::size_t>(i)] = t.as<float>()[i];
        break;
      case DType::fp16:
        out[static_cast<std::size_t>(i)] = fp16_bits_to_fp32(static_cast<const std::uint16_t*>(t.data)[i]);
        break;
      case DType::bf16:
        out[static_cast<std::size_t>(i)] = bf16_bits_to_fp32(static_cast<const std::uint16_t*>(t.data)[i]);
        break;
      default:
        ADD_FAILURE() << "unexpected dtype " << dtype_name(t.dtype);
    }
  }
  return out;
}

}  // namespace dstrain::engine_testing
