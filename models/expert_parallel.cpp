#include "models/expert_parallel.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "models/param_split.h"
#include "ops/error.h"

namespace dstrain {

ParamSpec expert_piece_spec(ParamSpec whole, ExpertParallelRank ep) {
  if (!ep.active() || whole.split.kind != SplitKind::experts) return whole;
  const Shape full = whole.shape;
  if (full.rank < 1 || full[0] % ep.ranks != 0)
    fail("parameter '{}': {} experts do not divide by {} expert-parallel ranks", whole.name, full.rank < 1 ? 0 : full[0], ep.ranks);
  whole.shape = piece_shape(whole.split, full, ep.ranks, ep.rank, whole.name);
  whole.piece = ParamPiece{full, ep.rank, ep.ranks};
  return whole;
}

ExpertParallelGroup& expert_layer_group(ExpertParallelGroup* group, ExpertParallelRank ep, const std::string& layer) {
  if (group == nullptr) {
    fail("layer '{}' was built for expert-parallel rank {} of {} but runs without its group; pass ForwardArgs/BackwardArgs::expert_parallel", layer,
         ep.rank, ep.ranks);
  }
  if (group->rank() != ep.rank || group->size() != ep.ranks) {
    fail("layer '{}' was built for expert-parallel rank {} of {} but runs in a group as rank {} of {}; build the layers for the mesh they run on",
         layer, ep.rank, ep.ranks, group->rank(), group->size());
  }
  return *group;
}

void check_expert_split(std::int64_t experts, int ranks, const std::string& key) {
  if (ranks < 1) fail("expert_parallel.autoep_size {}: give 1 or more", ranks);
  if (experts % ranks != 0) {
    // The divisors in pairs up to sqrt(E) (a descriptor may ask for very many experts).
    std::vector<std::int64_t> low, high;
    for (std::int64_t d = 1; d <= experts / d; ++d)
      if (experts % d == 0) {
        low.push_back(d);
        if (d != experts / d) high.push_back(experts / d);
      }
    low.insert(low.end(), high.rbegin(), high.rend());
    std::string divisors;
    for (std::int64_t d : low) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    fail("expert_parallel.autoep_size {}: {} = {} experts do not divide by it (each expert-parallel rank holds whole experts, the same number); "
         "use a size that divides {}: {}",
         ranks, key, experts, experts, divisors);
  }
}

}  // namespace dstrain
