// The 1-bit optimizers' constructor arguments (DeepSpeed's OnebitAdam, ZeroOneAdam, OnebitLamb in
// deepspeed/runtime/fp16/onebit/), with DeepSpeed's defaults. The Adam/Lamb ones they share
// (lr, betas, eps, weight_decay, bias_correction, eps_inside_sqrt, max_coeff, min_coeff) stay in
// OptimizerParams. docs/optimizers_onebit.md says what each does.
#pragma once

#include <cstdint>
#include <string>

namespace dstrain::config {

struct OneBitParams {
  std::int64_t freeze_step = 100000;       // OneBitAdam, OneBitLamb: full-precision warm-up steps
  std::string comm_backend_name = "nccl";  // nccl, mpi, hccl or compressed (all: the engine's communicator)
  bool cuda_aware = false;                 // MPI only: CUDA-aware MPI
  std::int64_t var_freeze_step = 100000;   // ZeroOneAdam: steps before the variance freezes
  std::int64_t var_update_scaler = 16;     // ZeroOneAdam: variance updates before their interval doubles
  std::int64_t local_step_scaler = 32678;  // ZeroOneAdam: local steps before their interval doubles
  std::int64_t local_step_clipper = 16;    // ZeroOneAdam: the largest local-step interval
  double coeff_beta = 0.9;                 // OneBitLamb: EMA of the warm-up's trust ratios
  double factor_max = 4.0;                 // OneBitLamb: clamp of the frozen ratio's factor
  double factor_min = 0.5;
  double factor_threshold = 0.1;  // OneBitLamb: the factor's largest change per step
};

}  // namespace dstrain::config
