#include "consolidate_command.h"

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>

#include "cli_options.h"

namespace dstrain::cli {
namespace {

struct ConsolidateArgs {
  std::string dir, tag, output, dtype = "fp32";
};

}  // namespace

void add_consolidate_command(CLI::App& app) {
  auto args = std::make_shared<ConsolidateArgs>();
  CLI::App* cmd =
      app.add_subcommand("consolidate",
                         "Write a training checkpoint's weights in the Hugging Face layout (GPT-2, or the Llama family: sharded above 5 GB)");
  cmd->add_option("dir", args->dir, "The checkpoint folder (a --save-dir)")->required();
  cmd->add_option("--tag", args->tag, "The checkpoint (default: the one DIR/latest names)")->check(not_empty());
  cmd->add_option("-o,--output", args->output, "The safetensors file to write")->required()->check(not_empty());
  cmd->add_option("--dtype", args->dtype, "The weights' dtype in the file")->check(one_of({"fp32", "bf16", "fp16"}))->capture_default_str();
  cmd->callback([args] {
    const std::string tag = consolidate_checkpoint(args->dir, args->tag, args->output, parse_dtype(args->dtype));
    std::printf("%s/%s -> %s (%s)\n", args->dir.c_str(), tag.c_str(), args->output.c_str(), args->dtype.c_str());
  });
}

}  // namespace dstrain::cli
