// Gpt2Embedding: x = dropout(wte[tokens] + wpe[t]).
// Tensor parallelism: each rank holds some rows of wte (vocabulary-parallel); its lookup gives zeros
// for the other rows' tokens and the group's sum completes it. Rank 0 adds wpe (the others a zero
// table), so the sum adds it once; every rank forms wpe's gradient from the same d(x). Under
// Megatron's sequence parallelism (models/residual_shards.h) the sum is a reduce-scatter into this
// rank's rows of the residual stream, and backward all-gathers d(x) over every token first.
#include <cstdint>

#include "ops/kernels/dropout.h"
#include "ops/kernels/encoder.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/layer_args.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

using layer_args::expect_count;

Gpt2Embedding::Gpt2Embedding(const Gpt2Config& cfg, TensorParallelRank tp, SequenceParallelRank sp) : cfg_(cfg), tp_(tp), sp_(sp) { validate(cfg_); }

namespace {

// Sequence parallelism: rank s holds positions [s·T, (s+1)·T), so its position table starts at row
// s·T (rows to the end of the table; the encoder reads the first T).
Tensor positions_from(const Tensor& wpe, std::int64_t first) {
  if (first == 0) return wpe;
  const std::int64_t C = wpe.shape[1];
  return Tensor(static_cast<char*>(wpe.data) + static_cast<std::size_t>(first * C) * dtype_size(wpe.dtype), wpe.dtype, Shape{wpe.shape[0] - first, C},
                wpe.device);
}

}  // namespace

std::vector<ParamSpec> Gpt2Embedding::params() const {
  const std::int64_t C = cfg_.n_embd;
  return {
      piece_spec({"wte.weight", Shape{cfg_.padded_vocab_size, C}, ParamInit::normal(0.02f, cfg_.vocab_size), true, {}, ParamSplit::vocabulary()},
                 tp_),                                                                            // (Vp, C); a rank: (its rows, C)
      {"wpe.weight", Shape{cfg_.n_positions, C}, ParamInit::normal(0.02f), true, {}},  // (maxT, C)
  };
}

ActivationSpec Gpt2Embedding::output(const LayerDims& d) const { return {"x", tp_.residual_shape(d.B, d.T, cfg_.n_embd), d.dtype}; }

std::vector<ActivationSpec> Gpt2Embedding::saved_activations(const LayerDims&) const { return {}; }

std::vector<ActivationSpec> Gpt2Embedding::scratch(const LayerDims& d) const {
  const bool cut = tp_.shards_residual(d.B * d.T);
  return {
      // (B, T, C) gradient before the dropout; cut: of every token (this rank's rows are dropped in place)
      {"dx_dropped", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"encoder_buckets", Shape{static_cast<std::int64_t>(encoder_backward_scratch_elems(d.B, d.T, cfg_.padded_vocab_size))}, DType::int32},
      // tensor-parallel ranks but 0: the zero position table of their lookup
      {"zero_positions", Shape{tp_.rank > 0 ? d.T : 0, cfg_.n_embd}, d.dtype},
      // Megatron's sequence parallelism: every token's partial sum before the reduce-scatter
      {"x_whole", Shape{d.B, cut ? d.T : 0, cfg_.n_embd}, d.dtype},
  };
}

void Gpt2Embedding::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, 2);
  expect_count(name(), "scratch", a.scratch, 4);
  const Tensor& tokens = a.batch.tokens;
  // wte has Vp rows, so the kernel accepts ids up to Vp; ids in [V, Vp) are data errors.
  check_token_ids(tokens, cfg_.vocab_size, "layer 'embedding'");
  if (tokens.shape.rank == 2 && tokens.shape[1] * sp_.ranks > cfg_.n_positions) {
    fail("layer 'embedding': sequence length T = {} exceeds n_positions = {}; use T <= {} or a model with more positions", tokens.shape[1] * sp_.ranks,
         cfg_.n_positions, cfg_.n_positions);
  }
  const std::int64_t first_position = sp_.rank * a.dims.T;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  if (tp_.active()) {
    Tensor positions = positions_from(a.params[1], first_position);
    if (tp_.rank > 0) {
      positions = a.scratch[2];
      zero_tensor(positions);
    }
    const layer_args::VocabPiece piece = layer_args::vocab_piece(cfg_.padded_vocab_size, cfg_.vocab_size, tp_);
    const Tensor x = rs.whole(a.scratch[3], a.output, Shape{a.dims.B, a.dims.T, cfg_.n_embd});
    encoder_forward(x, tokens, a.params[0], positions, VocabShard{piece.first, cfg_.padded_vocab_size});
    rs.reduce(x, a.output);
  } else {
    encoder_forward(a.output, tokens, a.params[0], positions_from(a.params[1], first_position));
  }
  const DropoutParams drop = layer_args::parallel_dropout(cfg_.embd_pdrop, a.rng, 0, a.train, layer_args::residual_stream(tp_, sp_, rs));
  if (drop.p > 0.0f) dropout_forward(a.output, a.output, drop);
}

void Gpt2Embedding::backward(const BackwardArgs& a) {
  expect_count(name(), "grads", a.grads, 2);
  expect_count(name(), "scratch", a.scratch, 4);
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const DropoutParams drop = layer_args::parallel_dropout(cfg_.embd_pdrop, a.rng, 0, a.train, layer_args::residual_stream(tp_, sp_, rs));
  Tensor dx = a.dout;
  if (rs.sharded) {
    // This rank's rows through the dropout — in place, as the forward's dropout_forward with the
    // same key draws the same mask (dout is dead after) — then every token's.
    if (drop.p > 0.0f) dropout_forward(a.dout, a.dout, drop);
    dx = a.scratch[0];
    rs.gather(a.dout, dx);
  } else if (drop.p > 0.0f) {
    dx = a.scratch[0];
    zero_tensor(dx);
    dropout_backward(dx, a.dout, drop);
  }
  VocabShard shard;
  if (tp_.active()) shard = {layer_args::vocab_piece(cfg_.padded_vocab_size, cfg_.vocab_size, tp_).first, cfg_.padded_vocab_size};
  encoder_backward(a.grads[0], positions_from(a.grads[1], sp_.rank * a.dims.T), dx, a.batch.tokens, a.scratch[1], shard);
}

}  // namespace dstrain
