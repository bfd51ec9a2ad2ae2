// `dstrain consolidate`: a training checkpoint's weights as one Hugging Face GPT-2 model.safetensors
// (engine/checkpoint/checkpoint_consolidate.h; DeepSpeed's zero_to_fp32.py without Python).
//
//   dstrain consolidate DIR [--tag T] -o model.safetensors [--dtype fp32|bf16|fp16]
//
// DIR is a --save-dir; without --tag the checkpoint DIR/latest names. The fp32 output equals
// `dstrain train --save-weights` of the same run and is loadable by --init-from.
#pragma once

namespace CLI {
class App;
}

namespace dstrain::cli {

void add_consolidate_command(CLI::App& app);

}  // namespace dstrain::cli
