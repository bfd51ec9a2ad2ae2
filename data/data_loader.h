// DataLoader: training batches of int32 tokens from an llm.c token file.
//
// Windows. With T = sequence_length and `count` tokens in the file, the file is cut into
//   N = (count - 1) / T
// non-overlapping windows; window i is tokens [i·T, i·T + T + 1). A window yields one sequence:
// inputs = its first T tokens, targets = its last T (the inputs shifted by one). Consecutive windows
// share one token (the last target of window i is the first input of window i+1); the tail of the
// file that does not fill a window is never used.
//
// Data order. Epoch e visits all N windows once, in order_e = shuffled_window_order(N, seed, e)
// (data/window_shuffle.h), or in file order (order_e[i] = i) with shuffle = false. The epochs
// are laid end to end into one stream: stream position p holds window
//   window(p) = order_{p / N}[p mod N].
// The global batch of optimizer step k (counted from a fresh loader) is the TBS windows at stream
// positions [k·TBS, (k+1)·TBS), TBS = train_batch_size = B·GAS·W. A step may cross from one epoch
// into the next; with TBS > N it may even hold a window twice.
//
// Data parallelism. Rank r (of W), micro-step m (of GAS) takes the B consecutive global-batch
// positions [(m·W + r)·B, (m·W + r + 1)·B), i.e. the windows at stream positions
//   k·TBS + (m·W + r)·B + b,   b = 0..B-1,
// and its micro-batch row b is the sequence of that window. So the global batch of a step is the same
// sequences for any W and GAS with the same TBS; the ranks' slices are disjoint and cover it; and the
// m-th micro-steps of all ranks together are one contiguous block of W·B sequences, which is what
// gradient accumulation on one rank with B' = W·B would see at that micro-step.
//
// State. (epoch, position) is the stream position epoch·N + position of the current step's first
// window, position < N. It does not depend on W, GAS or rank, so a checkpoint taken at one world
// size resumes at another (with the same TBS the steps are the same batches).
//
// Not thread-safe: each rank (thread or process) owns its loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "data/token_file.h"

namespace dstrain {

struct DataLoaderOptions {
  std::size_t micro_batch_size = 1;     // B: sequences per rank per micro-step
  std::size_t sequence_length = 0;      // T: tokens per sequence (each window is T + 1 tokens)
  int gradient_accumulation_steps = 1;  // GAS
  int world_size = 1;                   // W: data-parallel ranks
  int rank = 0;                         // r: this rank, 0..W-1
  bool shuffle = true;                  // false: windows in file order (evaluation, debugging)
  std::uint64_t seed = 0;               // the shuffle's seed; epoch e uses (seed, e)
  // When > 0, every token copied into a batch is checked to be < vocab_size (a token file made with
  // another tokenizer otherwise indexes past the embedding table). The check rides on the copy, so it
  // costs nothing measurable and never pages in the whole file; validate() scans everything up front.
  std::int32_t vocab_size = 0;
};

// Where the loader stands: the stream position epoch·N + position of the current step's first window.
struct DataLoaderState {
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;  // < window_count()
  friend bool operator==(const DataLoaderState&, const DataLoaderState&) = default;
};

class DataLoader {
 public:
  // Opens `path` as a TokenFile. Throws Error naming the file when it cannot be opened, holds fewer than
  // T + 1 tokens (with its count and T), or the options are inconsistent (naming the option).
  static DataLoader open(const std::filesystem::path& path, const DataLoaderOptions& options);
  DataLoader(TokenFile file, const DataLoaderOptions& options);

  // ---- reading ----
  // Fills micro-batch `micro_step` (0..GAS-1) of this rank for the current step: `inputs` and
  // `targets` are [B, T] row-major and must hold exactly B·T values each. Does not advance.
  void load_micro_batch(int micro_step, std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const;
  // Moves to the next optimizer step: position += TBS (into later epochs as needed).
  void advance_step();
  // llm.c-style sequential reading: loads micro-step micro_step() of the current step, then moves to
  // the next micro-step, and after the GAS-th to the next step.
  void next_micro_batch(std::span<std::int32_t> inputs, std::span<std::int32_t> targets);
  // The micro-step next_micro_batch() loads next (0 right after advance_step() or set_state()).
  int micro_step() const { return micro_step_; }

  // ---- which windows ----
  // The window at stream position p (the rule above).
  std::size_t window_at(std::uint64_t stream_position) const;
  // The current step's TBS windows, in global-batch order.
  std::vector<std::size_t> global_batch_windows() const;
  // This rank's B windows for `micro_step` of the current step, row by row.
  std::vector<std::size_t> micro_batch_windows(int micro_step) const;

  // ---- state, for checkpoints ----
  DataLoaderState state() const { return state_; }
  // Jumps to `state` at micro-step 0. Throws Error if state.position >= window_count() (a checkpoint of
  // another data file or sequence length).
  void set_state(const DataLoaderState& state);
  // The epoch of the current step's first window; advance_step() on rank 0 logs (info) when it changes.
  std::uint64_t epoch() const { return state_.epoch; }

  // Scans the whole file once; throws Error naming the file, the first position holding a token
  // >= vocab_size, and the token.
  void validate(std::int32_t vocab_size) const;

  std::size_t window_count() const { return window_count_; }          // N
  std::size_t train_batch_size() const { return train_batch_size_; }  // TBS = B·GAS·W, in sequences
  const DataLoaderOptions& options() const { return options_; }
  const TokenFile& file() const { return file_; }

 private:
  const std::vector<std::size_t>& order_of(std::uint64_t epoch) const;

  TokenFile file_;
  DataLoaderOptions options_;
  std::size_t window_count_ = 0;
  std::size_t train_batch_size_ = 0;
  DataLoaderState state_;
  int micro_step_ = 0;
  // The orders of the last two epochs asked for: a step reads at most a few consecutive epochs, and
  // an order is O(N) to build, so reading one batch must not rebuild it per window.
  struct CachedOrder {
    std::uint64_t epoch = 0;
    std::vector<std::size_t> order;
    bool valid = false;
  };
  mutable CachedOrder cache_[2];
  mutable std::size_t cache_next_ = 0;
};

// Copies windows `windows` of `file` (window i = tokens [i·T, i·T + T + 1)) into inputs/targets
// ([windows.size(), T] each), checking tokens < vocab_size when vocab_size > 0. Shared by the
// training and evaluation loaders.
void copy_windows(const TokenFile& file, std::size_t sequence_length, std::span<const std::size_t> windows, std::int32_t vocab_size,
                  std::span<std::int32_t> inputs, std::span<std::int32_t> targets);

// Throws Error naming the first position of `file` whose token is >= vocab_size.
void validate_token_file(const TokenFile& file, std::int32_t vocab_size);

}  // namespace dstrain
