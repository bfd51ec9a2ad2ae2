#include "data/eval_loader.h"

#include <algorithm>
#include <utility>

#include "data/data_loader.h"
#include "ops/error.h"

namespace dstrain {
namespace {

void check_options(const EvalLoaderOptions& o) {
  if (o.sequence_length == 0) fail("eval loader: sequence_length is 0: give the model's context length, e.g. 1024");
  if (o.batch_size == 0) fail("eval loader: batch_size is 0: give at least 1 sequence per batch");
  if (o.world_size < 1) fail("eval loader: world_size is {}: it must be >= 1", o.world_size);
  if (o.rank < 0 || o.rank >= o.world_size) {
    fail("eval loader: rank {} is outside 0..{} (world_size {}): check RANK/WORLD_SIZE", o.rank, o.world_size - 1, o.world_size);
  }
  if (o.vocab_size < 0) fail("eval loader: vocab_size is {}: give the tokenizer's vocabulary size, or 0", o.vocab_size);
}

}  // namespace

EvalLoader EvalLoader::open(const std::filesystem::path& path, const EvalLoaderOptions& options) {
  check_options(options);
  return EvalLoader(TokenFile::open(path), options);
}

EvalLoader::EvalLoader(TokenFile file, const EvalLoaderOptions& options) : file_(std::move(file)), options_(options) {
  check_options(options_);
  const std::size_t T = options_.sequence_length;
  const std::size_t B = options_.batch_size;
  window_count_ = file_.size() > T ? (file_.size() - 1) / T : 0;
  const std::size_t available = window_count_ / B;
  if (available == 0) {
    fail(
        "val token file {} holds {} tokens, too few for one evaluation batch of {} sequences x {} tokens "
        "(needs {} tokens): use a larger val split (--val-fraction of prepare-data) or a smaller batch",
        file_.path().string(), file_.size(), B, T, B * T + 1);
  }
  total_batches_ = options_.max_batches == 0 ? available : std::min(options_.max_batches, available);
  const auto W = static_cast<std::size_t>(options_.world_size);
  batch_count_ = (total_batches_ + W - 1) / W;
}

bool EvalLoader::batch_counts(std::size_t j) const {
  return j * static_cast<std::size_t>(options_.world_size) + static_cast<std::size_t>(options_.rank) < total_batches_;
}

std::vector<std::size_t> EvalLoader::batch_windows(std::size_t j) const {
  if (j >= batch_count_) fail("eval loader: batch {} is past the last batch {}", j, batch_count_ - 1);
  const std::size_t B = options_.batch_size;
  // A padding batch (past G) reads global batch 0: it exists, and its loss is not counted.
  const std::size_t g = batch_counts(j) ? j * static_cast<std::size_t>(options_.world_size) + static_cast<std::size_t>(options_.rank) : 0;
  std::vector<std::size_t> windows(B);
  for (std::size_t b = 0; b < B; ++b) windows[b] = g * B + b;
  return windows;
}

bool EvalLoader::next(std::span<std::int32_t> inputs, std::span<std::int32_t> targets) {
  if (next_batch_ >= batch_count_) return false;
  const std::vector<std::size_t> windows = batch_windows(next_batch_);
  copy_windows(file_, options_.sequence_length, windows, options_.vocab_size, inputs, targets);
  last_counts_ = batch_counts(next_batch_);
  ++next_batch_;
  return true;
}

}  // namespace dstrain
