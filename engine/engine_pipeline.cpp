// The engine's pipeline stage (EngineOptions::pipeline, docs/parallelism.md §7): the activation
// sets of the micro-batches in flight, a chunk's forward and backward on one micro-batch, and the
// step's cross-stage parts (the shared parameters' gradient sum). The schedule that calls these
// — which micro-batch when, and the activations and gradients sent between stages — is
// engine/pipeline_engine.h's.
//
// A mixture of experts' load-balancing loss pools the router statistics of every sparse layer of
// the model (models/moe_stats.h), which the stages hold apart. So a micro-batch's statistics travel
// with it, per micro-batch in flight: chunk c's forward of m starts from the running statistics the
// previous virtual stage sent with the activation (zeros on the first), adds its layers' and sends
// them on with its output; the chunk holding the loss then has the whole model's, computes the aux
// loss (summed over the sequence-parallel group there, once) and keeps them for m's backward, and
// they go back with the gradients, so that every stage's router backward uses the whole model's
// counts — the same numbers, summed in the same layer order, as one rank's.
#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tensor_parallel.h"
#include "models/activation_layout.h"
#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/log.h"

namespace dstrain {
namespace {

// Reserves `spec` at the end of a layout being packed; returns its offset.
std::size_t reserve(std::size_t& bytes, const ActivationSpec& spec) {
  std::vector<std::size_t> off;
  bytes = pack_activation_specs({spec}, bytes, off);
  return off[0];
}

// A pack of router statistics from its (device) buffer, and into it.
std::vector<double> read_stats(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  copy_tensor(Tensor(v.data(), DType::fp64, t.shape), t);
  return v;
}

void write_stats(const Tensor& t, const std::vector<double>& v) {
  DSTRAIN_CHECK(static_cast<std::int64_t>(v.size()) == t.numel(), "pipeline: {} router statistics for a buffer of {}", v.size(), t.numel());
  copy_tensor(t, Tensor(const_cast<double*>(v.data()), DType::fp64, t.shape));
}

}  // namespace

// Per chunk c, pipeline_slots[c] activation sets of its layers (one per micro-batch in flight),
// the received input of each slot (the chunk holding the model's first layer reads the tokens),
// the received output gradient and the residual stream's gradient, and one scratch arena.
// Activation checkpointing: a chunk's blocks (every layer but the model's first and last) run in
// segments of `interval`; a segment keeps only its input per slot (the previous layer's output),
// its inner outputs and saved activations are shared by the slots and recomputed before its
// backward, so a slot holds chunk inputs and segment boundaries instead of every activation.
void Engine::build_pipeline_activations(const config::DsConfig& config, const EngineOptions& options) {
  Impl& im = *impl_;
  const std::size_t L = model_.layers.size();
  const std::size_t C = model_.chunks.size();
  const std::size_t last_id = model_.whole_layer_count() - 1;
  const DType storage = dims_.dtype;
  if (!options.pipeline_in_flight.empty() && options.pipeline_in_flight.size() != C)
    fail("initialize: pipeline_in_flight has {} entries but this stage runs {} chunk(s)", options.pipeline_in_flight.size(), C);
  im.pipeline_slots.assign(C, 1);
  for (std::size_t c = 0; c < options.pipeline_in_flight.size(); ++c)
    im.pipeline_slots[c] = static_cast<int>(std::clamp<std::int64_t>(options.pipeline_in_flight[c], 1, gas_));
  im.chunk_of_layer.assign(L, 0);
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t i = model_.chunks[c].begin; i < model_.chunks[c].end; ++i) im.chunk_of_layer[i] = static_cast<int>(c);

