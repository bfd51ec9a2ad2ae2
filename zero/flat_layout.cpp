#include "zero/flat_layout.h"

#include <algorithm>

#include "ops/error.h"

namespace dstrain {
namespace {

constexpr std::int64_t kAlignBytes = 64;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

FlatRange intersect(FlatRange a, FlatRange b) {
  const FlatRange r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return r.empty() ? FlatRange{r.begin, r.begin} : r;
}

std::int64_t FlatLayout::chunk_count() const { return numel == 0 ? 0 : (numel + chunk - 1) / chunk; }

FlatRange FlatLayout::chunk_range(std::int64_t k) const {
  DSTRAIN_CHECK(k >= 0 && k < chunk_count(), "chunk {} of a layout with {} chunks", k, chunk_count());
  return {k * chunk, std::min((k + 1) * chunk, numel)};
}

FlatRange FlatLayout::piece(std::int64_t k, int rank) const {
  const FlatRange c = chunk_range(k);
  const std::int64_t n = c.size() / world;
  return {c.begin + rank * n, c.begin + (rank + 1) * n};
}

const FlatSlot* FlatLayout::slot_of(std::size_t spec) const {
  for (const FlatSlot& s : slots)
    if (s.spec == spec) return &s;
  return nullptr;
}

FlatLayout make_flat_layout(std::span<const ParamSpec> specs, int world, std::size_t element_bytes, std::int64_t max_chunk) {
  return make_flat_layout(specs, world, element_bytes, max_chunk, nullptr);
}

FlatLayout make_flat_layout(std::span<const ParamSpec> specs, int world, std::size_t element_bytes, std::int64_t max_chunk,
                            const std::function<bool(const ParamSpec&)>& owns) {
  if (world < 1) fail("make_flat_layout: world size must be >= 1, got {}", world);
  if (element_bytes == 0 || kAlignBytes % static_cast<std::int64_t>(element_bytes) != 0) {
    fail("make_flat_layout: element size {} bytes does not divide the 64-byte alignment", element_bytes);
  }
  FlatLayout l;
  l.world = world;
  l.ealign = kAlignBytes / static_cast<std::int64_t>(element_bytes);
  // Decayed params first, then the rest, so each rank's piece of a chunk is at most two optimizer
  // segments (decayed / not decayed).
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t j = 0; j < specs.size(); ++j) {
      if (specs[j].tied() || specs[j].weight_decay != (pass == 0) || (owns && !owns(specs[j]))) continue;
      l.used = round_up(l.used, l.ealign);
      l.slots.push_back({j, l.used, specs[j].shape.numel(), specs[j].weight_decay});
      l.used += specs[j].shape.numel();
      if (specs[j].weight_decay) l.decay_end = round_up(l.used, l.ealign);
    }
  }
  l.used = round_up(l.used, l.ealign);
  const std::int64_t unit = l.ealign * world;
  l.numel = round_up(l.used, unit);
  l.chunk = max_chunk <= 0 ? std::max<std::int64_t>(l.numel, unit) : std::min(std::max<std::int64_t>(l.numel, unit), round_up(max_chunk, unit));
  return l;
}

}  // namespace dstrain
