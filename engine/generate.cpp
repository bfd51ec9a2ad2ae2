#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "data/tokenizer.h"
#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/kernels/philox.h"
#include "models/activation_layout.h"

namespace dstrain {
namespace {

constexpr std::size_t kAlignBytes = kActivationAlignBytes;

// Sampling's Philox stream: a layer index no model reaches, so it never coincides with a dropout
// stream of the same seed.
constexpr std::uint32_t kSamplingStream = 65535;

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenSampler

TokenSampler::TokenSampler(std::int64_t vocab_size) : V_(vocab_size) {
  if (vocab_size <= 0) fail("TokenSampler: vocab_size is {}; it must be positive", vocab_size);
  order_.resize(static_cast<std::size_t>(V_));
  weight_.resize(static_cast<std::size_t>(V_));
}

std::int32_t TokenSampler::sample(std::span<const float> logits, float temperature, std::int64_t top_k, double u) {
  if (static_cast<std::int64_t>(logits.size()) != V_)
    fail("TokenSampler::sample: {} logits for a vocabulary of {}; pass the real vocabulary's columns only", logits.size(), V_);
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    fail("sampling temperature is {}: use 0 (greedy) or a positive finite value such as 1.0", temperature);
  if (top_k < 0) fail("sampling top_k is {}: use 0 (the whole vocabulary) or a positive count", top_k);

  if (temperature == 0.0f) {  // greedy: the first maximum
    std::int64_t best = 0;
    for (std::int64_t v = 1; v < V_; ++v)
      if (logits[static_cast<std::size_t>(v)] > logits[static_cast<std::size_t>(best)]) best = v;
    return static_cast<std::int32_t>(best);
  }

  // Candidates: all ids, or the k largest logits (ties to the lower id), then in ascending id order
  // so the inverse CDF walks a fixed order.
  std::size_t n = static_cast<std::size_t>(V_);
  for (std::size_t v = 0; v < n; ++v) order_[v] = static_cast<std::int32_t>(v);
  if (top_k > 0 && top_k < V_) {
    const auto larger = [&](std::int32_t a, std::int32_t b) {
      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      return la > lb || (la == lb && a < b);
    };
    n = static_cast<std::size_t>(top_k);
    std::nth_element(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n - 1), order_.end(), larger);
    std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  // softmax(logits / temperature) over the candidates, in double, shifted by the max for range.
  double max_scaled = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < n; ++j)
    max_scaled = std::max(max_scaled, static_cast<double>(logits[static_cast<std::size_t>(order_[j])]) / temperature);
  if (!std::isfinite(max_scaled)) fail("sampling: the logits are not finite (max {}); the model diverged", max_scaled);
  double total = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double w = std::exp(static_cast<double>(logits[static_cast<std::size_t>(order_[j])]) / temperature - max_scaled);
    weight_[j] = std::isnan(w) ? 0.0 : w;
    total += weight_[j];
  }
  const double target = u * total;
  double cum = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    cum += weight_[j];
    if (target < cum) return order_[j];
  }
  // Rounding left target at the very top: the last candidate with weight.
  for (std::size_t j = n; j-- > 0;)
    if (weight_[j] > 0.0) return order_[j];
  return order_[0];
}

double sampling_uniform(std::uint64_t seed, std::uint64_t n) {
  const RngKey key{seed, 0, kSamplingStream, 0, 0};
  const PhiloxCounter bits = key.group_bits(n);
  // 53 bits, as numpy's random(): 27 high + 26 low.
  const std::uint64_t a = bits.v[0] >> 5, b = bits.v[1] >> 6;
  return static_cast<double>(a * 67108864u + b) * 0x1p-53;
}

// ---------------------------------------------------------------------------------------------
// Generator

