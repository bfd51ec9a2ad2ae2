// A model family defined outside dstrain, as an application defines its own (docs/design.md
// "Adding a model family"): a bigram language model — each token's embedding, projected back onto
// the vocabulary, predicts the next token. Two layers written here against dstrain's Layer
// interface (plain loops on host fp32: this example trains on the CPU in fp32), an Architecture
// that answers for them, and a ModelFamily that reads "bigram:V<vocab>-C<width>" specs and the
// JSON its architectures write into checkpoints.
//
//   dstrain::register_model_family(std::make_shared<consumer::BigramFamily>());
//   dstrain::Trainer trainer(config, "bigram:V7-C16", options);  // or make_model("bigram:V7-C16")
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <dstrain/dstrain.h>

namespace consumer {

using dstrain::ActivationSpec;
using dstrain::BackwardArgs;
using dstrain::ForwardArgs;
using dstrain::LayerDims;
using dstrain::ParamInit;
using dstrain::ParamSpec;
using dstrain::ParamSplit;
using dstrain::Shape;

inline void require_fp32(const LayerDims& d, const char* layer) {
  if (d.dtype != dstrain::DType::fp32) {
    dstrain::fail("bigram layer '{}': this example computes in fp32; the config asks for {} (drop its fp16 / bf16 section)", layer,
                  dstrain::dtype_name(d.dtype));
  }
}

// tokens (B, T) -> x (B, T, C): each token's row of the embedding.
class BigramEmbedding final : public dstrain::Layer {
 public:
  BigramEmbedding(std::int64_t vocab, std::int64_t width) : V_(vocab), C_(width) {}
  std::string name() const override { return "embedding"; }
  std::string type_name() const override { return "BigramEmbedding"; }
  std::vector<ParamSpec> params() const override {
    return {{"embed.weight", Shape{V_, C_}, ParamInit::normal(0.5f), true, {}, ParamSplit::vocabulary()}};
  }
  ActivationSpec output(const LayerDims& d) const override { return {"x", Shape{d.B, d.T, C_}, d.dtype}; }
  std::vector<ActivationSpec> saved_activations(const LayerDims&) const override { return {}; }
  std::vector<ActivationSpec> scratch(const LayerDims&) const override { return {}; }

  void forward(const ForwardArgs& a) override {
    require_fp32(a.dims, "embedding");
    dstrain::check_token_ids(a.batch.tokens, V_, "bigram embedding");
    const auto* tok = a.batch.tokens.as<std::int32_t>();
    const float* w = a.params[0].as<float>();
    float* x = a.output.as<float>();
    for (std::int64_t i = 0; i < a.dims.B * a.dims.T; ++i) std::copy_n(w + tok[i] * C_, C_, x + i * C_);
  }
  void backward(const BackwardArgs& a) override {
    const auto* tok = a.batch.tokens.as<std::int32_t>();
    const float* dx = a.dout.as<float>();
    float* dw = a.grads[0].as<float>();  // accumulate (+=): gradients sum over micro-batches
    for (std::int64_t i = 0; i < a.dims.B * a.dims.T; ++i)
      for (std::int64_t c = 0; c < C_; ++c) dw[tok[i] * C_ + c] += dx[i * C_ + c];
  }

 private:
  std::int64_t V_, C_;
};

// x (B, T, C) -> logits = x · Wᵀ + b (B, T, V) -> cross-entropy against the targets; its output is
// the per-position losses (B, T) fp32, their mean over the counted targets in *loss.
class BigramHead final : public dstrain::Layer {
 public:
  BigramHead(std::int64_t vocab, std::int64_t width) : V_(vocab), C_(width) {}
  std::string name() const override { return "head"; }
  std::string type_name() const override { return "BigramHead"; }
  std::vector<ParamSpec> params() const override {
    return {{"head.weight", Shape{V_, C_}, ParamInit::normal(0.5f), true, {}, ParamSplit::vocabulary()},
            {"head.bias", Shape{V_}, ParamInit::zeros(), false, {}, ParamSplit::vocabulary()}};
  }
  ActivationSpec output(const LayerDims& d) const override { return {"losses", Shape{d.B, d.T}, dstrain::DType::fp32}; }
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override { return {{"probs", Shape{d.B, d.T, V_}, dstrain::DType::fp32}}; }
  std::vector<ActivationSpec> scratch(const LayerDims&) const override { return {}; }

