// The seeded order in which the training data loader visits sequence windows in one epoch.
//
// The order must be the same on every machine, compiler and standard library, because every
// data-parallel rank computes it on its own and the ranks must agree on the global batch; a resumed
// run must also see the order it was trained with. std::shuffle and std::uniform_int_distribution
// are implementation-defined, so the algorithm is spelled out here, small enough to re-implement in
// a few lines of Python (tests/unit/data/test_data_loader.cpp pins outputs computed that way):
//
//   mix64(x):  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27; x *= 0x94d049bb133111eb;
//              x ^= x >> 31                                   (splitmix64's finaliser; mod 2^64)
//   stream:    s = mix64(mix64(seed) ^ epoch); next() = { s += 0x9e3779b97f4a7c15; return mix64(s); }
//   below(n):  an unbiased draw in [0, n): threshold = 2^64 mod n; draw x = next() until
//              x >= threshold; return x mod n                 (arc4random_uniform's rejection)
//   shuffle:   order = [0, 1, ..., N-1]; for i = N-1 down to 1: swap(order[i], order[below(i + 1)])
//                                                             (Fisher–Yates, Durstenfeld's form)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dstrain {

// splitmix64's output function: a bijection on 64-bit integers that spreads every input bit.
std::uint64_t mix64(std::uint64_t x);

// The deterministic random stream behind the shuffle, keyed by (seed, epoch) as described above.
class WindowShuffleStream {
 public:
  WindowShuffleStream(std::uint64_t seed, std::uint64_t epoch);
  std::uint64_t next();
  // Uniform in [0, n) without modulo bias; n >= 1.
  std::uint64_t below(std::uint64_t n);

 private:
  std::uint64_t state_;
};

// The visiting order of `window_count` windows in `epoch`: a permutation of 0..window_count-1,
// a pure function of (seed, epoch, window_count).
std::vector<std::size_t> shuffled_window_order(std::size_t window_count, std::uint64_t seed, std::uint64_t epoch);

}  // namespace dstrain
