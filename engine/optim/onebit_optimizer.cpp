#include "engine/optim/onebit_optimizer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/error.h"
#include "engine/optim/host_segment.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

using config::OptimizerKind;

// fn(segment, host values, piece) for every tensor piece of the partition, sub-group by sub-group;
// `write`: the values changed (committed back).
template <typename Fn>
void visit(OptimizerPartition& partition, std::size_t n_states, bool write, Fn&& fn) {
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      HostSegment h(s, n_states);
      for (const TensorPiece& piece : s.pieces) fn(s, h, piece);
      if (write) h.commit();
    }
  });
}

std::int64_t lcm8(int w) { return static_cast<std::int64_t>(w) * 8 / std::gcd(w, 8); }

}  // namespace

void HostFloats::allocate(Allocator& allocator, std::int64_t n) {
  n_ = n;
  if (allocator.device().is_cpu()) {
    vec_.clear();
    buffer_ = Buffer(allocator, static_cast<std::size_t>(n) * 4, MemoryPurpose::optimizer);
    ptr_ = static_cast<float*>(buffer_.data());
  } else {
    buffer_.reset();
    vec_.assign(static_cast<std::size_t>(n), 0.0f);
    ptr_ = vec_.data();
  }
  zero();
}

void HostFloats::zero() { std::fill(ptr_, ptr_ + n_, 0.0f); }

std::vector<std::string> OneBitOptimizer::state_names(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::zero_one_adam:
      return {"exp_avg", "exp_avg_sq", "momentum_accumulator"};
    case OptimizerKind::onebit_lamb:
      return {"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"};
    default:
      return {"exp_avg", "exp_avg_sq"};
  }
}

OneBitOptimizer::OneBitOptimizer(const config::OptimizerConfig& config, Communicator* comm, Allocator& allocator)
    : kind_(config.kind), p_(config.params), ob_(config.onebit), comm_(comm), allocator_(allocator) {
  DSTRAIN_CHECK(config.is_onebit(), "OneBitOptimizer: optimizer.type \"{}\" is not OneBitAdam, ZeroOneAdam or OneBitLamb", config.type);
  if (p_.amsgrad) fail("optimizer.params.amsgrad is true: {} does not support the AMSGrad variant (DeepSpeed raises); remove it", config.type);
  world_ = comm != nullptr ? comm->world_size() : 1;
}

void OneBitOptimizer::build_groups(OptimizerPartition& partition) {
  tensors_.assign(static_cast<std::size_t>(partition.tensor_count()), TensorSlot{});
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments)
      for (const TensorPiece& piece : s.pieces) {
        tensors_[static_cast<std::size_t>(piece.tensor)].numel = piece.tensor_numel;
        tensors_[static_cast<std::size_t>(piece.tensor)].weight_decay = s.weight_decay;
      }
  });
  const std::int64_t unit = static_cast<std::int64_t>(world_) * lcm8(world_);  // DeepSpeed's size·divider
  auto pad = [&](std::int64_t n) { return (n + unit - 1) / unit * unit; };
  groups_.clear();
  if (kind_ == OptimizerKind::onebit_lamb) {
    // One flat buffer of every tensor's momentum, in order (DeepSpeed's exp_avg_flat).
    CommGroup g;
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      tensors_[t].group = 0;
      tensors_[t].offset = g.numel;
      g.tensors.push_back(static_cast<std::int32_t>(t));
      g.numel += tensors_[t].numel;
    }
    groups_.push_back(std::move(g));
  } else {
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      CommGroup g;
      g.tensors = {static_cast<std::int32_t>(t)};
      g.numel = tensors_[t].numel;
      tensors_[t].group = groups_.size();
      tensors_[t].offset = 0;
      groups_.push_back(std::move(g));
    }
  }
  std::int64_t largest = 0;
  for (CommGroup& g : groups_) {
    g.padded = pad(std::max<std::int64_t>(g.numel, 1));
    g.buf.allocate(allocator_, g.padded);
    g.worker_error.allocate(allocator_, g.padded);
    g.server_error.allocate(allocator_, g.padded / world_);
    largest = std::max(largest, g.padded);
  }
  reset_errors();
  if (comm_ != nullptr && world_ > 1 && allocator_.device().is_cuda()) {
    // NCCL communicates device memory: the bits go through a workspace on the training device.
    workspace_ = Buffer(allocator_, static_cast<std::size_t>(comm_->compressed_workspace_numel(largest)) * 4, MemoryPurpose::buffers);
  }
}

