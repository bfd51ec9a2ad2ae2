// A lower bound of the memory a training run takes, computed from the model's shape and the
// config before anything is allocated, so that a model that cannot fit is refused in the pre-flight
// with the figures — instead of an allocation failing (or the machine swapping) after minutes of
// building layers, or a size so large that its arithmetic overflows.
//
// Per rank, with Ψ the stored parameters (padded vocabulary), b the bytes of the model dtype (4 in
// fp32, 2 in fp16 / bf16), and the device mesh of the config (docs/parallelism.md §1): TP
// tensor_parallel.autotp_size, SP sequence_parallel_size, DP = world / (TP·SP), and W = DP·SP the
// ranks ZeRO partitions over (the data group of a tensor-parallel index):
//   Ψ_r         the parameters one rank stores: Ψ, or under tensor parallelism rank 0's pieces of
//               the cut parameters (whole heads, key/value-head groups, MLP features, vocabulary rows;
//               n units over TP ranks give rank r n / TP + (r < n % TP), rank 0 the most) and the
//               replicated ones whole, from the layers' own cut (ParamSpec::split)
//   Ψ_e         of Ψ_r, the expert-parallel rank's pieces of the expert stacks: under expert
//               parallelism (expert_parallel.autoep_size = EP, splitting DP) E / EP whole experts of
//               every sparse layer (ParamSpec::piece of a ParamSplit::experts stack); 0 without
//   W_e         W / EP, the ranks ZeRO partitions the expert pieces over (the expert-data group:
//               the W / EP ranks holding the same experts; zero/device_mesh.h)
//   ZeRO's share of a rank's n = Ψ_r elements: (Ψ_r - Ψ_e) / W + Ψ_e / W_e (= Ψ_r / W without
//               experts; with them the non-expert parameters / W plus the whole model's experts / W)
//   params      Ψ_r·b         (ZeRO-3: the share; MiCS: over mics_shard_size ranks instead of W;
//                             hpZ: + Ψ_r·b / zero_hpz_partition_size, its secondary shard)
//   grads       Ψ_r·b         (ZeRO-2, 3: the share)
//   optimizer   (4Ψ_r fp32 masters under fp16 / bf16 or optimizer offload) + 8Ψ_r Adam / AdamW / Lamb
//               moments, or 4Ψ_r per state of an element-wise rule (Adagrad 1, Lion 1, RMSprop 1-3, ...:
//               engine/optim/optimizer_rules.h), or 4Ψ_r for SGD's momentum buffer when momentum != 0
//               (ZeRO-1+: the share); with offload_optimizer in host memory instead of the device's
//   activations the logits of one micro-batch, the least any forward keeps: B·(T/SP)·Vr·b with Vr =
//               Vp / TP rounded up (vocabulary-parallel: rank 0's rows); with SP > 1 ALST's tiled loss
//               keeps one tile of them: the positions that fit in 64 MiB, at least one
//               (models/lm_head_loss.h)
// Without tensor or sequence parallelism these are Ψ, B·T·Vp·b and W = DP, as before the mesh.
// Where they live (docs/offload.md §11): offload_param (stage 3) moves the params to host memory
// ("cpu") or to swap files ("nvme": host memory keeps them all only when max_in_cpu covers the
// partition); offload_optimizer moves the optimizer's offloaded share — all of it, or the sub-groups
// past the first int((1 - ratio)·N) — to host memory, or to swap files with buffer_count sub-group
// buffers of every state in host memory ("nvme" at stage 3). Bytes in swap files are in no memory.
// All in double: a spec such as gpt2:L4294967296-C4294967296-H2 gives a finite, huge figure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config_schema/ds_config.h"
#include "models/model_family.h"
#include "models/stage_partition.h"

