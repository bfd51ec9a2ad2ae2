// ParamStore: where a rank's stage-3 parameter partition lives — the storage-dtype (fp16 / bf16, or
// fp32 in fp32 runs) shard of every partitioned layer — and the one way to read or write it when it
// is not on the training device (zero_optimization.offload_param; docs/offload.md §6).
//
// The partition is cut into units, one per partitioned layer (a layer's parameters share one flat
// buffer, so the layer's shard is what one all-gather sends). A reader or writer visits a unit:
//
//   Tensor v = store.acquire(u);   // the unit's elements in host (or device) memory
//   ... read / update v ...
//   store.release(u, /*modified=*/true);
//
// ResidentParamStore keeps every unit in one allocator's memory: the training device (no offload)
// or host memory (offload_param.device "cpu"); in_place() gives a unit's memory for good and
// acquire costs nothing. The offload layer implements the NVMe store (offload/nvme_param_store.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/tensor.h"
#include "zero/state_store.h"

namespace dstrain {

// What a parameter store holds: unit u is numel[u] elements of `dtype`.
struct ParamStoreLayout {
  DType dtype = DType::fp32;
  std::vector<std::int64_t> numel;
};

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const ParamStoreLayout& layout() const { return layout_; }
  virtual StateHome home() const = 0;
  // The unit's memory while the run lasts, where the unit never leaves memory; empty otherwise
  // (then acquire / release are the only way to it).
  virtual Tensor in_place(std::size_t u) const = 0;
  // The unit's elements, valid until release(u); blocks until they are in memory. One caller
  // at a time per unit; a store may limit how many are acquired at once (Error naming the limit).
  virtual Tensor acquire(std::size_t u) = 0;
  // Done with u; `modified`: its values must reach the home (a swapped store writes them back,
  // possibly asynchronously; flush() waits).
  virtual void release(std::size_t u, bool modified) = 0;
  // A hint that u is acquired soon (a swapped store starts reading it). Default: nothing.
  virtual void prefetch(std::size_t /*u*/) {}
  virtual void flush() {}
  virtual StateStoreBytes bytes() const = 0;

 protected:
  explicit ParamStore(ParamStoreLayout layout) : layout_(std::move(layout)) {}
  void check_unit(std::size_t u, const char* call) const;

 private:
  ParamStoreLayout layout_;
};

// Every unit, back to back, in one zero-filled buffer from `allocator` (purpose params).
class ResidentParamStore final : public ParamStore {
 public:
  ResidentParamStore(ParamStoreLayout layout, Allocator& allocator, StateHome home);
  StateHome home() const override { return home_; }
  Tensor in_place(std::size_t u) const override;
  Tensor acquire(std::size_t u) override { return in_place(u); }
  void release(std::size_t u, bool /*modified*/) override { check_unit(u, "release"); }
  StateStoreBytes bytes() const override;

 private:
  StateHome home_;
  Buffer buffer_;
  std::vector<Tensor> views_;
};

// Makes a rank's parameter store once ModelStates knows its units; nullptr in ZeroSettings: a
// resident store on the training allocator.
using ParamStoreFactory = std::function<std::unique_ptr<ParamStore>(ParamStoreLayout layout)>;

}  // namespace dstrain
