#include "zero/param_coordinator.h"

#include <algorithm>
#include <utility>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

ParamCoordinator::ParamCoordinator(std::vector<std::int64_t> numel, std::vector<std::vector<std::size_t>> needs, std::vector<std::string> names,
                                   ParamCoordinatorSettings settings, ParamCoordinatorCallbacks callbacks)
    : numel_(std::move(numel)), needs_(std::move(needs)), names_(std::move(names)), s_(settings), cb_(std::move(callbacks)) {
  if (needs_.size() != names_.size()) fail("ParamCoordinator: {} need lists for {} layer names", needs_.size(), names_.size());
  gathered_.assign(numel_.size(), false);
  for (std::size_t i = 0; i < needs_.size(); ++i) {
    auto& n = needs_[i];
    std::sort(n.begin(), n.end());
    n.erase(std::unique(n.begin(), n.end()), n.end());
    // Owners with nothing partitioned are never gathered: drop them from the lists.
    n.erase(std::remove_if(n.begin(), n.end(),
                           [&](std::size_t o) {
                             if (o >= numel_.size()) fail("ParamCoordinator: layer {} needs owner {} of {}", i, o, numel_.size());
                             return numel_[o] <= 0;
                           }),
            n.end());
    std::int64_t total = 0;
    for (std::size_t o : n) total += numel_[o];
    if (total > s_.max_live) {
      fail(
          "zero_optimization.stage3_max_live_parameters is {} but layer '{}' needs {} parameter elements gathered at once; "
          "raise stage3_max_live_parameters to at least {}",
          s_.max_live, names_[i], total, total);
    }
  }
}

bool ParamCoordinator::needed_by(std::size_t layer, std::size_t owner) const {
  const auto& n = needs_[layer];
  return std::binary_search(n.begin(), n.end(), owner);
}

void ParamCoordinator::gather(std::size_t owner) {
  gathered_[owner] = true;
  live_ += numel_[owner];
  peak_live_ = std::max(peak_live_, live_);
  ++gathers_;
  cb_.issue_gather(owner);
}

void ParamCoordinator::drop(std::size_t owner) {
  if (!gathered_[owner]) return;
  gathered_[owner] = false;
  live_ -= numel_[owner];
  cb_.release(owner);
}

std::int64_t ParamCoordinator::next_use_distance(std::size_t p, std::size_t owner, std::size_t* at) const {
  std::int64_t dist = 0;
  for (std::size_t q = p + 1; q < trace_.size(); ++q) {
    if (needed_by(trace_[q], owner)) {
      if (at != nullptr) *at = q;
      return dist;
    }
    for (std::size_t o : needs_[trace_[q]]) dist += numel_[o];
  }
  return -1;
}

void ParamCoordinator::begin_pass(std::span<const std::size_t> trace) {
  end_pass();
  trace_ = trace;
  pos_ = 0;
  trace_ok_ = true;
}

void ParamCoordinator::before(std::size_t layer) {
  DSTRAIN_CHECK(layer < needs_.size(), "ParamCoordinator::before: layer {} of {}", layer, needs_.size());
  if (trace_ok_ && (pos_ >= trace_.size() || trace_[pos_] != layer)) {
    log_debug("ZeRO-3: call of layer '{}' deviates from the trace at position {}; prefetch is off until the pass ends", names_[layer], pos_);
    trace_ok_ = false;
  }
  const auto& need = needs_[layer];
  std::int64_t missing = 0;
  for (std::size_t o : need)
    if (!gathered_[o]) missing += numel_[o];
  if (live_ + missing > s_.max_live) {
    // The hard cap: release owners this call does not need, the one used farthest ahead first.
    std::vector<std::pair<std::int64_t, std::size_t>> victims;  // (-distance, owner); never used again sorts first
    for (std::size_t o = 0; o < gathered_.size(); ++o) {
      if (!gathered_[o] || needed_by(layer, o)) continue;
      const std::int64_t d = trace_ok_ ? next_use_distance(pos_, o) : -1;
      victims.emplace_back(d < 0 ? INT64_MIN : -d, o);
    }
    std::sort(victims.begin(), victims.end());
    for (const auto& [key, o] : victims) {
      if (live_ + missing <= s_.max_live) break;
      drop(o);
    }
  }
  for (std::size_t o : need)
    if (!gathered_[o]) gather(o);
  if (trace_ok_ && s_.prefetch_bucket > 0) {
    std::int64_t issued = 0;
    for (std::size_t q = pos_ + 1; q < trace_.size(); ++q) {
      bool stop = false;
      for (std::size_t o : needs_[trace_[q]]) {
        if (gathered_[o]) continue;
        if (issued + numel_[o] > s_.prefetch_bucket || live_ + numel_[o] > s_.max_live) {
          stop = true;
          break;
        }
        gather(o);
        issued += numel_[o];
      }
      if (stop) break;
    }
    if (cb_.prefetch_read) {
      // The next owners not gathered yet, in trace order, within another prefetch_bucket.
      std::int64_t hinted = 0;
      std::vector<bool> seen(numel_.size(), false);
      for (std::size_t q = pos_ + 1; q < trace_.size() && hinted < s_.prefetch_bucket; ++q) {
        for (std::size_t o : needs_[trace_[q]]) {
          if (gathered_[o] || seen[o] || numel_[o] == 0) continue;
          seen[o] = true;
          if (hinted > 0 && hinted + numel_[o] > s_.prefetch_bucket) break;
          cb_.prefetch_read(o);
          hinted += numel_[o];
        }
      }
    }
  }
  for (std::size_t o : need) cb_.wait_gathered(o);
}

void ParamCoordinator::after(std::size_t layer) {
  DSTRAIN_CHECK(layer < needs_.size(), "ParamCoordinator::after: layer {} of {}", layer, needs_.size());
  for (std::size_t o : needs_[layer]) {
    const std::int64_t d = trace_ok_ ? next_use_distance(pos_, o) : -1;
    if (d < 0 || d > s_.max_reuse_distance) drop(o);
  }
  if (trace_ok_) ++pos_;
}

void ParamCoordinator::end_pass() {
  for (std::size_t o = 0; o < gathered_.size(); ++o) drop(o);
  trace_ = {};
  trace_ok_ = false;
  pos_ = 0;
}

}  // namespace dstrain
