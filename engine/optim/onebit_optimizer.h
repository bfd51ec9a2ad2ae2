// OneBitOptimizer: DeepSpeed's communication-compressing optimizers — "OneBitAdam" (1-bit Adam),
// "ZeroOneAdam" (0/1 Adam) and "OneBitLamb" (1-bit LAMB), deepspeed/runtime/fp16/onebit/ — on a
// rank's ZeRO-0 partition (the whole model), with the compressed all-reduce of the Communicator
// (zero/communicator.h). docs/optimizers_onebit.md is the specification: the steps, what is
// communicated when, and where the engine's gradient all-reduce is switched off.
//
// Each step:
//   step(partition, lr, grad_scale, t)   t: DeepSpeed's state['step'] (1-based, applied steps)
//   gradient_all_reduce()                whether the NEXT backward must all-reduce the gradients
//                                        (DeepSpeed's engine.enable_backward_allreduce); false:
//                                        the grads each rank holds are its own
// The per-element states (state_names()) live in the partition's StateStore; the error-feedback
// buffers are per rank and per world size and live here (DeepSpeed resets them when a checkpoint
// is loaded, and so does load_state()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config_schema/optimizer_config.h"
#include "ops/allocator.h"
#include "ops/buffer.h"
#include "zero/communicator.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

// fp32 host memory of the optimizer's own buffers: from the engine's allocator when that is the
// host's (so it is counted as optimizer memory), else plain host memory (a GPU engine).
class HostFloats {
 public:
  void allocate(Allocator& allocator, std::int64_t n);  // zeroed
  float* data() const { return ptr_; }
  std::int64_t size() const { return n_; }
  void zero();

 private:
  Buffer buffer_;
  std::vector<float> vec_;
  float* ptr_ = nullptr;
  std::int64_t n_ = 0;
};

class OneBitOptimizer {
 public:
  // comm: the data-parallel group (nullptr: one rank). allocator: where the NCCL workspace of the
  // compressed all-reduce lives (the training device's). Throws Error for a config DeepSpeed refuses.
  OneBitOptimizer(const config::OptimizerConfig& config, Communicator* comm, Allocator& allocator);

  // exp_avg, exp_avg_sq (+ momentum_accumulator for 0/1 Adam, exp_avg_sq_fresh for 1-bit LAMB).
  static std::vector<std::string> state_names(config::OptimizerKind kind);

  void step(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t);
  bool gradient_all_reduce() const { return gradient_all_reduce_; }
  // true once the compressed phase has begun (1-bit Adam / LAMB: after freeze_step; 0/1 Adam: after
  // var_freeze_step).
  bool frozen() const { return frozen_; }
  // The trust ratios of the last 1-bit LAMB step, one per tensor in tensor order (DeepSpeed's lamb_coeffs).
  const std::vector<float>& lamb_coeffs() const { return lamb_coeffs_; }

  // The scalars (phase, counters, 1-bit LAMB's per-tensor coefficients), for checkpoints. Loading
  // is in two parts so that a malformed checkpoint is refused before anything changes:
  // parse_state reads and type-checks (json's exceptions), load_state only assigns.
  struct SavedState {
    bool initialized = false, frozen = false, gradient_all_reduce = true, counters_ready = false, errors_reset = false;
    std::int64_t var_interval = 0, var_counter = 0, local_step_interval = 0, local_step_counter = 0;
    double lrs = 0.0;
    std::vector<double> lamb_coeff_freeze, last_factor, scaling_coeff;
  };
  nlohmann::json state() const;
  static SavedState parse_state(const nlohmann::json& j);
  void load_state(const SavedState& s);

 private:
  // One compressed all-reduce unit: 1-bit / 0/1 Adam one per tensor, 1-bit LAMB one for the model.
  // `offset[k]` places tensor tensors[k] in the unit's flat buffer; n padded to W·lcm(W, 8).
  struct CommGroup {
    std::vector<std::int32_t> tensors;
    std::int64_t numel = 0, padded = 0;
    HostFloats buf, worker_error, server_error;
  };
  struct TensorSlot {
    std::int64_t numel = 0;
    bool weight_decay = true;
    std::size_t group = 0;
    std::int64_t offset = 0;  // in the group's buffer
  };
  void build_groups(OptimizerPartition& partition);
  void reset_errors();
  // Compressed all-reduce of every group's buf (W > 1).
  void communicate();
  float* staging(std::int32_t tensor) {
    return groups_[tensors_[static_cast<std::size_t>(tensor)].group].buf.data() + tensors_[static_cast<std::size_t>(tensor)].offset;
  }

  void step_onebit_adam(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t);
  void step_zero_one_adam(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t);
  void step_onebit_lamb(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t);

  config::OptimizerKind kind_;
  config::OptimizerParams p_;
  config::OneBitParams ob_;
  Communicator* comm_;
  Allocator& allocator_;
  int world_ = 1;
  std::vector<CommGroup> groups_;
  std::vector<TensorSlot> tensors_;
  Buffer workspace_;  // device training: the bits' path for the compressed all-reduce

  bool initialized_ = false;  // DeepSpeed's `initialize`: the first step only sets up
  bool frozen_ = false;       // adam_freeze_key / freeze_key / lamb_freeze_key
  bool gradient_all_reduce_ = true;
  // 0/1 Adam's counters (the same for every tensor in DeepSpeed's per-tensor state).
  bool counters_ready_ = false, errors_reset_ = false;
  std::int64_t var_interval_ = 1, var_counter_ = 0, local_step_interval_ = 1, local_step_counter_ = 0;
  double lrs_ = 0.0;
  // 1-bit LAMB, per tensor.
  std::vector<double> lamb_coeff_freeze_, last_factor_, scaling_coeff_;
  std::vector<float> lamb_coeffs_;
  HostFloats last_momentum_;  // 1-bit LAMB: the momentum before this step, in the group's layout
};

}  // namespace dstrain