  const std::int64_t interval = options.pipeline_checkpoint_interval > 0 ? options.pipeline_checkpoint_interval : options.checkpoint_activations ? 1 : 0;
  if (interval > 0 && (config.activation_checkpointing.cpu_checkpointing || config.activation_checkpointing.number_checkpoints)) {
    log_warning(
        "pipeline: activation_checkpointing.cpu_checkpointing and number_checkpoints are not read with pipeline stages; each stage recomputes "
        "its blocks in segments of {} (pipeline.activation_checkpoint_interval), keeping the segments' inputs on the device",
        interval);
  }
  // inner[i]: layer i's activations are shared by the slots (a checkpointed segment's, except the
  // segment's last output, which is the next segment's kept input).
  std::vector<bool> shared_saved(L, false), shared_output(L, false);
  im.segment_first.assign(L, -1);
  if (interval > 0) {
    for (const ModelChunk& ch : model_.chunks) {
      std::size_t i = ch.begin;
      while (i < ch.end) {
        const std::size_t id = model_.layer_id(i);
        if (id == 0 || id == last_id) {
          ++i;
          continue;
        }
        std::size_t j = i;
        while (j + 1 < ch.end && j + 1 - i < static_cast<std::size_t>(interval) && model_.layer_id(j + 1) != last_id) ++j;
        for (std::size_t k = i; k <= j; ++k) {
          shared_saved[k] = true;
          shared_output[k] = k != j;
        }
        im.segment_first[j] = static_cast<std::int64_t>(i);
        i = j + 1;
      }
    }
  }

  // Offsets first, tensors after the one allocation.
  struct Place {
    std::size_t output = 0;
    std::vector<std::size_t> saved;
  };
  std::vector<std::vector<Place>> place(L);  // [layer][slot]
  std::vector<std::vector<std::size_t>> input_off(C), upload_off(C);
  std::vector<ActivationSpec> out_spec(L);
  std::vector<std::vector<ActivationSpec>> saved_spec(L);
  std::size_t bytes = 0, sbytes = 0;
  const Shape residual = model_.residual_shape(dims_);
  const ActivationSpec residual_spec{"pipeline_residual", residual, storage};
  const bool upload = !im.allocator->device().is_cpu();
  const ActivationSpec batch_spec{"pipeline_batch", Shape{2 * dims_.B * dims_.T}, DType::int32};
  // A mixture of experts: every stage passes the router statistics on, sparse layers of its own or
  // not (the architecture says whether the model has any; engine_impl.h).
  const MoeConfig* moe = model_.architecture ? model_.architecture->moe_config() : nullptr;
  if (moe != nullptr && moe->sparse_layers(model_.architecture->n_layer()) > 0) {
    im.moe_experts = moe->num_experts;
    im.moe_layers = model_.architecture->n_layer();
    im.moe_pack = 2 * im.moe_experts + 2;
    im.moe_aux_weight = moe->aux_loss_weight();
  }
  const ActivationSpec stats_spec{"pipeline_moe_stats", Shape{im.moe_pack}, DType::fp64};
  std::vector<std::vector<std::size_t>> stats_in_off(C), stats_out_off(C);
  for (std::size_t c = 0; c < C; ++c) {
    const ModelChunk& ch = model_.chunks[c];
    const int slots = im.pipeline_slots[c];
    for (std::size_t i = ch.begin; i < ch.end; ++i) {
      out_spec[i] = model_.layers[i]->output(dims_);
      saved_spec[i] = model_.layers[i]->saved_activations(dims_);
      place[i].resize(static_cast<std::size_t>(slots));
      Place shared;
      if (shared_output[i]) shared.output = reserve(bytes, out_spec[i]);
      if (shared_saved[i])
        for (const ActivationSpec& a : saved_spec[i]) shared.saved.push_back(reserve(bytes, a));
      for (int k = 0; k < slots; ++k) {
        Place& p = place[i][static_cast<std::size_t>(k)];
        p.output = shared_output[i] ? shared.output : reserve(bytes, out_spec[i]);
        if (shared_saved[i]) {
          p.saved = shared.saved;
        } else {
          for (const ActivationSpec& a : saved_spec[i]) p.saved.push_back(reserve(bytes, a));
        }
      }
      std::vector<std::size_t> unused;
      sbytes = std::max(sbytes, pack_activation_specs(model_.layers[i]->scratch(dims_), 0, unused));
    }
    for (int k = 0; k < slots; ++k) {
      if (model_.layer_id(ch.begin) != 0) input_off[c].push_back(reserve(bytes, residual_spec));
      if (upload) upload_off[c].push_back(reserve(bytes, batch_spec));
      if (im.moe_pack > 0 && model_.layer_id(ch.begin) != 0) stats_in_off[c].push_back(reserve(bytes, stats_spec));
      if (im.moe_pack > 0 && model_.layer_id(ch.end - 1) != last_id) stats_out_off[c].push_back(reserve(bytes, stats_spec));
    }
  }
  std::array<std::size_t, 2> grad_in_off{}, dres_off{}, stats_grad_in_off{}, stats_grad_out_off{};
  for (std::size_t k = 0; k < 2; ++k) {
    grad_in_off[k] = reserve(bytes, residual_spec);
    dres_off[k] = reserve(bytes, residual_spec);
    if (im.moe_pack > 0) {
      stats_grad_in_off[k] = reserve(bytes, stats_spec);
      stats_grad_out_off[k] = reserve(bytes, stats_spec);
    }
  }
  im.pipeline_buf = Buffer(*im.allocator, align_up(bytes), MemoryPurpose::activations);
  im.scratch_buf = Buffer(*im.allocator, std::max(sbytes, kActivationAlignBytes), MemoryPurpose::buffers);

