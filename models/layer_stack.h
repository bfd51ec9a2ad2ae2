// LayerStack: a model's layer list with its own memory, for standalone use and tests (Gpt2Model,
// LlamaModel).
//
// The engine drives the layers itself (ZeRO, checkpointing, offload); this class is the plainest
// driver of the same Layer interface: one flat buffer of parameters and one of gradients (owned
// parameters in layer order, each view 64-byte aligned), the outputs and saved activations of
// every layer, one residual-gradient buffer shared by all layers (backward runs in place through
// the blocks), and one scratch arena sized for the largest layer. Everything is allocated in the
// constructor; forward and backward allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "ops/allocator.h"
#include "ops/buffer.h"
#include "models/layer.h"
#include "models/moe_stats.h"

namespace dstrain {

struct StepOptions {
  bool train = true;       // dropout on (when the config's p > 0)
  std::uint64_t seed = 0;  // dropout stream: (seed, step, layer site, micro_batch)
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
};

class LayerStack {
 public:
  // One owned parameter: its spec and the views of its value and gradient in the flat buffers.
  struct Param {
    ParamSpec spec;
    Tensor value;
    Tensor grad;
  };

  // Allocates params, grads (storage dtype `dtype`) and activations for micro-batches of B x T
  // from `allocator`; parameters and gradients start at zero. n_embd: the width of the residual
  // stream between layers. `who` names the model in errors.
  LayerStack(std::vector<std::unique_ptr<Layer>> layers, std::int64_t n_embd, DType dtype, std::int64_t B, std::int64_t T, Allocator& allocator,
             std::string_view who);
  virtual ~LayerStack() = default;
  LayerStack(const LayerStack&) = delete;
  LayerStack& operator=(const LayerStack&) = delete;

  LayerDims dims() const { return dims_; }
  std::span<const std::unique_ptr<Layer>> layers() const { return layers_; }

  // Owned parameters (tied ones excluded), in layer order.
  const std::vector<Param>& params() const { return params_; }
  // The parameter / gradient with this name (a tied name resolves to its owner). Error if unknown.
  Tensor param(std::string_view name) const;
  Tensor grad(std::string_view name) const;
  Tensor flat_params() const { return flat_params_; }  // every owned element, alignment gaps included (zero)
  Tensor flat_grads() const { return flat_grads_; }

  // Layer i's saved activations (in saved_activations() order) as the last forward left them,
  // e.g. the head's logits after an evaluation forward.
  std::span<const Tensor> saved(std::size_t layer) const { return mem_.at(layer).saved; }

  // The init each ParamSpec declares, for every owned parameter (param_init.h).
  void init_params(std::uint64_t seed);
  void zero_grad();

  // tokens, targets: (B, T) int32 of the constructor's B and T. Returns the mean loss over the
  // non-ignored targets (plus a mixture of experts' weighted load-balancing loss, when its config
  // asks for it).
  float forward(Tensor tokens, Tensor targets, const StepOptions& options = {});
  // The last forward's load-balancing loss, unweighted (0 without sparse layers).
  double last_aux_loss() const { return last_aux_loss_; }
  // After forward (same batch, same options): accumulates d(dloss * mean loss)/d(params) into the
  // gradients (+=).
  void backward(float dloss = 1.0f);

 private:
  struct LayerMemory {
    std::vector<Tensor> params, grads, saved, scratch;
    Tensor output;
  };
  const Param& find(std::string_view name) const;

  std::string who_;
  LayerDims dims_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Param> params_;
  std::vector<std::pair<std::string, std::string>> tied_;  // (tied name, owner name)
  std::vector<LayerMemory> mem_;
  Buffer param_buf_, grad_buf_, act_buf_, scratch_buf_;
  Tensor flat_params_, flat_grads_;
  Tensor dresidual_;  // (B, T, n_embd): the residual stream's gradient, in place through the blocks
  Batch batch_;
  StepOptions last_options_;
  bool have_forward_ = false;
  MoeStats moe_;
  double last_aux_loss_ = 0.0;  // mixture of experts: the sparse layers' routing of the last forward
};

}  // namespace dstrain