  void forward(const ForwardArgs& a) override {
    require_fp32(a.dims, "head");
    const float *x = a.input.as<float>(), *w = a.params[0].as<float>(), *b = a.params[1].as<float>();
    const auto* tgt = a.batch.targets.as<std::int32_t>();
    float* probs = a.saved[0].as<float>();
    float* losses = a.output.as<float>();
    double sum = 0.0;
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < a.dims.B * a.dims.T; ++i) {
      float* p = probs + i * V_;
      float max = -INFINITY;
      for (std::int64_t v = 0; v < V_; ++v) {
        float z = b[v];
        for (std::int64_t c = 0; c < C_; ++c) z += x[i * C_ + c] * w[v * C_ + c];
        p[v] = z;
        max = std::max(max, z);
      }
      double total = 0.0;
      for (std::int64_t v = 0; v < V_; ++v) total += (p[v] = std::exp(p[v] - max));
      for (std::int64_t v = 0; v < V_; ++v) p[v] = static_cast<float>(p[v] / total);
      losses[i] = tgt[i] < 0 ? 0.0f : -std::log(std::max(p[tgt[i]], 1e-30f));
      if (tgt[i] >= 0) sum += losses[i], ++counted;
    }
    if (a.loss != nullptr) *a.loss = counted > 0 ? static_cast<float>(sum / static_cast<double>(counted)) : 0.0f;
  }
  void backward(const BackwardArgs& a) override {
    const float *x = a.input.as<float>(), *w = a.params[0].as<float>(), *probs = a.saved[0].as<float>();
    const auto* tgt = a.batch.targets.as<std::int32_t>();
    float *dw = a.grads[0].as<float>(), *db = a.grads[1].as<float>(), *dx = a.dinput.as<float>();
    const std::int64_t counted = dstrain::count_targets(a.batch);
    const float scale = counted > 0 ? a.dloss / static_cast<float>(counted) : 0.0f;
    std::vector<float> g(static_cast<std::size_t>(V_));
    for (std::int64_t i = 0; i < a.dims.B * a.dims.T; ++i) {
      std::fill_n(dx + i * C_, C_, 0.0f);  // d(input) is written, not accumulated
      if (tgt[i] < 0) continue;
      for (std::int64_t v = 0; v < V_; ++v) g[static_cast<std::size_t>(v)] = (probs[i * V_ + v] - (v == tgt[i] ? 1.0f : 0.0f)) * scale;
      for (std::int64_t v = 0; v < V_; ++v) {
        const float gv = g[static_cast<std::size_t>(v)];
        db[v] += gv;
        for (std::int64_t c = 0; c < C_; ++c) {
          dw[v * C_ + c] += gv * x[i * C_ + c];
          dx[i * C_ + c] += gv * w[v * C_ + c];
        }
      }
    }
  }

 private:
  std::int64_t V_, C_;
};

class BigramFamily;

class BigramArchitecture final : public dstrain::Architecture {
 public:
  BigramArchitecture(const dstrain::ModelFamily& family, std::int64_t vocab, std::int64_t width) : family_(family), V_(vocab), C_(width) {
    if (V_ < 1 || C_ < 1) dstrain::fail("bigram model: V{} C{} — the vocabulary and the width must be at least 1", V_, C_);
  }
  const dstrain::ModelFamily& family() const override { return family_; }
  std::int64_t n_layer() const override { return 0; }  // no transformer blocks
  std::int64_t n_embd() const override { return C_; }
  std::int64_t n_positions() const override { return 1 << 20; }  // a bigram sees one token: any T
  std::int64_t vocab_size() const override { return V_; }
  double parameter_count() const override { return static_cast<double>(2 * V_ * C_ + V_); }
  double stored_parameter_count() const override { return parameter_count(); }
  std::string describe() const override {
    return "bigram model: vocab " + std::to_string(V_) + ", width " + std::to_string(C_) + "; " + std::to_string(2 * V_ * C_ + V_) + " parameters";
  }
  std::vector<std::unique_ptr<dstrain::Layer>> make_layers() const override {
    std::vector<std::unique_ptr<dstrain::Layer>> layers;
    layers.push_back(std::make_unique<BigramEmbedding>(V_, C_));
    layers.push_back(std::make_unique<BigramHead>(V_, C_));
    return layers;
  }
  std::string config_json() const override { return dstrain::config::Json{{"vocab_size", V_}, {"width", C_}}.dump(); }

 private:
  const dstrain::ModelFamily& family_;
  std::int64_t V_, C_;
};

class BigramFamily final : public dstrain::ModelFamily {
 public:
  std::string name() const override { return "bigram"; }
  std::string spec_forms() const override { return "bigram:V<vocab>-C<width>"; }
  std::shared_ptr<const dstrain::Architecture> from_spec(std::string_view spec) const override {
    long long v = 0, c = 0;
    char tail = 0;
    if (std::sscanf(std::string(spec).c_str(), "bigram:V%lld-C%lld%c", &v, &c, &tail) != 2) {
      dstrain::fail("model spec '{}': a bigram spec is {}", spec, spec_forms());
    }
    return std::make_shared<BigramArchitecture>(*this, v, c);
  }
  std::shared_ptr<const dstrain::Architecture> from_config_json(std::string_view text, std::string_view source) const override {
    const auto j = dstrain::config::Json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("vocab_size") || !j.contains("width")) dstrain::fail("{}: not a bigram config", source);
    return std::make_shared<BigramArchitecture>(*this, j["vocab_size"].get<std::int64_t>(), j["width"].get<std::int64_t>());
  }
};

}  // namespace consumer