  im.slot_views.assign(L, {});
  im.chunk_inputs.assign(C, {});
  im.slot_batches.assign(C, {});
  im.slot_uploads.assign(C, {});
  im.stats_in.assign(C, {});
  im.stats_out.assign(C, {});
  im.stats_whole.assign(C, {});
  for (std::size_t c = 0; c < C; ++c) {
    const ModelChunk& ch = model_.chunks[c];
    const auto slots = static_cast<std::size_t>(im.pipeline_slots[c]);
    for (std::size_t off : input_off[c]) im.chunk_inputs[c].push_back(im.pipeline_buf.tensor(storage, residual, off));
    for (std::size_t off : upload_off[c]) im.slot_uploads[c].push_back(im.pipeline_buf.tensor(DType::int32, batch_spec.shape, off));
    for (std::size_t off : stats_in_off[c]) im.stats_in[c].push_back(im.pipeline_buf.tensor(DType::fp64, stats_spec.shape, off));
    for (std::size_t off : stats_out_off[c]) im.stats_out[c].push_back(im.pipeline_buf.tensor(DType::fp64, stats_spec.shape, off));
    if (im.moe_pack > 0 && model_.layer_id(ch.end - 1) == last_id) im.stats_whole[c].resize(slots);
    im.slot_batches[c].resize(slots);
    for (std::size_t i = ch.begin; i < ch.end; ++i) {
      im.slot_views[i].resize(slots);
      for (std::size_t k = 0; k < slots; ++k) {
        Impl::SlotViews& v = im.slot_views[i][k];
        const Place& p = place[i][k];
        v.output = v.recompute_output = im.pipeline_buf.tensor(out_spec[i].dtype, out_spec[i].shape, p.output);
        for (std::size_t j = 0; j < saved_spec[i].size(); ++j)
          v.saved.push_back(im.pipeline_buf.tensor(saved_spec[i][j].dtype, saved_spec[i][j].shape, p.saved[j]));
        if (i > ch.begin) {
          v.input = im.slot_views[i - 1][k].output;
        } else if (!im.chunk_inputs[c].empty()) {
          v.input = im.chunk_inputs[c][k];
        }
      }
    }
  }
  for (std::size_t i = 0; i < L; ++i) {
    std::vector<ActivationSpec> specs = model_.layers[i]->scratch(dims_);
    std::vector<std::size_t> so;
    pack_activation_specs(specs, 0, so);
    for (std::size_t k = 0; k < specs.size(); ++k) im.layers[i].scratch.push_back(im.scratch_buf.tensor(specs[k].dtype, specs[k].shape, so[k]));
  }
  for (std::size_t k = 0; k < 2; ++k) {
    im.grad_in[k] = im.pipeline_buf.tensor(storage, residual, grad_in_off[k]);
    im.pipeline_dresidual[k] = im.pipeline_buf.tensor(storage, residual, dres_off[k]);
    if (im.moe_pack > 0) {
      im.stats_grad_in[k] = im.pipeline_buf.tensor(DType::fp64, stats_spec.shape, stats_grad_in_off[k]);
      im.stats_grad_out[k] = im.pipeline_buf.tensor(DType::fp64, stats_spec.shape, stats_grad_out_off[k]);
    }
  }
  im.dresidual = im.pipeline_dresidual[0];
  for (std::size_t c = 0; c < C; ++c) select_slot(static_cast<int>(c), 0);
  if (interval > 0) {
    std::size_t segments = 0;
    for (std::int64_t f : im.segment_first) segments += f >= 0 ? 1 : 0;
    log_info("pipeline: activation checkpointing: {} segment(s) of at most {} block(s) on this stage; each keeps only its input per micro-batch in flight",
             segments, interval);
  }
}

