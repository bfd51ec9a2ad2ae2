#include "models/layer_stack.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "ops/error.h"
#include "models/activation_layout.h"
#include "models/param_init.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

constexpr std::size_t kAlignBytes = kActivationAlignBytes;
constexpr auto pack = pack_activation_specs;

std::vector<Tensor> views(const Buffer& buf, const std::vector<ActivationSpec>& specs, const std::vector<std::size_t>& offsets) {
  std::vector<Tensor> out;
  out.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) out.push_back(buf.tensor(specs[i].dtype, specs[i].shape, offsets[i]));
  return out;
}

}  // namespace

LayerStack::LayerStack(std::vector<std::unique_ptr<Layer>> layers, std::int64_t n_embd, DType dtype, std::int64_t B, std::int64_t T,
                       Allocator& allocator, std::string_view who)
    : who_(who), dims_{B, T, dtype}, layers_(std::move(layers)) {
  if (!is_floating(dtype)) fail("{}: storage dtype {} is not fp32, fp16 or bf16", who_, dtype_name(dtype));
  if (B <= 0 || T <= 0) fail("{}: micro-batch B = {}, T = {} must be positive", who_, B, T);
  const std::size_t esize = dtype_size(dtype);

  // ---- parameters and gradients: owned params packed in layer order, each 64-byte aligned ----
  std::vector<std::vector<ParamSpec>> specs;
  std::vector<std::size_t> param_offsets;
  std::unordered_map<std::string, std::size_t> owner;  // name -> index in params_
  std::size_t pbytes = 0;
  for (const auto& layer : layers_) {
    specs.push_back(layer->params());
    for (const ParamSpec& ps : specs.back()) {
      if (ps.tied()) {
        tied_.emplace_back(ps.name, ps.tied_to);
        continue;
      }
      if (owner.count(ps.name) != 0) fail("{}: parameter name '{}' is declared twice", who_, ps.name);
      pbytes = align_up(pbytes, kAlignBytes);
      param_offsets.push_back(pbytes);
      owner.emplace(ps.name, params_.size());
      params_.push_back(Param{ps, Tensor{}, Tensor{}});
      pbytes += static_cast<std::size_t>(ps.shape.numel()) * esize;
    }
  }
  pbytes = align_up(pbytes, kAlignBytes);
  param_buf_ = Buffer(allocator, pbytes, MemoryPurpose::params);
  grad_buf_ = Buffer(allocator, pbytes, MemoryPurpose::grads);
  flat_params_ = param_buf_.tensor(dtype, Shape{static_cast<std::int64_t>(pbytes / esize)});
  flat_grads_ = grad_buf_.tensor(dtype, Shape{static_cast<std::int64_t>(pbytes / esize)});
  zero_tensor(flat_params_);
  zero_tensor(flat_grads_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i].value = param_buf_.tensor(dtype, params_[i].spec.shape, param_offsets[i]);
    params_[i].grad = grad_buf_.tensor(dtype, params_[i].spec.shape, param_offsets[i]);
  }

  // ---- per layer: param/grad views (tied -> the owner's), output and saved activations ----
  mem_.resize(layers_.size());
  std::vector<std::vector<ActivationSpec>> act_specs(layers_.size());
  std::vector<std::vector<std::size_t>> act_offsets(layers_.size());
  std::size_t abytes = 0, sbytes = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    for (const ParamSpec& ps : specs[i]) {
      const std::string& key = ps.tied() ? ps.tied_to : ps.name;
      const auto it = owner.find(key);
      if (it == owner.end()) fail("{}: '{}' of layer '{}' is tied to '{}', which no earlier layer owns", who_, ps.name, layers_[i]->name(), key);
      const Param& o = params_[it->second];
      if (!(o.spec.shape == ps.shape)) {
        fail("{}: '{}' {} is tied to '{}' of another shape {}", who_, ps.name, ps.shape.str(), key, o.spec.shape.str());
      }
      mem_[i].params.push_back(o.value);
      mem_[i].grads.push_back(o.grad);
    }
    act_specs[i].push_back(layers_[i]->output(dims_));
    for (auto& s : layers_[i]->saved_activations(dims_)) act_specs[i].push_back(std::move(s));
    abytes = pack(act_specs[i], abytes, act_offsets[i]);
    std::vector<std::size_t> scratch_offsets;
    sbytes = std::max(sbytes, pack(layers_[i]->scratch(dims_), 0, scratch_offsets));
  }
  const ActivationSpec dres{"dresidual", Shape{B, T, n_embd}, dtype};
  abytes = align_up(abytes, kAlignBytes);
  const std::size_t dres_offset = abytes;
  abytes += dres.nbytes();
  act_buf_ = Buffer(allocator, abytes, MemoryPurpose::activations);
  scratch_buf_ = Buffer(allocator, std::max<std::size_t>(sbytes, kAlignBytes), MemoryPurpose::buffers);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::vector<Tensor> v = views(act_buf_, act_specs[i], act_offsets[i]);
    mem_[i].output = v.front();
    mem_[i].saved.assign(v.begin() + 1, v.end());
    const auto sc = layers_[i]->scratch(dims_);
    std::vector<std::size_t> scratch_offsets;
    pack(sc, 0, scratch_offsets);
    mem_[i].scratch = views(scratch_buf_, sc, scratch_offsets);
  }
  dresidual_ = act_buf_.tensor(dtype, dres.shape, dres_offset);
}

