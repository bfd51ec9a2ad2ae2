// EvalLoader: validation batches, llm.c style: the val file read once, in file order, for a fixed
// number of batches, the same ones at every evaluation.
//
// Windows are those of DataLoader (window i = tokens [i·T, i·T + T + 1), N = (count - 1) / T).
// An evaluation is G batches of B consecutive windows over all ranks together — global batch g is
// windows [g·B, (g + 1)·B) — with
//   G = total_batches() = min(max_batches, N / B)     (max_batches = 0: N / B, the whole file),
// so the windows evaluated, and the val loss (the mean of the G batch losses), do not depend on the
// world size W. Rank r takes the global batches g = j·W + r, j = 0, 1, ...; every rank runs the same
// number of batches, batch_count() = ceil(G / W), because evaluation is collective (ZeRO-3 gathers
// the parameters for every forward, and the ranks average their sums at the end): in the last round
// a rank whose g >= G evaluates a padding batch (global batch 0 again) that does not count
// (last_counts() is false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "data/token_file.h"

namespace dstrain {

struct EvalLoaderOptions {
  std::size_t batch_size = 1;       // B: sequences per rank per batch
  std::size_t sequence_length = 0;  // T
  int world_size = 1;               // W
  int rank = 0;                     // r
  std::size_t max_batches = 0;      // G: batches per evaluation over all ranks; 0: as many as the file holds
  std::int32_t vocab_size = 0;      // > 0: check every token read is below it (see DataLoaderOptions)
};

class EvalLoader {
 public:
  // Throws Error naming the file when it cannot be opened, or holds too few tokens for one batch
  // (its count, and the B·T + 1 tokens one batch needs), or an option is invalid.
  static EvalLoader open(const std::filesystem::path& path, const EvalLoaderOptions& options);
  EvalLoader(TokenFile file, const EvalLoaderOptions& options);

  // Fills the next batch ([B, T] inputs and targets) and returns true, or returns false (and leaves
  // the buffers alone) once batch_count() batches have been read.
  bool next(std::span<std::int32_t> inputs, std::span<std::int32_t> targets);
  // Whether the batch next() filled last counts in the val loss (false: a padding batch).
  bool last_counts() const { return last_counts_; }
  // Back to the first batch, for the next evaluation.
  void reset() { next_batch_ = 0; }

  // The windows of this rank's batch j (j < batch_count()), row by row.
  std::vector<std::size_t> batch_windows(std::size_t j) const;
  // Whether this rank's batch j counts (j·W + r < G).
  bool batch_counts(std::size_t j) const;

  std::size_t batch_count() const { return batch_count_; }      // ceil(G / W): batches every rank runs
  std::size_t total_batches() const { return total_batches_; }  // G: batches that count, over all ranks
  std::size_t window_count() const { return window_count_; }

 private:
  TokenFile file_;
  EvalLoaderOptions options_;
  std::size_t window_count_ = 0;
  std::size_t total_batches_ = 0;
  std::size_t batch_count_ = 0;
  std::size_t next_batch_ = 0;
  bool last_counts_ = false;
};

}  // namespace dstrain