void Engine::select_slot(int chunk, int slot) {
  Impl& im = *impl_;
  const ModelChunk& ch = model_.chunks[static_cast<std::size_t>(chunk)];
  for (std::size_t i = ch.begin; i < ch.end; ++i) {
    const Impl::SlotViews& v = im.slot_views[i][static_cast<std::size_t>(slot)];
    Impl::LayerState& ls = im.layers[i];
    ls.input = v.input;
    ls.output = v.output;
    ls.recompute_output = v.recompute_output;
    ls.saved = v.saved;
  }
}

namespace {

void check_pipeline_call(const Model& model, const char* who, int chunk, int micro, std::int64_t gas, bool pipelined) {
  if (!pipelined) fail("Engine::{}: this engine has no pipeline (EngineOptions::pipeline); use forward, backward and step", who);
  if (chunk < 0 || static_cast<std::size_t>(chunk) >= model.chunks.size())
    fail("Engine::{}: chunk {} is outside this stage's {} chunk(s)", who, chunk, model.chunks.size());
  if (micro < 0 || micro >= gas) fail("Engine::{}: micro-batch {} is outside the step's {} (gradient_accumulation_steps)", who, micro, gas);
}

}  // namespace

Tensor Engine::pipeline_input(int chunk, int micro) const {
  check_pipeline_call(model_, "pipeline_input", chunk, micro, gas_, model_.pipelined());
  const auto& in = impl_->chunk_inputs[static_cast<std::size_t>(chunk)];
  if (in.empty()) fail("Engine::pipeline_input: chunk {} holds the model's first layer, which reads the tokens", chunk);
  return in[static_cast<std::size_t>(micro % impl_->pipeline_slots[static_cast<std::size_t>(chunk)])];
}

Tensor Engine::pipeline_output(int chunk, int micro) const {
  check_pipeline_call(model_, "pipeline_output", chunk, micro, gas_, model_.pipelined());
  const ModelChunk& ch = model_.chunks[static_cast<std::size_t>(chunk)];
  return impl_->slot_views[ch.end - 1][static_cast<std::size_t>(micro % impl_->pipeline_slots[static_cast<std::size_t>(chunk)])].output;
}

Tensor Engine::pipeline_grad_in(int buffer) const {
  if (buffer < 0) buffer = static_cast<int>(impl_->pipeline_backwards % 2);
  DSTRAIN_CHECK(buffer < 2, "Engine::pipeline_grad_in: buffer {} (there are 2)", buffer);
  return impl_->grad_in[static_cast<std::size_t>(buffer)];
}

