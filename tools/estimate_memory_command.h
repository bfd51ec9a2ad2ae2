// `dstrain estimate-memory`: the per-rank memory a training run needs, by purpose and location,
// as the pre-flight of `train` estimates it, beside DeepSpeed's own model-states estimate.
#pragma once

#include <CLI/CLI.hpp>

namespace dstrain::cli {

void add_estimate_memory_command(CLI::App& app);

}  // namespace dstrain::cli