Generator::Generator(GenerationModel model, std::int64_t max_context, Allocator& allocator) : model_(std::move(model)), sampler_(model_.vocab_size) {
  if (model_.layers.empty()) fail("Generator: the model has no layers");
  for (std::size_t i = 0; i < model_.layers.size(); ++i)
    if (model_.layers[i] == nullptr) fail("Generator: layer {} is null", i);
  if (!model_.params) fail("Generator: GenerationModel::params is empty; give a function returning a layer's param views");
  if (model_.n_positions <= 0) fail("Generator: n_positions is {}; it must be positive", model_.n_positions);
  if (max_context < 0 || max_context > model_.n_positions)
    fail("Generator: max_context is {}; use 0 (= n_positions) or 1 .. n_positions = {}", max_context, model_.n_positions);
  if (!is_floating(model_.dtype)) fail("Generator: storage dtype {} is not fp32, fp16 or bf16", dtype_name(model_.dtype));
  window_ = max_context == 0 ? model_.n_positions : max_context;

  Layer& head = *model_.layers.back();
  {
    const auto saved = head.saved_activations(LayerDims{1, 1, model_.dtype});
    const auto it = std::find_if(saved.begin(), saved.end(), [](const ActivationSpec& s) { return s.name == "logits"; });
    if (it == saved.end())
      fail(
          "Generator: the last layer '{}' saves no activation named \"logits\"; generation reads the (B, T, Vp) "
          "logits the LM head saves",
          head.name());
    logits_index_ = static_cast<std::size_t>(it - saved.begin());
  }

  // Context lengths: powers of two below the window, and the window.
  std::vector<std::int64_t> Ts;
  for (std::int64_t T = 1; T < window_; T *= 2) Ts.push_back(T);
  Ts.push_back(window_);

  // Layout per T: two ping-pong outputs (a layer's input is the previous output), one saved area
  // shared by all layers (in evaluation nothing is read back after the layer returns, except the
  // head's logits, and the head runs last), one scratch area. Buffers sized for the largest T.
  struct Plan {
    std::size_t out_bytes = 0, saved_bytes = 0, scratch_bytes = 0;
    std::vector<std::vector<std::size_t>> saved_off, scratch_off;
  };
  std::vector<Plan> plans(Ts.size());
  std::size_t act_bytes = 0, scratch_bytes = 0;
  for (std::size_t b = 0; b < Ts.size(); ++b) {
    const LayerDims dims{1, Ts[b], model_.dtype};
    Plan& pl = plans[b];
    for (Layer* layer : model_.layers) {
      pl.out_bytes = std::max(pl.out_bytes, align_up(layer->output(dims).nbytes(), kAlignBytes));
      std::size_t off = 0;
      pl.saved_off.emplace_back();
      for (const auto& s : layer->saved_activations(dims)) {
        off = align_up(off, kAlignBytes);
        pl.saved_off.back().push_back(off);
        off += s.nbytes();
      }
      pl.saved_bytes = std::max(pl.saved_bytes, align_up(off, kAlignBytes));
      off = 0;
      pl.scratch_off.emplace_back();
      for (const auto& s : layer->scratch(dims)) {
        off = align_up(off, kAlignBytes);
        pl.scratch_off.back().push_back(off);
        off += s.nbytes();
      }
      pl.scratch_bytes = std::max(pl.scratch_bytes, align_up(off, kAlignBytes));
    }
    act_bytes = std::max(act_bytes, 2 * pl.out_bytes + pl.saved_bytes);
    scratch_bytes = std::max(scratch_bytes, pl.scratch_bytes);
  }
  act_buf_ = Buffer(allocator, std::max(act_bytes, kAlignBytes), MemoryPurpose::activations);
  scratch_buf_ = Buffer(allocator, std::max(scratch_bytes, kAlignBytes), MemoryPurpose::buffers);
  // tokens (window) then targets (window), int32; targets all -1: no loss is wanted.
  const std::size_t tok_bytes = align_up(static_cast<std::size_t>(window_) * sizeof(std::int32_t), kAlignBytes);
  token_buf_ = Buffer(allocator, 2 * tok_bytes, MemoryPurpose::buffers);
  host_tokens_.assign(2 * tok_bytes / sizeof(std::int32_t), -1);
  copy_tensor(token_buf_.tensor(DType::int32, Shape{static_cast<std::int64_t>(host_tokens_.size())}),
              Tensor(host_tokens_.data(), DType::int32, Shape{static_cast<std::int64_t>(host_tokens_.size())}));

  for (std::size_t b = 0; b < Ts.size(); ++b) {
    const std::int64_t T = Ts[b];
    const LayerDims dims{1, T, model_.dtype};
    const Plan& pl = plans[b];
    Bucket bk;
    bk.T = T;
    bk.tokens = token_buf_.tensor(DType::int32, Shape{1, T}, 0);
    bk.targets = token_buf_.tensor(DType::int32, Shape{1, T}, tok_bytes);
    for (std::size_t i = 0; i < model_.layers.size(); ++i) {
      Layer* layer = model_.layers[i];
      LayerViews lv;
      const auto out = layer->output(dims);
      lv.output = act_buf_.tensor(out.dtype, out.shape, (i % 2) * pl.out_bytes);
      if (i > 0) lv.input = bk.layers[i - 1].output;
      const auto saved = layer->saved_activations(dims);
      for (std::size_t s = 0; s < saved.size(); ++s)
        lv.saved.push_back(act_buf_.tensor(saved[s].dtype, saved[s].shape, 2 * pl.out_bytes + pl.saved_off[i][s]));
      const auto scratch = layer->scratch(dims);
      for (std::size_t s = 0; s < scratch.size(); ++s)
        lv.scratch.push_back(scratch_buf_.tensor(scratch[s].dtype, scratch[s].shape, pl.scratch_off[i][s]));
      bk.layers.push_back(std::move(lv));
    }
    bk.logits = bk.layers.back().saved[logits_index_];
    const Shape& ls = bk.logits.shape;
    if (ls.rank != 3 || ls[0] != 1 || ls[1] != T || ls[2] < model_.vocab_size || !is_floating(bk.logits.dtype))
      fail("Generator: the head's logits are {} but a floating (1, {}, Vp >= V = {}) tensor is expected", bk.logits.str(), T, model_.vocab_size);
    buckets_.push_back(std::move(bk));
  }
  row_.resize(static_cast<std::size_t>(model_.vocab_size));
  row_storage_.resize(static_cast<std::size_t>(model_.vocab_size));
}

