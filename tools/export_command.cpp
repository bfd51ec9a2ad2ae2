#include "export_command.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>

#include "cli_options.h"

namespace dstrain::cli {
namespace {

struct ExportArgs {
  std::string dir, tag, output, format = "deepspeed", dtype;
  std::optional<int> zero_stage, dp;
};

}  // namespace

void add_export_command(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a training checkpoint as a DeepSpeed checkpoint folder (save_checkpoint's layout, or a universal checkpoint)");
  cmd->add_option("dir", args->dir, "The checkpoint folder (a --save-dir)")->required();
  cmd->add_option("--tag", args->tag, "The checkpoint (default: the one DIR/latest names)")->check(not_empty());
  cmd->add_option("-o,--output", args->output, "The DeepSpeed folder to write (its `latest` and <tag>/)")->required()->check(not_empty());
  cmd->add_option("--format", args->format,
                  "deepspeed: the folder engine.save_checkpoint writes (load_checkpoint, zero_to_fp32.py); universal: ds_to_universal.py's")
      ->check(one_of({"deepspeed", "universal"}))
      ->capture_default_str();
  cmd->add_option("--zero-stage", args->zero_stage, "The DeepSpeed run's ZeRO stage (default: the checkpoint's)")->check(CLI::Range(0, 3));
  cmd->add_option("--dp", args->dp, "The DeepSpeed run's data-parallel ranks, one optimizer file each (default: the checkpoint's)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--dtype", args->dtype, "The DeepSpeed run's precision: the module weights' dtype (default: the checkpoint's)")
      ->check(one_of({"fp32", "bf16", "fp16"}));
  cmd->callback([args] {
    const bool universal = args->format == "universal";
    if (universal && (args->zero_stage || args->dp || !args->dtype.empty()))
      throw CLI::ValidationError("--format universal", "a universal checkpoint has no ZeRO stage, ranks or dtype; leave out --zero-stage, --dp and --dtype");
    std::optional<DeepSpeedSaveLayout> layout;
    if (!universal) {
      DeepSpeedSaveLayout l = deepspeed_layout_of_checkpoint(args->dir, args->tag);
      if (args->zero_stage) l.zero_stage = *args->zero_stage;
      if (args->dp) l.dp_world_size = *args->dp;
      if (!args->dtype.empty()) l.dtype = args->dtype;
      layout = l;
    }
    const std::string tag = export_deepspeed_checkpoint(args->dir, args->tag, args->output,
                                                        universal ? DeepSpeedExportFormat::universal : DeepSpeedExportFormat::deepspeed, layout);
    if (universal) {
      std::printf("%s/%s -> %s/%s (universal)\n", args->dir.c_str(), tag.c_str(), args->output.c_str(), tag.c_str());
    } else {
      std::printf("%s/%s -> %s/%s (DeepSpeed, ZeRO stage %d on %d ranks, %s)\n", args->dir.c_str(), tag.c_str(), args->output.c_str(), tag.c_str(),
                  layout->zero_stage, layout->dp_world_size, layout->dtype.c_str());
    }
  });
}

}  // namespace dstrain::cli
