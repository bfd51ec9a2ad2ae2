// NvmeStateStore: a rank's optimizer partition on NVMe (offload_optimizer.device "nvme"), behind
// the StateStore interface (zero/state_store.h) — docs/offload.md §5.
//
// Each buffer of the layout ("master", "exp_avg", ...) is one swap file in the rank's SwapFolder,
// holding the sub-groups in order, each padded to 4096 bytes so every sub-group starts at an
// O_DIRECT-aligned offset (file_bytes gives the size). `slots` host buffers of one sub-group each
// (offload_optimizer.buffer_count) hold what is in memory: acquire(g) reads g into a free slot (or
// finds it there, prefetched), release(g, true) starts writing it back and frees the slot for reuse
// once the write is done. With 3 slots, reading k+1 (prefetch) and writing k-1 overlap updating k.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "offload/io_uring_engine.h"
#include "offload/swap_folder.h"
#include "offload/swap_slot.h"
#include "ops/allocator.h"
#include "zero/state_store.h"

namespace dstrain {

// offload_optimizer.pipeline_read / pipeline_write, with DeepSpeed's meaning: without them a
// sub-group is read when acquired (prefetch does nothing) and written back before release returns.
struct NvmePipelining {
  bool read = true;
  bool write = true;
};

// What the swap files of a layout hold, known before anything is made: the state's bytes, and the
// files' — every sub-group padded to 4096 bytes per state, so tiny sub-groups cost a page each
// (sub_group_size 1 turned 38 MB of state into 39 GB of swap).
struct NvmeSwapPlan {
  std::uint64_t state_bytes = 0;  // fp32 bytes of every state: numel x 4 x states
  std::uint64_t swap_bytes = 0;   // the swap files' bytes: Σ_g round_up(4 · size(g), 4096) x states
  std::size_t states = 0;         // files: "master", "exp_avg", ...
  std::size_t groups = 0;
  std::int64_t largest_group = 0;  // elements

  static NvmeSwapPlan of(const StateStoreLayout& layout);
  // The swap may exceed the state by the padding of small sub-groups up to this factor, plus one
  // page per file (the last, partial sub-group): any sub_group_size of 512 elements or more fits.
  static constexpr std::uint64_t kMaxOverheadFactor = 2;
  bool fits() const;
  // "183.11 MiB of optimizer state (3 fp32 states of N elements) in G sub-groups of at most S
  // elements (zero_optimization.sub_group_size)".
  std::string describe() const;
};

class NvmeStateStore final : public StateStore {
 public:
  // `io` and `host` outlive the store. Slots are 4096-aligned (O_DIRECT): asked of `host` when its
  // default alignment is a page (PinnedHostAllocator), else cut from a block 4096 bytes larger
  // (cudaHostAlloc'ed memory: CudaPinnedAllocator aligns to 512 only).
  // Creates and preallocates the swap files (SwapFolder: errors before step 1, named by `config_key`).
  NvmeStateStore(StateStoreLayout layout, IoEngine& io, Allocator& host, std::size_t slots, const std::string& nvme_path,
                 const std::string& config_key, const std::string& run, int rank, NvmePipelining pipelining = {});
  // Waits for the write-backs (a failure is logged: the destructor cannot throw), then removes the files.
  ~NvmeStateStore() override;

  StateHome home() const override { return StateHome::nvme; }
  Device view_device() const override { return Device::cpu(); }
  std::span<const Tensor> acquire(std::size_t g) override;
  void release(std::size_t g, bool modified) override;
  void prefetch(std::size_t g) override;
  // Reads sub-groups 0, 1, ... into free slots (whose I/O has finished) until one does not fit:
  // between steps every slot can hold the next step's first sub-groups (pipeline_read only).
  void prefetch_step() override;
  void flush() override;
  StateStoreBytes bytes() const override;

  const SwapFolder& folder() const { return *folder_; }
  // The line the run logs before step 1: the swap folder's (files, bytes preallocated, where, what
  // was free) and the plan's (the state it holds, in how many sub-groups).
  std::string describe() const;
  // The bytes of each swap file: every sub-group's fp32 bytes rounded up to 4096.
  static std::uint64_t file_bytes(const StateStoreLayout& layout);

 private:
  struct Slot : SwapSlot {  // key: the sub-group it holds; memory: buffer_count() regions of stride_ bytes
    std::vector<Tensor> views;
  };

  void start_read(Slot& s, std::size_t g);
  std::uint64_t padded_bytes(std::size_t g) const;

  IoEngine& io_;
  Allocator& host_;
  std::unique_ptr<SwapFolder> folder_;
  std::vector<std::uint64_t> offsets_;  // file offset of each sub-group
  std::uint64_t stride_ = 0;            // bytes of one buffer's region in a slot
  std::vector<Slot> slots_;
  std::uint64_t clock_ = 0;
  NvmePipelining pipelining_;
  NvmeSwapPlan plan_;
};

}  // namespace dstrain
