// The engine's optimizer step at the gradient-accumulation boundary (Engine::step, pipeline_step's
// end; docs/design.md "The step, as data flows"): the overflow check and the global gradient norm
// over every group that holds part of the model (data, tensor-parallel, pipeline), the loss
// scaler's skip-or-apply decision, clipping, the optimizer's update, the LR schedule and counters.
#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/grad_norm.h"
#include "engine/loss_scaler.h"
#include "engine/optim/onebit_optimizer.h"
#include "engine/optim/optimizer.h"
#include "engine/tensor_parallel.h"
#include "ops/error.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/log.h"
#include "zero/model_states.h"

namespace dstrain {

void Engine::step() {
  if (!have_backward_) {
    fail(
        "Engine::step: call backward() first; step() counts the micro-step whose gradients backward() accumulated (forward, backward, "
        "step for every micro-batch)");
  }
  have_backward_ = false;
  boundary_reduced_ = false;
  if (is_gradient_accumulation_boundary()) boundary_step();
  micro_steps_ += 1;
}

void Engine::boundary_step() {
  {
    const bool counted = optimizer_step();
    last_step_loss_ = static_cast<float>(step_loss_sum_ / static_cast<double>(gas_));
    if (impl_->io) {
      // This step's NVMe traffic, counted as the collectives are.
      const IoEngine::Totals now = impl_->io->totals();
      impl_->step_io = now - impl_->io_at_step_start;
      impl_->train_io += impl_->step_io;
      impl_->io_at_step_start = now;
    }
    if (impl_->comm != nullptr) {
      // This step's collectives: everything since the previous step ended.
      const CommStats now = impl_->zero_comm_stats();
      impl_->step_comm = now - impl_->comm_at_step_start;
      impl_->comm_at_step_start = now;
    }
    step_loss_sum_ = 0.0;
    global_steps_ += 1;
    global_samples_ += train_batch_size_;
    // The next step's LR; a skipped step leaves it where it was (the schedule did not step, and
    // a hook is asked for the step index the optimizer has reached).
    if (counted) lr_ = impl_->hook ? impl_->hook(global_steps_ - skipped_steps_) : impl_->schedule.lr();
  }
}

bool Engine::optimizer_step() {
  impl_->initial_state = false;
  Impl& im = *impl_;
  const std::optional<LrSchedule::Betas> betas = im.hook ? std::nullopt : im.schedule.betas();
  // The optimizer's own step count (Adam's bias corrections): skipped steps do not advance it.
  const std::int64_t t = global_steps_ - skipped_steps_ + 1;
  const int stage = im.config.zero_optimization.stage;
  // The 1-bit optimizers' compressed phase: the backward did not all-reduce, each rank holds its own
  // gradients, and DeepSpeed clips them with their own (local) norm.
  const bool local_grads = im.onebit != nullptr && !im.states->gradient_all_reduce() && im.world > 1;
  // Stage 0: every rank holds the same averaged grads (under expert parallelism: the same experts'
  // grads on the ranks of one expert-data group), and the first rank of the group counts them.
  const bool partitioned = stage >= 1 || local_grads;
  // MiCS: the replicas of a partition hold the same reduced grads; the first replica counts them.
  const bool counts_here = (partitioned && im.states->partition_replica() == 0) || (!partitioned && im.states->rank() == 0) || im.ep != nullptr;

  if (im.mixed) {
    const std::int64_t step_number = global_steps_ + 1;  // 1-based, as --inject-overflow counts
    const auto& inject = im.options.inject_overflow_steps;
    const std::vector<PartitionSegment>& parts = im.states->partitions();
    if (std::find(inject.begin(), inject.end(), step_number) != inject.end() && !parts.empty()) {
      // One +inf where a real fp16 overflow would put it: the first gradient element this rank
      // holds (a real parameter's, never alignment padding), or the first it holds of the
      // parameter named (none when it holds none of it).
      Tensor g = parts.front().grads;
      const std::string& name = im.options.inject_overflow_param;
      if (!name.empty()) {
        g = Tensor{};
        for (const PartitionSegment& sg : parts) {
          for (const TensorPiece& piece : sg.pieces) {
            if (g.data != nullptr || piece.numel == 0 || im.owned[static_cast<std::size_t>(piece.tensor)].spec.name != name) continue;
            g = Tensor(static_cast<char*>(sg.grads.data) + static_cast<std::size_t>(piece.offset) * dtype_size(sg.grads.dtype), sg.grads.dtype, Shape{1},
                       sg.grads.device);
          }
        }
      }
      if (g.data != nullptr) {
        float inf = std::numeric_limits<float>::infinity();
        std::uint32_t value = 0;  // inf in the gradient dtype, on the host
        convert_tensor(Tensor(&value, g.dtype, Shape{1}), Tensor(&inf, DType::fp32, Shape{1}));
        copy_tensor(Tensor(g.data, g.dtype, Shape{1}, g.device), Tensor(&value, g.dtype, Shape{1}));
      }
    }
  }
  // Pipeline: the shared parameters' copies sum their gradients first (then they are one gradient,
  // counted once below, on the owner's stage).
  reduce_shared_params();
  const std::vector<bool>& pipeline_copy = im.pipeline_copy;
  const bool has_copies = std::find(pipeline_copy.begin(), pipeline_copy.end(), true) != pipeline_copy.end();
  // One fused norm + overflow pass over this rank's gradients; the first layer (in model order)
  // with an inf/NaN names the overflow in the log, as DeepSpeed's ZeRO error message does.
  GradNormOverflow total;
  std::string first_bad;
  const bool expert_stage0 = im.ep != nullptr && !partitioned;
  if (counts_here && im.tp == nullptr && !has_copies && !expert_stage0) {
    for (const PartitionSegment& sg : im.states->partitions()) {
      const GradNormOverflow r = grad_norm_overflow(sg.grads);
      if (r.overflow() && first_bad.empty()) first_bad = model_.layers[sg.layer]->name();
      total += r;
    }
  } else if (counts_here) {
    // Tensor parallelism: a cut parameter's pieces add up over the group, a replicated one (the
    // same gradient on every rank of the group) counts once — from tensor-parallel rank 0. Expert
    // parallelism at stage 0: the non-expert grads from data rank 0, each expert's from the first
    // rank of its expert-data group.
    const int expert_data_rank = im.ep != nullptr ? im.options.expert_data->rank() : 0;
    for (const PartitionSegment& sg : im.states->partitions()) {
      const std::size_t es = dtype_size(sg.grads.dtype);
      for (const TensorPiece& piece : sg.pieces) {
        const ParamSpec& spec = im.owned[static_cast<std::size_t>(piece.tensor)].spec;
        if (!is_tensor_piece(spec) && im.tp_rank() != 0) continue;
        if (expert_stage0 && (is_expert_piece(spec) ? expert_data_rank : im.states->rank()) != 0) continue;
        if (pipeline_copy[static_cast<std::size_t>(piece.tensor)]) continue;
        const Tensor g(static_cast<char*>(sg.grads.data) + static_cast<std::size_t>(piece.offset) * es, sg.grads.dtype, Shape{piece.numel},
                       sg.grads.device);
        const GradNormOverflow r = grad_norm_overflow(g);
        if (r.overflow() && first_bad.empty()) first_bad = model_.layers[sg.layer]->name();
        total += r;
      }
    }
  }
  if (!im.mixed) total.nonfinite = 0.0;  // fp32 has no overflow check: a NaN norm clips to NaN, as in DeepSpeed
  // Several ranks: ONE all-reduce of (norm², non-finite count, loss), in fp64 (docs/training_state.md
  // §4), so that every rank takes the same skip and clip decision as one rank would, a norm² past
  // FLT_MAX stays finite, and the loss is the global batch's.
  double loss_sum = step_loss_sum_;
  if (im.world > 1) {
    double v[3] = {total.norm_sq, total.nonfinite, step_loss_sum_};
    im.states->all_reduce_sum(Tensor(v, DType::fp64, Shape{3}));
    if (!local_grads) total.norm_sq = v[0];
    total.nonfinite = v[1];
    loss_sum = v[2];
    if (total.overflow() && first_bad.empty()) first_bad = "a layer of another rank";
  }
  step_loss_sum_ = loss_sum / static_cast<double>(im.world);
  if (im.tp != nullptr) {
    // ... and over the tensor-parallel group: every rank of the mesh takes the same decision.
    double v[2] = {total.norm_sq, total.nonfinite};
    all_reduce_host(*im.tp, Tensor(v, DType::fp64, Shape{2}), ReduceOp::sum, im.host_value_staging());
    total.norm_sq = v[0];
    if (v[1] > total.nonfinite && first_bad.empty()) first_bad = "a layer of another tensor-parallel rank";
    total.nonfinite = v[1];
  }
  if (im.pp != nullptr) {
    // ... and over the pipeline's stages: the norm is the whole model's, an overflow on any stage
    // skips the step on every stage, and the loss is the last stage's.
    double v[3] = {total.norm_sq, total.nonfinite, step_loss_sum_};
    all_reduce_host(*im.pp, Tensor(v, DType::fp64, Shape{3}), ReduceOp::sum, im.host_value_staging());
    total.norm_sq = v[0];
    if (v[1] > total.nonfinite && first_bad.empty()) first_bad = "a layer of another pipeline stage";
    total.nonfinite = v[1];
    step_loss_sum_ = v[2];
  }

  if (!im.mixed) {
    grad_norm_ = total.norm();
    clip_coef_ = dstrain::clip_coefficient(grad_norm_, im.config.gradient_clipping);
    // lr_ is this step's LR (set at construction / after the previous step); the schedule steps
    // after the update, as DeepSpeed's _take_model_step does (fp32 never skips a step).
    apply_optimizer(lr_, clip_coef_, t, betas);
    im.states->after_update();
    last_step_lr_ = lr_;
    im.schedule.step();
    im.states->zero_grads();
    return true;
  }

  const LossScaleUpdate r = im.scaler.update(total.overflow(), first_bad);
  // The logged norm is the un-scaled one with the scale the gradients carry; -1 on overflow, as
  // DeepSpeed reports it.
  grad_norm_ = total.overflow() ? -1.0 : total.norm() / r.old_scale;
  if (r.skipped) {
    log_warning("{}", im.scaler.overflow_log_line(r, 0, first_bad));
    clip_coef_ = 1.0f;
  } else {
    if (total.overflow()) {
      if (r.count_skipped) {
        log_warning(
            "non-finite gradient (first in {}): applied anyway, as DeepSpeed's non-ZeRO bf16 optimizer does (counted as a skipped step, "
            "the LR schedule does not step)",
            first_bad);
      } else {
        log_warning(
            "non-finite gradient (first in {}): applied anyway, as DeepSpeed does here (its BF16_Optimizer, or bf16 ZeRO with "
            "check_grad_overflow false, never checks; docs/precision.md)",
            first_bad);
      }
    }
    // Un-scale with the NEW scale (docs/precision.md §6: the update precedes un-scaling) and clip, in
    // the optimizer's single pass.
    const double divisor = unscale_clip_divisor(total.norm_sq, r.new_scale, im.config.gradient_clipping);
    clip_coef_ = static_cast<float>(r.new_scale / divisor);
    apply_optimizer(lr_, static_cast<float>(1.0 / divisor), t, betas);
    im.states->after_update();
    last_step_lr_ = lr_;
  }
  if (r.count_skipped) {
    skipped_steps_ += 1;
  } else {
    im.schedule.step();
  }
  im.states->zero_grads();
  return !r.count_skipped;
}

void Engine::apply_optimizer(double lr, float grad_scale, std::int64_t t, std::optional<std::pair<double, double>> betas) {
  Impl& im = *impl_;
  if (im.onebit) {
    im.onebit->step(*im.states, lr, grad_scale, t);
    // DeepSpeed's enable_backward_allreduce, which the 1-bit optimizers switch: the next backward.
    im.states->set_gradient_all_reduce(im.onebit->gradient_all_reduce());
    return;
  }
  if (im.tp != nullptr) {
    // Tensor parallelism: the per-tensor optimizers sum the cut tensors' pieces over the group too.
    TensorParallelPartition partition(*im.states, *im.tp);
    im.optimizer.step(partition, lr, grad_scale, t, betas, im.rounding);
    return;
  }
  im.optimizer.step(*im.states, lr, grad_scale, t, betas, im.rounding);
}

}  // namespace dstrain