Tensor Engine::pipeline_grad_out(int buffer) const {
  if (buffer < 0) return impl_->dresidual;
  DSTRAIN_CHECK(buffer < 2, "Engine::pipeline_grad_out: buffer {} (there are 2)", buffer);
  return impl_->pipeline_dresidual[static_cast<std::size_t>(buffer)];
}

Tensor Engine::pipeline_input_stats(int chunk, int micro) const {
  check_pipeline_call(model_, "pipeline_input_stats", chunk, micro, gas_, model_.pipelined());
  const auto& in = impl_->stats_in[static_cast<std::size_t>(chunk)];
  return in.empty() ? Tensor{} : in[static_cast<std::size_t>(micro % impl_->pipeline_slots[static_cast<std::size_t>(chunk)])];
}

Tensor Engine::pipeline_output_stats(int chunk, int micro) const {
  check_pipeline_call(model_, "pipeline_output_stats", chunk, micro, gas_, model_.pipelined());
  const auto& out = impl_->stats_out[static_cast<std::size_t>(chunk)];
  return out.empty() ? Tensor{} : out[static_cast<std::size_t>(micro % impl_->pipeline_slots[static_cast<std::size_t>(chunk)])];
}

Tensor Engine::pipeline_grad_in_stats(int buffer) const {
  DSTRAIN_CHECK(buffer >= 0 && buffer < 2, "Engine::pipeline_grad_in_stats: buffer {} (there are 2)", buffer);
  return impl_->stats_grad_in[static_cast<std::size_t>(buffer)];
}

Tensor Engine::pipeline_grad_out_stats(int buffer) const {
  DSTRAIN_CHECK(buffer >= 0 && buffer < 2, "Engine::pipeline_grad_out_stats: buffer {} (there are 2)", buffer);
  return impl_->stats_grad_out[static_cast<std::size_t>(buffer)];
}

// A chunk's forward starts from the router statistics of the micro-batch so far: zeros on the
// model's first chunk, else what the previous virtual stage sent (in `slot`). Nothing without
// sparse layers in the model.
void Engine::begin_chunk_stats(std::size_t chunk, std::size_t slot, bool train) {
  Impl& im = *impl_;
  im.moe.begin(train);
  if (im.moe_pack == 0) return;
  const auto& in = im.stats_in[chunk];
  im.moe.load(in.empty() ? std::vector<double>(static_cast<std::size_t>(im.moe_pack), 0.0) : read_stats(in[slot]), im.moe_aux_weight);
}

float Engine::forward_chunk(int chunk, int micro, const Batch& batch) {
  check_pipeline_call(model_, "forward_chunk", chunk, micro, gas_, model_.pipelined());
  Impl& im = *impl_;
  const auto c = static_cast<std::size_t>(chunk);
  const ModelChunk& ch = model_.chunks[c];
  const auto slot = static_cast<std::size_t>(micro % im.pipeline_slots[c]);
  select_slot(chunk, static_cast<int>(slot));
  set_batch(batch, im.slot_uploads[c].empty() ? Tensor{} : im.slot_uploads[c][slot]);
  im.slot_batches[c][slot] = im.batch;
  im.pipeline_micro = micro;
  const bool has_loss = model_.layer_id(ch.end - 1) == model_.whole_layer_count() - 1;
  float loss = 0.0f;
  begin_chunk_stats(c, slot, true);
  for (std::size_t i = ch.begin; i < ch.end; ++i) forward_layer(i, true, has_loss && i + 1 == ch.end ? &loss : nullptr, false);
  end_chunk_stats(c, slot, has_loss);
  if (has_loss) {
    loss = whole_sequence_loss(loss) + (im.moe_pack > 0 ? moe_aux_term() : 0.0f);
    last_loss_ = loss;
    step_loss_sum_ += static_cast<double>(loss);
    if (im.moe_pack > 0) im.stats_whole[c][slot] = im.moe.pack();  // after the sequence-parallel sum: the backward's
  }
  return loss;
}

