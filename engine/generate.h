// Text generation from a model built from our layers (any family), as llm.c / nanoGPT sample at the val
// interval: for every new token, one forward pass over the context (B = 1), then a token drawn
// from softmax(logits / temperature) over the REAL vocabulary (never a padding column), optionally
// restricted to the top k logits; temperature 0 is greedy (argmax).
//
// Inputs, and why: the engine owns the parameters (flat buffers, ZeRO partitions, gathered per
// layer under ZeRO-3), so the Generator does not take a model with its own memory. It takes the layer list and a
// callback that returns a layer's parameter views right before that layer's forward, which is
// where the engine gathers (and, with `release`, frees) them. LayerStackGenerationViews builds the
// same thing from a LayerStack (Gpt2Model, LlamaModel) for standalone use and tests.
//
// Memory: the Generator allocates everything in its constructor (activations for B = 1 and the
// context window, the token buffer, the sampling work arrays). generate() allocates nothing per
// token except appending to the returned vector (reserved up front). The context length T of a
// forward pass is the current length rounded up to a power of two (capped at the window): views
// for those few T are laid out once, and positions past the current length hold token 0. Attention
// is causal, so the logits at the last real position are those of a forward over exactly the
// current length (up to the kernels' rounding, which may depend on T: ~1e-6 relative in fp32);
// the rounding of T bounds the wasted work at 2x and keeps the layout finite.
// Past the window (n_positions, or a smaller max_context) the context slides: the last `window`
// tokens.
//
// The model's last layer must save an activation named "logits" of shape (B, T, Vp), Vp >= V (the
// GPT-2 head does); its output (the per-position losses) is computed with all targets ignored.
// Any device: the context is written on the host and uploaded; the last position's logits row is
// copied back (V values) for sampling on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ops/allocator.h"
#include "ops/buffer.h"
#include "models/layer_stack.h"
#include "models/layer.h"

namespace dstrain {

class Tokenizer;

// What the Generator runs.
struct GenerationModel {
  std::vector<Layer*> layers;  // in forward order: embedding, blocks, head
  // The param views of layer i, in layers[i]->params() order with tied entries included (the
  // owner's view), valid until the next call or `release(i)`.
  std::function<std::span<const Tensor>(std::size_t layer)> params;
  // Called after layer i's forward (ZeRO-3: free the gathered parameters); may be empty.
  std::function<void(std::size_t layer)> release;
  std::int64_t vocab_size = 0;   // V: the real tokens; sampled ids are always < V
  std::int64_t n_positions = 0;  // the longest context the model takes (wpe rows)
  DType dtype = DType::fp32;     // storage dtype of params and activations
};

struct SamplingOptions {
  std::int64_t max_new_tokens = 64;
  float temperature = 1.0f;        // > 0: softmax(logits / temperature); 0: greedy (argmax)
  std::int64_t top_k = 0;          // > 0: sample among the k largest logits only; 0: all V
  std::uint64_t seed = 1337;       // Philox key; token n of the output uses counter n
  std::int32_t eot_token = 50256;  // the prompt when none is given (GPT-2's <|endoftext|>; a Llama tokenizer's bos: sample_start_token)
};

// Draws one token from logits over the real vocabulary (logits.size() = V: the caller passes only
// the real columns, so a padding column cannot be drawn). Work arrays are allocated once.
class TokenSampler {
 public:
  explicit TokenSampler(std::int64_t vocab_size);

  // u in [0, 1) is the random draw (inverse CDF over the candidates in ascending id order).
  // temperature 0: argmax (lowest id on ties), u unused. top_k 0 or >= V: all of the vocabulary;
  // otherwise the k largest logits (ties at the k-th value go to the lower ids).
  // Throws Error for a negative / non-finite temperature, a negative top_k, a wrong logits size.
  std::int32_t sample(std::span<const float> logits, float temperature, std::int64_t top_k, double u);

 private:
  std::int64_t V_;
  std::vector<std::int32_t> order_;  // candidate ids
  std::vector<double> weight_;       // their unnormalised probabilities
};

// The uniform draw for output token n of a seed: 53 random bits from Philox (seed, n).
double sampling_uniform(std::uint64_t seed, std::uint64_t n);

class Generator {
 public:
  // max_context: the window (0 = model.n_positions; at most n_positions). Allocates from
  // `allocator`, on the device of the model's parameters.
  explicit Generator(GenerationModel model, std::int64_t max_context = 0, Allocator& allocator = cpu_allocator());

  // Returns the max_new_tokens new tokens (the prompt not included). An empty prompt means
  // {options.eot_token}. Every prompt token must be in [0, V).
  std::vector<std::int32_t> generate(std::span<const std::int32_t> prompt, const SamplingOptions& options);

  // One forward pass over the last `window()` tokens of `context` (non-empty); returns the fp32
  // logits of the last position over the real vocabulary (V values; valid until the next call).
  std::span<const float> next_token_logits(std::span<const std::int32_t> context);

  std::int64_t window() const { return window_; }

 private:
  struct LayerViews {
    Tensor input, output;
    std::vector<Tensor> saved, scratch;
  };
  struct Bucket {  // the views for one context length T
    std::int64_t T = 0;
    Tensor tokens, targets;
    std::vector<LayerViews> layers;
    Tensor logits;  // (1, T, Vp)
  };
  const Bucket& bucket_for(std::int64_t len) const;

  GenerationModel model_;
  std::int64_t window_ = 0;
  std::size_t logits_index_ = 0;  // index of "logits" in the last layer's saved activations
  Buffer act_buf_, scratch_buf_, token_buf_;
  std::vector<Bucket> buckets_;             // ascending T; the last has T = window_
  std::vector<float> row_;                  // (V) the last position's logits, fp32
  std::vector<std::int32_t> host_tokens_;   // the token buffer's host side (tokens, then targets = -1)
  std::vector<std::uint32_t> row_storage_;  // (V) the logits row copied from a device, any dtype
  TokenSampler sampler_;
};

// The GenerationModel of a layer stack with its own memory (a Gpt2Model, a LlamaModel: its layers
// and parameter views, tied ones resolved to their owner), for a model of `vocab_size` tokens and
// sequences up to `n_positions`. Keep it alive while a Generator made from model() is used; the
// stack too.
class LayerStackGenerationViews {
 public:
  LayerStackGenerationViews(const LayerStack& stack, std::int64_t vocab_size, std::int64_t n_positions);
  // model()'s params callback points at this object: it must not move.
  LayerStackGenerationViews(const LayerStackGenerationViews&) = delete;
  LayerStackGenerationViews& operator=(const LayerStackGenerationViews&) = delete;
  GenerationModel model() const;

 private:
  const LayerStack* stack_;
  std::int64_t vocab_size_ = 0, n_positions_ = 0;
  std::vector<Layer*> layers_;
  std::vector<std::vector<Tensor>> params_;
};

// The tokens as text for a log line: the tokenizer's decoding, ids outside its vocabulary shown as
// "<|id|>" instead of failing (a sample is never worth an exception).
std::string decode_for_print(const Tokenizer& tokenizer, std::span<const std::int32_t> tokens);

}  // namespace dstrain
