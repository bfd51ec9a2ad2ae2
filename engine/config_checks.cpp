#include "engine/config_checks.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "engine/engine.h"
#include "engine/optim/optimizer.h"
#include "offload/swap_folder.h"
#include "ops/error.h"
#include "ops/log.h"
#include "zero/model_states.h"

namespace dstrain {

// ZeRO++ and MiCS at stage 3 (docs/zero.md §10): what DeepSpeed refuses, and what cannot mean
// anything, before step 1. (Below stage 3 the config layer warns that they are ignored.)
static void check_zeropp(const config::DsConfig& c, const config::StatePlacement& placement, int world_size) {
  const auto& z = c.zero_optimization;
  if (z.stage != 3) return;
  const bool zeropp = z.zero_quantized_weights || z.zero_hpz_partition_size > 1 || z.zero_quantized_gradients || z.mics_shard_size > 0;
  if (zeropp && c.expert_parallel.ep_size() > 1) {
    fail(
        "zero_optimization's ZeRO++ / MiCS keys with expert_parallel.autoep_size {}: the experts' parameters are partitioned over their "
        "expert-data-parallel group (world / autoep_size ranks), for which dstrain builds neither ZeRO++'s node hierarchy nor MiCS's "
        "shard groups. Fix: drop zero_quantized_weights / zero_hpz_partition_size / zero_quantized_gradients / mics_shard_size, or "
        "expert parallelism",
        c.expert_parallel.ep_size());
  }
  if (z.zero_quantized_gradients && !z.reduce_scatter) {
    fail(
        "zero_optimization.zero_quantized_gradients with reduce_scatter: false — qgZ is a reduce-scatter (DeepSpeed runs it in "
        "__avg_scatter_grads, its reduce-scatter path), and reduce_scatter: false asks for an all-reduce instead. Fix: drop "
        "reduce_scatter: false, or zero_quantized_gradients");
  }
  if (z.zero_quantized_gradients && c.communication_data_type) {
    fail(
        "communication_data_type \"{}\" with zero_optimization.zero_quantized_gradients — qgZ sends the gradients as int4 blocks and sums "
        "them in fp32, so there is no communication dtype to choose. Fix: remove communication_data_type, or zero_quantized_gradients",
        *c.communication_data_type);
  }
  const ZeroppGroupSizes sizes = zeropp_group_sizes(world_size, z.mics_shard_size, z.zero_hpz_partition_size);
  if (sizes.shard < world_size && placement.optimizer != StateHome::device) {
    fail(
        "zero_optimization.mics_shard_size {} with offload_optimizer — MiCS averages each partition's gradients across its {} replicas "
        "on the training device, and DeepSpeed refuses the offloaded case (\"Local sharding has no support for CPU offloading\"). "
        "Fix: remove offload_optimizer, or mics_shard_size",
        z.mics_shard_size, world_size / sizes.shard);
  }
}

// What this build trains: CPU or CUDA, fp32 / fp16 / bf16, ZeRO stages 0-3 on the ranks of the
// communicator, optimizer offload to host memory or NVMe, parameter offload at stage 3 (activation checkpointing,
// cpu_checkpointing included, is provided; partition_activations only warns). Anything else is refused up front, naming the key, rather
// than trained differently from what the config asks.
void check_config_is_provided(const config::DsConfig& c, int world_size) {
  if (c.fp16.enabled && c.bf16.enabled) fail("fp16.enabled and bf16.enabled are both true; DeepSpeed refuses this too — enable at most one of them");
  if (c.optimizer.kind == config::OptimizerKind::lamb && c.fp16.enabled && !c.fp16.dynamic()) {
    fail("optimizer.type \"Lamb\" with fp16.loss_scale: {} — DeepSpeed's Lamb needs dynamic loss scaling; set \"loss_scale\": 0", c.fp16.loss_scale);
  }
  // DeepSpeed's ZeRO optimizers refuse Muon with reduce_scatter (on by default) at stage 3
  // (stage3.py), and with reduce_scatter and optimizer offload at stages 1-2 (stage_1_and_2.py).
  const config::StatePlacement placement = c.placement();
  if (c.optimizer.kind == config::OptimizerKind::muon && c.zero_optimization.reduce_scatter) {
    if (c.zero_optimization.stage == 3) {
      fail(
          "optimizer.type {} with zero_optimization.stage 3 and reduce_scatter true: Muon and reduce scatter cannot be used together "
          "(DeepSpeed's ZeRO-3 optimizer raises this ValueError); set zero_optimization.reduce_scatter to false",
          c.optimizer.type);
    }
    if (placement.optimizer != StateHome::device) {  // stages 1-2 here
      fail(
          "optimizer.type {} with zero_optimization.stage {}, reduce_scatter true and offload_optimizer: Muon with reduce scatter does "
          "not support optimizer offload because offload retains only partition slices (DeepSpeed's ZeRO-1/2 optimizer raises this "
          "ValueError); disable reduce scatter (zero_optimization.reduce_scatter: false) or optimizer offload",
          c.optimizer.type, c.zero_optimization.stage);
    }
  }
  if (c.amp.enabled) fail("amp.enabled: true — NVIDIA Apex AMP is not part of dstrain; remove the \"amp\" block");
  if (c.zero_optimization.stage < 0 || c.zero_optimization.stage > 3)
    fail("zero_optimization.stage: {} — ZeRO has stages 0 to 3", c.zero_optimization.stage);
  // Offload below the stage it belongs to is ignored, as DeepSpeed ignores it, not refused: real
  // configs carry it (DeepSpeed-Chat's and OpenRLHF's builders set offload_param at stage 2). Where
  // each partition lives is the placement's to say (config_schema/state_placement.h).
  // Partial offload (ratio < 1; stage 3 only, which the config layer enforces as DeepSpeed does):
  // DeepSpeed's twin-flow pairs its CPU Adam with a device AdamW and asserts the optimizer is
  // DeepSpeedCPUAdam ("Hybrid Optimizer Only Supports DeepSpeedCPUAdam"), i.e. Adam or AdamW.
  if (placement.optimizer != StateHome::device && placement.offload_ratio < 1.0 && c.optimizer.present() &&
      c.optimizer.kind != config::OptimizerKind::adam && c.optimizer.kind != config::OptimizerKind::adamw) {
    fail(
        "zero_optimization.offload_optimizer.ratio: {} with optimizer.type \"{}\" — partial offload runs Adam on both shares "
        "(DeepSpeed asserts \"Hybrid Optimizer Only Supports DeepSpeedCPUAdam\"); use Adam or AdamW, or set ratio to 1.0",
        placement.offload_ratio, c.optimizer.type);
  }
  check_zeropp(c, placement, world_size);
  if (!c.managed_gradient_accumulation) {
    fail(
        "managed_gradient_accumulation: false — the client would decide the accumulation boundary, but this engine's step() "
        "steps every gradient_accumulation_steps micro-batches; remove the key (or set it to true)");
  }
  if (c.data_parallel_world_size != world_size) {
    fail(
        "the config was resolved for a data-parallel world size of {} but the engine's communicator has {} rank(s); resolve it for {} "
        "(dstrain check-config --world-size {}, or dstrain train --num-ranks {})",
        c.data_parallel_world_size, world_size, world_size, world_size, c.data_parallel_world_size);
  }
  if (!(c.gradient_clipping >= 0.0) && !(c.gradient_clipping <= 0.0))
    fail("gradient_clipping: {} is not a number; give a max norm >= 0", c.gradient_clipping);
}

void check_group_backend(const Device& device, std::string_view backend, std::string_view subject, std::string_view moves,
                         std::string_view group) {
  if (device.is_cuda() && (backend == "mpi" || backend == "gloo")) {
    fail("{} on {} over the {} backend: {} in device memory, and it communicates host memory only; make {} with the nccl backend "
         "(one process per GPU) or the local backend (ranks sharing the GPU), or train on the CPU",
         subject, device.str(), backend, moves, group);
  }
  if (!device.is_cuda() && backend == "nccl") {
    fail("{} on {} over the nccl backend: NCCL communicates GPU memory only; train on the GPU (--device cuda), or make {} with the local, mpi "
         "or gloo backend",
         subject, device.str(), group);
  }
}

void check_tensor_parallel_engine(const config::DsConfig& config, const Device& device, int tp_ranks, std::string_view tp_backend) {
  if (tp_ranks <= 1) return;
  using config::OptimizerKind;
  const OptimizerKind k = config.optimizer.kind;
  // Lamb, Muon and Adafactor read each weight matrix whole; they sum (or gather) the pieces over the
  // tensor-parallel group (engine/optim/tensor_cut.h) and train as one rank. The 1-bit family runs
  // as DeepSpeed runs it with a model-parallel unit (deepspeed/runtime/comm/nccl.py: NcclBackend(mpu)
  // compresses over mpu.get_data_parallel_group()): its compressed exchange is over the data group,
  // on the tensors a rank holds — a cut tensor's piece, with the piece's scales (docs/parallelism.md §4).
  if (device.is_cuda() && (k == OptimizerKind::lamb || k == OptimizerKind::muon || k == OptimizerKind::adafactor)) {
    fail("optimizer.type \"{}\" with tensor parallelism ({} ranks) on {}: its sums and gathers of the matrices' pieces over the tensor-parallel "
         "group move host memory in this build; train it tensor-parallel on the CPU, or use Adam or AdamW on the GPU",
         config.optimizer.type, tp_ranks, device.str());
  }
  // The layers' collectives run on their activations in place, on the training device: the
  // group's backend must communicate that memory (docs/parallelism.md "What composes").
  check_group_backend(device, tp_backend, fmt::format("tensor parallelism ({} ranks)", tp_ranks), "the layers all-reduce their activations",
                      "the tensor-parallel group");
}

void check_sequence_parallel_engine(const Device& device, int sp_ranks, std::string_view sp_backend) {
  if (sp_ranks <= 1) return;
  // Ulysses' all-to-alls move the activations where they are, the training device's memory: the
  // group's backend must communicate it, as the tensor-parallel group's must.
  check_group_backend(device, sp_backend, fmt::format("sequence_parallel_size {}", sp_ranks), "DeepSpeed-Ulysses' all-to-alls move activations",
                      "the sequence-parallel group");
}

namespace {

// The swap folders the config names, (path, key), in the order the engine checks them at initialize
// (ModelStates makes the parameter store before the optimizer's), so that check-config and train
// name the same key when both are wrong.
std::vector<std::pair<std::string, const char*>> swap_folder_paths(const config::DsConfig& config) {
  std::vector<std::pair<std::string, const char*>> paths;
  const config::StatePlacement placement = config.placement();
  if (placement.params == StateHome::nvme)
    paths.emplace_back(config.zero_optimization.offload_param->nvme_path.value_or(""), "zero_optimization.offload_param.nvme_path");
  if (placement.optimizer == StateHome::nvme)
    paths.emplace_back(config.zero_optimization.offload_optimizer->nvme_path.value_or(""), "zero_optimization.offload_optimizer.nvme_path");
  return paths;
}

}  // namespace

void check_engine_trains(const config::DsConfig& config) {
  check_config_is_provided(config, static_cast<int>(config.data_parallel_world_size));
  if (config.optimizer.present()) (void)Optimizer(config.optimizer);  // its type and params, as the engine builds it
  // What tensor parallelism refuses of the optimizer; the device is the machine's, and waits for train.
  check_tensor_parallel_engine(config, Device::cpu(), static_cast<int>(config.tensor_parallel_size), "local");
  // An nvme_path given empty is wrong on every machine (what it names on this one: machine_findings).
  for (const auto& [path, key] : swap_folder_paths(config))
    if (path.empty()) SwapFolder::check_path(path, key);
}

std::vector<std::string> machine_findings(const config::DsConfig& config) {
  // The space the swap folders need depends on the model, and waits for train.
  std::vector<std::string> findings;
  for (const auto& [path, key] : swap_folder_paths(config)) {
    try {
      SwapFolder::check_path(path, key);
    } catch (const Error& e) {
      findings.emplace_back(e.what());
    }
  }
  return findings;
}

}  // namespace dstrain
