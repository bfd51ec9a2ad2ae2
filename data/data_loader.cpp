#include "data/data_loader.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "data/window_shuffle.h"
#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

constexpr const char* kRegenerate = "make one with `dstrain prepare-data`";

void check_options(const DataLoaderOptions& o) {
  if (o.sequence_length == 0) fail("data loader: sequence_length is 0: give the model's context length, e.g. 1024");
  if (o.micro_batch_size == 0) {
    fail("data loader: micro_batch_size is 0: give train_micro_batch_size_per_gpu >= 1");
  }
  if (o.gradient_accumulation_steps < 1) {
    fail("data loader: gradient_accumulation_steps is {}: it must be >= 1", o.gradient_accumulation_steps);
  }
  if (o.world_size < 1) fail("data loader: world_size is {}: it must be >= 1", o.world_size);
  if (o.rank < 0 || o.rank >= o.world_size) {
    fail("data loader: rank {} is outside 0..{} (world_size {}): check RANK/WORLD_SIZE", o.rank, o.world_size - 1, o.world_size);
  }
  if (o.vocab_size < 0) fail("data loader: vocab_size is {}: give the tokenizer's vocabulary size, or 0", o.vocab_size);
}

// Windows of one sequence need T + 1 tokens; a file with fewer cannot give a single sequence.
std::size_t window_count_of(const TokenFile& file, std::size_t sequence_length) {
  if (file.size() < sequence_length + 1) {
    fail(
        "token file {} holds {} tokens, too few for one sequence of {} tokens (a window needs sequence_length + 1 = "
        "{}): use a larger data file or a shorter sequence length",
        file.path().string(), file.size(), sequence_length, sequence_length + 1);
  }
  return (file.size() - 1) / sequence_length;
}

}  // namespace

void copy_windows(const TokenFile& file, std::size_t sequence_length, std::span<const std::size_t> windows, std::int32_t vocab_size,
                  std::span<std::int32_t> inputs, std::span<std::int32_t> targets) {
  const std::size_t T = sequence_length;
  const std::size_t expected = windows.size() * T;
  if (inputs.size() != expected || targets.size() != expected) {
    fail("data loader: the batch buffers hold {} inputs and {} targets, but {} sequences of {} tokens need {} each", inputs.size(), targets.size(),
         windows.size(), T, expected);
  }
  // vocab_size 0 means checked only against int32, the type the batch holds ids in.
  const std::uint32_t limit = vocab_size > 0 ? static_cast<std::uint32_t>(vocab_size) : 0x80000000u;
  std::vector<std::uint32_t> window(T + 1);  // one window's tokens, read from the file (TokenFile::read)
  for (std::size_t row = 0; row < windows.size(); ++row) {
    const std::size_t start = windows[row] * T;
    if (start + T + 1 > file.size()) {
      fail("data loader: window {} (tokens {}..{}) lies past the end of {} ({} tokens)", windows[row], start, start + T, file.path().string(),
           file.size());
    }
    file.read(start, window);
    const std::uint32_t* src = window.data();
    std::int32_t* in = inputs.data() + row * T;
    std::int32_t* tg = targets.data() + row * T;
    std::uint32_t largest = 0;
    for (std::size_t t = 0; t < T; ++t) {
      in[t] = static_cast<std::int32_t>(src[t]);
      tg[t] = static_cast<std::int32_t>(src[t + 1]);
      largest = std::max(largest, src[t]);
    }
    largest = std::max(largest, src[T]);
    if (largest >= limit) {
      for (std::size_t t = 0; t <= T; ++t) {
        if (src[t] >= limit) {
          fail(
              "token file {}: token {} at position {} is >= the vocabulary size {}: the file was made with another "
              "tokenizer; {} with the model's tokenizer",
              file.path().string(), src[t], start + t, vocab_size, kRegenerate);
        }
      }
    }
  }
}

void validate_token_file(const TokenFile& file, std::int32_t vocab_size) {
  if (vocab_size <= 0) fail("validate: vocab_size is {}: give the tokenizer's vocabulary size (>= 1)", vocab_size);
  const auto limit = static_cast<std::uint32_t>(vocab_size);
  constexpr std::size_t kChunk = std::size_t{1} << 20;  // tokens per read: 4 MiB
  std::vector<std::uint32_t> chunk(std::min(kChunk, file.size()));
  for (std::size_t first = 0; first < file.size(); first += kChunk) {
    const std::size_t n = std::min(kChunk, file.size() - first);
    const std::span<std::uint32_t> part(chunk.data(), n);
    file.read(first, part);
    for (std::size_t i = 0; i < n; ++i) {
      if (part[i] >= limit) {
        fail(
            "token file {}: token {} at position {} is >= the vocabulary size {}: the file was made with another "
            "tokenizer; {} with the model's tokenizer",
            file.path().string(), part[i], first + i, vocab_size, kRegenerate);
      }
    }
  }
}