void OneBitOptimizer::reset_errors() {
  for (CommGroup& g : groups_) {
    g.worker_error.zero();
    g.server_error.zero();
  }
}

void OneBitOptimizer::communicate() {
  for (CommGroup& g : groups_) {
    // The padding is zero on every call (DeepSpeed concatenates fresh zeros).
    std::fill(g.buf.data() + g.numel, g.buf.data() + g.padded, 0.0f);
    Tensor ws;
    if (!workspace_.empty()) ws = workspace_.tensor(DType::int32, Shape{comm_->compressed_workspace_numel(g.padded)});
    comm_->compressed_all_reduce(Tensor(g.buf.data(), DType::fp32, Shape{g.padded}), Tensor(g.worker_error.data(), DType::fp32, Shape{g.padded}),
                                 Tensor(g.server_error.data(), DType::fp32, Shape{g.padded / world_}), ws);
  }
}

void OneBitOptimizer::step(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t) {
  if (groups_.empty()) build_groups(partition);
  switch (kind_) {
    case OptimizerKind::onebit_adam:
      step_onebit_adam(partition, lr, grad_scale, t);
      break;
    case OptimizerKind::zero_one_adam:
      step_zero_one_adam(partition, lr, grad_scale, t);
      break;
    default:
      step_onebit_lamb(partition, lr, grad_scale, t);
      break;
  }
}

// deepspeed/runtime/fp16/onebit/adam.py OnebitAdam.step. No bias correction and eps outside the
// square root whatever the config says (DeepSpeed reads bias_correction and eps_inside_sqrt but
// does not use them); weight decay is added to the update (decoupled, times lr).
void OneBitOptimizer::step_onebit_adam(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t) {
  if (!initialized_) {
    // The initialization step: DeepSpeed allocates the error buffers and compresses the (zero)
    // momentum, which changes nothing; no parameter moves and the gradients are dropped.
    initialized_ = true;
    return;
  }
  const float b1 = static_cast<float>(p_.betas.first), b2 = static_cast<float>(p_.betas.second);
  const float eps = static_cast<float>(p_.eps), flr = static_cast<float>(lr), wd = static_cast<float>(p_.weight_decay);
  auto apply = [&](const OptimizerSegment& s, float* p, const float* m, const float* v, std::int64_t i) {
    float update = m[i] / (std::sqrt(v[i]) + eps);
    if (s.weight_decay && wd > 0.0f) update += wd * p[i];
    p[i] = p[i] + -flr * update;
  };
  if (!frozen_) {
    visit(partition, 2, true, [&](const OptimizerSegment& s, HostSegment& h, const TensorPiece& piece) {
      float *p = h.master(), *m = h.state(0), *v = h.state(1);
      const float* g = h.grads();
      for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) {
        const float gi = g[i] * grad_scale;
        m[i] = m[i] * b1 + (1.0f - b1) * gi;
        v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
        apply(s, p, m, v, i);
      }
    });
    if (t >= ob_.freeze_step) {
      frozen_ = true;  // "OnebitAdam - starting compressed communication"
      gradient_all_reduce_ = false;
    }
    return;
  }
  // Compressed phase: the momentum of the local gradient, averaged through the 1-bit all-reduce,
  // with the variance frozen.
  visit(partition, 2, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
    float* m = h.state(0);
    const float* g = h.grads();
    float* out = staging(piece.tensor) + piece.tensor_offset;
    for (std::int64_t i = 0; i < piece.numel; ++i) {
      const std::int64_t k = piece.offset + i;
      m[k] = m[k] * b1 + (1.0f - b1) * (g[k] * grad_scale);
      out[i] = m[k];
    }
  });
  if (world_ > 1) {
    communicate();
    visit(partition, 2, true, [&](const OptimizerSegment& s, HostSegment& h, const TensorPiece& piece) {
      float *p = h.master(), *m = h.state(0), *v = h.state(1);
      const float* in = staging(piece.tensor) + piece.tensor_offset;
      for (std::int64_t i = 0; i < piece.numel; ++i) {
        const std::int64_t k = piece.offset + i;
        m[k] = in[i];
        apply(s, p, m, v, k);
      }
    });
  } else {
    visit(partition, 2, true, [&](const OptimizerSegment& s, HostSegment& h, const TensorPiece& piece) {
      for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) apply(s, h.master(), h.state(0), h.state(1), k);
    });
  }
}

