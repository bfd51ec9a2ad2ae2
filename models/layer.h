// Layer: the unit the engine's step loop runs, in both directions (docs/design.md "The step, as data
// flows"). A model is an ordered list of layers; the GPT-2 one is Embedding, n_layer Blocks, Head.
//
// A layer owns NO memory. It declares
//   - its parameters (ParamSpec: name, shape, init, weight decay, a tie to another layer's
//     parameter, and how tensor / expert parallelism may split it),
//   - the activations it saves between forward and backward, its output, and its scratch, each as
//     a (name, shape, dtype) for a given (B, T, storage dtype),
// and the engine allocates all of it up front and passes views on every call. Because nothing is
// bound to a layer, these need no change to this interface:
//   - ZeRO-3: the engine gathers a layer's parameters into any buffer right before the call and
//     passes views of it; they may sit at a different address on every call.
//   - Activation checkpointing: the engine keeps only the layer's input, lets checkpointed layers
//     share one `saved` area, and calls forward again (same args, same RNG key) right before
//     backward; forward is a pure function of (input, params, batch, rng), so it regenerates the
//     saved activations (and the dropout masks) bit for bit.
//   - 16-bit storage: the layer sees only storage-dtype params and grads (fp32, fp16 or bf16); the
//     fp32 master copy and the optimizer live elsewhere.
//   - User-defined layers: subclass Layer; the engine treats every layer the same way.
//
// Conventions (as the kernels, ops/kernels/*.h): activations are written (=), parameter gradients
// accumulate (+=) so that they sum over micro-batches. The gradient w.r.t. the layer's input is an
// activation of the backward pass: it is WRITTEN, and every layer must accept it being the same
// memory as the gradient w.r.t. the output (the residual stream's gradient then flows through all
// blocks in one buffer, as in llm.c) as well as a separate buffer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/param_split.h"
#include "ops/dtype.h"
#include "ops/kernels/philox.h"
#include "ops/tensor.h"

namespace dstrain {

// How a parameter starts (GPT-2: normal(0, 0.02), zeros for biases, ones for norm weights).
struct ParamInit {
  enum class Kind { normal, zeros, ones };
  Kind kind = Kind::zeros;
  float std = 0.0f;        // normal: the standard deviation (mean is always 0)
  std::int64_t rows = -1;  // normal: draw only the first `rows` rows, the rest are zero (the
                           // padded vocabulary rows of wte); -1 = all rows

  static ParamInit normal(float std, std::int64_t rows = -1) { return {Kind::normal, std, rows}; }
  static ParamInit zeros() { return {Kind::zeros, 0.0f, -1}; }
  static ParamInit ones() { return {Kind::ones, 0.0f, -1}; }
};

class TensorParallelGroup;    // models/tensor_parallel.h
class SequenceParallelGroup;  // models/sequence_parallel.h
class ExpertParallelGroup;    // models/expert_parallel.h
class MoeStats;               // models/moe_stats.h

// Under tensor or expert parallelism a layer holds a piece of some of its parameters: rank `rank`
// of `ranks` holds the ranges models/param_split.h gives it of the parameter of shape `whole` (a
// tensor-parallel rank for rows / columns / vocabulary splits, an expert-parallel rank for the
// experts split: models/expert_parallel.h).
struct ParamPiece {
  Shape whole;
  int rank = 0;
  int ranks = 1;
};

// One parameter of a layer.
struct ParamSpec {
  std::string name;  // Hugging Face GPT-2 name relative to the model: "wte.weight",
                     // "h.3.attn.c_attn.weight", "ln_f.bias"; unique within the model
  Shape shape;       // our layout: linear weights are nn.Linear (out, in)
  ParamInit init;
  bool weight_decay = true;  // GPT recipes: decay matrices (and embeddings), not biases or norm weights
  // Non-empty: this parameter IS the named parameter of an earlier layer (the LM head's weight is
  // "wte.weight"). It has no storage, init, optimizer state or count of its own; the engine passes
  // the owner's param view here and the owner's grad view as its gradient, so the tied use
  // accumulates (+=) into the same gradient. The shapes must match. Under ZeRO-3 the engine gathers
  // the owner's parameter for this layer too.
  std::string tied_to;
  // How tensor or expert parallelism may cut it (models/param_split.h): replicated by default. A
  // tied parameter is cut as its owner is.
  ParamSplit split;
  // The family's Hugging Face checkpoints hold this matrix transposed, as (in, out): GPT-2's Conv1D
  // weights. Its import and export transpose it; rules that read a matrix's shape as the model's
  // authors wrote it (Muon's scale) swap the two dimensions.
  bool hf_transposed = false;
  // Tensor or expert parallelism: `shape` is this rank's piece of the parameter
  // (models/tensor_parallel.h's piece_spec, models/expert_parallel.h's expert_piece_spec set it);
  // ranks == 1 (the default): the spec is the whole parameter.
  ParamPiece piece{};

