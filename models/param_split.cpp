#include "models/param_split.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {

const char* split_kind_name(SplitKind kind) {
  switch (kind) {
    case SplitKind::replicated:
      return "replicated";
    case SplitKind::rows:
      return "rows";
    case SplitKind::columns:
      return "columns";
    case SplitKind::vocabulary:
      return "vocabulary";
    case SplitKind::experts:
      return "experts";
  }
  return "?";
}

int ParamSplit::dim() const {
  switch (kind) {
    case SplitKind::replicated:
      return -1;
    case SplitKind::columns:
      return 1;
    default:
      return 0;
  }
}

std::string ParamSplit::describe() const {
  std::string s = split_kind_name(kind);
  if (parts.empty()) return s;
  s += " [";
  for (std::size_t i = 0; i < parts.size(); ++i) s += fmt::format("{}{}/{}", i ? " | " : "", parts[i].size, parts[i].unit);
  return s + "]";
}

std::int64_t units_of_rank(std::int64_t units, int ranks, int rank) {
  DSTRAIN_CHECK(ranks > 0 && rank >= 0 && rank < ranks, "units_of_rank: rank {} of {}", rank, ranks);
  return units / ranks + (rank < units % ranks ? 1 : 0);
}

std::vector<SplitRange> split_ranges(const ParamSplit& split, const Shape& shape, int ranks, int rank, const std::string& name) {
  if (ranks <= 0 || rank < 0 || rank >= ranks) fail("split_ranges: parameter '{}': rank {} is not one of {} rank(s)", name, rank, ranks);
  const int dim = split.is_replicated() ? 0 : split.dim();
  if (shape.rank <= dim)
    fail("parameter '{}' of shape {} is split as {}, which cuts dimension {} it does not have", name, shape.str(), split.describe(), dim);
  const std::int64_t extent = shape.rank > 0 ? shape[dim] : 1;
  if (split.is_replicated()) return {{0, extent}};
  std::vector<ParamSplit::Part> parts = split.parts;
  if (parts.empty()) parts.push_back({extent, 1});
  std::int64_t total = 0;
  for (const ParamSplit::Part& p : parts) {
    if (p.unit <= 0 || p.size < 0 || p.size % p.unit != 0) {
      fail("parameter '{}' is split as {}: a part of {} elements is not a whole number of units of {}", name, split.describe(), p.size, p.unit);
    }
    total += p.size;
  }
  if (total != extent) {
    fail("parameter '{}' of shape {} is split as {}: its parts add up to {} but dimension {} has {}", name, shape.str(), split.describe(), total, dim,
         extent);
  }
  std::vector<SplitRange> out;
  std::int64_t part_begin = 0;
  for (const ParamSplit::Part& p : parts) {
    const std::int64_t units = p.size / p.unit;
    std::int64_t first = 0;  // the units of the ranks before this one
    for (int r = 0; r < rank; ++r) first += units_of_rank(units, ranks, r);
    out.push_back({part_begin + first * p.unit, units_of_rank(units, ranks, rank) * p.unit});
    part_begin += p.size;
  }
  return out;
}

Shape piece_shape(const ParamSplit& split, const Shape& whole, int ranks, int rank, const std::string& name) {
  if (split.is_replicated()) return whole;
  std::int64_t extent = 0;
  for (const SplitRange& r : split_ranges(split, whole, ranks, rank, name)) extent += r.size;
  Shape s = whole;
  s.dims[static_cast<std::size_t>(split.dim())] = extent;
  return s;
}

namespace {

// Copies every range of the rank between the whole parameter and its piece, one direction.
void copy_ranges(const Tensor& whole, const Tensor& piece, const ParamSplit& split, int ranks, int rank, const std::string& name, bool to_piece) {
  if (!whole.device.is_cpu() || !piece.device.is_cpu() || whole.dtype != piece.dtype) {
    fail("parameter '{}': its whole value and its tensor-parallel piece must be host tensors of one dtype ({} and {})", name, whole.str(), piece.str());
  }
  const Shape want = piece_shape(split, whole.shape, ranks, rank, name);
  if (piece.shape.numel() != want.numel()) {
    fail("parameter '{}': rank {} of {} holds a piece of shape {} of {}, not {} elements", name, rank, ranks, want.str(), whole.shape.str(),
         piece.shape.numel());
  }
  const std::size_t es = dtype_size(whole.dtype);
  auto* w = static_cast<char*>(whole.data);
  auto* p = static_cast<char*>(piece.data);
  auto copy = [&](std::int64_t w_off, std::int64_t p_off, std::int64_t n) {
    if (n <= 0) return;
    char* a = w + static_cast<std::size_t>(w_off) * es;
    char* b = p + static_cast<std::size_t>(p_off) * es;
    if (to_piece) std::memcpy(b, a, static_cast<std::size_t>(n) * es);
    else std::memcpy(a, b, static_cast<std::size_t>(n) * es);
  };
  if (split.is_replicated()) {
    copy(0, 0, whole.shape.numel());
    return;
  }
  const std::vector<SplitRange> ranges = split_ranges(split, whole.shape, ranks, rank, name);
  const std::int64_t d0 = whole.shape.rank > 0 ? whole.shape[0] : 1;
  if (split.dim() == 0) {
    const std::int64_t inner = d0 > 0 ? whole.shape.numel() / d0 : 0;  // elements per row
    std::int64_t p_off = 0;
    for (const SplitRange& r : ranges) {
      copy(r.begin * inner, p_off, r.size * inner);
      p_off += r.size * inner;
    }
    return;
  }
  // dim 1 of a matrix (rows, cols): each row's column ranges, packed.
  const std::int64_t cols = whole.shape[1];
  const std::int64_t inner = cols > 0 ? whole.shape.numel() / (d0 * cols) : 0;  // elements per column entry
  std::int64_t piece_cols = 0;
  for (const SplitRange& r : ranges) piece_cols += r.size;
  for (std::int64_t row = 0; row < d0; ++row) {
    std::int64_t p_col = 0;
    for (const SplitRange& r : ranges) {
      copy((row * cols + r.begin) * inner, (row * piece_cols + p_col) * inner, r.size * inner);
      p_col += r.size;
    }
  }
}

}  // namespace