const Generator::Bucket& Generator::bucket_for(std::int64_t len) const {
  for (const Bucket& b : buckets_)
    if (b.T >= len) return b;
  return buckets_.back();
}

std::span<const float> Generator::next_token_logits(std::span<const std::int32_t> context) {
  if (context.empty()) fail("Generator: the context is empty; give at least one token (e.g. <|endoftext|>)");
  const auto n = static_cast<std::int64_t>(context.size());
  const std::int64_t len = std::min(n, window_);
  const std::span<const std::int32_t> window = context.subspan(static_cast<std::size_t>(n - len));
  const Bucket& bk = bucket_for(len);
  // Written on the host, then uploaded (a no-op copy when the model runs on the CPU).
  std::int32_t* tokens = host_tokens_.data();
  for (std::int64_t t = 0; t < len; ++t) {
    const std::int32_t id = window[static_cast<std::size_t>(t)];
    if (id < 0 || id >= model_.vocab_size)
      fail("Generator: token {} at position {} is outside the vocabulary [0, {})", id, n - len + t, model_.vocab_size);
    tokens[t] = id;
  }
  // Positions past the context: any valid id; causal attention keeps them out of position len-1.
  std::fill(tokens + len, tokens + bk.T, 0);
  copy_tensor(bk.tokens, Tensor(tokens, DType::int32, bk.tokens.shape));

  float loss = 0.0f;
  for (std::size_t i = 0; i < model_.layers.size(); ++i) {
    const LayerViews& lv = bk.layers[i];
    ForwardArgs a;
    a.dims = LayerDims{1, bk.T, model_.dtype};
    a.batch = Batch{bk.tokens, bk.targets};
    a.input = lv.input;
    a.output = lv.output;
    a.params = model_.params(i);
    a.saved = lv.saved;
    a.scratch = lv.scratch;
    a.rng = RngKey{0, 0, static_cast<std::uint32_t>(i), 0, 0};
    a.train = false;  // no dropout
    a.loss = &loss;
    model_.layers[i]->forward(a);
    if (model_.release) model_.release(i);
  }
  // The last real position's logits over the real vocabulary: to the host, then to fp32.
  const std::int64_t Vp = bk.logits.shape[2];
  const Shape v_shape{model_.vocab_size};
  const Tensor row(static_cast<char*>(bk.logits.data) + static_cast<std::size_t>((len - 1) * Vp) * dtype_size(bk.logits.dtype), bk.logits.dtype,
                   v_shape, bk.logits.device);
  Tensor host_row = row;
  if (!row.device.is_cpu()) {
    host_row = Tensor(row_storage_.data(), row.dtype, v_shape);
    copy_tensor(host_row, row);
  }
  convert_tensor(Tensor(row_.data(), DType::fp32, v_shape), host_row);
  return row_;
}