  bool tied() const { return !tied_to.empty(); }
  // True when this spec is a rank's piece of a parameter cut across tensor-parallel ranks.
  bool is_piece() const { return piece.ranks > 1 && !split.is_replicated(); }
  // The whole parameter's shape (= shape unless is_piece()).
  Shape whole_shape() const { return is_piece() ? piece.whole : shape; }
};

// A tensor the engine allocates for a layer: saved activations, the output, scratch.
struct ActivationSpec {
  std::string name;  // for memory tables and error messages, e.g. "qkv", "ln1_mean"
  Shape shape;
  DType dtype;

  std::size_t nbytes() const { return static_cast<std::size_t>(shape.numel()) * dtype_size(dtype); }
};

// The sizes every allocation depends on: micro-batch B, sequence length T, and the storage dtype
// of params and activations (fp32 / fp16 / bf16; statistics such as LayerNorm mean/rstd are fp32).
struct LayerDims {
  std::int64_t B = 0;
  std::int64_t T = 0;
  DType dtype = DType::fp32;
};

// What a micro-batch brings: token ids and next-token targets.
struct Batch {
  Tensor tokens;   // (B, T) int32, each in [0, vocab_size)
  Tensor targets;  // (B, T) int32, each in [0, vocab_size) or -1 (ignored: no loss, no gradient)
  // How many targets are not -1 (the loss is their mean); -1: not counted yet, and the loss layer
  // counts them, reading device targets back to the host. The engine counts a host batch before
  // uploading it, so a step on a GPU reads nothing back for this.
  std::int64_t target_count = -1;
};

// batch.target_count, or the count of its targets that are not -1 (copied to the host when they
// live on a device).
std::int64_t count_targets(const Batch& batch);

// Error naming `who`, the id and its position when an int32 token id in host memory is outside
// [0, vocab_size): a padded embedding table (Vp > V rows) would accept ids in [V, Vp) silently.
// Nothing to check for tokens on a device (their kernel checks against the table).
void check_token_ids(const Tensor& tokens, std::int64_t vocab_size, std::string_view who);

// Dropout call sites per layer: the engine sets `rng.layer` to the layer's index in the model and
// `rng.site` to 0; a layer tells its dropout call sites apart with sites 0 .. kRngSitesPerLayer-1.
inline constexpr std::uint32_t kRngSitesPerLayer = 4;

struct ForwardArgs {
  LayerDims dims;
  Batch batch;                      // every layer may read it (the embedding the tokens, the head the targets)
  Tensor input;                     // the previous layer's output (empty for the first layer)
  Tensor output;                    // this layer's output(dims), written
  std::span<const Tensor> params;   // in params() order, tied ones included (views of the owner)
  std::span<const Tensor> saved;    // in saved_activations(dims) order, written
  std::span<const Tensor> scratch;  // in scratch(dims) order; contents undefined on entry and exit
  // Dropout keys: seed, step, micro_batch of this micro-step; layer = index of this layer in the
  // model; site 0 (the layer adds its call site). A recompute passes the same key.
  RngKey rng;
  bool train = true;      // false: dropout off (evaluation)
  float* loss = nullptr;  // a layer that computes the loss (the head) stores the mean here
  // Training, for a layer whose fuses_loss_grad() is true: compute the loss's gradient in the same
  // pass as the loss (dloss as BackwardArgs will carry it; the GPU then reads the logits once
  // instead of three times); its backward gets BackwardArgs::loss_grad_done = true.
  bool fuse_loss_grad = false;
  float dloss = 1.0f;  // with fuse_loss_grad: BackwardArgs::dloss of this micro-batch
  // The layer's tensor-parallel group (models/tensor_parallel.h), for layers built as one rank's
  // piece (tensor_parallel.autotp_size > 1); nullptr otherwise.
  TensorParallelGroup* tensor_parallel = nullptr;
  // The layer's sequence-parallel group (models/sequence_parallel.h), for layers built for one
  // rank's share of the sequence (sequence_parallel_size > 1); nullptr otherwise.
  SequenceParallelGroup* sequence_parallel = nullptr;
  // The layer's expert-parallel group (models/expert_parallel.h), for sparse layers built for one
  // rank's experts (expert_parallel.autoep_size > 1); nullptr otherwise.
  ExpertParallelGroup* expert_parallel = nullptr;
  // Mixture-of-experts layers record their routing here (the load-balancing loss couples every
  // sparse layer of the model, models/moe_stats.h); nullptr: nothing is recorded (no aux loss).
  MoeStats* moe = nullptr;
};

struct BackwardArgs {
  LayerDims dims;
  Batch batch;
  Tensor input;                    // the forward's input (kept, or recomputed, by the engine)
  Tensor output;                   // the forward's output
  Tensor dout;                     // d(loss)/d(output) (empty for a layer that ends in the loss)
  Tensor dinput;                   // d(loss)/d(input), WRITTEN; may be the same memory as dout; empty
                                   // for the first layer (nothing below it)
  std::span<const Tensor> params;  // as in forward
  std::span<const Tensor> grads;   // in params() order, ACCUMULATED (+=); a tied entry is the owner's grad
  std::span<const Tensor> saved;   // as the forward left them; backward may overwrite them (dead after it)
  std::span<const Tensor> scratch;
  RngKey rng;         // the forward's key (dropout masks are regenerated, never stored)
  bool train = true;  // as in forward
  // For a layer that ends in the loss: d(objective)/d(mean loss of this micro-batch), e.g. 1, or
  // loss_scale / gradient_accumulation_steps under fp16 loss scaling with accumulation.
  float dloss = 1.0f;
  bool loss_grad_done = false;  // the forward ran with fuse_loss_grad (the same dloss)
  TensorParallelGroup* tensor_parallel = nullptr;      // as in forward
  SequenceParallelGroup* sequence_parallel = nullptr;  // as in forward
  ExpertParallelGroup* expert_parallel = nullptr;      // as in forward
  // The statistics every sparse layer's forward recorded for this micro-batch (the load-balancing
  // loss's gradient needs all of them); nullptr: no aux loss term.
  const MoeStats* moe = nullptr;
};

class Layer {
 public:
  virtual ~Layer() = default;
  Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // A short name for tables and errors: "embedding", "h.3", "head".
  virtual std::string name() const = 0;
  // The layer's class as its family's Hugging Face model names it ("GPT2Block",
  // "LlamaDecoderLayer"): what a pipeline's partition method "type:<regex>" matches, as
  // DeepSpeed's PipelineModule matches layer class names (models/stage_partition.h).
  virtual std::string type_name() const { return "Layer"; }

  virtual std::vector<ParamSpec> params() const = 0;

  // This layer's output: the next layer's input. GPT-2: (B, T, C) in the storage dtype; the head's
  // is the per-position losses (B, T) fp32.
  virtual ActivationSpec output(const LayerDims& dims) const = 0;

  // Activations written by forward and read by backward (dropped and recomputed under
  // activation checkpointing).
  virtual std::vector<ActivationSpec> saved_activations(const LayerDims& dims) const = 0;

  // Temporary tensors of forward and backward (the same list serves both). Needed only during one
  // call, so the engine can give every layer the same scratch arena.
  virtual std::vector<ActivationSpec> scratch(const LayerDims& dims) const = 0;

  // Reads input/params/batch, writes output and saved. Deterministic for a given rng key.
  virtual void forward(const ForwardArgs& args) = 0;

  // Writes dinput, accumulates grads (+=).
  virtual void backward(const BackwardArgs& args) = 0;
  // A loss layer that can compute its loss gradient during a training forward
  // (ForwardArgs::fuse_loss_grad). False by default: the engine then leaves it to backward.
  virtual bool fuses_loss_grad() const { return false; }
};

}  // namespace dstrain
