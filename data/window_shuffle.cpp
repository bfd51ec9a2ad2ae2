#include "data/window_shuffle.h"

#include <numeric>
#include <utility>

namespace dstrain {

std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Mixing the seed before the epoch is XORed in keeps (seed, epoch) and (seed ^ 1, epoch ^ 1) apart,
// and the outer mix64 keeps consecutive epochs from starting on neighbouring points of the stream.
WindowShuffleStream::WindowShuffleStream(std::uint64_t seed, std::uint64_t epoch) : state_(mix64(mix64(seed) ^ epoch)) {}

std::uint64_t WindowShuffleStream::next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return mix64(state_);
}

std::uint64_t WindowShuffleStream::below(std::uint64_t n) {
  // 2^64 mod n, computed in 64 bits as (2^64 - n) mod n; values below it would favour small results.
  const std::uint64_t threshold = (0 - n) % n;
  std::uint64_t x = next();
  while (x < threshold) x = next();
  return x % n;
}

std::vector<std::size_t> shuffled_window_order(std::size_t window_count, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::size_t> order(window_count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  WindowShuffleStream stream(seed, epoch);
  for (std::size_t i = window_count; i > 1; --i) {
    const auto j = static_cast<std::size_t>(stream.below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace dstrain