namespace dstrain {

struct MemoryEstimate {
  double parameters = 0.0;                                               // Ψ, the stored parameters
  double rank_parameters = 0.0;  // Ψ_r, those one rank stores (= Ψ without tensor or expert parallelism)
  double expert_parameters = 0.0;  // Ψ_e, of Ψ_r the rank's expert-parallel pieces of the experts (0 without expert parallelism)
  double zero_ranks = 1.0;         // W, the ranks ZeRO partitions over: data-parallel x sequence-parallel
  double expert_zero_ranks = 1.0;  // W_e = W / EP, the ranks ZeRO partitions the expert pieces over (= W without expert parallelism)
  double params = 0.0, grads = 0.0, optimizer = 0.0, activations = 0.0;  // bytes per rank, wherever they live
  double secondary_params = 0.0;  // of params: hpZ's secondary shard, Ψ_r·b / zero_hpz_partition_size (on the device)
  // Where params and optimizer are: the training device's memory, host memory by offload (for
  // "nvme": the swap buffers and what max_in_cpu keeps), swap files. device + host + nvme equals the
  // total above except for "nvme", whose host buffers hold copies of what is in the files.
  double params_device = 0.0, params_host = 0.0, params_nvme = 0.0;
  double optimizer_device = 0.0, optimizer_host = 0.0, optimizer_nvme = 0.0;
  // offload_optimizer "nvme" at stage 3: optimizer_host is optimizer_buffers host buffers, each one
  // sub-group (optimizer_buffer_elements, sub_group_size or the whole partition if smaller) of every
  // fp32 state, optimizer_bytes_per_element bytes per element (12 for Adam: master + 2 moments).
  // The pre-flight names sub_group_size when these buffers do not fit (docs/offload.md §11).
  double optimizer_buffers = 0.0, optimizer_buffer_elements = 0.0, optimizer_bytes_per_element = 0.0;
  // The elements of a rank's ZeRO partition: (Ψ_r - Ψ_e) / W + Ψ_e / W_e.
  double zero_partition() const {
    return expert_parameters > 0.0 ? (rank_parameters - expert_parameters) / zero_ranks + expert_parameters / expert_zero_ranks
                                   : rank_parameters / zero_ranks;
  }
  // Bytes in memory, device and host (on the cpu device they are the same memory); swap files not.
  double per_rank() const { return params_device + params_host + grads + optimizer_device + optimizer_host + activations; }
  // Of per_rank(): what offload holds in host memory, and what stays on the training device.
  double host() const { return params_host + optimizer_host; }
  double device() const { return per_rank() - host(); }
};

// The lower bound above for one rank of `cfg` (its stage, precision, optimizer, micro-batch and
// device mesh) training `model` on sequences of T tokens: from its stored parameter count — under
// tensor parallelism tensor-parallel rank 0's, the largest, under expert parallelism with E / EP
// experts of each sparse layer (Architecture::make_parallel_layers) — and padded vocabulary. Error
// naming tensor_parallel.autotp_size or expert_parallel.autoep_size when the model cannot be cut
// across that many ranks.
MemoryEstimate estimate_rank_memory(const Architecture& model, const config::DsConfig& cfg, std::int64_t T);

// The model states alone (params, grads, optimizer; no activations) of one rank that stores
// `rank_parameters` parameters, `expert_parameters` of them expert-parallel pieces, as `cfg` places
// them (precision, optimizer, ZeRO over the data group of DP x SP ranks and the experts over its
// expert-data group, offload): what a pipeline stage's layers cost each of its ranks.
MemoryEstimate estimate_state_memory(double rank_parameters, const config::DsConfig& cfg, double expert_parameters = 0.0);

// The parameters each pipeline stage's rank stores (tensor-parallel rank 0's pieces under tensor
// parallelism, expert-parallel rank 0's E / EP experts under expert parallelism; of them the expert
// pieces in *stage_expert_parameters when given), stage s holding the virtual stages v with v % stages == s of `parts` (Megatron's
// layout: virtual stage v = chunk * stages + stage). A tied parameter counts in every stage that
// holds it without its owner, as DeepSpeed's TiedLayerSpec keeps a real copy on each such stage
// (GPT-2's LM head on the last stage). Builds the model's layers: call it with a pipeline only.
std::vector<double> pipeline_stage_parameters(const Architecture& model, const config::DsConfig& cfg, const StageParts& parts, int stages,
                                              std::vector<double>* stage_expert_parameters = nullptr);

// The lower bound above for one rank of pipeline stage `stage` of `stages`: its layers' states
// (stage_parameters[stage]), and the activations of the micro-batches it holds at once — 1F1B keeps
// min(stages - stage, M) of them on stage `stage` (M = gradient_accumulation_steps), GPipe all M —
// each at least the B x T/SP x C hidden state it received (a tensor-parallel rank's 1/TP of it, as
// Megatron's sequence parallelism cuts it), plus on the last stage one micro-batch's logits.
// `stage_expert_parameters` (pipeline_stage_parameters' out-parameter; empty: none) are partitioned
// over the expert-data group.
MemoryEstimate estimate_pipeline_stage_memory(const Architecture& model, const config::DsConfig& cfg, std::int64_t T,
                                              const std::vector<double>& stage_parameters, int stage, bool gpipe,
                                              const std::vector<double>& stage_expert_parameters = {});

// What this process may still allocate on the host, and where the figure comes from: the smallest
// of MemAvailable + SwapFree (/proc/meminfo), the cgroup's memory limit less its usage, and the
// address-space / data-segment limits (ulimit -v / -d). nullopt when none is known.
struct HostMemoryLimit {
  double bytes = 0.0;
  std::string source;  // e.g. "MemAvailable + SwapFree in /proc/meminfo", "the cgroup's memory.max"
};
std::optional<HostMemoryLimit> host_memory_limit();

// "3.21 GiB" style, for doubles beyond 2^64 too ("8.00e+09 TiB").
std::string format_estimate_bytes(double bytes);

}  // namespace dstrain
