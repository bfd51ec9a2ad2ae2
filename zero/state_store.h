// StateStore: where a rank's optimizer partition lives — the fp32 masters (when kept apart from the
// params) and the optimizer's per-element states — and the one way to read or write it
// (docs/training_state.md §3).
//
// A store holds `buffers` fp32 arrays of the rank's shard space (`numel` elements each, the same
// element order as the grad partition: zero/flat_layout.h) and cuts that space into sub-groups of
// at most `sub_group_size` elements (DeepSpeed's zero_optimization.sub_group_size). Every reader and
// writer visits it one sub-group at a time:
//
//   std::span<const Tensor> v = store.acquire(g);  // one fp32 view of sub-group g per buffer
//   ... read / update v ...
//   store.release(g, /*modified=*/true);            // the values must reach the home
//
// ResidentStateStore (below) keeps the buffers in one allocator's memory — the training device, or
// host memory for offload_optimizer.device "cpu"; acquire and release cost nothing. The offload
// layer (offload/) implements the NVMe store behind the same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config_schema/state_placement.h"
#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/tensor.h"
#include "zero/flat_layout.h"

namespace dstrain {

// The partition's home (StateHome, state_home_name): config_schema/state_placement.h decides it.

// What a store holds: buffer b is `names[b]` ("master", "exp_avg", ...), each `numel` fp32 elements
// in shard order, cut into `groups` (contiguous, in order, covering [0, numel)).
struct StateStoreLayout {
  std::int64_t numel = 0;
  std::vector<std::string> names;
  std::vector<FlatRange> groups;

  std::size_t buffer_count() const { return names.size(); }
  // The sub-groups of [0, numel) at most `sub_group_size` elements each (<= 0: one group); each
  // boundary falls on a multiple of `align` elements where the size allows.
  static std::vector<FlatRange> cut(std::int64_t numel, std::int64_t sub_group_size, std::int64_t align = 16);
};

// Bytes a store holds, by where they are.
struct StateStoreBytes {
  std::uint64_t device = 0, host = 0, nvme = 0;
};

class StateStore {
 public:
  virtual ~StateStore() = default;
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const StateStoreLayout& layout() const { return layout_; }
  virtual StateHome home() const = 0;
  // Where acquire()'s views live: the training device for a device store, the CPU otherwise.
  virtual Device view_device() const = 0;
  // Where sub-group g's views live: view_device() unless the store splits its sub-groups between
  // memories (SplitStateStore: offload_optimizer.ratio < 1).
  virtual Device group_device(std::size_t /*g*/) const { return view_device(); }

  // Views of sub-group g, one per buffer (fp32, layout().groups[g].size() elements), valid until
  // release(g). Blocks until the values are in memory. A sub-group is acquired by one caller at a
  // time; a store may limit how many are acquired at once (Error when exceeded, naming the limit).
  virtual std::span<const Tensor> acquire(std::size_t g) = 0;
  // Done with g. `modified`: its values changed and must reach the home (a swapped store writes
  // them back, possibly asynchronously; flush() waits).
  virtual void release(std::size_t g, bool modified) = 0;
  // A hint that g will be acquired next (a swapped store starts reading it). Default: nothing.
  virtual void prefetch(std::size_t /*g*/) {}
  // A hint that the optimizer step will come next and visit the sub-groups from the first: a swapped
  // store starts reading the first ones into the buffers that are free, so that their reads overlap
  // the forward and backward (docs/offload.md §5). Called often between steps (each layer), so it
  // must cost nothing when there is nothing to start. Default: nothing.
  virtual void prefetch_step() {}
  // Every write-back has reached the home (before the process reads the home another way, or exits).
  virtual void flush() {}
  virtual StateStoreBytes bytes() const = 0;

 protected:
  explicit StateStore(StateStoreLayout layout) : layout_(std::move(layout)) {}
  void check_group(std::size_t g, const char* call) const;

 private:
  StateStoreLayout layout_;
};

// The buffers in memory from `allocator` (purpose optimizer), zero-filled; acquire returns views.
class ResidentStateStore final : public StateStore {
 public:
  ResidentStateStore(StateStoreLayout layout, Allocator& allocator, StateHome home);
  StateHome home() const override { return home_; }
  Device view_device() const override { return alloc_.device(); }
  std::span<const Tensor> acquire(std::size_t g) override;
  void release(std::size_t g, bool modified) override;
  StateStoreBytes bytes() const override;

 private:
  Allocator& alloc_;
  StateHome home_;
  std::vector<Buffer> buffers_;
  std::vector<std::vector<Tensor>> views_;  // [group][buffer]
};

// Makes the store of a rank's optimizer partition once ModelStates knows its layout; the engine
// passes one that follows the config (device, host, nvme). nullptr in ZeroSettings: a device store
// on the training allocator.
using StateStoreFactory = std::function<std::unique_ptr<StateStore>(StateStoreLayout layout)>;

}  // namespace dstrain
