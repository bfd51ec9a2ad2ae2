// ActivationCheckpointing: layer-granular recompute in the engine's layer loop (docs/design.md "The
// step, as data flows": ckpt.keep_input(i, x) in forward, recompute before backward).
//
// Switched on by EngineOptions::checkpoint_activations (`dstrain train --checkpoint-activations`),
// as Megatron-DeepSpeed's --checkpoint-activations and Hugging Face's gradient_checkpointing do;
// the ds_config's "activation_checkpointing" section only configures it, as in DeepSpeed.
//
// What is checkpointed: the blocks, i.e. every layer between the first (the embedding: it reads
// only the batch and saves nothing) and the last (the head: its backward follows its forward
// immediately, so dropping and recomputing its saved logits would free nothing at the peak).
// number_checkpoints = K splits the N blocks into K segments of consecutive blocks, as even as
// possible (the first N % K one block longer); default K = N, one block per segment. Each segment
// keeps only its input (B, T, C); in backward the segment is run forward again from that input
// with the same RngKeys (dropout masks identical), then backward block by block. This is
// DeepSpeed's checkpoint(run_function, x) over a chunk of layers.
//
// Memory (purpose activations; every tensor 64-byte aligned), with a segment's bytes
// seg(s) = sum over its blocks of (output + saved_activations) and head = the head's output + saved:
//   device keeps:   K x (B,T,C) kept inputs + (B,T,C) head input
//                   + max(max_s seg(s), head)  one shared area: the segment being run, or the head
//                   + the first layer's saved (none for GPT-2) + (B,T,C) residual gradient (engine)
//   cpu_checkpointing: the kept inputs of segments 0..K-2 live in host memory (host_memory_stats(),
//                   purpose activations) and two (B,T,C) device buffers carry the segment inputs:
//                   2 x (B,T,C) + shared area + first layer's saved + (B,T,C) on the device. The
//                   last segment's input never leaves the device (it is needed first, as
//                   DeepSpeed's offload engine keeps the newest input); segment s-2's input is
//                   copied back while segment s runs backward, one segment ahead of need.
//   contiguous_memory_optimization: the kept inputs are slots of ONE preallocated buffer instead
//                   of one allocation each (all memory is allocated up front either way).
// Nothing is allocated during a step.
//
// synchronize_checkpoint_boundary: a device synchronize at the start and end of every segment's
// forward and backward (DeepSpeed's SYNCHRONIZE; a no-op hook on the CPU, counted).
// profile: per segment, the wall time of its forward, of its recompute and of its backward, logged
// (info) after each segment's backward and kept in profile(). DeepSpeed's 'backward' timer is
// recompute + backward.
// partition_activations: no effect, dstrain has no tensor (model) parallelism to split across; a
// warning says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config_schema/checkpoint_config.h"
#include "ops/kernels/copy_stream.h"
#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/memory_stats.h"
#include "ops/tensor.h"
#include "models/layer.h"

namespace dstrain {

// Layers [first, last] of the model (inclusive) run as one checkpoint segment; the input of
// `first` is kept.
struct CheckpointSegment {
  std::size_t first = 0;
  std::size_t last = 0;
  std::size_t size() const { return last - first + 1; }
};

// The segments of the blocks [first_block, first_block + num_blocks): number_checkpoints of them
// (unset: num_blocks), consecutive, sizes differing by at most one, longer ones first. Error naming
// activation_checkpointing.number_checkpoints when it is not in [1, num_blocks].
std::vector<CheckpointSegment> plan_checkpoint_segments(std::size_t first_block, std::size_t num_blocks,
                                                        std::optional<std::int64_t> number_checkpoints);

// What to tell the user about the section given whether checkpointing is on: a note when the
// section configures something but checkpointing is off (how to switch it on), a warning for
// partition_activations when it is on. Each line is complete; `warning` says how to log it.
struct CheckpointingNote {
  bool warning = false;
  std::string text;
};
std::vector<CheckpointingNote> activation_checkpointing_notes(const config::ActivationCheckpointingConfig& cfg, bool enabled);

// One segment's last timings, in seconds (profile: true).
struct SegmentProfile {
  double forward_s = 0.0;
  double recompute_s = 0.0;
  double backward_s = 0.0;
};

class ActivationCheckpointing {
 public:
  // Allocates the kept inputs, the segment area and the boundary buffers from `device` (purpose
  // activations) and, for cpu_checkpointing, the kept inputs from `host` (nullptr: a host
  // allocator of its own, so host bytes are counted apart from the device's; pinned memory,
  // CudaPinnedAllocator, when `device` is a GPU in a CUDA build). `layers` must have
  // at least 3 entries (first layer, >= 1 block, last layer) whose outputs are the residual stream
  // of shape `residual` (Model::residual_shape: (B, T, n_embd), or a tensor-parallel rank's rows)
  // except the last's. Error naming the key or the model otherwise.
  ActivationCheckpointing(const config::ActivationCheckpointingConfig& cfg, std::span<const std::unique_ptr<Layer>> layers, const LayerDims& dims,
                          const Shape& residual, Allocator& device, Allocator* host);
  ~ActivationCheckpointing();
  ActivationCheckpointing(const ActivationCheckpointing&) = delete;
  ActivationCheckpointing& operator=(const ActivationCheckpointing&) = delete;