// After a chunk's forward: its running router statistics go on with its output (not on the chunk
// holding the loss, where they are the whole model's). A model whose architecture names no sparse
// layers but whose layers record an aux loss (a list of layers built by hand) cannot pool them.
void Engine::end_chunk_stats(std::size_t chunk, std::size_t slot, bool has_loss) {
  Impl& im = *impl_;
  if (im.moe_pack == 0) {
    if (im.moe.aux_weight() > 0.0)
      fail("Engine: a pipeline stage's layers record a mixture-of-experts load-balancing loss, but the model's architecture names no sparse "
           "layers, so their router statistics cannot travel between the stages; build the model with make_model from its architecture");
    return;
  }
  if (!has_loss) write_stats(im.stats_out[chunk][slot], im.moe.pack());
}

float Engine::evaluate_chunk(int chunk, const Batch& batch) {
  check_pipeline_call(model_, "evaluate_chunk", chunk, 0, gas_, model_.pipelined());
  Impl& im = *impl_;
  const auto c = static_cast<std::size_t>(chunk);
  const ModelChunk& ch = model_.chunks[c];
  if (im.pipeline_backwards != 0) fail("Engine::evaluate_chunk: a step is under way (its micro-batches' activations would be overwritten); evaluate between steps");
  select_slot(chunk, 0);
  set_batch(batch, im.slot_uploads[c].empty() ? Tensor{} : im.slot_uploads[c][0]);
  im.pipeline_micro = 0;
  const bool has_loss = model_.layer_id(ch.end - 1) == model_.whole_layer_count() - 1;
  float loss = 0.0f;
  begin_chunk_stats(c, 0, false);
  for (std::size_t i = ch.begin; i < ch.end; ++i) forward_layer(i, false, has_loss && i + 1 == ch.end ? &loss : nullptr, false);
  end_chunk_stats(c, 0, has_loss);
  im.pipeline_micro = -1;
  // With the load-balancing term, as Engine::evaluate (forward_layers) adds it.
  return has_loss ? whole_sequence_loss(loss) + (im.moe_pack > 0 ? moe_aux_term() : 0.0f) : 0.0f;
}

void Engine::backward_chunk(int chunk, int micro) {
  check_pipeline_call(model_, "backward_chunk", chunk, micro, gas_, model_.pipelined());
  Impl& im = *impl_;
  const auto c = static_cast<std::size_t>(chunk);
  const ModelChunk& ch = model_.chunks[c];
  const auto slot = static_cast<std::size_t>(micro % im.pipeline_slots[c]);
  select_slot(chunk, static_cast<int>(slot));
  im.batch = im.slot_batches[c][slot];
  im.pipeline_micro = micro;
  const std::size_t last_id = model_.whole_layer_count() - 1;
  const bool boundary = micro == gas_ - 1;
  const auto buffer = static_cast<std::size_t>(im.pipeline_backwards % 2);  // double-buffered (engine_impl.h)
  im.dresidual = im.pipeline_dresidual[buffer];
  if (model_.layer_id(ch.end - 1) != last_id) copy_tensor(im.dresidual, im.grad_in[buffer]);
  if (im.moe_pack > 0) {
    // The whole model's router statistics of this micro-batch, for the routers' aux gradient: kept
    // by the chunk holding the loss, received with the gradient elsewhere; and passed back with it.
    // A checkpointed recompute below records nothing (forward_layer), so they stay.
    const std::vector<double> whole = model_.layer_id(ch.end - 1) == last_id ? im.stats_whole[c][slot] : read_stats(im.stats_grad_in[buffer]);
    im.moe.load(whole, im.moe_aux_weight);
    im.last_aux_loss = im.moe.aux_loss();
    im.moe.report_aux(im.last_aux_loss);
    if (model_.layer_id(ch.begin) != 0) write_stats(im.stats_grad_out[buffer], whole);
  }
  const float dloss = micro_batch_dloss();
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration reduction{0};
  for (std::size_t k = ch.end; k-- > ch.begin;) {
    if (const std::int64_t f = im.segment_first[k]; f >= 0) {
      // The segment's activations were overwritten by later micro-batches: run it forward again
      // from its kept input (same keys, the same dropout masks).
      for (auto j = static_cast<std::size_t>(f); j <= k; ++j) forward_layer(j, true, nullptr, true);
    }
    reduction += backward_layer(k, boundary, dloss);
  }
  im.pipeline_backwards += 1;
  // The step's last backward on this rank flushes the gradient reduction (at ZeRO-0 the regions
  // of every chunk's boundary backward form one range, the chunks running last to first).
  end_backward_timed(im.pipeline_backwards == gas_ * static_cast<std::int64_t>(model_.chunks.size()), start, reduction);
}

