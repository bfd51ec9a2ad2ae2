// The Layer interface as the engine will drive it, without Gpt2Model: memory from the test,
// activation checkpointing (every layer's saved activations share ONE area and are recomputed by
// calling forward again right before backward), dinput in a different buffer than dout, scratch
// full of garbage on entry, parameters passed as views that move between calls (as ZeRO-3
// gathers would). The gradients must be bit-identical to Gpt2Model's plain run, dropout on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "model_test_util.h"
#include "ops/buffer.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_model.h"

namespace dstrain {
namespace {

struct Arena {
  std::vector<Buffer> buffers;
  std::vector<Tensor> tensors;
};

Arena allocate(const std::vector<ActivationSpec>& specs) {
  Arena a;
  for (const auto& s : specs) {
    a.buffers.emplace_back(cpu_allocator(), std::max<std::size_t>(s.nbytes(), 64), MemoryPurpose::activations);
    a.tensors.push_back(a.buffers.back().tensor(s.dtype, s.shape));
  }
  return a;
}

// 0xff bytes: NaN in every float format; a layer that reads scratch before writing it fails.
void poison(const Arena& a) {
  for (const auto& t : a.tensors) std::memset(t.data, 0xff, t.nbytes());
}

TEST(LayerInterface, CheckpointedRecomputeWithSeparateBuffersMatchesTheModel) {
  Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  cfg.embd_pdrop = cfg.resid_pdrop = cfg.attn_pdrop = 0.1f;
  const LayerDims dims{2, 8, DType::fp32};
  Gpt2Model ref(cfg, DType::fp32, 2, 8);
  test::fill_test_params(ref, 21);
  auto b = test::random_batch(2, 8, 61, 22);
  const Gpt2StepOptions opt{true, 77, 5, 3};
  ref.zero_grad();
  const float ref_loss = ref.forward(b.tokens_tensor(), b.targets_tensor(), opt);
  ref.backward();

  // The "engine": its own parameter copies, re-copied to a fresh place before every call.
  const auto layers = make_gpt2_layers(cfg);
  std::unordered_map<std::string, std::pair<Buffer, Buffer>> store;  // name -> (value, grad)
  for (const auto& layer : layers)
    for (const auto& ps : layer->params()) {
      if (ps.tied()) continue;
      const std::size_t bytes = static_cast<std::size_t>(ps.shape.numel()) * 4;
      Buffer v(cpu_allocator(), bytes, MemoryPurpose::params), g(cpu_allocator(), bytes, MemoryPurpose::grads);
      std::memcpy(v.data(), ref.param(ps.name).data, bytes);
      std::memset(g.data(), 0, bytes);
      store.emplace(ps.name, std::make_pair(std::move(v), std::move(g)));
    }
  auto views = [&](const Layer& layer, bool grads) {
    std::vector<Tensor> out;
    for (const auto& ps : layer.params()) {
      const auto& [v, g] = store.at(ps.tied() ? ps.tied_to : ps.name);
      out.push_back((grads ? g : v).tensor(DType::fp32, ps.shape));
    }
    return out;
  };
  // "Gathered" parameters: a fresh copy at a new address for every call.
  auto gather = [&](const Layer& layer, std::vector<Buffer>& holder) {
    std::vector<Tensor> out;
    for (const Tensor& t : views(layer, false)) {
      holder.emplace_back(cpu_allocator(), t.nbytes(), MemoryPurpose::params);
      std::memcpy(holder.back().data(), t.data, t.nbytes());
      out.push_back(holder.back().tensor(t.dtype, t.shape));
    }
    return out;
  };

  // One saved area for every layer (its largest need), one scratch arena.
  std::vector<ActivationSpec> saved_max, scratch_max;
  std::size_t saved_bytes = 0, scratch_bytes = 0;
  for (const auto& layer : layers) {
    std::size_t s = 0, c = 0;
    for (const auto& a : layer->saved_activations(dims)) s += a.nbytes() + 64;
    for (const auto& a : layer->scratch(dims)) c += a.nbytes() + 64;
    saved_bytes = std::max(saved_bytes, s);
    scratch_bytes = std::max(scratch_bytes, c);
  }
  Buffer saved_area(cpu_allocator(), saved_bytes, MemoryPurpose::activations);
  Buffer scratch_area(cpu_allocator(), scratch_bytes, MemoryPurpose::buffers);
  auto carve = [](const Buffer& buf, const std::vector<ActivationSpec>& specs) {
    std::vector<Tensor> out;
    std::size_t off = 0;
    for (const auto& s : specs) {
      off = (off + 63) / 64 * 64;
      out.push_back(buf.tensor(s.dtype, s.shape, off));
      off += s.nbytes();
    }
    return out;
  };
  auto scratch_for = [&](const Layer& layer) {
    std::memset(scratch_area.data(), 0xff, scratch_area.bytes());
    return carve(scratch_area, layer.scratch(dims));
  };

  std::vector<Arena> outputs;
  for (const auto& layer : layers) outputs.push_back(allocate({layer->output(dims)}));
  const Batch batch{b.tokens_tensor(), b.targets_tensor()};
  auto fwd_args = [&](std::size_t i, std::span<const Tensor> params, std::span<const Tensor> saved, std::span<const Tensor> scratch, float* loss) {
    ForwardArgs a;
    a.dims = dims;
    a.batch = batch;
    a.input = i == 0 ? Tensor{} : outputs[i - 1].tensors[0];
    a.output = outputs[i].tensors[0];
    a.params = params;
    a.saved = saved;
    a.scratch = scratch;
    a.rng = RngKey{opt.seed, opt.step, static_cast<std::uint32_t>(i), opt.micro_batch};
    a.train = true;
    a.loss = loss;
    return a;
  };

  float loss = 0.0f;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::vector<Buffer> holder;
    const auto params = gather(*layers[i], holder);
    const auto saved = carve(saved_area, layers[i]->saved_activations(dims));
    const auto scratch = scratch_for(*layers[i]);
    layers[i]->forward(fwd_args(i, params, saved, scratch, &loss));
    std::memset(saved_area.data(), 0xff, saved_area.bytes());  // checkpointing: dropped
  }
  EXPECT_EQ(loss, ref_loss);