std::vector<std::int32_t> Generator::generate(std::span<const std::int32_t> prompt, const SamplingOptions& options) {
  if (options.max_new_tokens < 0) fail("generate: max_new_tokens is {}; it must be >= 0", options.max_new_tokens);
  // Checked before any forward pass, so a bad option fails fast rather than after a forward.
  if (!(options.temperature >= 0.0f) || !std::isfinite(options.temperature))
    fail("sampling temperature is {}: use 0 (greedy) or a positive finite value such as 1.0", options.temperature);
  if (options.top_k < 0) fail("sampling top_k is {}: use 0 (the whole vocabulary) or a positive count", options.top_k);
  const std::int32_t eot = options.eot_token;
  if (prompt.empty() && (eot < 0 || eot >= model_.vocab_size))
    fail(
        "generate: no prompt and eot_token {} is outside the vocabulary [0, {}); give a prompt or set "
        "SamplingOptions::eot_token",
        eot, model_.vocab_size);
  // The whole sequence, reserved once: appending never reallocates. Only its last window() tokens
  // are ever read.
  std::vector<std::int32_t> seq;
  seq.reserve((prompt.empty() ? 1 : prompt.size()) + static_cast<std::size_t>(options.max_new_tokens));
  if (prompt.empty())
    seq.push_back(eot);
  else
    seq.assign(prompt.begin(), prompt.end());
  const std::size_t start = seq.size();
  for (std::int64_t n = 0; n < options.max_new_tokens; ++n) {
    const std::span<const float> logits = next_token_logits(seq);
    const double u = options.temperature == 0.0f ? 0.0 : sampling_uniform(options.seed, static_cast<std::uint64_t>(n));
    seq.push_back(sampler_.sample(logits, options.temperature, options.top_k, u));
  }
  return {seq.begin() + static_cast<std::ptrdiff_t>(start), seq.end()};
}

// ---------------------------------------------------------------------------------------------
// LayerStackGenerationViews

LayerStackGenerationViews::LayerStackGenerationViews(const LayerStack& stack, std::int64_t vocab_size, std::int64_t n_positions)
    : stack_(&stack), vocab_size_(vocab_size), n_positions_(n_positions) {
  for (const auto& layer : stack.layers()) {
    layers_.push_back(layer.get());
    std::vector<Tensor> views;
    for (const ParamSpec& ps : layer->params()) views.push_back(stack.param(ps.tied() ? ps.tied_to : ps.name));
    params_.push_back(std::move(views));
  }
}

GenerationModel LayerStackGenerationViews::model() const {
  GenerationModel m;
  m.layers = layers_;
  m.params = [this](std::size_t i) { return std::span<const Tensor>(params_[i]); };
  m.vocab_size = vocab_size_;
  m.n_positions = n_positions_;
  m.dtype = stack_->dims().dtype;
  return m;
}

// ---------------------------------------------------------------------------------------------

std::string decode_for_print(const Tokenizer& tokenizer, std::span<const std::int32_t> tokens) {
  std::string out;
  std::size_t begin = 0;
  const auto flush = [&](std::size_t end) {
    if (end > begin) out += tokenizer.decode(tokens.subspan(begin, end - begin));
  };
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= 0 && tokens[i] < tokenizer.vocab_size()) continue;
    flush(i);
    out += fmt::format("<|{}|>", tokens[i]);
    begin = i + 1;
  }
  flush(tokens.size());
  return out;
}

}  // namespace dstrain
