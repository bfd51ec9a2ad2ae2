// `dstrain export`: a training checkpoint as the folder DeepSpeed would have saved for the same run
// of the Hugging Face model (engine/checkpoint/deepspeed_export.h; docs/checkpoints.md "Saving for
// DeepSpeed").
//
//   dstrain export DIR -o OUT [--format deepspeed|universal] [--tag T]
//                             [--zero-stage S] [--dp W] [--dtype fp32|fp16|bf16]
//
// deepspeed: OUT/latest and OUT/<tag>/ as engine.save_checkpoint writes them for ZeRO stage S on W
// data-parallel ranks in DTYPE (each unset: the checkpoint's own), for DeepSpeed's load_checkpoint
// and zero_to_fp32.py; universal: OUT/<tag>/zero/<param>/... as ds_to_universal.py writes it.
#pragma once

namespace CLI {
class App;
}

namespace dstrain::cli {

void add_export_command(CLI::App& app);

}  // namespace dstrain::cli