  // Backward: recompute each layer's forward into the shared area, then its backward; the
  // gradient w.r.t. the input goes to the other of two ping-pong buffers.
  Arena d0 = allocate({layers[1]->output(dims)}), d1 = allocate({layers[1]->output(dims)});
  poison(d0);
  poison(d1);
  Tensor dout;  // empty for the head
  for (std::size_t k = 0; k < layers.size(); ++k) {
    const std::size_t i = layers.size() - 1 - k;
    std::vector<Buffer> holder;
    const auto params = gather(*layers[i], holder);
    const auto grads = views(*layers[i], true);
    const auto saved = carve(saved_area, layers[i]->saved_activations(dims));
    float unused = 0.0f;
    layers[i]->forward(fwd_args(i, params, saved, scratch_for(*layers[i]), &unused));
    const Tensor dinput = i == 0 ? Tensor{} : (k % 2 == 0 ? d0.tensors[0] : d1.tensors[0]);
    BackwardArgs a;
    a.dims = dims;
    a.batch = batch;
    a.input = i == 0 ? Tensor{} : outputs[i - 1].tensors[0];
    a.output = outputs[i].tensors[0];
    a.dout = dout;
    a.dinput = dinput;
    a.params = params;
    a.grads = grads;
    a.saved = saved;
    const auto scratch = scratch_for(*layers[i]);
    a.scratch = scratch;
    a.rng = RngKey{opt.seed, opt.step, static_cast<std::uint32_t>(i), opt.micro_batch};
    a.train = true;
    layers[i]->backward(a);
    if (!dout.empty()) std::memset(dout.data, 0xff, dout.nbytes());  // consumed
    dout = dinput;
  }

  for (const auto& p : ref.params()) {
    const Buffer& g = store.at(p.spec.name).second;
    EXPECT_EQ(std::memcmp(g.data(), p.grad.data, p.grad.nbytes()), 0) << p.spec.name;
  }
}

}  // namespace
}  // namespace dstrain
