// How a model's layers group into pipeline stages: DeepSpeed's PipelineModule partition methods
// (deepspeed/runtime/pipe/module.py, _partition_layers), on the Layer interface alone, so that any
// family's model partitions the same way.
//
//   "uniform"       every stage gets the same number of layers, the first ones one more when they
//                   do not divide (partition_uniform)
//   "parameters"    balanced by each layer's parameter count, its tied parameters included as
//                   DeepSpeed counts a TiedLayerSpec's module in every stage that holds it
//                   (partition_balanced); pipeline.partition "best" is read as this
//   "type:<regex>"  balanced by the layers whose type_name() the regex finds, case-insensitive
//                   (weight 1 for those, 0 for the rest); an Error when it finds none
//
// partition_balanced is DeepSpeed's linear-partition dynamic program: of the splits into
// contiguous stages, the one whose heaviest and lightest stages differ least, ties going to the
// split that DeepSpeed's loop order meets last. With no more layers than stages, every stage gets
// at most one layer (partition_uniform).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "models/layer.h"

namespace dstrain {

// Stage boundaries as DeepSpeed's `parts`: stages + 1 layer indices, parts[0] = 0, parts[stages] =
// the layer count; stage s runs layers [parts[s], parts[s + 1]).
using StageParts = std::vector<std::size_t>;

StageParts partition_uniform(std::size_t items, std::size_t stages);
StageParts partition_balanced(std::span<const double> weights, std::size_t stages);

// `layers` into `stages` stages by `method` (above). Error naming the method when it is unknown,
// stages < 1, or a type regex is invalid or matches no layer.
StageParts partition_layers(std::span<const std::unique_ptr<Layer>> layers, std::size_t stages, std::string_view method);

}  // namespace dstrain
