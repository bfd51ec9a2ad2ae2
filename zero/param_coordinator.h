// ParamCoordinator: when ZeRO stage 3 gathers and releases each layer's parameters.
//
// The engine knows its call order statically: a training micro-step calls layers 0..L-1 forward,
// then backward from L-1 to 0 with the checkpointed segments' recomputes in between; an evaluation
// calls them forward only. That order is the trace (DeepSpeed records it during the first step and
// drops prefetch for good when a step deviates; here it is given up front, and a deviation only
// switches prefetch off until the pass ends).
//
// A layer "needs" the partitioned parameters of the owner layers it reads: its own, plus the owner
// of any tied parameter (GPT-2's head reads the embedding's wte). Owners with persistent (never
// partitioned) parameters are not managed here. At trace position p (layer i):
//   before(i)  1. every owner i needs is gathered (issued now if it was not prefetched) and waited
//                 for. Gathered elements never exceed max_live: prefetched or kept owners that i
//                 does not need are released first, farthest next use first (stage3_max_live_
//                 parameters is a hard cap, unlike DeepSpeed's, which limits only prefetch);
//              2. prefetch: owners needed at p+1, p+2, ... are issued in trace order while the
//                 elements issued by this prefetch stay within prefetch_bucket and the live total
//                 within max_live.
//   after(i)   each owner i needed is released unless the trace uses it again within
//              max_reuse_distance elements (the elements of the owners needed by the calls in
//              between); at the pass's end everything is released.
// The callbacks issue a gather (it may complete later), wait for one, and release one (after
// waiting for it if it is still in flight).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace dstrain {

struct ParamCoordinatorSettings {
  std::int64_t prefetch_bucket = 50'000'000;        // stage3_prefetch_bucket_size (0: no prefetch)
  std::int64_t max_live = 1'000'000'000;            // stage3_max_live_parameters
  std::int64_t max_reuse_distance = 1'000'000'000;  // stage3_max_reuse_distance
};

struct ParamCoordinatorCallbacks {
  std::function<void(std::size_t owner)> issue_gather;
  std::function<void(std::size_t owner)> wait_gathered;
  std::function<void(std::size_t owner)> release;
  // Optional: a hint that `owner` is gathered soon — the owners next in the trace after the
  // prefetched ones, within another prefetch_bucket of elements — so that an offloaded parameter
  // store reads their shards ahead of their gathers (docs/offload.md §6).
  std::function<void(std::size_t owner)> prefetch_read{};
};

class ParamCoordinator {
 public:
  // numel[j]: the gathered elements of owner layer j (0: nothing partitioned: never gathered);
  // needs[i]: the owners layer i reads; names[i]: layer names for errors. Throws Error naming
  // stage3_max_live_parameters when a layer needs more than max_live elements at once.
  ParamCoordinator(std::vector<std::int64_t> numel, std::vector<std::vector<std::size_t>> needs, std::vector<std::string> names,
                   ParamCoordinatorSettings settings, ParamCoordinatorCallbacks callbacks);

  // Starts a pass that will call the layers in `trace` order (the span must outlive the pass).
  void begin_pass(std::span<const std::size_t> trace);
  void before(std::size_t layer);
  void after(std::size_t layer);
  // Releases everything still gathered.
  void end_pass();

  std::int64_t live() const { return live_; }            // elements gathered or in flight now
  std::int64_t peak_live() const { return peak_live_; }  // the most ever
  void reset_peak() { peak_live_ = live_; }
  std::uint64_t gathers() const { return gathers_; }  // gathers issued so far
  bool prefetching() const { return trace_ok_; }      // false after a deviation from the trace

 private:
  void gather(std::size_t owner);
  void drop(std::size_t owner);
  // Distance (elements) from trace position p to the next use of `owner` after p; -1: none.
  std::int64_t next_use_distance(std::size_t p, std::size_t owner, std::size_t* at = nullptr) const;
  bool needed_by(std::size_t layer, std::size_t owner) const;

  std::vector<std::int64_t> numel_;
  std::vector<std::vector<std::size_t>> needs_;
  std::vector<std::string> names_;
  ParamCoordinatorSettings s_;
  ParamCoordinatorCallbacks cb_;
  std::vector<bool> gathered_;  // gathered or in flight
  std::span<const std::size_t> trace_;
  std::size_t pos_ = 0;  // trace position of the current / next call
  bool trace_ok_ = false;
  std::int64_t live_ = 0;
  std::int64_t peak_live_ = 0;
  std::uint64_t gathers_ = 0;
};

}  // namespace dstrain
