// A whole training state given in memory — every parameter's whole fp32 master and optimizer
// states by dstrain's parameter names, the optimizer step, the counters, the loss scaler and the LR
// schedule's position — loaded into an engine at any world size, ZeRO stage, tensor-parallel,
// expert-parallel and pipeline layout, each rank taking its owned pieces' runs of the whole tensors
// (CheckpointManager::load_whole_state). This is how a run DeepSpeed saved resumes
// (engine/checkpoint/deepspeed_resume.h maps a DeepSpeed checkpoint onto one; docs/checkpoints.md
// "Resuming a DeepSpeed checkpoint"), and how any other whole state would.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/loss_scaler.h"

namespace dstrain {

struct WholeTrainingState {
  // What it came from, for messages: "DeepSpeed checkpoint /runs/x/global_step100".
  std::string source = "whole training state";
  // Every parameter of the whole model (CheckpointManager's whole_params: the untied ones, at whole
  // shapes), row-major, by dstrain name. Exactly these names: a missing or extra one is an Error.
  std::map<std::string, std::vector<float>> masters;
  // Optimizer state name (Optimizer::state_names(): "exp_avg", "exp_avg_sq", ...) -> parameter ->
  // whole values, for every state of the engine's optimizer. Empty: the optimizer starts fresh
  // (zero states, step counted from global_steps - skipped_steps as always).
  std::map<std::string, std::map<std::string, std::vector<float>>> states;
  // The optimizer's own step count where the source has one (torch's state["step"]): must be
  // global_steps - skipped_steps, which is what dstrain's bias corrections count.
  std::optional<std::int64_t> optimizer_step;
  std::int64_t global_steps = 0, global_samples = 0, skipped_steps = 0;
  // The dynamic fp16 loss scale's state; nullopt: the engine's scaler is left as it is.
  std::optional<LossScalerState> loss_scaler;
  // The LR schedule's last_batch_iteration (LrSchedule::set_last_batch_iteration); nullopt: left.
  std::optional<std::int64_t> lr_last_batch_iteration;
};

// The numbers of elements of a whole parameter of shape `shape`.
std::int64_t whole_numel(const std::vector<std::int64_t>& shape);

}  // namespace dstrain
