#include "formats/hf_weights_file.h"

#include "ops/error.h"

namespace dstrain {

std::filesystem::path hf_weights_file(const std::filesystem::path& path, const char* option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  // The index first: transformers writes it instead of model.safetensors when it shards, and a
  // folder holding both (a stale single file beside new shards) is read as the index says.
  if (fs::is_regular_file(path / "model.safetensors.index.json", ec)) return path / "model.safetensors.index.json";
  if (fs::is_regular_file(path / "model.safetensors", ec)) return path / "model.safetensors";
  fail(
      "{} {} is a folder holding neither model.safetensors.index.json nor model.safetensors; give the folder of a Hugging Face "
      "checkpoint (as `dstrain train --save-weights DIR/model.safetensors` or transformers' save_pretrained write it) or the path of "
      "a weights file",
      option, path.string());
}

}  // namespace dstrain
