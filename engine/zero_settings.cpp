#include "engine/zero_settings.h"

#include <algorithm>
#include <memory>
#include <string>

#include "ops/dtype.h"
#include "zero/param_store.h"

#include "offload/nvme_param_store.h"
#include "offload/nvme_state_store.h"
#include "ops/log.h"
#include "zero/split_state_store.h"

namespace dstrain {

ZeroSettings zero_settings(const config::DsConfig& c, DType storage, const Optimizer& optimizer, Allocator& device, Allocator& host, IoEngine* io,
                           int rank) {
  const config::ZeroConfig& z = c.zero_optimization;
  const config::StatePlacement placement = c.placement();
  ZeroSettings s;
  s.stage = z.stage;
  s.optimizer_home = placement.optimizer;
  if (s.optimizer_home == StateHome::host) {
    // The masters and optimizer states in the host allocator's memory, counted there (purpose
    // optimizer); ModelStates keeps the masters apart from the params (§1).
    s.store_factory = [&host](StateStoreLayout layout) -> std::unique_ptr<StateStore> {
      return std::make_unique<ResidentStateStore>(std::move(layout), host, StateHome::host);
    };
  } else if (s.optimizer_home == StateHome::nvme) {
    // Swap files under nvme_path, checked and preallocated now, before step 1; buffer_count
    // sub-groups in host memory at a time (docs/offload.md §4-5).
    const config::OffloadOptimizerConfig& off = *z.offload_optimizer;
    // buffer_count 0 is refused by the config layer (as offload_param's), never raised here.
    const auto slots = static_cast<std::size_t>(std::max<std::int64_t>(off.buffer_count, 0));
    const std::string path = off.nvme_path.value_or("");
    const NvmePipelining pipelining{off.pipeline_read, off.pipeline_write};
    s.store_factory = [&host, io, rank, slots, path, pipelining](StateStoreLayout layout) -> std::unique_ptr<StateStore> {
      auto store = std::make_unique<NvmeStateStore>(std::move(layout), *io, host, slots, path, "zero_optimization.offload_optimizer.nvme_path", "",
                                                    rank, pipelining);
      log_info("{}", store->describe());
      return store;
    };
  }
  if (s.optimizer_home != StateHome::device && placement.offload_ratio < 1.0) {
    // Partial offload (docs/offload.md §7): the first int((1 - ratio) * N) of the N sub-groups stay
    // on the training device, the rest go to the store made above.
    const double ratio = placement.offload_ratio;
    const StateHome home = s.optimizer_home;
    s.store_factory = [&device, ratio, home, offloaded = s.store_factory](StateStoreLayout layout) -> std::unique_ptr<StateStore> {
      const std::size_t on_device = SplitStateStore::device_groups(ratio, layout.groups.size());
      log_info("offload_optimizer.ratio {}: {} of {} optimizer sub-groups stay on the training device, the rest in {}", ratio, on_device,
               layout.groups.size(), state_home_name(home));
      return std::make_unique<SplitStateStore>(std::move(layout), on_device, device, offloaded, home);
    };
  }
  s.param_home = placement.params;
  if (s.param_home == StateHome::host) {
    // The 16-bit (fp32 in fp32 runs) shards in the host allocator's memory, counted there (purpose
    // params); each is copied to the device for its all-gather (docs/offload.md §6).
    s.param_store_factory = [&host](ParamStoreLayout layout) -> std::unique_ptr<ParamStore> {
      return std::make_unique<ResidentParamStore>(std::move(layout), host, StateHome::host);
    };
  } else if (s.param_home == StateHome::nvme) {
    const config::OffloadParamConfig& off = *z.offload_param;
    const NvmeParamSettings ps{static_cast<std::size_t>(off.buffer_count), off.buffer_size, off.max_in_cpu};
    const std::string path = off.nvme_path.value_or("");
    s.param_store_factory = [&host, io, rank, ps, path](ParamStoreLayout layout) -> std::unique_ptr<ParamStore> {
      auto store = std::make_unique<NvmeParamStore>(std::move(layout), *io, host, ps, path, "", rank);
      log_info("{}", store->describe());
      return store;
    };
  }
  // Offload next to a GPU: the staging the sub-groups' grads and params pass through is page-locked
  // host memory, so the copy stream's copies run asynchronously (docs/offload.md §12).
  s.staging_host = &host;
  s.storage = storage;
  s.optimizer_states = optimizer.state_names();
  s.sub_group_size = z.sub_group_size;
  s.reduce_bucket_size = z.reduce_bucket_size;
  s.allgather_bucket_size = z.allgather_bucket_size;
  s.overlap_comm = z.overlap_comm;
  s.reduce_scatter = z.reduce_scatter;
  s.reduction.average = c.gradient_allreduce_op != "sum";
  s.reduction.prescale = c.prescale_gradients;
  s.reduction.predivide = c.gradient_predivide_factor;
  // DeepSpeed's default communication dtype is the model dtype: the gradients' own here.
  if (c.communication_data_type && parse_dtype(*c.communication_data_type) != storage)
    s.reduction.comm_dtype = parse_dtype(*c.communication_data_type);
  s.prefetch_bucket_size = z.prefetch_bucket_size;
  s.param_persistence_threshold = z.param_persistence_threshold;
  s.model_persistence_threshold = z.model_persistence_threshold;
  s.max_live_parameters = z.max_live_parameters;
  s.max_reuse_distance = z.max_reuse_distance;
  if (z.stage == 3) {  // below stage 3 they are ignored, as DeepSpeed ignores them (warned by the config)
    s.quantized_weights = z.zero_quantized_weights;
    s.hpz_partition_size = static_cast<int>(std::max<std::int64_t>(1, z.zero_hpz_partition_size));
    s.quantized_gradients = z.zero_quantized_gradients;
    s.mics_shard_size = z.mics_shard_size > 0 ? static_cast<int>(z.mics_shard_size) : 0;
    s.mics_hierarchical_gather = z.mics_hierarchical_params_gather;
  }
  return s;
}

}  // namespace dstrain
