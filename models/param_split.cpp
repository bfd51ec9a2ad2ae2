#include "models/param_split.h"

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

}  // namespace dstrain