DataLoader DataLoader::open(const std::filesystem::path& path, const DataLoaderOptions& options) {
  check_options(options);  // before mapping, so a bad option is reported even for a missing file
  return DataLoader(TokenFile::open(path), options);
}

DataLoader::DataLoader(TokenFile file, const DataLoaderOptions& options) : file_(std::move(file)), options_(options) {
  check_options(options_);
  window_count_ = window_count_of(file_, options_.sequence_length);
  train_batch_size_ =
      options_.micro_batch_size * static_cast<std::size_t>(options_.gradient_accumulation_steps) * static_cast<std::size_t>(options_.world_size);
}

const std::vector<std::size_t>& DataLoader::order_of(std::uint64_t epoch) const {
  for (const CachedOrder& cached : cache_) {
    if (cached.valid && cached.epoch == epoch) return cached.order;
  }
  CachedOrder& slot = cache_[cache_next_];
  cache_next_ = (cache_next_ + 1) % 2;
  slot.epoch = epoch;
  if (options_.shuffle) {
    slot.order = shuffled_window_order(window_count_, options_.seed, epoch);
  } else {
    slot.order.resize(window_count_);
    std::iota(slot.order.begin(), slot.order.end(), std::size_t{0});
  }
  slot.valid = true;
  return slot.order;
}

std::size_t DataLoader::window_at(std::uint64_t stream_position) const {
  const std::uint64_t n = window_count_;
  return order_of(stream_position / n)[static_cast<std::size_t>(stream_position % n)];
}

std::vector<std::size_t> DataLoader::global_batch_windows() const {
  const std::uint64_t first = state_.epoch * window_count_ + state_.position;
  std::vector<std::size_t> windows(train_batch_size_);
  for (std::size_t i = 0; i < train_batch_size_; ++i) windows[i] = window_at(first + i);
  return windows;
}

std::vector<std::size_t> DataLoader::micro_batch_windows(int micro_step) const {
  if (micro_step < 0 || micro_step >= options_.gradient_accumulation_steps) {
    fail("data loader: micro-step {} is outside 0..{} (gradient_accumulation_steps {})", micro_step, options_.gradient_accumulation_steps - 1,
         options_.gradient_accumulation_steps);
  }
  const std::size_t B = options_.micro_batch_size;
  const auto slot = static_cast<std::size_t>(micro_step) * static_cast<std::size_t>(options_.world_size) + static_cast<std::size_t>(options_.rank);
  const std::uint64_t first = state_.epoch * window_count_ + state_.position + slot * B;
  std::vector<std::size_t> windows(B);
  for (std::size_t b = 0; b < B; ++b) windows[b] = window_at(first + b);
  return windows;
}

void DataLoader::load_micro_batch(int micro_step, std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const {
  const std::vector<std::size_t> windows = micro_batch_windows(micro_step);
  copy_windows(file_, options_.sequence_length, windows, options_.vocab_size, inputs, targets);
}

void DataLoader::advance_step() {
  const std::uint64_t next = state_.position + train_batch_size_;
  const std::uint64_t previous_epoch = state_.epoch;
  state_.epoch += next / window_count_;
  state_.position = next % window_count_;
  micro_step_ = 0;
  // When the data starts repeating is worth a line in the training log, once: by the loader of data
  // rank 0 (ranks may be threads of one process, where log_info's own rank filter sees one rank).
  if (state_.epoch != previous_epoch && options_.rank == 0) {
    log_info("data: {} now in epoch {} ({} windows of {} tokens per epoch)", file_.path().string(), state_.epoch, window_count_,
             options_.sequence_length + 1);
  }
}

void DataLoader::next_micro_batch(std::span<std::int32_t> inputs, std::span<std::int32_t> targets) {
  load_micro_batch(micro_step_, inputs, targets);
  if (++micro_step_ == options_.gradient_accumulation_steps) advance_step();
}

void DataLoader::set_state(const DataLoaderState& state) {
  if (state.position >= window_count_) {
    fail(
        "data loader state: position {} is not below the {} windows of {} (sequence length {}): the state was "
        "saved for another data file or sequence length; resume with the same --data and model",
        state.position, window_count_, file_.path().string(), options_.sequence_length);
  }
  state_ = state;
  micro_step_ = 0;
}

void DataLoader::validate(std::int32_t vocab_size) const { validate_token_file(file_, vocab_size); }

}  // namespace dstrain
