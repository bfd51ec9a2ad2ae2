#include "models/tensor_parallel.h"

#include "models/param_split.h"
#include "ops/error.h"

namespace dstrain {

ParamSpec piece_spec(ParamSpec whole, TensorParallelRank tp) {
  if (!tp.active() || whole.split.is_replicated()) return whole;
  const Shape full = whole.shape;
  whole.shape = piece_shape(whole.split, full, tp.ranks, tp.rank, whole.name);
  whole.piece = ParamPiece{full, tp.rank, tp.ranks};
  return whole;
}

TensorParallelGroup& layer_group(TensorParallelGroup* group, TensorParallelRank tp, const std::string& layer) {
  if (group == nullptr) {
    fail("layer '{}' was built for tensor-parallel rank {} of {} but runs without its group; pass ForwardArgs/BackwardArgs::tensor_parallel", layer,
         tp.rank, tp.ranks);
  }
  if (group->rank() != tp.rank || group->size() != tp.ranks) {
    fail("layer '{}' was built for tensor-parallel rank {} of {} but runs in a group as rank {} of {}; build the layers for the mesh they run on",
         layer, tp.rank, tp.ranks, group->rank(), group->size());
  }
  return *group;
}

}  // namespace dstrain
