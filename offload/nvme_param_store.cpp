#include "offload/nvme_param_store.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/log.h"
#include "ops/stop_request.h"

namespace dstrain {
namespace {

constexpr std::uint64_t kAlign = IoEngine::kMinAlignment;
constexpr const char* kPathKey = "zero_optimization.offload_param.nvme_path";
constexpr const char* kContext = "offload_param (NVMe parameter store)";  // the prefix of its I/O errors

std::uint64_t round_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

NvmeParamStore::NvmeParamStore(ParamStoreLayout layout, IoEngine& io, Allocator& host, NvmeParamSettings settings, const std::string& nvme_path,
                               const std::string& run, int rank)
    : ParamStore(std::move(layout)), io_(io), host_(host), settings_(settings) {
  const ParamStoreLayout& lo = this->layout();
  const std::size_t es = dtype_size(lo.dtype);
  // Units kept in host memory: in order, while the running total fits max_in_cpu (DeepSpeed's
  // _create_param_groups_fp16_flat_cpu_memory keeps the first max_params_in_cpu elements).
  std::vector<bool> in_cpu(lo.numel.size(), false);
  std::int64_t kept = 0;
  for (std::size_t u = 0; u < lo.numel.size(); ++u) {
    if (kept + lo.numel[u] > settings_.max_in_cpu) break;
    in_cpu[u] = true;
    kept += lo.numel[u];
  }
  std::int64_t largest = 0;
  std::size_t largest_unit = 0;
  for (std::size_t u = 0; u < lo.numel.size(); ++u) {
    if (in_cpu[u] || lo.numel[u] <= largest) continue;
    largest = lo.numel[u];
    largest_unit = u;
  }
  if (largest > 0 && settings_.buffer_size < largest) {
    fail(
        "zero_optimization.offload_param.buffer_size: {} elements, but a swapped parameter partition (unit {}: one layer's shard "
        "on this rank) has {} elements; every swap buffer must hold the largest one — set buffer_size to at least {} (or raise "
        "max_in_cpu so that it stays in host memory)",
        settings_.buffer_size, largest_unit, largest, largest);
  }
  if (largest > 0 && settings_.buffer_count < 1) {
    fail("zero_optimization.offload_param.buffer_count: 0 — swapped parameters need at least 1 host buffer (DeepSpeed's default is 5)");
  }
  in_cpu_ = Buffer(host_, static_cast<std::size_t>(kept) * es, MemoryPurpose::params);
  if (kept > 0) zero_tensor(in_cpu_.tensor(lo.dtype, Shape{kept}));
  std::uint64_t offset = 0;
  std::int64_t at = 0;
  for (std::size_t u = 0; u < lo.numel.size(); ++u) {
    offsets_.push_back(offset);
    if (in_cpu[u]) {
      in_cpu_views_.push_back(in_cpu_.tensor(lo.dtype, Shape{lo.numel[u]}, static_cast<std::size_t>(at) * es));
      at += lo.numel[u];
    } else {
      in_cpu_views_.emplace_back();
      offset += round_up(static_cast<std::uint64_t>(lo.numel[u]) * es);
      ++swapped_;
    }
  }
  // Everything fits max_in_cpu (or is persistent): no file, no buffers. The folder is still checked
  // (tmpfs included), so a config that only works while the model is small is refused now.
  if (swapped_ == 0) {
    SwapFolder::check_path(nvme_path, kPathKey);
    return;
  }
  // The optimizer store of the same rank may use the default run name: its own sub-folder name.
  // SwapFolder names kPathKey in every error, its files' open errors included.
  folder_ = std::make_unique<SwapFolder>(io, nvme_path, kPathKey, (run.empty() ? SwapFolder::default_run_name() : run) + "-params", rank,
                                         std::vector<SwapFileSpec>{{"params.swp", offset}});
  slot_bytes_ = round_up(static_cast<std::uint64_t>(largest) * es);
  slots_.resize(settings_.buffer_count);
  const bool page_aligned = host_.default_alignment() >= kAlign;
  for (Slot& s : slots_) {
    if (page_aligned) {
      s.block = static_cast<std::byte*>(host_.allocate(slot_bytes_, MemoryPurpose::params, kAlign));
      s.memory = s.block;
    } else {
      s.block = static_cast<std::byte*>(host_.allocate(slot_bytes_ + kAlign, MemoryPurpose::params));
      const auto address = reinterpret_cast<std::uintptr_t>(s.block);
      s.memory = s.block + (round_up(address) - address);
    }
    io_.register_buffer(s.memory, slot_bytes_);
  }
}

NvmeParamStore::~NvmeParamStore() {
  for (Slot& s : slots_) {
    for (const IoHandle& h : s.pending) {
      try {
        h.wait();
      } catch (const Error& e) {
        log_warning("NVMe parameter store, at the end: {}", e.what());
      }
    }
    s.pending.clear();
    if (s.block != nullptr) {
      io_.unregister_buffer(s.memory);
      host_.deallocate(s.block);
    }
  }
}

std::string NvmeParamStore::describe() const {
  std::int64_t kept = 0;
  for (std::size_t u = 0; u < in_cpu_views_.size(); ++u)
    if (!in_cpu_views_[u].empty()) kept += layout().numel[u];
  std::string line = fmt::format("offload_param: {} of {} parameter partition units in host memory ({} elements, max_in_cpu {})",
                                 in_cpu_views_.size() - swapped_, in_cpu_views_.size(), kept, settings_.max_in_cpu);
  if (folder_) line += fmt::format("; {} swapped through {} host buffers of {} bytes; {}", swapped_, slots_.size(), slot_bytes_, folder_->describe());
  return line;
}

std::uint64_t NvmeParamStore::padded_bytes(std::size_t u) const {
  return round_up(static_cast<std::uint64_t>(layout().numel[u]) * dtype_size(layout().dtype));
}

Tensor NvmeParamStore::in_place(std::size_t u) const {
  check_unit(u, "in_place");
  return in_cpu_views_[u];
}

void NvmeParamStore::start_read(Slot& s, std::size_t u) {
  s.key = static_cast<std::ptrdiff_t>(u);
  s.state = SwapSlot::State::reading;
  s.last_use = ++clock_;
  s.pending.push_back(io_.read(folder_->file(0), offsets_[u], s.memory, padded_bytes(u)));
}

Tensor NvmeParamStore::acquire(std::size_t u) {
  check_unit(u, "acquire");
  if (!in_cpu_views_[u].empty()) return in_cpu_views_[u];
  // As the optimizer store's: a stop request past its grace ends the swap-in loop here.
  if (stop_overdue()) throw StopRequested(stop_signal(), fmt::format("swapping parameter unit {} of {} in from NVMe", u + 1, in_cpu_views_.size()));
  Slot* s = find_slot(slots_, u);
  if (s != nullptr && s->state == SwapSlot::State::acquired) fail("NVMe parameter store: unit {} acquired twice without a release", u);
  if (s == nullptr) {
    s = choose_victim(slots_, /*without_waiting=*/false);
    if (s == nullptr)
      fail(
          "NVMe parameter store: all {} host buffers (zero_optimization.offload_param.buffer_count) hold acquired partitions; "
          "raise buffer_count",
          slots_.size());
    settle_slot(*s, kContext);  // its write-back (or an unused prefetch) finishes before the buffer is reused
    start_read(*s, u);
  }
  settle_slot(*s, kContext);
  s->state = SwapSlot::State::acquired;
  s->last_use = ++clock_;
  return Tensor(s->memory, layout().dtype, Shape{layout().numel[u]}, Device::cpu());
}

void NvmeParamStore::release(std::size_t u, bool modified) {
  check_unit(u, "release");
  if (!in_cpu_views_[u].empty()) return;
  Slot* s = find_slot(slots_, u);
  if (s == nullptr || s->state != SwapSlot::State::acquired) fail("NVMe parameter store: release of unit {}, which is not acquired", u);
  if (!modified) {
    s->state = SwapSlot::State::ready;
    return;
  }
  s->state = SwapSlot::State::writing;
  s->pending.push_back(io_.write(folder_->file(0), offsets_[u], s->memory, padded_bytes(u)));
}

void NvmeParamStore::prefetch(std::size_t u) {
  check_unit(u, "prefetch");
  if (!in_cpu_views_[u].empty() || find_slot(slots_, u) != nullptr) return;
  Slot* s = choose_victim(slots_, /*without_waiting=*/true);
  if (s == nullptr) return;  // every buffer busy: acquire reads it
  settle_slot(*s, kContext);
  start_read(*s, u);
}

void NvmeParamStore::flush() {
  std::string first_error;
  for (Slot& s : slots_) {
    if (s.state != SwapSlot::State::writing) continue;
    try {
      settle_slot(s, kContext);
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw Error(first_error);
}

StateStoreBytes NvmeParamStore::bytes() const {
  StateStoreBytes b;
  b.host = in_cpu_.bytes() + slots_.size() * slot_bytes_;
  b.nvme = folder_ ? folder_->bytes() : 0;
  return b;
}

}  // namespace dstrain
