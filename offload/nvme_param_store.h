// NvmeParamStore: a rank's stage-3 parameter partition on NVMe (offload_param.device "nvme"),
// behind the ParamStore interface (zero/param_store.h) — docs/offload.md §6.
//
// DeepSpeed's partitioned_param_swapper, per layer: the partitioned layers' shards (units), in
// layer order, are kept in host memory while their running total stays within max_in_cpu elements
// (DeepSpeed's max_params_in_cpu); the rest live in one swap file (params.swp) of the rank's
// SwapFolder, each unit at a 4096-aligned offset. `buffer_count` host buffers of `buffer_size`
// elements each hold the swapped units that are in memory: acquire(u) reads u into a free buffer
// (or finds it there, prefetched), release(u, true) writes it back and frees the buffer once the
// write is done. A swapped unit larger than buffer_size is refused at construction, naming the key
// and the size needed (DeepSpeed asserts "More elements ... than buffer size" at the first fetch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "offload/io_uring_engine.h"
#include "offload/swap_folder.h"
#include "offload/swap_slot.h"
#include "ops/allocator.h"
#include "zero/param_store.h"

namespace dstrain {

struct NvmeParamSettings {
  std::size_t buffer_count = 5;             // offload_param.buffer_count
  std::int64_t buffer_size = 100'000'000;   // offload_param.buffer_size, elements
  std::int64_t max_in_cpu = 1'000'000'000;  // offload_param.max_in_cpu, elements
};

class NvmeParamStore final : public ParamStore {
 public:
  // `io` and `host` outlive the store. Errors (before step 1) name the offload_param keys.
  NvmeParamStore(ParamStoreLayout layout, IoEngine& io, Allocator& host, NvmeParamSettings settings, const std::string& nvme_path,
                 const std::string& run, int rank);
  ~NvmeParamStore() override;

  StateHome home() const override { return StateHome::nvme; }
  Tensor in_place(std::size_t u) const override;
  Tensor acquire(std::size_t u) override;
  void release(std::size_t u, bool modified) override;
  void prefetch(std::size_t u) override;
  void flush() override;
  StateStoreBytes bytes() const override;

  const SwapFolder& folder() const { return *folder_; }
  std::string describe() const;

 private:
  using Slot = SwapSlot;  // key: the unit it holds; memory: slot_bytes_

  void start_read(Slot& s, std::size_t u);
  std::uint64_t padded_bytes(std::size_t u) const;

  IoEngine& io_;
  Allocator& host_;
  NvmeParamSettings settings_;
  Buffer in_cpu_;                       // the units kept in host memory (max_in_cpu)
  std::vector<Tensor> in_cpu_views_;    // per unit; empty for a swapped unit
  std::vector<std::uint64_t> offsets_;  // file offset of each swapped unit
  std::size_t swapped_ = 0;
  std::unique_ptr<SwapFolder> folder_;
  std::uint64_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  std::uint64_t clock_ = 0;
};

}  // namespace dstrain
