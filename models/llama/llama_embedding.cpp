// LlamaEmbedding: x = embed_tokens[tokens]. The encoder kernel adds a position table too; Llama
// has none (RoPE acts inside attention), so a zero table from the scratch stands in for it: one
// extra add of zeros per element, in exchange for no second embedding kernel. Under Megatron's
// sequence parallelism (models/residual_shards.h) the tensor-parallel sum is a reduce-scatter into
// this rank's rows of the residual stream, and backward all-gathers d(x) of every token first.
#include <cstdint>

#include "ops/kernels/encoder.h"
#include "ops/kernels/tensor_ops.h"
#include "models/layer_args.h"
#include "models/llama/llama_layers.h"

namespace dstrain {

using layer_args::expect_count;

namespace {
enum Scratch { kZeroPositions, kBuckets, kWhole, kNumScratch };
}

LlamaEmbedding::LlamaEmbedding(const LlamaConfig& cfg, TensorParallelRank tp) : cfg_(cfg), tp_(tp) { validate(cfg_); }

std::vector<ParamSpec> LlamaEmbedding::params() const {
  return {piece_spec({"model.embed_tokens.weight",
                      Shape{cfg_.padded_vocab_size, cfg_.n_embd},
                      ParamInit::normal(cfg_.initializer_range, cfg_.vocab_size),
                      true,
                      {},
                      ParamSplit::vocabulary()},
                     tp_)};  // (Vp, C); a tensor-parallel rank: (its rows, C)
}

ActivationSpec LlamaEmbedding::output(const LayerDims& d) const {
  llama_check_sequence(cfg_, d.T);
  return {"x", tp_.residual_shape(d.B, d.T, cfg_.n_embd), d.dtype};
}

std::vector<ActivationSpec> LlamaEmbedding::saved_activations(const LayerDims&) const { return {}; }

std::vector<ActivationSpec> LlamaEmbedding::scratch(const LayerDims& d) const {
  return {
      {"zero_positions", Shape{d.T, cfg_.n_embd}, d.dtype},  // forward: the encoder's position table (zeros); backward: its discarded gradient
      {"encoder_buckets", Shape{static_cast<std::int64_t>(encoder_backward_scratch_elems(d.B, d.T, cfg_.padded_vocab_size))}, DType::int32},
      // Megatron's sequence parallelism: every token's partial lookup (forward), d(x) (backward)
      {"x_whole", Shape{d.B, tp_.shards_residual(d.B * d.T) ? d.T : 0, cfg_.n_embd}, d.dtype},
  };
}

void LlamaEmbedding::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, 1);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  check_token_ids(a.batch.tokens, cfg_.vocab_size, "layer 'embedding'");
  llama_check_sequence(cfg_, a.dims.T);
  zero_tensor(a.scratch[kZeroPositions]);
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Tensor x = rs.whole(a.scratch[kWhole], a.output, Shape{a.dims.B, a.dims.T, cfg_.n_embd});
  encoder_forward(x, a.batch.tokens, a.params[0], a.scratch[kZeroPositions], shard());
  // Tensor parallelism: each rank looked up its vocabulary rows (zeros for the others'); the sum
  // completes the lookup (cut: this rank's rows of it).
  rs.reduce(x, a.output);
}

VocabShard LlamaEmbedding::shard() const {
  if (!tp_.active()) return {};
  return {layer_args::vocab_piece(cfg_.padded_vocab_size, cfg_.vocab_size, tp_).first, cfg_.padded_vocab_size};
}

void LlamaEmbedding::backward(const BackwardArgs& a) {
  expect_count(name(), "grads", a.grads, 1);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Tensor dx = rs.whole(a.scratch[kWhole], a.dout, Shape{a.dims.B, a.dims.T, cfg_.n_embd});
  rs.gather(a.dout, dx);
  encoder_backward(a.grads[0], a.scratch[kZeroPositions], dx, a.batch.tokens, a.scratch[kBuckets], shard());
}

}  // namespace dstrain
