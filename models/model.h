// Model: what the engine trains — an ordered list of layers, and the architecture they were built
// from (models/model_family.h), which answers for them: weights in the family's Hugging Face
// layout, FLOPs, the checkpoint manifest's model, the sequence-length check.
//
// The layers own no memory (models/layer.h); the engine allocates everything for them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/expert_parallel.h"
#include "models/layer.h"
#include "models/model_family.h"
#include "models/tensor_parallel.h"

namespace dstrain {

// A run of consecutive layers of a pipeline rank's model that is one virtual stage of the whole
// model (models/pipeline_stage.h): local layers [begin, end).
struct ModelChunk {
  std::size_t begin = 0;
  std::size_t end = 0;
  int virtual_stage = 0;
};

// A parameter that more than one pipeline stage holds (models/pipeline_stage.h): its name, the
// stages holding it, and whether this rank's is the copy (the norm counts the owner's).
struct SharedParam {
  std::string name;
  std::vector<int> stages;
  bool copy = false;
};

struct Model {
  std::vector<std::unique_ptr<Layer>> layers;  // run first to last in forward, last to first in backward
  // The architecture the layers come from; null for a list of layers without a family (then there
  // are no weight files, and the FLOPs and checkpoint manifests know only the layers).
  std::shared_ptr<const Architecture> architecture;
  std::string description;  // one line for the top of a run
  // Width of the residual stream (B, T, n_embd) that flows between layers; the engine keeps one
  // buffer of its shape (residual_shape below) for its gradient and runs backward in place through
  // it (as LayerStack).
  std::int64_t n_embd = 0;
  std::int64_t n_positions = 0;  // longest sequence the model takes (T <= n_positions)
  std::int64_t vocab_size = 0;   // tokens must be < vocab_size
  // The sequence-parallel ranks the layers were built for (make_model's sp.ranks; 1: whole sequences).
  int sequence_parallel_ranks = 1;
  // The tensor-parallel rank the layers were built for (make_model's tp).
  TensorParallelRank tensor_parallel;
  // The expert-parallel rank the layers were built for (make_model's ep; models/expert_parallel.h):
  // the sparse layers hold its E/EP experts and their expert weight gradients are scaled by 1/EP.
  ExpertParallelRank expert_parallel;

  // Pipeline parallelism (models/pipeline_stage.h): the layers are this rank's chunks of a model of
  // whole_layers layers; layer_ids[i] is layer i's index in it and chunks the virtual stages the
  // layers make. Empty (and 0) without a pipeline: one chunk of every layer, ids their positions.
  std::vector<std::size_t> layer_ids;
  std::vector<ModelChunk> chunks;
  std::size_t whole_layers = 0;
  std::vector<SharedParam> shared_params;

  // Layer i's index in the whole model (its dropout key).
  std::size_t layer_id(std::size_t i) const { return layer_ids.empty() ? i : layer_ids[i]; }
  std::size_t whole_layer_count() const { return whole_layers > 0 ? whole_layers : layers.size(); }
  bool pipelined() const { return !chunks.empty(); }

  // The residual stream's shape for a micro-batch: (B, T, n_embd), or this tensor-parallel rank's
  // rows of it under Megatron's sequence parallelism (models/residual_shards.h).
  Shape residual_shape(const LayerDims& dims) const { return tensor_parallel.residual_shape(dims.B, dims.T, n_embd); }
};

// The model of `architecture`: its layers, description and sizes. With tensor parallelism, the
// layers of rank tp.rank (Architecture::make_tensor_parallel_layers).
// With sequence parallelism, of tensor-parallel rank tp and sequence-parallel rank sp. With expert
// parallelism (ep.ranks > 1), Architecture::make_parallel_layers(tp, sp, ep).
Model make_model(std::shared_ptr<const Architecture> architecture, TensorParallelRank tp = {}, SequenceParallelRank sp = {},
                 ExpertParallelRank ep = {});

// `sp` with ALST's tiles, as a sequence-parallel run takes them: the loss in tiles of at most
// kLossTileBytes of a tensor-parallel rank's logits (models/lm_head_loss.h), so the (T, V) logits
// never exist whole, and the MLP in tiles of n_embd positions (ALST's ceil(T / hidden_size)
// shards: a tile's hidden features about the size of the MLP's weights; models/row_tiles.h).
// `tp_ranks`: the vocabulary's cut; `bytes`: the storage dtype's size.
SequenceParallelRank with_alst_tiles(SequenceParallelRank sp, const Architecture& architecture, int tp_ranks, std::int64_t bytes);

}  // namespace dstrain
