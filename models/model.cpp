#include "models/model.h"

#include <utility>

#include "models/lm_head_loss.h"
#include "ops/error.h"

namespace dstrain {

Model make_model(std::shared_ptr<const Architecture> architecture, TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep) {
  if (!architecture) fail("make_model: no architecture given");
  Model m;
  m.layers = ep.ranks != 1                                                            ? architecture->make_parallel_layers(tp, sp, ep)
             : sp.active() || sp.loss_tile_rows > 0 || sp.mlp_tile_rows > 0 ? architecture->make_parallel_layers(tp, sp)
             : tp.active()                                                   ? architecture->make_tensor_parallel_layers(tp)
                                                                             : architecture->make_layers();
  m.expert_parallel = ep;
  m.description = architecture->describe();
  m.sequence_parallel_ranks = sp.ranks;
  m.tensor_parallel = tp;
  m.n_embd = architecture->n_embd();
  m.n_positions = architecture->n_positions();
  m.vocab_size = architecture->vocab_size();
  m.architecture = std::move(architecture);
  return m;
}

SequenceParallelRank with_alst_tiles(SequenceParallelRank sp, const Architecture& architecture, int tp_ranks, std::int64_t bytes) {
  const std::int64_t vocab_rows = (architecture.padded_vocab_size() + tp_ranks - 1) / tp_ranks;
  sp.loss_tile_rows = loss_tile_rows_for(vocab_rows, bytes);
  sp.mlp_tile_rows = architecture.n_embd();
  return sp;
}

}  // namespace dstrain
