// ZeroReport: what ZeRO holds and sends on one rank — bytes held by purpose and location, the last
// step's collectives and NVMe traffic — for --summary-json, the offload report and tests; and its
// figures as one list of numbers, so that process-per-rank runs gather every rank's report with
// one all-gather (train/trainer.cpp) without a second copy of the field order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "config_schema/state_placement.h"
#include "ops/memory_stats.h"
#include "zero/communicator.h"

namespace dstrain {

// NVMe traffic of the engine's io_uring engine (offload/io_uring_engine.h): bytes read and written,
// and the seconds the step was blocked waiting for a transfer (docs/offload.md §9).
struct OffloadIo {
  std::uint64_t bytes_read = 0, bytes_written = 0;
  double wait_seconds = 0.0;
};

// What ZeRO holds and sends on this rank (dstrain train --summary-json writes it per rank).
struct ZeroReport {
  int stage = 0;
  int rank = 0;
  int world_size = 1;
  // Bytes held between steps (allocator statistics, purposes params / grads / optimizer: the fp32
  // masters and the optimizer's states count as optimizer) and the allocator's peak of all purposes.
  std::uint64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  std::uint64_t peak_bytes = 0;
  // The optimizer partition's bytes in host memory (offload_optimizer.device "cpu"; the host
  // allocator's optimizer purpose). optimizer_bytes above is the training device's share.
  std::uint64_t host_optimizer_bytes = 0;
  StateHome optimizer_home = StateHome::device;  // where the optimizer partition lives
  // Bytes held between steps per purpose (index: MemoryPurpose) and location: the training
  // allocator's, the host allocator's (offloaded state, pinned staging) and the swap files' on NVMe.
  std::array<std::uint64_t, kNumMemoryPurposes> device_bytes{}, host_bytes{}, nvme_bytes{};
  // NVMe transfers (offload_optimizer.device "nvme"; zero otherwise): of the last optimizer step
  // (from the end of the previous one, checkpoints and evaluation excluded) and of every step.
  OffloadIo step_io, train_io;
  std::int64_t padded_param_elements = 0;         // Ψ with each layer padded to split across ranks
  std::int64_t peak_gathered_param_elements = 0;  // stage 3: most parameter elements gathered at once
  // hpZ (zero_hpz_partition_size): this rank's secondary shard of the 16-bit weights, counted in
  // param_bytes too (docs/zero.md §10).
  std::uint64_t secondary_param_bytes = 0;
  // The collectives of the last optimizer step: its micro-steps' backward reductions (and stage 3
  // gathers), the step's (norm², overflow, loss) all-reduce and the post-step all-gather.
  CommStats step_comm;
};

// Calls f(field) for every figure of a ZeroReport, in one fixed order: integers, doubles and the
// optimizer's home, by reference (a const report gives const references). Packing the report into
// numbers and unpacking it are the same walk, so the two cannot disagree on the order.
template <class Report, class F>
requires std::is_same_v<std::remove_const_t<Report>, ZeroReport>
void for_each_figure(Report& r, F&& f) {
  f(r.stage);
  f(r.rank);
  f(r.world_size);
  f(r.param_bytes);
  f(r.grad_bytes);
  f(r.optimizer_bytes);
  f(r.peak_bytes);
  f(r.host_optimizer_bytes);
  f(r.optimizer_home);
  for (auto* purposes : {&r.device_bytes, &r.host_bytes, &r.nvme_bytes})
    for (auto& b : *purposes) f(b);
  for (auto* io : {&r.step_io, &r.train_io}) {
    f(io->bytes_read);
    f(io->bytes_written);
    f(io->wait_seconds);
  }
  f(r.padded_param_elements);
  f(r.peak_gathered_param_elements);
  f(r.secondary_param_bytes);
  for (auto& b : r.step_comm.bytes) f(b);
  for (auto& c : r.step_comm.calls) f(c);
  for (auto& b : r.step_comm.cross_node_bytes) f(b);
}

}  // namespace dstrain