const LayerStack::Param& LayerStack::find(std::string_view name) const {
  std::string_view key = name;
  for (const auto& [tied, owner] : tied_)
    if (tied == name) key = owner;
  for (const Param& p : params_)
    if (p.spec.name == key) return p;
  fail("{}: no parameter named '{}'; the names are the layers' ParamSpec names (e.g. '{}')", who_, name,
       params_.empty() ? std::string() : params_.front().spec.name);
}

Tensor LayerStack::param(std::string_view name) const { return find(name).value; }
Tensor LayerStack::grad(std::string_view name) const { return find(name).grad; }

void LayerStack::init_params(std::uint64_t seed) {
  for (const Param& p : params_) init_param(p.value, p.spec, seed);
}

void LayerStack::zero_grad() { zero_tensor(flat_grads_); }

float LayerStack::forward(Tensor tokens, Tensor targets, const StepOptions& options) {
  const Shape bt{dims_.B, dims_.T};
  for (const auto& [what, t] : {std::pair<const char*, const Tensor&>{"tokens", tokens}, {"targets", targets}}) {
    if (t.dtype != DType::int32 || !(t.shape == bt)) {
      fail("{}::forward: {} is {} but int32{} (the model's B x T) is expected", who_, what, t.str(), bt.str());
    }
  }
  batch_ = Batch{tokens, targets};
  last_options_ = options;
  float loss = 0.0f;
  moe_.begin(options.train);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    ForwardArgs a;
    a.dims = dims_;
    a.batch = batch_;
    a.input = i == 0 ? Tensor{} : mem_[i - 1].output;
    a.output = mem_[i].output;
    a.params = mem_[i].params;
    a.saved = mem_[i].saved;
    a.scratch = mem_[i].scratch;
    a.rng = RngKey{options.seed, options.step, static_cast<std::uint32_t>(i), options.micro_batch};
    a.train = options.train;
    a.loss = &loss;
    a.moe = &moe_;
    layers_[i]->forward(a);
  }
  have_forward_ = true;
  last_aux_loss_ = moe_.aux_loss();
  // Mixture of experts: the load-balancing loss × its weight (models/moe_stats.h)
  return loss + static_cast<float>(moe_.aux_weight() * last_aux_loss_);
}

void LayerStack::backward(float dloss) {
  if (!have_forward_) fail("{}::backward: call forward first (backward reads the activations it saved)", who_);
  have_forward_ = false;  // the head turns its logits into dlogits in place
  const std::size_t last = layers_.size() - 1;
  for (std::size_t k = 0; k <= last; ++k) {
    const std::size_t i = last - k;
    BackwardArgs a;
    a.dims = dims_;
    a.batch = batch_;
    a.input = i == 0 ? Tensor{} : mem_[i - 1].output;
    a.output = mem_[i].output;
    a.dout = i == last ? Tensor{} : dresidual_;
    a.dinput = i == 0 ? Tensor{} : dresidual_;
    a.params = mem_[i].params;
    a.grads = mem_[i].grads;
    a.saved = mem_[i].saved;
    a.scratch = mem_[i].scratch;
    a.rng = RngKey{last_options_.seed, last_options_.step, static_cast<std::uint32_t>(i), last_options_.micro_batch};
    a.train = last_options_.train;
    a.dloss = dloss;
    a.moe = &moe_;
    layers_[i]->backward(a);
  }
}

}  // namespace dstrain