void copy_whole_to_piece(const Tensor& whole, const Tensor& piece, const ParamSplit& split, int ranks, int rank, const std::string& name) {
  copy_ranges(whole, piece, split, ranks, rank, name, true);
}

void copy_piece_to_whole(const Tensor& piece, const Tensor& whole, const ParamSplit& split, int ranks, int rank, const std::string& name) {
  copy_ranges(whole, piece, split, ranks, rank, name, false);
}

std::vector<ElementRun> piece_runs(const ParamSplit& split, const Shape& whole, int ranks, int rank, std::int64_t local_offset, std::int64_t local_numel,
                                   const std::string& name) {
  const Shape piece = piece_shape(split, whole, ranks, rank, name);
  if (local_offset < 0 || local_numel < 0 || local_offset > piece.numel() - local_numel) {
    fail("parameter '{}': elements [{}, +{}) are not inside rank {} of {}'s piece of shape {} (of {})", name, local_offset, local_numel, rank, ranks,
         piece.str(), whole.str());
  }
  std::vector<ElementRun> out;
  if (local_numel == 0) return out;
  const std::int64_t lo = local_offset, hi = local_offset + local_numel;
  // Adds the part of the segment (piece elements [l, l + n) = whole elements [w, w + n)) inside [lo, hi).
  const auto add = [&](std::int64_t w, std::int64_t l, std::int64_t n) {
    const std::int64_t b = std::max(l, lo), e = std::min(l + n, hi);
    if (b >= e) return;
    const ElementRun run{w + (b - l), b, e - b};
    if (!out.empty() && out.back().whole_offset + out.back().numel == run.whole_offset && out.back().local_offset + out.back().numel == run.local_offset) {
      out.back().numel += run.numel;
    } else {
      out.push_back(run);
    }
  };
  if (split.is_replicated() || ranks == 1) {
    add(local_offset, local_offset, local_numel);
    return out;
  }
  const std::vector<SplitRange> ranges = split_ranges(split, whole, ranks, rank, name);
  const std::int64_t d0 = whole.rank > 0 ? whole[0] : 1;
  if (split.dim() == 0) {
    const std::int64_t inner = d0 > 0 ? whole.numel() / d0 : 0;  // elements per row
    std::int64_t p_off = 0;
    for (const SplitRange& r : ranges) {
      add(r.begin * inner, p_off, r.size * inner);
      p_off += r.size * inner;
    }
    return out;
  }
  // dim 1: row `row` of the piece is its column ranges, packed; only the rows [lo, hi) touches.
  const std::int64_t cols = whole[1];
  const std::int64_t inner = cols > 0 ? whole.numel() / (d0 * cols) : 0;  // elements per column entry
  std::int64_t piece_cols = 0;
  for (const SplitRange& r : ranges) piece_cols += r.size;
  const std::int64_t row_len = piece_cols * inner;  // > 0: the piece holds the elements asked for
  for (std::int64_t row = lo / row_len; row < d0 && row * row_len < hi; ++row) {
    std::int64_t p_col = 0;
    for (const SplitRange& r : ranges) {
      add((row * cols + r.begin) * inner, (row * piece_cols + p_col) * inner, r.size * inner);
      p_col += r.size;
    }
  }
  return out;
}

std::int64_t piece_slot_numel(const ParamSplit& split, const Shape& whole, int ranks, const std::string& name) {
  std::int64_t slot = 0;
  for (int r = 0; r < ranks; ++r) slot = std::max(slot, piece_shape(split, whole, ranks, r, name).numel());
  return slot;
}

void assemble_whole(const Tensor& slots, std::int64_t slot, const Tensor& whole, const ParamSplit& split, int ranks, const std::string& name) {
  if (slots.numel() != slot * ranks || slots.dtype != whole.dtype || !slots.device.is_cpu()) {
    fail("parameter '{}': assembling the whole {} from {} rank(s)' pieces needs host slots of {} x {} elements of its dtype, got {}", name,
         whole.str(), ranks, ranks, slot, slots.str());
  }
  const std::size_t bytes = static_cast<std::size_t>(slot) * dtype_size(slots.dtype);
  for (int r = 0; r < ranks; ++r) {
    const Shape ps = piece_shape(split, whole.shape, ranks, r, name);
    copy_piece_to_whole(Tensor(static_cast<char*>(slots.data) + bytes * static_cast<std::size_t>(r), slots.dtype, ps), whole, split, ranks, r, name);
  }
}

}  // namespace dstrain