// deepspeed/runtime/fp16/onebit/zoadam.py ZeroOneAdam.step: adaptive variance updates (the interval
// between full-precision steps doubles every var_update_scaler updates; between them the momentum
// takes the 1-bit averaged gradient), then after var_freeze_step local steps whose accumulated
// update is synchronised through the 1-bit all-reduce every local_step_interval steps.
void OneBitOptimizer::step_zero_one_adam(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t) {
  if (!initialized_) {
    initialized_ = true;  // the initialization step (see step_onebit_adam)
    return;
  }
  if (!counters_ready_) {
    // DeepSpeed re-creates the per-tensor scalars and buffers at the first real step.
    counters_ready_ = true;
    var_interval_ = 1;
    var_counter_ = 0;
    local_step_interval_ = 1;
    local_step_counter_ = 0;
    lrs_ = 0.0;
    reset_errors();
  }
  const float b1 = static_cast<float>(p_.betas.first), b2 = static_cast<float>(p_.betas.second);
  const float eps = static_cast<float>(p_.eps), flr = static_cast<float>(lr), wd = static_cast<float>(p_.weight_decay);
  const bool frozen = frozen_;
  if (!frozen) {
    if (t % var_interval_ == 0) {
      visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
        float *m = h.state(0), *v = h.state(1);
        const float* g = h.grads();
        for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) {
          const float gi = g[k] * grad_scale;
          v[k] = v[k] * b2 + (1.0f - b2) * gi * gi;
          m[k] = m[k] * b1 + (1.0f - b1) * gi;
        }
      });
    } else if (world_ > 1) {
      // The local gradient, averaged through the 1-bit all-reduce, into the momentum only.
      visit(partition, 3, false, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
        const float* g = h.grads() + piece.offset;
        float* out = staging(piece.tensor) + piece.tensor_offset;
        for (std::int64_t i = 0; i < piece.numel; ++i) out[i] = g[i] * grad_scale;
      });
      communicate();
      visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
        float* m = h.state(0);
        const float* in = staging(piece.tensor) + piece.tensor_offset;
        for (std::int64_t i = 0; i < piece.numel; ++i) m[piece.offset + i] = m[piece.offset + i] * b1 + (1.0f - b1) * in[i];
      });
    }
  } else {
    visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
      float* m = h.state(0);
      const float* g = h.grads();
      for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) m[k] = m[k] * b1 + (1.0f - b1) * (g[k] * grad_scale);
    });
    lrs_ += lr;
  }
  // The update; in the frozen phase it is also accumulated in momentum_accumulator (u).
  visit(partition, 3, true, [&](const OptimizerSegment& s, HostSegment& h, const TensorPiece& piece) {
    float *p = h.master(), *m = h.state(0), *v = h.state(1), *u = h.state(2);
    for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) {
      float update = m[k] / (std::sqrt(v[k]) + eps);
      if (s.weight_decay && wd > 0.0f) update += wd * p[k];
      p[k] = p[k] + -flr * update;
      if (frozen) u[k] = u[k] + -flr * update;
    }
  });
  if (frozen && t % local_step_interval_ == 0) {
    // Synchronise: undo the local steps, exchange the accumulated update (scaled back to momentum
    // units by the frozen denominator) through the 1-bit all-reduce, apply the average.
    visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
      float *p = h.master(), *v = h.state(1), *u = h.state(2);
      float* out = staging(piece.tensor) + piece.tensor_offset;
      for (std::int64_t i = 0; i < piece.numel; ++i) {
        const std::int64_t k = piece.offset + i;
        p[k] = p[k] + -1.0f * u[k];
        u[k] = u[k] * (std::sqrt(v[k]) + eps);
        out[i] = u[k];
      }
    });
    if (world_ > 1) communicate();
    const float flrs = static_cast<float>(lrs_);
    visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
      float *p = h.master(), *m = h.state(0), *v = h.state(1), *u = h.state(2);
      const float* in = staging(piece.tensor) + piece.tensor_offset;
      for (std::int64_t i = 0; i < piece.numel; ++i) {
        const std::int64_t k = piece.offset + i;
        u[k] = in[i];
        m[k] = 0.0f + -1.0f * (u[k] / flrs);
        p[k] = p[k] + u[k] / (std::sqrt(v[k]) + eps);
        u[k] = 0.0f;
      }
    });
    lrs_ = 0.0;
  }
  if (!frozen) {
    if (t % var_interval_ == 0) {
      var_counter_ += 1;
      if (var_counter_ == ob_.var_update_scaler) {
        var_counter_ = 0;
        var_interval_ *= 2;
      }
    }
    gradient_all_reduce_ = (t + 1) % var_interval_ == 0;
  } else {
    local_step_counter_ += 1;
    if (local_step_counter_ == ob_.local_step_scaler) {
      local_step_counter_ = 0;
      local_step_interval_ = std::min(ob_.local_step_clipper, local_step_interval_ * 2);
    }
  }
  if (t > ob_.var_freeze_step) {
    frozen_ = true;
    gradient_all_reduce_ = false;
  }
  if (frozen_ && !errors_reset_) {
    // The errors now feed back a different quantity (accumulated updates, not gradients).
    reset_errors();
    errors_reset_ = true;
  }
}

