// Philox4x32-10: the counter-based RNG of Salmon et al., "Parallel Random Numbers: As Easy as
// 1, 2, 3" (SC'11), as in D. E. Shaw Research's Random123 library.
//
// Why counter-based: a random number is a pure function of (key, counter), so dropout masks are
// never stored. Backward and activation-checkpoint recompute regenerate exactly the forward mask,
// and the CPU, the GPU and any world size agree, because each element's bits depend only on its
// address, not on which thread or rank produced it.
//
// Addressing (docs/design.md "RNG"): key = the 64-bit seed; counter =
//   {group bits 0..31,  group bits 32..47 | site << 16,  step,  layer << 16 | micro_batch}
// where group = element / 4 (one Philox call yields 4 words, one per element of the group), and
// site tells apart the dropout call sites of one layer (attention probabilities, attention
// output, MLP output, ...). layer, micro_batch and site must be < 65536, elements < 2^50.
//
// Header-only and constexpr, with __host__ __device__ under nvcc, so the CUDA kernels include
// this very file.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSTRAIN_HOST_DEVICE __host__ __device__
#else
#define DSTRAIN_HOST_DEVICE
#endif

namespace dstrain {

struct PhiloxCounter {
  std::uint32_t v[4];
};
struct PhiloxKey {
  std::uint32_t v[2];
};

namespace philox_detail {
inline constexpr std::uint32_t kM0 = 0xD2511F53u;  // multipliers (Random123 PHILOX_M4x32_0/1)
inline constexpr std::uint32_t kM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kW0 = 0x9E3779B9u;  // Weyl key increments (golden ratio, sqrt(3)-1)
inline constexpr std::uint32_t kW1 = 0xBB67AE85u;

DSTRAIN_HOST_DEVICE constexpr PhiloxCounter round(PhiloxCounter c, PhiloxKey k) {
  const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c.v[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c.v[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
  return PhiloxCounter{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}
}  // namespace philox_detail

// The 10-round block function: 128 random bits per (counter, key).
DSTRAIN_HOST_DEVICE constexpr PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k.v[0] += philox_detail::kW0;
      k.v[1] += philox_detail::kW1;
    }
    c = philox_detail::round(c, k);
  }
  return c;
}

// Where a stream of random numbers belongs: (seed, step, layer, micro_batch, site). See the top
// comment.
struct RngKey {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t layer = 0;        // < 65536
  std::uint32_t micro_batch = 0;  // < 65536
  std::uint32_t site = 0;         // < 65536: which dropout call site within the layer

  // Largest element count a stream addresses (2^48 groups of 4).
  static constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 50;

  DSTRAIN_HOST_DEVICE constexpr bool valid() const { return layer < 65536u && micro_batch < 65536u && site < 65536u; }
  DSTRAIN_HOST_DEVICE constexpr PhiloxKey key() const {
    return PhiloxKey{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
  }
  // The counter of element group g (elements 4g .. 4g+3).
  DSTRAIN_HOST_DEVICE constexpr PhiloxCounter counter(std::uint64_t group) const {
    return PhiloxCounter{
        {static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32) | (site << 16), step, (layer << 16) | micro_batch}};
  }
  // The four random words of element group g.
  DSTRAIN_HOST_DEVICE constexpr PhiloxCounter group_bits(std::uint64_t group) const { return philox4x32_10(counter(group), key()); }
  // The random word of one element.
  DSTRAIN_HOST_DEVICE constexpr std::uint32_t element_bits(std::uint64_t element) const { return group_bits(element >> 2).v[element & 3u]; }
};

// Uniform in [0, 1) from the top 24 bits: exactly representable in fp32, identical on CPU and GPU.
DSTRAIN_HOST_DEVICE constexpr float philox_uniform(std::uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1p-24f; }

// Dropout's keep decision for one element: kept with probability 1 - p.
DSTRAIN_HOST_DEVICE constexpr bool dropout_keep(std::uint32_t bits, float p) { return philox_uniform(bits) >= p; }

}  // namespace dstrain
