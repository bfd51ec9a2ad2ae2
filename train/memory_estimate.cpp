#include "train/memory_estimate.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "engine/optim/optimizer_rules.h"
#include "models/lm_head_loss.h"
#include "zero/split_state_store.h"

namespace dstrain {
namespace {

// A number from a cgroup file ("max" or unreadable: nullopt).
std::optional<double> read_cgroup_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stod(text);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

namespace {

// Moves the offloaded shares of e's params and optimizer off the device (memory_estimate.h says
// where; the engine's stores: engine.cpp make_state_stores, docs/offload.md).
// b: bytes per stored parameter element.
void place_offloaded(MemoryEstimate& e, const config::DsConfig& cfg, const config::StatePlacement& placement, double b) {
  const config::ZeroConfig& z = cfg.zero_optimization;
  if (placement.params != StateHome::device) {
    const config::OffloadParamConfig& poff = *z.offload_param;
    e.params_device = 0.0;
    if (placement.params == StateHome::host) {
      e.params_host = e.params;
    } else {
      // NvmeParamStore keeps the units, in order, while their running total fits max_in_cpu: all of
      // them when it covers the partition; otherwise an unknown prefix (0 as the lower bound) and
      // buffer_count buffers of the largest swapped unit (at least one element: the bound again).
      const double partition = e.zero_partition();
      if (static_cast<double>(poff.max_in_cpu) >= partition) {
        e.params_host = e.params;
      } else {
        e.params_nvme = e.params;
        e.params_host = static_cast<double>(std::max<std::int64_t>(poff.buffer_count, 1)) * b;
      }
    }
  }
  if (placement.optimizer == StateHome::device || e.optimizer <= 0.0 || e.rank_parameters <= 0.0) return;
  const config::OffloadOptimizerConfig& off = *z.offload_optimizer;
  // Sub-groups of sub_group_size elements over the rank's partition; the first int((1 - ratio)·N)
  // stay on the device (SplitStateStore::device_groups), only at stage 3.
  const double partition = e.zero_partition();
  // StateStoreLayout::cut's step: sub_group_size rounded down to a multiple of 16 elements.
  const std::int64_t step = z.sub_group_size > 16 ? z.sub_group_size - z.sub_group_size % 16 : std::max<std::int64_t>(z.sub_group_size, 1);
  const double group = std::min(static_cast<double>(step), partition);
  const double groups = std::ceil(partition / group);
  const double ratio = placement.offload_ratio;
  const double kept_groups = groups < 0x1p53 ? static_cast<double>(SplitStateStore::device_groups(ratio, static_cast<std::size_t>(groups)))
                                             : std::floor((1.0 - ratio) * groups);
  const double on_device = std::min(kept_groups * group, partition);
  const double per_element = e.optimizer / partition;
  e.optimizer_device = on_device * per_element;
  const double offloaded = e.optimizer - e.optimizer_device;
  if (placement.optimizer == StateHome::nvme && offloaded > 0.0) {
    // NvmeStateStore: buffer_count slots, each one sub-group of every state, in host memory.
    e.optimizer_nvme = offloaded;
    e.optimizer_buffers = static_cast<double>(std::max<std::int64_t>(off.buffer_count, 1));
    e.optimizer_buffer_elements = group;
    e.optimizer_bytes_per_element = per_element;
    e.optimizer_host = e.optimizer_buffers * group * per_element;
  } else {
    e.optimizer_host = offloaded;
  }
}

// Elements of the parameters `layers` store (a tied parameter is its owner's), in double: the
// shapes of an absurd descriptor (C = 2^32) overflow Shape::numel's int64. `experts`: of them, the
// expert-parallel rank's pieces of the expert stacks (engine/expert_parallel.h is_expert_piece),
// which ZeRO partitions over the expert-data group instead of the data group.
struct StoredCount {
  double all = 0.0;
  double experts = 0.0;
};

double elements_of(const ParamSpec& p) {
  double elements = 1.0;
  for (int d = 0; d < p.shape.rank; ++d) elements *= static_cast<double>(p.shape[d]);
  return elements;
}

bool expert_piece(const ParamSpec& p) { return p.is_piece() && p.split.kind == SplitKind::experts; }

StoredCount stored_elements(const std::vector<std::unique_ptr<Layer>>& layers) {
  StoredCount n;
  for (const auto& layer : layers) {
    for (const ParamSpec& p : layer->params()) {
      if (p.tied()) continue;
      const double elements = elements_of(p);
      n.all += elements;
      if (expert_piece(p)) n.experts += elements;
    }
  }
  return n;
}

// The layers of tensor-parallel rank 0 of `tp_ranks` and expert-parallel rank 0 of `ep_ranks` (one
// sequence-parallel rank: Ulysses replicates the weights).
std::vector<std::unique_ptr<Layer>> rank0_layers(const Architecture& model, int tp_ranks, int ep_ranks) {
  if (ep_ranks > 1) return model.make_parallel_layers(TensorParallelRank{0, tp_ranks}, SequenceParallelRank{}, ExpertParallelRank{0, ep_ranks});
  return model.make_tensor_parallel_layers(TensorParallelRank{0, tp_ranks});
}

// The parameters tensor-parallel rank 0 of `tp_ranks` and expert-parallel rank 0 of `ep_ranks`
// store: its pieces of the cut parameters, its E / EP experts of every sparse layer, and the
// replicated ones whole, from the layers' own specs (ParamSpec::split, piece_spec). Rank 0 holds
// the most of every tensor-parallel cut (n units over W ranks give rank r n / W + (r < n % W)), so
// this is the largest rank's; every expert-parallel rank holds as many experts. Of a family that
// copies its shape with fewer blocks (Architecture::with_n_layer) only a one- and a two-block copy
// are built: their difference is one block, and the model has n_layer of them.
StoredCount rank0_parameters(const Architecture& model, int tp_ranks, int ep_ranks) {
  const std::shared_ptr<const Architecture> one = model.with_n_layer(1), two = model.with_n_layer(2);
  if (!one || !two) return stored_elements(rank0_layers(model, tp_ranks, ep_ranks));
  const StoredCount with_one = stored_elements(rank0_layers(*one, tp_ranks, ep_ranks));
  const StoredCount with_two = stored_elements(rank0_layers(*two, tp_ranks, ep_ranks));
  const double blocks = static_cast<double>(model.n_layer() - 1);
  return {with_one.all + blocks * (with_two.all - with_one.all), with_one.experts + blocks * (with_two.experts - with_one.experts)};
}

// Ψ stored parameters, Ψ_r of them on one rank (its tensor-parallel pieces and the replicated ones),
// `expert_parameters` of those its expert-parallel pieces, Vp the padded vocabulary (the logits'
// width, the largest activation).
MemoryEstimate estimate(double parameters, double rank_parameters, double expert_parameters, double Vp, const config::DsConfig& cfg,
                        std::int64_t T) {
  MemoryEstimate e;
  e.parameters = parameters;
  e.rank_parameters = rank_parameters;
  e.expert_parameters = expert_parameters;
  const config::StatePlacement placement = cfg.placement();
  const bool mixed = placement.mixed_precision;
  const double b = mixed ? 2.0 : 4.0;
  const int stage = cfg.zero_optimization.stage;
  // ZeRO partitions over the data group: the DP x SP ranks of a tensor-parallel index (sequence
  // parallelism replicates the weights, as data parallelism does; docs/parallelism.md §1).
  const std::int64_t tp = std::max<std::int64_t>(1, cfg.tensor_parallel_size), sp = std::max<std::int64_t>(1, cfg.sequence_parallel_world_size);
  double W = static_cast<double>(std::max<std::int64_t>(1, cfg.data_parallel_world_size) * sp);
  // MiCS shards over groups of mics_shard_size ranks and replicates across them (docs/zero.md §10).
  const auto& z = cfg.zero_optimization;
  if (stage == 3 && z.mics_shard_size > 0 && static_cast<double>(z.mics_shard_size) < W) W = static_cast<double>(z.mics_shard_size);
  e.zero_ranks = W;
  // Expert parallelism: a rank's expert pieces are partitioned over the expert-data group, the
  // W / EP ranks holding the same experts (zero/device_mesh.h); the rest over the data group.
  const double EP = static_cast<double>(std::max(1, cfg.expert_parallel.ep_size()));
  e.expert_zero_ranks = W / EP;
  const double psi = e.rank_parameters, psi_e = e.expert_parameters;
  // ZeRO's share of `whole` bytes (of which `expert` bytes are expert pieces) on one rank.
  const auto partitioned = [&](double whole, double expert) { return psi_e > 0.0 ? (whole - expert) / W + expert / e.expert_zero_ranks : whole / W; };
  e.params = stage >= 3 ? partitioned(psi * b, psi_e * b) : psi * b;
  e.grads = stage >= 2 ? partitioned(psi * b, psi_e * b) : psi * b;
  const config::OptimizerKind k = cfg.optimizer.kind;
  // Muon and Adafactor keep two fp32 states per element too (docs/optimizers.md §9, §10.1).
  const bool two_moments = k == config::OptimizerKind::adam || k == config::OptimizerKind::adamw || k == config::OptimizerKind::lamb ||
                           k == config::OptimizerKind::muon || k == config::OptimizerKind::adafactor;
  // The 1-bit family (stage 0 only; docs/optimizers_onebit.md §5): exp_avg, exp_avg_sq (+ 0/1 Adam's
  // momentum accumulator or 1-bit LAMB's fresh variance), the worker error, the staging copy that is
  // communicated (+ 1-bit LAMB's previous momentum), and the server error, ψ/W.
  const double onebit = k == config::OptimizerKind::onebit_adam     ? 16.0 + 4.0 / W
                        : k == config::OptimizerKind::zero_one_adam ? 20.0 + 4.0 / W
                        : k == config::OptimizerKind::onebit_lamb   ? 24.0 + 4.0 / W
                                                                    : 0.0;
  // The fp32 masters apart from the params: 16-bit storage, or offload (docs/training_state.md §1).
  const bool masters_apart = placement.masters_apart;
  // The element-wise rules (Adagrad, Lion, RMSprop, ...; engine/optim/optimizer_rules.h): one fp32 state
  // per element for each of the rule's states, which may depend on its params (RMSprop's momentum, centered).
  // SGD keeps a momentum buffer only with momentum (docs/training_state.md §1).
  double rule_states = 0.0;
  if (optimizer_rule_of(k)) {
    rule_states = 4.0 * static_cast<double>(rule_state_names(cfg.optimizer).size());
  } else if (k == config::OptimizerKind::sgd && cfg.optimizer.params.momentum != 0.0) {
    rule_states = 4.0;
  }
  const auto optimizer_bytes = [&](double n) { return (masters_apart ? 4.0 * n : 0.0) + (two_moments ? 8.0 * n : 0.0) + rule_states * n + onebit * n; };
  e.optimizer = stage >= 1 ? partitioned(optimizer_bytes(psi), optimizer_bytes(psi_e)) : optimizer_bytes(psi);
  // The logits of one micro-batch: a sequence-parallel rank's T / SP tokens of each sequence, a
  // tensor-parallel rank's vocabulary rows (vocabulary-parallel; rank 0 holds the most, Vp / TP
  // rounded up). With sequence parallelism ALST's tiled loss keeps one tile of them
  // (models/lm_head_loss.h, as train/rank_trainer.cpp builds it).
  const double rows = tp > 1 ? std::ceil(Vp / static_cast<double>(tp)) : Vp;
  double positions = static_cast<double>(cfg.train_micro_batch_size_per_gpu) * static_cast<double>(T / sp);
  if (sp > 1) {
    const std::int64_t bytes = mixed ? 2 : 4;
    const double tile = rows < 0x1p62 ? static_cast<double>(loss_tile_rows_for(static_cast<std::int64_t>(rows), bytes)) : 1.0;
    positions = std::min(positions, tile);
  }
  e.activations = positions * rows * b;
  e.params_device = e.params;
  e.optimizer_device = e.optimizer;
  place_offloaded(e, cfg, placement, b);
  if (stage == 3 && z.zero_hpz_partition_size > 1) {
    // hpZ's secondary shard of the 16-bit weights, 1/h of them, on the training device.
    e.secondary_params = psi * b / static_cast<double>(z.zero_hpz_partition_size);
    e.params += e.secondary_params;
    e.params_device += e.secondary_params;
  }
  return e;
}

}  // namespace

MemoryEstimate estimate_rank_memory(const Architecture& model, const config::DsConfig& cfg, std::int64_t T) {
  const double stored = model.stored_parameter_count();
  const int tp = static_cast<int>(std::max<std::int64_t>(1, cfg.tensor_parallel_size));
  const int ep = std::max(1, cfg.expert_parallel.ep_size());
  const StoredCount rank = tp > 1 || ep > 1 ? rank0_parameters(model, tp, ep) : StoredCount{stored, 0.0};
  return estimate(stored, rank.all, rank.experts, static_cast<double>(model.padded_vocab_size()), cfg, T);
}

MemoryEstimate estimate_state_memory(double rank_parameters, const config::DsConfig& cfg, double expert_parameters) {
  return estimate(rank_parameters, rank_parameters, expert_parameters, 0.0, cfg, 0);
}

std::vector<double> pipeline_stage_parameters(const Architecture& model, const config::DsConfig& cfg, const StageParts& parts, int stages,
                                              std::vector<double>* stage_expert_parameters) {
  const int tp = static_cast<int>(std::max<std::int64_t>(1, cfg.tensor_parallel_size));
  const int ep = std::max(1, cfg.expert_parallel.ep_size());
  const std::vector<std::unique_ptr<Layer>> layers = tp > 1 || ep > 1 ? rank0_layers(model, tp, ep) : model.make_layers();
  std::vector<double> out(static_cast<std::size_t>(std::max(stages, 1)), 0.0);
  std::vector<double> experts(out.size(), 0.0);
  const std::size_t virtual_stages = parts.size() - 1;
  // The names each stage owns, so that a tied parameter whose owner is in the same stage counts once.
  std::vector<std::vector<std::string>> owned(out.size());
  const auto stage_of = [&](std::size_t v) { return v % out.size(); };
  for (std::size_t v = 0; v < virtual_stages; ++v)
    for (std::size_t i = parts[v]; i < parts[v + 1] && i < layers.size(); ++i)
      for (const ParamSpec& p : layers[i]->params())
        if (!p.tied()) owned[stage_of(v)].push_back(p.name);
  for (std::size_t v = 0; v < virtual_stages; ++v) {
    const std::vector<std::string>& own = owned[stage_of(v)];
    for (std::size_t i = parts[v]; i < parts[v + 1] && i < layers.size(); ++i) {
      for (const ParamSpec& p : layers[i]->params()) {
        if (p.tied() && std::find(own.begin(), own.end(), p.tied_to) != own.end()) continue;
        const double elements = elements_of(p);
        out[stage_of(v)] += elements;
        if (expert_piece(p)) experts[stage_of(v)] += elements;
      }
    }
  }
  if (stage_expert_parameters != nullptr) *stage_expert_parameters = std::move(experts);
  return out;
}

MemoryEstimate estimate_pipeline_stage_memory(const Architecture& model, const config::DsConfig& cfg, std::int64_t T,
                                              const std::vector<double>& stage_parameters, int stage, bool gpipe,
                                              const std::vector<double>& stage_expert_parameters) {
  const int stages = static_cast<int>(stage_parameters.size());
  const bool last = stage == stages - 1;
  const std::size_t s = static_cast<std::size_t>(stage);
  MemoryEstimate e = estimate(model.stored_parameter_count(), stage_parameters[s], s < stage_expert_parameters.size() ? stage_expert_parameters[s] : 0.0,
                              last ? static_cast<double>(model.padded_vocab_size()) : 0.0, cfg, T);
  const double M = static_cast<double>(std::max<std::int64_t>(1, cfg.gradient_accumulation_steps));
  const double in_flight = gpipe ? M : std::min(static_cast<double>(stages - stage), M);
  const std::int64_t tp = std::max<std::int64_t>(1, cfg.tensor_parallel_size), sp = std::max<std::int64_t>(1, cfg.sequence_parallel_world_size);
  const double b = cfg.placement().mixed_precision ? 2.0 : 4.0;
  const double hidden = static_cast<double>(cfg.train_micro_batch_size_per_gpu) * static_cast<double>(T / sp) * static_cast<double>(model.n_embd()) /
                        static_cast<double>(tp) * b;
  e.activations += in_flight * hidden;
  return e;
}

std::optional<HostMemoryLimit> host_memory_limit() {
  std::optional<HostMemoryLimit> best;
  const auto consider = [&](double bytes, std::string source) {
    if (std::isnan(bytes)) return;
    bytes = std::max(0.0, bytes);
    if (!best || bytes < best->bytes) best = HostMemoryLimit{bytes, std::move(source)};
  };
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kib = 0.0, available = -1.0, swap_free = 0.0;
    std::string unit;
    while (in >> key >> kib) {
      std::getline(in, unit);
      if (key == "MemAvailable:") available = kib * 1024.0;
      if (key == "SwapFree:") swap_free = kib * 1024.0;
    }
    if (available >= 0.0) consider(available + swap_free, "MemAvailable + SwapFree in /proc/meminfo");
  }
  // cgroup v2, then v1: the limit of the container or job this process runs in.
  if (const auto max = read_cgroup_number("/sys/fs/cgroup/memory.max")) {
    const double used = read_cgroup_number("/sys/fs/cgroup/memory.current").value_or(0.0);
    consider(*max - used, "the cgroup's memory.max less memory.current");
  } else if (const auto limit = read_cgroup_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"); limit && *limit < 1e18) {
    const double used = read_cgroup_number("/sys/fs/cgroup/memory/memory.usage_in_bytes").value_or(0.0);
    consider(*limit - used, "the cgroup's memory.limit_in_bytes less its usage");
  }
  // ulimit -v / -d, less what this process has mapped already (VmSize / VmData of /proc/self/status).
  double vm_size = 0.0, vm_data = 0.0;
  {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string key;
      double kib = 0.0;
      if (!(fields >> key >> kib)) continue;
      if (key == "VmSize:") vm_size = kib * 1024.0;
      if (key == "VmData:") vm_data = kib * 1024.0;
    }
  }
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider(static_cast<double>(r.rlim_cur) - vm_size, "the address-space limit (ulimit -v) less what is mapped");
  if (::getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider(static_cast<double>(r.rlim_cur) - vm_data, "the data-segment limit (ulimit -d) less what is in use");
  return best;
}

std::string format_estimate_bytes(double bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++u;
  }
  if (bytes >= 1e6) return fmt::format("{:.2e} {}", bytes, kUnits[u]);
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, kUnits[u]);
}

}  // namespace dstrain
