// One pipeline rank's part of a model: the chunks of the whole model's layers that this rank runs
// (docs/parallelism.md §7, "Pipeline parallelism").
//
// The whole model's layers are cut into stages · V contiguous pieces (models/stage_partition.h's
// StageParts: virtual stage v runs layers [parts[v], parts[v + 1])). Rank `stage` of the pipeline
// runs the virtual stages stage, stage + P, stage + 2P, ... (Megatron-LM's interleaved layout; V = 1
// is one contiguous piece per rank), in that order: its Model holds their layers one after the
// other, Model::chunks says where each begins and ends, and Model::layer_ids gives every layer its
// index in the whole model — what its dropout key uses, so a pipeline draws the masks one rank does.
//
// Tied parameters across stages (DeepSpeed's TiedLayerSpec). A layer whose parameter is tied to one
// that another stage holds (GPT-2's head weight, tied to the embedding's "wte.weight") gets a copy
// of its own under the owner's name, initialised as the owner is, and both stages list it in
// Model::shared_params: the engine sums its gradient over the ranks holding it every step, so
// both copies take the same update and stay equal, and the global gradient norm counts the copy
// once (on the owner's stage).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/stage_partition.h"

namespace dstrain {

// The whole model's virtual stages that pipeline rank `stage` of `stages` runs: stage, stage + P, ...
// (parts.size() - 1 = stages · V of them). Error when parts does not divide by the stages.
std::vector<int> virtual_stages_of(const StageParts& parts, int stages, int stage);

// The pipeline rank that runs virtual stage v.
inline int stage_of_virtual_stage(int v, int stages) { return v % stages; }

// `whole` (every layer of the model, as make_model builds it for this rank's tensor- and
// sequence-parallel coordinates) reduced to pipeline rank `stage`'s chunks. Error naming the sizes when
// parts does not cover whole's layers, or a stage would get no layer.
Model make_pipeline_stage_model(Model whole, const StageParts& parts, int stages, int stage);

}  // namespace dstrain
