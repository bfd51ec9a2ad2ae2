// The checks of a config against what the engine trains, apart from the step: what this build
// provides (check_config_is_provided, which the Engine's constructor runs first), and the public
// check_engine_trains / machine_findings of engine.h that check-config and train call.
#pragma once

#include <string_view>

#include "config_schema/ds_config.h"
#include "ops/device.h"

namespace dstrain {

// Throws Error naming the key when `c` asks for something this build does not train on
// `world_size` ranks.
void check_config_is_provided(const config::DsConfig& c, int world_size);

// Error when a group of `backend` ("local", "mpi", "nccl") cannot move the training `device`'s
// memory, which the layers' collectives read in place: mpi on a GPU (host memory only), nccl on the
// CPU (GPU memory only). `subject` names what asks ("tensor parallelism (2 ranks)"), `moves` what
// moves in device memory, `group` the group to make with another backend.
void check_group_backend(const Device& device, std::string_view backend, std::string_view subject, std::string_view moves, std::string_view group);

// Error naming the key and the fix when the engine cannot train `config` with `tp_ranks`
// tensor-parallel ranks on `device` over a group of backend `tp_backend` ("local", "mpi", "nccl";
// docs/parallelism.md "What composes"): Lamb, Muon and Adafactor on a GPU (their sums
// and gathers of the pieces over the group, engine/optim/tensor_cut.h, move host memory); or a
// group whose backend cannot communicate the device's memory (mpi on a GPU, nccl on the CPU),
// which the layers' collectives run on.
void check_tensor_parallel_engine(const config::DsConfig& config, const Device& device, int tp_ranks, std::string_view tp_backend);

// What sequence parallelism (DeepSpeed-Ulysses) needs of the device and the sequence-parallel
// group's backend (`sp_backend`: Communicator::backend()): a backend that communicates the training
// device's memory — local or nccl on a GPU, local or mpi on the CPU. Error naming the fix otherwise.
void check_sequence_parallel_engine(const Device& device, int sp_ranks, std::string_view sp_backend);

}  // namespace dstrain