  const std::vector<CheckpointSegment>& segments() const { return segments_; }
  const config::ActivationCheckpointingConfig& config() const { return cfg_; }

  // ---- where each layer reads and writes (the same views in forward, recompute and backward,
  // except the output of a segment's last block: the next boundary in forward, its slot in the
  // segment area in the recompute) ----
  Tensor input(std::size_t layer) const { return bind_[layer].input; }  // empty for layer 0
  Tensor output(std::size_t layer) const { return bind_[layer].output; }
  Tensor recompute_output(std::size_t layer) const { return bind_[layer].recompute_output; }
  std::span<const Tensor> saved(std::size_t layer) const { return bind_[layer].saved; }

  // ---- hooks of the engine's loop ----
  void before_forward(std::size_t layer, bool train);  // train false (evaluate): nothing is kept
  void after_forward(std::size_t layer, bool train);
  // The segment that `layer` ends, or -1: the engine recomputes it before that layer's backward.
  std::int64_t segment_ending_at(std::size_t layer) const { return seg_of_last_[layer]; }
  void begin_recompute(std::size_t segment);
  void end_recompute(std::size_t segment);
  void after_backward(std::size_t layer);

  // ---- reporting ----
  MemoryStats host_memory_stats() const { return host_->stats(); }
  const CopyStream& transfer() const { return *transfer_; }
  const std::vector<SegmentProfile>& profile() const { return profile_; }
  // One line: "12 segments of 1 block, kept inputs 36.00 MiB on the device (12 buffers)".
  std::string describe() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Binding {
    Tensor input, output, recompute_output;
    std::vector<Tensor> saved;
  };
  bool host_mode() const { return cfg_.cpu_checkpointing; }
  Tensor boundary(std::size_t s) const;  // input of segment s; s == K: the last layer's input
  // The segment whose input `layer` writes in forward (layer + 1 starts it), K when layer is the
  // last block, -1 otherwise.
  std::int64_t boundary_written_by(std::size_t layer) const;
  void sync_if();
  void issue_prefetch(std::int64_t s);

  config::ActivationCheckpointingConfig cfg_;
  std::vector<std::string> names_;
  std::vector<CheckpointSegment> segments_;
  std::vector<std::int64_t> seg_of_first_, seg_of_last_;
  std::vector<Binding> bind_;
  std::unique_ptr<Allocator> own_host_;
  Allocator* host_ = nullptr;
  std::unique_ptr<CopyStream> transfer_;
  std::vector<Buffer> kept_bufs_;  // kept inputs (device, or host for cpu_checkpointing)
  std::vector<Tensor> kept_;       // one per segment (cpu_checkpointing: segments 0..K-2)
  Buffer boundary_buf_;            // device: head input; cpu_checkpointing: 2 ping-pong slots
  std::vector<Tensor> staging_;    // the boundary views
  Buffer area_buf_, first_saved_buf_;
  std::vector<CopyStream::Ticket> keep_ticket_, fetch_ticket_;
  std::vector<SegmentProfile> profile_;
  Clock::time_point t0_;
};

}  // namespace dstrain
