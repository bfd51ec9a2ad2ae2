#include "engine/activation_checkpointing.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/log.h"
#include "models/activation_layout.h"

#if defined(DSTRAIN_HAS_CUDA)
#include "ops/cuda/pinned_allocator.h"
#endif

namespace dstrain {
namespace {

constexpr auto pack = pack_activation_specs;

// A layer's output followed by its saved activations: the tensors its forward writes.
std::vector<ActivationSpec> written_by(const Layer& layer, const LayerDims& dims) {
  std::vector<ActivationSpec> specs{layer.output(dims)};
  for (auto& s : layer.saved_activations(dims)) specs.push_back(std::move(s));
  return specs;
}

}  // namespace

std::vector<CheckpointSegment> plan_checkpoint_segments(std::size_t first_block, std::size_t num_blocks,
                                                        std::optional<std::int64_t> number_checkpoints) {
  if (num_blocks == 0) fail("activation checkpointing: the model has no layers between its first and its last to checkpoint; turn checkpointing off");
  const std::int64_t k = number_checkpoints.value_or(static_cast<std::int64_t>(num_blocks));
  if (k <= 0 || k > static_cast<std::int64_t>(num_blocks)) {
    fail(
        "activation_checkpointing.number_checkpoints: {} — it is the number of checkpoint segments (kept inputs) and must be between 1 and "
        "the model's {} transformer blocks; give a value in that range, or remove the key for one checkpoint per block",
        k, num_blocks);
  }
  const auto K = static_cast<std::size_t>(k);
  std::vector<CheckpointSegment> segs;
  std::size_t first = first_block;
  for (std::size_t s = 0; s < K; ++s) {
    const std::size_t len = num_blocks / K + (s < num_blocks % K ? 1 : 0);
    segs.push_back({first, first + len - 1});
    first += len;
  }
  return segs;
}

std::vector<CheckpointingNote> activation_checkpointing_notes(const config::ActivationCheckpointingConfig& c, bool enabled) {
  std::vector<CheckpointingNote> notes;
  const bool configures = c.present || c.partition_activations || c.cpu_checkpointing || c.contiguous_memory_optimization ||
                          c.number_checkpoints.has_value() || c.synchronize_checkpoint_boundary || c.profile;
  if (!enabled && configures) {
    notes.push_back({true,
                     "the \"activation_checkpointing\" section only configures activation checkpointing; it does not switch it on (as "
                     "in DeepSpeed, where the model code must call deepspeed.checkpointing.checkpoint), so every activation is kept; "
                     "pass --checkpoint-activations to `dstrain train` (EngineOptions::checkpoint_activations = true when embedding the "
                     "engine) to recompute activations in backward, or remove the section"});
  }
  if (enabled && c.partition_activations) {
    notes.push_back({true,
                     "activation_checkpointing.partition_activations: true has no effect: it splits each kept input across the tensor "
                     "(model) parallel ranks, and dstrain has no tensor parallelism, so the kept inputs are kept whole; remove the key "
                     "(or set it to false) to silence this warning"});
  }
  return notes;
}

ActivationCheckpointing::ActivationCheckpointing(const config::ActivationCheckpointingConfig& cfg, std::span<const std::unique_ptr<Layer>> layers,
                                                 const LayerDims& dims, const Shape& residual, Allocator& device, Allocator* host)
    : cfg_(cfg) {
  const std::size_t L = layers.size();
  if (L < 3)
    fail("activation checkpointing: the model has {} layers but needs a first layer, at least one block and a last layer; turn checkpointing off", L);
  segments_ = plan_checkpoint_segments(1, L - 2, cfg.number_checkpoints);
  const std::size_t K = segments_.size();
  for (const auto& l : layers) names_.push_back(l->name());

  // The residual stream (B, T, C), or a tensor-parallel rank's rows of it, flows between the
  // layers; boundaries and kept inputs hold it.
  const Shape btc = residual;
  for (std::size_t i = 0; i + 1 < L; ++i) {
    const ActivationSpec out = layers[i]->output(dims);
    if (!(out.shape == btc) || out.dtype != dims.dtype) {
      fail(
          "activation checkpointing: layer '{}' outputs {} {} but the kept inputs are the residual stream {} {}; turn checkpointing off for this "
          "model",
          names_[i], out.name, out.shape.str(), btc.str(), dtype_name(dims.dtype));
    }
  }
  const std::size_t btc_bytes = static_cast<std::size_t>(btc.numel()) * dtype_size(dims.dtype);
  const std::size_t slot = align_up(btc_bytes);

  seg_of_first_.assign(L, -1);
  seg_of_last_.assign(L, -1);
  for (std::size_t s = 0; s < K; ++s) {
    seg_of_first_[segments_[s].first] = static_cast<std::int64_t>(s);
    seg_of_last_[segments_[s].last] = static_cast<std::int64_t>(s);
  }

  if (host != nullptr) {
    host_ = host;
  } else {
#if defined(DSTRAIN_HAS_CUDA)
    // Pinned, so the copies to and from a GPU run asynchronously at PCIe speed.
    if (device.device().is_cuda()) own_host_ = std::make_unique<CudaPinnedAllocator>(device.device().index);
#endif
    if (own_host_ == nullptr) own_host_ = std::make_unique<CpuAllocator>();
    host_ = own_host_.get();
  }
  transfer_ = make_copy_stream(device.device(), "activation checkpointing");

  // ---- kept inputs: K on the device, or K - 1 on the host (the last segment's stays on the device) ----
  const std::size_t n_kept = host_mode() ? K - 1 : K;
  Allocator& kept_alloc = host_mode() ? *host_ : device;
  if (cfg.contiguous_memory_optimization && n_kept > 0) {
    kept_bufs_.emplace_back(kept_alloc, n_kept * slot, MemoryPurpose::activations);
    for (std::size_t s = 0; s < n_kept; ++s) kept_.push_back(kept_bufs_[0].tensor(dims.dtype, btc, s * slot));
  } else {
    for (std::size_t s = 0; s < n_kept; ++s) {
      kept_bufs_.emplace_back(kept_alloc, btc_bytes, MemoryPurpose::activations);
      kept_.push_back(kept_bufs_.back().tensor(dims.dtype, btc));
    }
  }
  // ---- boundaries: device: the last layer's input; cpu_checkpointing: two ping-pong buffers ----
  const std::size_t n_staging = host_mode() ? 2 : 1;
  boundary_buf_ = Buffer(device, (n_staging - 1) * slot + btc_bytes, MemoryPurpose::activations);
  for (std::size_t k = 0; k < n_staging; ++k) staging_.push_back(boundary_buf_.tensor(dims.dtype, btc, k * slot));

  // ---- the shared area: one segment's outputs and saved activations, or the last layer's ----
  std::vector<std::vector<ActivationSpec>> specs(L);
  std::vector<std::vector<std::size_t>> offsets(L);
  std::size_t area = 0;
  for (const CheckpointSegment& sg : segments_) {
    std::size_t off = 0;
    for (std::size_t i = sg.first; i <= sg.last; ++i) {
      specs[i] = written_by(*layers[i], dims);
      off = pack(specs[i], off, offsets[i]);
    }
    area = std::max(area, off);
  }
  specs[L - 1] = written_by(*layers[L - 1], dims);
  area = std::max(area, pack(specs[L - 1], 0, offsets[L - 1]));
  area_buf_ = Buffer(device, area, MemoryPurpose::activations);
  // The first layer's saved activations (none for GPT-2's embedding) live through the whole step.
  const std::vector<ActivationSpec> first_saved = layers[0]->saved_activations(dims);
  std::vector<std::size_t> first_off;
  first_saved_buf_ = Buffer(device, pack(first_saved, 0, first_off), MemoryPurpose::activations);

  // ---- bindings ----
  bind_.resize(L);
  bind_[0].output = bind_[0].recompute_output = boundary(0);
  for (std::size_t k = 0; k < first_saved.size(); ++k)
    bind_[0].saved.push_back(first_saved_buf_.tensor(first_saved[k].dtype, first_saved[k].shape, first_off[k]));
  const auto area_view = [&](std::size_t i, std::size_t k) { return area_buf_.tensor(specs[i][k].dtype, specs[i][k].shape, offsets[i][k]); };
  for (std::size_t s = 0; s < K; ++s) {
    for (std::size_t i = segments_[s].first; i <= segments_[s].last; ++i) {
      Binding& b = bind_[i];
      b.input = i == segments_[s].first ? boundary(s) : area_view(i - 1, 0);
      b.recompute_output = area_view(i, 0);
      b.output = i == segments_[s].last ? boundary(s + 1) : b.recompute_output;
      for (std::size_t k = 1; k < specs[i].size(); ++k) b.saved.push_back(area_view(i, k));
    }
  }
  bind_[L - 1].input = boundary(K);
  bind_[L - 1].output = bind_[L - 1].recompute_output = area_view(L - 1, 0);
  for (std::size_t k = 1; k < specs[L - 1].size(); ++k) bind_[L - 1].saved.push_back(area_view(L - 1, k));

  keep_ticket_.assign(K, 0);
  fetch_ticket_.assign(K, 0);
  profile_.assign(K, {});
}

// The buffers are members declared before transfer_, so they are freed first: a copy still in
// flight (a step that ended in an exception) must finish before its memory goes back to the
// allocator's cache.
ActivationCheckpointing::~ActivationCheckpointing() {
  if (!transfer_) return;
  try {
    transfer_->synchronize();
  } catch (...) {  // a destructor cannot throw; the device error resurfaces at the next call
  }
}

Tensor ActivationCheckpointing::boundary(std::size_t s) const {
  if (host_mode()) return staging_[s % 2];
  return s < kept_.size() ? kept_[s] : staging_[0];
}

std::int64_t ActivationCheckpointing::boundary_written_by(std::size_t layer) const {
  if (layer + 1 < seg_of_first_.size() && seg_of_first_[layer + 1] >= 0) return seg_of_first_[layer + 1];
  if (layer == segments_.back().last) return static_cast<std::int64_t>(segments_.size());
  return -1;
}

void ActivationCheckpointing::sync_if() {
  if (cfg_.synchronize_checkpoint_boundary) transfer_->synchronize();
}

void ActivationCheckpointing::before_forward(std::size_t layer, bool train) {
  // cpu_checkpointing: the boundary this layer writes last held segment w-2's input; its copy to
  // the host must be done before it is overwritten.
  const std::int64_t w = boundary_written_by(layer);
  if (host_mode() && w >= 2) transfer_->wait(keep_ticket_[static_cast<std::size_t>(w - 2)]);
  const std::int64_t s = seg_of_first_[layer];
  if (s < 0) return;
  sync_if();
  t0_ = Clock::now();
  // keep_input: the segment's input goes to the host (the last segment's stays on the device). On
  // the device it already sits in its kept slot: the previous layer wrote it there.
  if (train && host_mode() && static_cast<std::size_t>(s) + 1 < segments_.size()) {
    keep_ticket_[static_cast<std::size_t>(s)] = transfer_->to_host(kept_[static_cast<std::size_t>(s)], boundary(static_cast<std::size_t>(s)));
  }
}

void ActivationCheckpointing::after_forward(std::size_t layer, bool train) {
  const std::int64_t s = seg_of_last_[layer];
  if (s < 0) return;
  if (train) profile_[static_cast<std::size_t>(s)].forward_s = std::chrono::duration<double>(Clock::now() - t0_).count();
  sync_if();
}

void ActivationCheckpointing::issue_prefetch(std::int64_t s) {
  if (s < 0) return;
  const auto k = static_cast<std::size_t>(s);
  fetch_ticket_[k] = transfer_->to_device(boundary(k), kept_[k]);
}

void ActivationCheckpointing::begin_recompute(std::size_t segment) {
  sync_if();
  if (host_mode()) transfer_->wait(fetch_ticket_[segment]);
  t0_ = Clock::now();
}

void ActivationCheckpointing::end_recompute(std::size_t segment) {
  const Clock::time_point now = Clock::now();
  profile_[segment].recompute_s = std::chrono::duration<double>(now - t0_).count();
  t0_ = now;
}

void ActivationCheckpointing::after_backward(std::size_t layer) {
  const auto K = static_cast<std::int64_t>(segments_.size());
  if (layer + 1 == names_.size()) {
    // The last layer's input (boundary K) is dead: bring segment K-2's input back into it while
    // segment K-1 (whose input never left the device) runs backward.
    if (host_mode()) issue_prefetch(K - 2);
    return;
  }
  const std::int64_t s = seg_of_first_[layer];
  if (s < 0) return;
  SegmentProfile& p = profile_[static_cast<std::size_t>(s)];
  p.backward_s = std::chrono::duration<double>(Clock::now() - t0_).count();
  if (cfg_.profile) {
    const CheckpointSegment& sg = segments_[static_cast<std::size_t>(s)];
    log_info("activation checkpointing profile: segment {}/{} ({}{}{}): forward {:.3f} ms | recompute {:.3f} ms | backward {:.3f} ms", s + 1, K,
             names_[sg.first], sg.size() > 1 ? ".." : "", sg.size() > 1 ? names_[sg.last] : std::string(), p.forward_s * 1e3, p.recompute_s * 1e3,
             p.backward_s * 1e3);
  }
  sync_if();
  // Segment s's input buffer is dead: segment s-2's input goes there, one segment ahead of need.
  if (host_mode()) issue_prefetch(s - 2);
}

std::string ActivationCheckpointing::describe() const {
  std::size_t lo = segments_.front().size(), hi = lo;
  for (const auto& s : segments_) {
    lo = std::min(lo, s.size());
    hi = std::max(hi, s.size());
  }
  std::size_t kept_bytes = 0;
  for (const Buffer& b : kept_bufs_) kept_bytes += b.bytes();
  return fmt::format("activation checkpointing: {} segment{} of {} block{}; kept inputs {} in {} {} buffer{}{}; recompute area {}", segments_.size(),
                     segments_.size() == 1 ? "" : "s", lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi), hi == 1 ? "" : "s",
                     format_bytes(kept_bytes), kept_bufs_.size(), host_mode() ? "host" : "device", kept_bufs_.size() == 1 ? "" : "s",
                     host_mode() ? " (the last segment's input stays on the device)" : "", format_bytes(area_buf_.bytes()));
}

}  // namespace dstrain
