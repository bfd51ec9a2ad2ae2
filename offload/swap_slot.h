// SwapSlot: one host buffer of an NVMe store — an optimizer sub-group (NvmeStateStore) or a
// parameter unit (NvmeParamStore) — with what it holds and the I/O in flight for it; and the slot
// bookkeeping both stores share: find a key's slot, choose one to load into, wait for a slot's I/O.
//
// A slot's life: empty → reading (a read started: acquire, or a prefetch) → ready → acquired →
// writing (release of modified contents) → ready; an I/O failure sends it back to empty, because
// what the buffer holds is then not what the file holds (a failed write) or should (a failed read).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "offload/io_uring_engine.h"
#include "ops/error.h"

namespace dstrain {

struct SwapSlot {
  enum class State { empty, reading, ready, acquired, writing };
  std::ptrdiff_t key = -1;  // the sub-group or unit it holds (-1: none)
  State state = State::empty;
  std::vector<IoHandle> pending;  // the reads or writes in flight for `key`
  std::uint64_t last_use = 0;
  std::byte* block = nullptr;   // what the host allocator gave (freed with it)
  std::byte* memory = nullptr;  // the 4096-aligned buffer inside `block`
};

// The slot holding `key` (in memory, being read, or being written back), or nullptr.
template <class Slot>
Slot* find_slot(std::vector<Slot>& slots, std::size_t key) {
  for (Slot& s : slots)
    if (s.key == static_cast<std::ptrdiff_t>(key)) return &s;
  return nullptr;
}

// A slot to load into: an empty one first, then the least recently used one not acquired; nullptr
// when all are acquired. `without_waiting` (a prefetch): only slots whose I/O has finished, and
// never one read ahead and not yet used.
template <class Slot>
Slot* choose_victim(std::vector<Slot>& slots, bool without_waiting) {
  Slot* best = nullptr;
  for (Slot& s : slots) {
    if (s.state == SwapSlot::State::acquired) continue;
    if (without_waiting && s.state == SwapSlot::State::reading) continue;
    if (without_waiting && std::any_of(s.pending.begin(), s.pending.end(), [](const IoHandle& h) { return !h.done(); })) continue;
    if (s.state == SwapSlot::State::empty) return &s;
    if (best == nullptr || s.last_use < best->last_use) best = &s;
  }
  return best;
}

// Waits for every I/O of the slot. On a failure the slot forgets what it held (empty) and the first
// error is thrown, prefixed with `context` (which store). Reading and writing slots become ready.
void settle_slot(SwapSlot& s, const std::string& context);

}  // namespace dstrain