// deepspeed/runtime/fp16/onebit/lamb.py OnebitLamb.step. Warm-up: LAMB with per-tensor trust
// ratios (no bias correction), whose running average lamb_coeff_freeze is kept; compressed phase:
// the momentum of the local gradient, scaled per tensor to a common magnitude (scaling_coeff,
// fixed at the first compressed step), averaged through one 1-bit all-reduce of the flat
// momentum, and the frozen ratio corrected by the factor between the frozen and a fresh variance.
void OneBitOptimizer::step_onebit_lamb(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t) {
  if (!initialized_) {
    initialized_ = true;  // the initialization step (see step_onebit_adam)
    return;
  }
  const std::size_t nt = tensors_.size();
  if (lamb_coeff_freeze_.size() != nt) {
    lamb_coeff_freeze_.assign(nt, 0.0);
    last_factor_.assign(nt, 1.0);
  }
  const float b1 = static_cast<float>(p_.betas.first), b2 = static_cast<float>(p_.betas.second);
  const float eps = static_cast<float>(p_.eps), wd = static_cast<float>(p_.weight_decay);
  const double max_coeff = p_.max_coeff, min_coeff = p_.min_coeff;
  lamb_coeffs_.assign(nt, 1.0f);
  auto tensor_wd = [&](std::int32_t tensor) { return tensors_[static_cast<std::size_t>(tensor)].weight_decay && wd > 0.0f; };
  std::vector<double> a(nt, 0.0), b(nt, 0.0), c(nt, 0.0);  // per-tensor sums of squares / maxima
  if (!frozen_) {
    visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
      float *p = h.master(), *m = h.state(0), *v = h.state(1), *vf = h.state(2);
      const float* g = h.grads();
      const bool decay = tensor_wd(piece.tensor);
      for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) {
        const float gi = g[k] * grad_scale;
        m[k] = m[k] * b1 + (1.0f - b1) * gi;
        v[k] = v[k] * b2 + (1.0f - b2) * gi * gi;
        if (t == ob_.freeze_step) vf[k] = v[k];
        float update = m[k] / (std::sqrt(v[k]) + eps);
        if (decay) update += wd * p[k];
        a[static_cast<std::size_t>(piece.tensor)] += static_cast<double>(p[k]) * p[k];
        b[static_cast<std::size_t>(piece.tensor)] += static_cast<double>(update) * update;
      }
    });
    partition.all_reduce_sum(a);  // one rank at stage 0: unchanged
    partition.all_reduce_sum(b);
    for (std::size_t k = 0; k < nt; ++k) {
      const float weight_norm = static_cast<float>(std::sqrt(a[k])), update_norm = static_cast<float>(std::sqrt(b[k]));
      double coeff = 1.0;
      if (weight_norm != 0.0f && update_norm != 0.0f) coeff = std::clamp(static_cast<double>(weight_norm / update_norm), min_coeff, max_coeff);
      if (coeff != 1.0) lamb_coeff_freeze_[k] = ob_.coeff_beta * lamb_coeff_freeze_[k] + (1.0 - ob_.coeff_beta) * coeff;
      lamb_coeffs_[k] = static_cast<float>(coeff);
    }
    visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
      float *p = h.master(), *m = h.state(0), *v = h.state(1);
      const bool decay = tensor_wd(piece.tensor);
      const float step = static_cast<float>(lr) * lamb_coeffs_[static_cast<std::size_t>(piece.tensor)];
      for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) {
        float update = m[k] / (std::sqrt(v[k]) + eps);
        if (decay) update += wd * p[k];
        p[k] = p[k] + -step * update;
      }
    });
    if (t >= ob_.freeze_step) {
      frozen_ = true;  // "OnebitLamb - starting compressed communication"
      gradient_all_reduce_ = false;
    }
    return;
  }
  CommGroup& group = groups_[0];
  if (scaling_coeff_.size() != nt) {
    // First compressed step: each tensor's momentum scaled to the mean RMS over the tensors.
    visit(partition, 3, false, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
      const float* m = h.state(0);
      for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k)
        a[static_cast<std::size_t>(piece.tensor)] += static_cast<double>(m[k]) * m[k];
    });
    std::vector<double> scales(nt);
    double united = 0.0;
    for (std::size_t k = 0; k < nt; ++k) {
      scales[k] = static_cast<double>(static_cast<float>(std::sqrt(a[k]))) / std::sqrt(static_cast<double>(tensors_[k].numel));
      united += scales[k];
    }
    united /= static_cast<double>(nt);
    scaling_coeff_.resize(nt);
    for (std::size_t k = 0; k < nt; ++k) scaling_coeff_[k] = united / scales[k];
    std::fill(a.begin(), a.end(), 0.0);
  }
  if (last_momentum_.size() != group.padded) last_momentum_.allocate(allocator_, group.padded);
  visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
    float* m = h.state(0);
    const float* g = h.grads();
    const float sc = static_cast<float>(scaling_coeff_[static_cast<std::size_t>(piece.tensor)]);
    float* out = staging(piece.tensor) + piece.tensor_offset;
    float* last = last_momentum_.data() + tensors_[static_cast<std::size_t>(piece.tensor)].offset + piece.tensor_offset;
    for (std::int64_t i = 0; i < piece.numel; ++i) {
      const std::int64_t k = piece.offset + i;
      last[i] = m[k];
      m[k] = (m[k] * b1 + (1.0f - b1) * (g[k] * grad_scale)) * sc;
      out[i] = m[k];
    }
  });
  if (world_ > 1) communicate();
  // a: ‖update‖², b: ‖update_prelim‖², c: max(denom / denom_real).
  visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
    float *p = h.master(), *m = h.state(0), *v = h.state(1), *vf = h.state(2);
    const std::size_t tk = static_cast<std::size_t>(piece.tensor);
    const float sc = static_cast<float>(scaling_coeff_[tk]);
    const float* in = staging(piece.tensor) + piece.tensor_offset;
    const float* last = last_momentum_.data() + tensors_[tk].offset + piece.tensor_offset;
    const bool decay = tensor_wd(piece.tensor);
    for (std::int64_t i = 0; i < piece.numel; ++i) {
      const std::int64_t k = piece.offset + i;
      m[k] = in[i] / sc;
      const float gr = (m[k] - last[i] * b1) / (1.0f - b1);
      vf[k] = vf[k] * b2 + (1.0f - b2) * gr * gr;
      const float denom = std::sqrt(v[k]) + eps;
      const float prelim = m[k] / denom;
      const float update = decay ? prelim + wd * p[k] : prelim;
      a[tk] += static_cast<double>(update) * update;
      b[tk] += static_cast<double>(prelim) * prelim;
      c[tk] = std::max(c[tk], static_cast<double>(denom / (std::sqrt(vf[k]) + eps)));
    }
  });
  for (std::size_t k = 0; k < nt; ++k) {
    double factor = static_cast<float>(c[k]);
    if (tensors_[k].weight_decay && wd > 0.0f) {
      const double ratio = std::min(1.0, static_cast<double>(static_cast<float>(std::sqrt(b[k])) / static_cast<float>(std::sqrt(a[k]))));
      factor = factor * ratio + (1.0 - ratio);
    }
    factor = std::min(factor, ob_.factor_max);
    factor = std::max(factor, ob_.factor_min);
    factor = std::min(factor, last_factor_[k] * (1.0 + ob_.factor_threshold));
    factor = std::max(factor, last_factor_[k] * (1.0 - ob_.factor_threshold));
    last_factor_[k] = factor;
    lamb_coeffs_[k] = static_cast<float>(lamb_coeff_freeze_[k] * factor);
  }
  visit(partition, 3, true, [&](const OptimizerSegment&, HostSegment& h, const TensorPiece& piece) {
    float *p = h.master(), *m = h.state(0), *v = h.state(1);
    const bool decay = tensor_wd(piece.tensor);
    const float step = static_cast<float>(lr) * lamb_coeffs_[static_cast<std::size_t>(piece.tensor)];
    for (std::int64_t k = piece.offset; k < piece.offset + piece.numel; ++k) {
      const float prelim = m[k] / (std::sqrt(v[k]) + eps);
      const float update = decay ? prelim + wd * p[k] : prelim;
      p[k] = p[k] + -step * update;
    }
  });
}

