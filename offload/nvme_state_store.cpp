#include "offload/nvme_state_store.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/log.h"
#include "ops/memory_stats.h"
#include "ops/stop_request.h"

namespace dstrain {
namespace {

constexpr std::uint64_t kAlign = IoEngine::kMinAlignment;

std::uint64_t round_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::uint64_t NvmeStateStore::file_bytes(const StateStoreLayout& layout) {
  std::uint64_t total = 0;
  for (const FlatRange& r : layout.groups) total += round_up(static_cast<std::uint64_t>(r.size()) * sizeof(float));
  return total;
}

NvmeSwapPlan NvmeSwapPlan::of(const StateStoreLayout& layout) {
  NvmeSwapPlan p;
  p.states = layout.buffer_count();
  p.groups = layout.groups.size();
  p.state_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(layout.numel, 0)) * sizeof(float) * p.states;
  p.swap_bytes = NvmeStateStore::file_bytes(layout) * p.states;
  for (const FlatRange& r : layout.groups) p.largest_group = std::max(p.largest_group, r.size());
  return p;
}

bool NvmeSwapPlan::fits() const { return swap_bytes <= kMaxOverheadFactor * state_bytes + kAlign * states; }

std::string NvmeSwapPlan::describe() const {
  return fmt::format(
      "{} of optimizer state ({} fp32 state(s) of {} elements) in {} sub-group(s) of at most {} elements "
      "(zero_optimization.sub_group_size)",
      format_bytes(state_bytes), states, states == 0 ? 0 : state_bytes / sizeof(float) / states, groups, largest_group);
}

NvmeStateStore::NvmeStateStore(StateStoreLayout layout, IoEngine& io, Allocator& host, std::size_t slots, const std::string& nvme_path,
                               const std::string& config_key, const std::string& run, int rank, NvmePipelining pipelining)
    : StateStore(std::move(layout)), io_(io), host_(host), pipelining_(pipelining) {
  const StateStoreLayout& l = this->layout();
  if (slots < 1)
    fail("zero_optimization.offload_optimizer.buffer_count is {}: the NVMe optimizer store needs at least 1 host buffer (4 is DeepSpeed's default)",
         slots);
  // Refused before any file is made: a layout whose padding outweighs the state would preallocate
  // (and move every step) mostly padding, and its many tiny transfers never finish a step.
  const NvmeSwapPlan plan = NvmeSwapPlan::of(l);
  if (!plan.fits())
    fail(
        "zero_optimization.sub_group_size: the NVMe swap files would take {} for {}: every sub-group is padded to 4096 "
        "bytes per state, and the swap may be at most {}x the state (plus 4096 bytes per file). Set "
        "zero_optimization.sub_group_size to at least 1024 (4096 bytes of fp32 per state: no padding; 1e6 to 1e8 suit NVMe)",
        format_bytes(plan.swap_bytes), plan.describe(), NvmeSwapPlan::kMaxOverheadFactor);
  plan_ = plan;
  std::uint64_t offset = 0, largest = 0;
  for (std::size_t g = 0; g < l.groups.size(); ++g) {
    offsets_.push_back(offset);
    offset += padded_bytes(g);
    largest = std::max(largest, padded_bytes(g));
  }
  std::vector<SwapFileSpec> files;
  for (const std::string& name : l.names) files.push_back({name + ".swp", offset});
  folder_ = std::make_unique<SwapFolder>(io, nvme_path, config_key, run, rank, files);
  stride_ = largest;
  slots_.resize(slots);
  const std::size_t slot_bytes = static_cast<std::size_t>(stride_ * l.buffer_count());
  const bool page_aligned = host_.default_alignment() >= kAlign;
  for (Slot& s : slots_) {
    if (slot_bytes == 0) break;
    if (page_aligned) {
      s.block = static_cast<std::byte*>(host_.allocate(slot_bytes, MemoryPurpose::optimizer, kAlign));
      s.memory = s.block;
    } else {
      s.block = static_cast<std::byte*>(host_.allocate(slot_bytes + kAlign, MemoryPurpose::optimizer));
      const auto address = reinterpret_cast<std::uintptr_t>(s.block);
      s.memory = s.block + (round_up(address) - address);
    }
    io_.register_buffer(s.memory, slot_bytes);  // best effort: unregistered I/O works too
  }
}

NvmeStateStore::~NvmeStateStore() {
  for (Slot& s : slots_) {
    for (const IoHandle& h : s.pending) {
      try {
        h.wait();
      } catch (const Error& e) {
        log_warning("NVMe optimizer store, at the end: {}", e.what());
      }
    }
    s.pending.clear();
    if (s.block != nullptr) {
      io_.unregister_buffer(s.memory);
      host_.deallocate(s.block);
    }
  }
}

std::string NvmeStateStore::describe() const { return fmt::format("{}: {}", folder_->describe(), plan_.describe()); }

std::uint64_t NvmeStateStore::padded_bytes(std::size_t g) const {
  return round_up(static_cast<std::uint64_t>(layout().groups[g].size()) * sizeof(float));
}

void NvmeStateStore::start_read(Slot& s, std::size_t g) {
  s.key = static_cast<std::ptrdiff_t>(g);
  s.state = SwapSlot::State::reading;
  s.last_use = ++clock_;  // a prefetched group is about to be used: not the next to be evicted
  for (std::size_t b = 0; b < layout().buffer_count(); ++b)
    s.pending.push_back(io_.read(folder_->file(b), offsets_[g], s.memory + b * stride_, padded_bytes(g)));
}

std::span<const Tensor> NvmeStateStore::acquire(std::size_t g) {
  check_group(g, "acquire");
  // The swap-in loop visits every sub-group: a stop request that waited past the grace for a step
  // boundary ends it here, within seconds, however many sub-groups are left.
  if (stop_overdue())
    throw StopRequested(stop_signal(), fmt::format("swapping optimizer sub-group {} of {} in from NVMe", g + 1, layout().groups.size()));
  Slot* s = find_slot(slots_, g);
  if (s != nullptr && s->state == SwapSlot::State::acquired) fail("NVMe optimizer store: sub-group {} acquired twice without a release", g);
  if (s == nullptr) {
    s = choose_victim(slots_, /*without_waiting=*/false);
    if (s == nullptr)
      fail(
          "NVMe optimizer store: all {} host buffers (zero_optimization.offload_optimizer.buffer_count) hold acquired "
          "sub-groups; raise buffer_count",
          slots_.size());
    settle_slot(*s, "");  // its write-back (or an unused prefetch) must finish before the buffer is reused
    start_read(*s, g);
  }
  settle_slot(*s, "");
  s->state = SwapSlot::State::acquired;
  s->last_use = ++clock_;
  s->views.clear();
  const std::int64_t n = layout().groups[g].size();
  for (std::size_t b = 0; b < layout().buffer_count(); ++b) s->views.emplace_back(s->memory + b * stride_, DType::fp32, Shape{n}, Device::cpu());
  return s->views;
}

void NvmeStateStore::release(std::size_t g, bool modified) {
  check_group(g, "release");
  Slot* s = find_slot(slots_, g);
  if (s == nullptr || s->state != SwapSlot::State::acquired) fail("NVMe optimizer store: release of sub-group {}, which is not acquired", g);
  s->views.clear();
  if (!modified) {
    s->state = SwapSlot::State::ready;
    return;
  }
  s->state = SwapSlot::State::writing;
  for (std::size_t b = 0; b < layout().buffer_count(); ++b)
    s->pending.push_back(io_.write(folder_->file(b), offsets_[g], s->memory + b * stride_, padded_bytes(g)));
  if (!pipelining_.write) settle_slot(*s, "");  // pipeline_write false: on disk before the step goes on
}

void NvmeStateStore::prefetch(std::size_t g) {
  check_group(g, "prefetch");
  if (!pipelining_.read || find_slot(slots_, g) != nullptr) return;  // pipeline_read false: read at acquire
  Slot* s = choose_victim(slots_, /*without_waiting=*/true);
  if (s == nullptr) return;  // every buffer busy: acquire will read it
  settle_slot(*s, "");
  start_read(*s, g);
}

void NvmeStateStore::prefetch_step() {
  if (!pipelining_.read) return;
  for (std::size_t g = 0; g < layout().groups.size(); ++g) {
    if (find_slot(slots_, g) != nullptr) continue;  // in memory, being read, or being written back
    // In visiting order, so that a later sub-group never takes the buffer an earlier one needs;
    // a group read ahead stays `reading` until acquired, and victim() never picks it.
    Slot* s = choose_victim(slots_, /*without_waiting=*/true);
    if (s == nullptr) return;
    settle_slot(*s, "");
    start_read(*s, g);
  }
}

void NvmeStateStore::flush() {
  std::string first_error;
  for (Slot& s : slots_) {
    if (s.state != SwapSlot::State::writing) continue;
    try {
      settle_slot(s, "");
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw Error(first_error);
}

StateStoreBytes NvmeStateStore::bytes() const {
  StateStoreBytes b;
  b.host = slots_.size() * stride_ * layout().buffer_count();
  b.nvme = folder_->bytes();
  return b;
}

}  // namespace dstrain