void Engine::pipeline_step() {
  Impl& im = *impl_;
  if (!model_.pipelined()) fail("Engine::pipeline_step: this engine has no pipeline (EngineOptions::pipeline); use step()");
  const std::int64_t want = gas_ * static_cast<std::int64_t>(model_.chunks.size());
  if (im.pipeline_backwards != want)
    fail("Engine::pipeline_step: {} chunk backward(s) ran this step but the step has {} ({} micro-batches x {} chunk(s))", im.pipeline_backwards, want,
         gas_, model_.chunks.size());
  im.pipeline_backwards = 0;
  micro_steps_ += gas_ - 1;  // the step's micro-batches, the last counted by boundary_step's caller below
  boundary_step();
  micro_steps_ += 1;
  im.pipeline_micro = -1;
}

void Engine::pipeline_all_reduce_sum(std::span<float> values) {
  Impl& im = *impl_;
  if (im.pp == nullptr || values.empty()) return;
  if (values.size() > 64) fail("Engine::pipeline_all_reduce_sum: {} values; at most 64", values.size());
  all_reduce_host(*im.pp, Tensor(values.data(), DType::fp32, Shape{static_cast<std::int64_t>(values.size())}), ReduceOp::sum, im.host_value_staging());
}

namespace {

// A piece of a parameter's gradient in this rank's partition, and where it sits in the parameter.
struct HeldPiece {
  Tensor grads;
  std::int64_t tensor_offset = 0;
};

std::vector<HeldPiece> held_pieces(const ModelStates& states, std::int32_t tensor) {
  std::vector<HeldPiece> held;
  for (const PartitionSegment& sg : states.partitions()) {
    const std::size_t es = dtype_size(sg.grads.dtype);
    for (const TensorPiece& p : sg.pieces)
      if (p.tensor == tensor)
        held.push_back({Tensor(static_cast<char*>(sg.grads.data) + static_cast<std::size_t>(p.offset) * es, sg.grads.dtype, Shape{p.numel},
                               sg.grads.device),
                        p.tensor_offset});
  }
  return held;
}

// The pieces into `whole` (the parameter's fp32 host values), or back from it (in their dtype and place).
void read_pieces(const std::vector<HeldPiece>& held, float* whole) {
  std::vector<char> host;
  for (const HeldPiece& h : held) {
    host.resize(h.grads.nbytes());
    const Tensor hg(host.data(), h.grads.dtype, h.grads.shape);
    copy_tensor(hg, h.grads);
    convert_tensor(Tensor(whole + h.tensor_offset, DType::fp32, h.grads.shape), hg);
  }
}

void write_pieces(const std::vector<HeldPiece>& held, const float* whole) {
  std::vector<char> host;
  for (const HeldPiece& h : held) {
    host.resize(h.grads.nbytes());
    const Tensor hg(host.data(), h.grads.dtype, h.grads.shape);
    convert_tensor(hg, Tensor(const_cast<float*>(whole) + h.tensor_offset, DType::fp32, h.grads.shape));
    copy_tensor(h.grads, hg);
  }
}

// This rank's local gradient `mine` of a shared parameter exchanged with the same (data, tensor)
// coordinate on every other stage holding it (`stages`), over the pipeline group in one batch, and
// summed in stage order into `mine`, so that every holder gets the same bits. On a GPU the batch
// moves device copies (what NCCL needs).
void sum_over_stages(Communicator& pp, const std::vector<int>& stages, std::vector<float>& mine, Allocator* staging) {
  const Shape shape{static_cast<std::int64_t>(mine.size())};
  std::vector<std::vector<float>> by_stage(static_cast<std::size_t>(pp.world_size()));
  by_stage[static_cast<std::size_t>(pp.rank())] = mine;
  std::vector<Buffer> device;
  const auto on_device = [&](std::vector<float>& v) {
    if (staging == nullptr) return Tensor(v.data(), DType::fp32, shape);
    device.emplace_back(*staging, v.size() * sizeof(float), MemoryPurpose::buffers);
    return device.back().tensor(DType::fp32, shape);
  };
  std::vector<PointToPointOp> ops;
  for (int s : stages) {
    if (s == pp.rank()) continue;
    by_stage[static_cast<std::size_t>(s)].assign(mine.size(), 0.0f);
    const Tensor out = on_device(mine);
    if (staging != nullptr) copy_tensor(out, Tensor(mine.data(), DType::fp32, shape));
    ops.push_back({true, out, s});
    ops.push_back({false, on_device(by_stage[static_cast<std::size_t>(s)]), s});
  }
  pp.send_recv(ops);
  if (staging != nullptr) {
    pp.synchronize();
    for (const PointToPointOp& op : ops)
      if (!op.is_send) copy_tensor(Tensor(by_stage[static_cast<std::size_t>(op.peer)].data(), DType::fp32, shape), op.buffer);
  }
  std::fill(mine.begin(), mine.end(), 0.0f);
  for (int s : stages)
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k] += by_stage[static_cast<std::size_t>(s)][k];
}

}  // namespace