nlohmann::json OneBitOptimizer::state() const {
  nlohmann::json j{{"initialized", initialized_},
                   {"frozen", frozen_},
                   {"gradient_all_reduce", gradient_all_reduce_},
                   {"counters_ready", counters_ready_},
                   {"errors_reset", errors_reset_},
                   {"var_interval", var_interval_},
                   {"var_counter", var_counter_},
                   {"local_step_interval", local_step_interval_},
                   {"local_step_counter", local_step_counter_},
                   {"lrs", lrs_},
                   {"lamb_coeff_freeze", lamb_coeff_freeze_},
                   {"last_factor", last_factor_},
                   {"scaling_coeff", scaling_coeff_}};
  return j;
}

OneBitOptimizer::SavedState OneBitOptimizer::parse_state(const nlohmann::json& j) {
  SavedState s;
  s.initialized = j.at("initialized").get<bool>();
  s.frozen = j.at("frozen").get<bool>();
  s.gradient_all_reduce = j.at("gradient_all_reduce").get<bool>();
  s.counters_ready = j.at("counters_ready").get<bool>();
  s.errors_reset = j.at("errors_reset").get<bool>();
  s.var_interval = j.at("var_interval").get<std::int64_t>();
  s.var_counter = j.at("var_counter").get<std::int64_t>();
  s.local_step_interval = j.at("local_step_interval").get<std::int64_t>();
  s.local_step_counter = j.at("local_step_counter").get<std::int64_t>();
  s.lrs = j.at("lrs").get<double>();
  s.lamb_coeff_freeze = j.at("lamb_coeff_freeze").get<std::vector<double>>();
  s.last_factor = j.at("last_factor").get<std::vector<double>>();
  s.scaling_coeff = j.at("scaling_coeff").get<std::vector<double>>();
  return s;
}

void OneBitOptimizer::load_state(const SavedState& s) {
  initialized_ = s.initialized;
  frozen_ = s.frozen;
  gradient_all_reduce_ = s.gradient_all_reduce;
  counters_ready_ = s.counters_ready;
  errors_reset_ = s.errors_reset;
  var_interval_ = s.var_interval;
  var_counter_ = s.var_counter;
  local_step_interval_ = s.local_step_interval;
  local_step_counter_ = s.local_step_counter;
  lrs_ = s.lrs;
  lamb_coeff_freeze_ = s.lamb_coeff_freeze;
  last_factor_ = s.last_factor;
  scaling_coeff_ = s.scaling_coeff;
  // DeepSpeed resets the compression errors when a checkpoint is loaded (they are per rank and per
  // world size); so does dstrain.
  reset_errors();
}

}  // namespace dstrain