// The shared parameters' gradients (GPT-2's tied embedding on the first and last stages), summed
// over the ranks holding a copy, as DeepSpeed's PipelineEngine all-reduces a TiedLayerSpec's
// gradients among its owners: every holder contributes the pieces of the (data-group reduced)
// gradient its partition holds — at ZeRO-0 every data rank holds all of it, so only data rank 0 —
// into a whole fp32 tensor, one all-reduce over the holders, and each takes its pieces back.
// The 1-bit optimizers' compressed phase is the exception: each rank holds its own (local)
// gradients, which the optimizer then exchanges compressed over the data group, so the copies of
// this rank's pipeline add theirs (sum_over_stages; the 1-bit optimizers run at ZeRO stage 0, where
// a rank's pieces are the whole parameter).
void Engine::reduce_shared_params() {
  Impl& im = *impl_;
  if (im.pp_ties == nullptr || model_.shared_params.empty()) return;
  const bool local = im.onebit != nullptr && !im.states->gradient_all_reduce() && im.world > 1;
  const bool contributes = local || im.config.zero_optimization.stage >= 1 || im.states->rank() == 0;
  for (const SharedParam& shared : model_.shared_params) {
    const auto it = im.by_name.find(shared.name);
    DSTRAIN_CHECK(it != im.by_name.end(), "pipeline: shared parameter '{}' is not owned here", shared.name);
    const std::vector<HeldPiece> held = held_pieces(*im.states, static_cast<std::int32_t>(it->second));
    std::vector<float> whole(static_cast<std::size_t>(im.owned[it->second].spec.shape.numel()), 0.0f);
    if (contributes) read_pieces(held, whole.data());
    if (local) {
      sum_over_stages(*im.pp, shared.stages, whole, im.host_value_staging());
    } else {
      all_reduce_host(*im.pp_ties, Tensor(whole.data(), DType::fp32, Shape{static_cast<std::int64_t>(whole.size())}), ReduceOp::sum,
                      im.host_value_staging());
    }
    write_pieces(held, whole.data());
  }
}

}  // namespace dstrain
