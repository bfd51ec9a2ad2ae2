// FlatLayout (zero/flat_layout.h) against offsets written out by hand for a small layer, and
// against an independent brute-force check of every layout rule over random layers, world sizes,
// element sizes and chunk limits: 64-byte aligned offsets, decayed params first, tied params
// skipped, numel a multiple of world · ealign, chunks that tile [0, numel), pieces that tile every
// chunk, shard offsets that put a rank's pieces back to back.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ops/error.h"
#include "models/layer.h"
#include "zero/flat_layout.h"

namespace dstrain {
namespace {

ParamSpec spec(const std::string& name, std::int64_t n, bool decay, const std::string& tied_to = "") {
  ParamSpec s;
  s.name = name;
  s.shape = Shape{n};
  s.init = ParamInit::zeros();
  s.weight_decay = decay;
  s.tied_to = tied_to;
  return s;
}

// A layer in params() order: A (decay, 10), B (no decay, 3), C (tied to an earlier layer's
// parameter), D (decay, 17), E (no decay, 1).
std::vector<ParamSpec> small_layer() {
  return {spec("a", 10, true), spec("b", 3, false), spec("c", 12, true, "wte.weight"), spec("d", 17, true), spec("e", 1, false)};
}

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

TEST(ZeroFlatLayout, SmallLayerFp32ByHand) {
  const auto specs = small_layer();
  // fp32: ealign = 64 / 4 = 16 elements. Decayed first: a at 0 (ends 10), d at 16 (ends 33);
  // decay_end = 48; then b at 48 (ends 51), e at 64 (ends 65); used = 80.
  const FlatLayout l = make_flat_layout(specs, 1, 4, 0);
  EXPECT_EQ(l.ealign, 16);
  ASSERT_EQ(l.slots.size(), 4u);
  EXPECT_EQ(l.slots[0].spec, 0u);
  EXPECT_EQ(l.slots[0].offset, 0);
  EXPECT_EQ(l.slots[0].numel, 10);
  EXPECT_TRUE(l.slots[0].weight_decay);
  EXPECT_EQ(l.slots[1].spec, 3u);
  EXPECT_EQ(l.slots[1].offset, 16);
  EXPECT_EQ(l.slots[1].numel, 17);
  EXPECT_TRUE(l.slots[1].weight_decay);
  EXPECT_EQ(l.slots[2].spec, 1u);
  EXPECT_EQ(l.slots[2].offset, 48);
  EXPECT_EQ(l.slots[2].numel, 3);
  EXPECT_FALSE(l.slots[2].weight_decay);
  EXPECT_EQ(l.slots[3].spec, 4u);
  EXPECT_EQ(l.slots[3].offset, 64);
  EXPECT_EQ(l.slots[3].numel, 1);
  EXPECT_EQ(l.decay_end, 48);
  EXPECT_EQ(l.used, 80);
  EXPECT_EQ(l.numel, 80);
  EXPECT_EQ(l.chunk_count(), 1);
  EXPECT_EQ(l.slot_of(2), nullptr);  // tied: the owner holds it
  ASSERT_NE(l.slot_of(3), nullptr);
  EXPECT_EQ(l.slot_of(3)->offset, 16);
  EXPECT_EQ(l.slot_of(99), nullptr);

  // Same element layout for any world; only the padding changes: world · 16 divides numel.
  EXPECT_EQ(make_flat_layout(specs, 2, 4, 0).numel, 96);   // unit 32
  EXPECT_EQ(make_flat_layout(specs, 3, 4, 0).numel, 96);   // unit 48
  EXPECT_EQ(make_flat_layout(specs, 4, 4, 0).numel, 128);  // unit 64
  EXPECT_EQ(make_flat_layout(specs, 5, 4, 0).numel, 80);   // unit 80 = used
  EXPECT_EQ(make_flat_layout(specs, 6, 4, 0).numel, 96);   // unit 96 > used
  EXPECT_EQ(make_flat_layout(specs, 7, 4, 0).numel, 112);  // unit 112
  for (int w : {2, 3, 4, 5, 6}) {
    const FlatLayout lw = make_flat_layout(specs, w, 4, 0);
    EXPECT_EQ(lw.used, 80) << w;
    EXPECT_EQ(lw.decay_end, 48) << w;
    ASSERT_EQ(lw.slots.size(), 4u);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(lw.slots[i].offset, l.slots[i].offset) << w;
  }
}

TEST(ZeroFlatLayout, SmallLayerBf16ByHand) {
  // 2-byte elements: ealign = 32. a at 0, d at 32 (ends 49), decay_end 64; b at 64, e at 96
  // (ends 97); used 128.
  const FlatLayout l = make_flat_layout(small_layer(), 2, 2, 0);
  EXPECT_EQ(l.ealign, 32);
  ASSERT_EQ(l.slots.size(), 4u);
  EXPECT_EQ(l.slots[0].offset, 0);
  EXPECT_EQ(l.slots[1].offset, 32);
  EXPECT_EQ(l.slots[2].offset, 64);
  EXPECT_EQ(l.slots[3].offset, 96);
  EXPECT_EQ(l.decay_end, 64);
  EXPECT_EQ(l.used, 128);
  EXPECT_EQ(l.numel, 128);                                         // unit 64 divides 128
  EXPECT_EQ(make_flat_layout(small_layer(), 3, 2, 0).numel, 192);  // unit 96
  EXPECT_EQ(l.shard_numel(), 64);
  EXPECT_EQ(l.piece(0, 0).begin, 0);
  EXPECT_EQ(l.piece(0, 0).end, 64);
  EXPECT_EQ(l.piece(0, 1).begin, 64);
  EXPECT_EQ(l.piece(0, 1).end, 128);
}

TEST(ZeroFlatLayout, ChunksByHand) {
  // fp32, world 2: numel 96 (unit 32). max_chunk 40 rounds up to 64: chunks [0,64), [64,96).
  const FlatLayout l = make_flat_layout(small_layer(), 2, 4, 40);
  EXPECT_EQ(l.chunk, 64);
  ASSERT_EQ(l.chunk_count(), 2);
  EXPECT_EQ(l.chunk_range(0).begin, 0);
  EXPECT_EQ(l.chunk_range(0).end, 64);
  EXPECT_EQ(l.chunk_range(1).begin, 64);
  EXPECT_EQ(l.chunk_range(1).end, 96);
  // Rank r's piece: the r-th half of each chunk.
  EXPECT_EQ(l.piece(0, 0).begin, 0);
  EXPECT_EQ(l.piece(0, 0).end, 32);
  EXPECT_EQ(l.piece(0, 1).begin, 32);
  EXPECT_EQ(l.piece(0, 1).end, 64);
  EXPECT_EQ(l.piece(1, 0).begin, 64);
  EXPECT_EQ(l.piece(1, 0).end, 80);
  EXPECT_EQ(l.piece(1, 1).begin, 80);
  EXPECT_EQ(l.piece(1, 1).end, 96);
  // A rank's shard: 32 + 16 elements, piece 1 at 32.
  EXPECT_EQ(l.shard_numel(), 48);
  EXPECT_EQ(l.shard_offset(0), 0);
  EXPECT_EQ(l.shard_offset(1), 32);
  EXPECT_THROW(l.chunk_range(2), Error);
  EXPECT_THROW(l.chunk_range(-1), Error);

  // An exact multiple stays: max_chunk 32 → chunks of 32: 3 of them.
  const FlatLayout l32 = make_flat_layout(small_layer(), 2, 4, 32);
  EXPECT_EQ(l32.chunk, 32);
  EXPECT_EQ(l32.chunk_count(), 3);
  // max_chunk 1 rounds up to one unit (32).
  EXPECT_EQ(make_flat_layout(small_layer(), 2, 4, 1).chunk, 32);
  // A limit above numel: one chunk.
  const FlatLayout big = make_flat_layout(small_layer(), 2, 4, 10'000);
  EXPECT_EQ(big.chunk_count(), 1);
  EXPECT_EQ(big.chunk_range(0).end, 96);
  // max_chunk <= 0: one chunk.
  EXPECT_EQ(make_flat_layout(small_layer(), 2, 4, -5).chunk_count(), 1);
}

TEST(ZeroFlatLayout, IntersectRanges) {
  EXPECT_EQ(intersect({0, 10}, {5, 20}).begin, 5);
  EXPECT_EQ(intersect({0, 10}, {5, 20}).end, 10);
  EXPECT_TRUE(intersect({0, 10}, {10, 20}).empty());
  EXPECT_TRUE(intersect({30, 40}, {0, 20}).empty());
  EXPECT_EQ(intersect({30, 40}, {0, 20}).size(), 0);
  EXPECT_EQ(intersect({3, 7}, {0, 100}).size(), 4);
}

TEST(ZeroFlatLayout, EdgeLayers) {
  // Only tied params: nothing owned, an empty buffer.
  const std::vector<ParamSpec> tied_only{spec("h", 64, true, "wte.weight")};
  const FlatLayout t = make_flat_layout(tied_only, 4, 4, 0);
  EXPECT_TRUE(t.slots.empty());
  EXPECT_EQ(t.used, 0);
  EXPECT_EQ(t.numel, 0);
  EXPECT_EQ(t.chunk_count(), 0);
  EXPECT_EQ(t.shard_numel(), 0);
  // Only non-decayed params: decay_end 0.
  const std::vector<ParamSpec> nd{spec("g", 5, false), spec("b", 5, false)};
  const FlatLayout n = make_flat_layout(nd, 1, 4, 0);
  EXPECT_EQ(n.decay_end, 0);
  EXPECT_EQ(n.slots[1].offset, 16);
  EXPECT_EQ(n.used, 32);
  // Only decayed params: decay_end = used.
  const std::vector<ParamSpec> d{spec("w", 20, true)};
  const FlatLayout dl = make_flat_layout(d, 1, 4, 0);
  EXPECT_EQ(dl.decay_end, 32);
  EXPECT_EQ(dl.used, 32);
  // An exact multiple of 16 needs no padding.
  EXPECT_EQ(make_flat_layout(std::vector<ParamSpec>{spec("w", 48, true)}, 3, 4, 0).numel, 48);
}

TEST(ZeroFlatLayout, BadInputsAreErrors) {
  const auto specs = small_layer();
  EXPECT_THROW(make_flat_layout(specs, 0, 4, 0), Error);
  EXPECT_THROW(make_flat_layout(specs, -2, 4, 0), Error);
  EXPECT_THROW(make_flat_layout(specs, 1, 0, 0), Error);
  EXPECT_THROW(make_flat_layout(specs, 1, 3, 0), Error);    // 3 does not divide 64
  EXPECT_THROW(make_flat_layout(specs, 1, 128, 0), Error);  // larger than the alignment
  try {
    make_flat_layout(specs, 0, 4, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world"), std::string::npos) << e.what();
  }
}

// The plain aligned packing, written independently: decayed untied specs in order, then the
// non-decayed ones, each starting at the next multiple of ealign.
struct Packed {
  std::vector<std::size_t> order;
  std::vector<std::int64_t> offsets;
  std::int64_t decay_end = 0, used = 0;
};
Packed plain_packing(const std::vector<ParamSpec>& specs, std::int64_t ealign) {
  Packed p;
  std::int64_t at = 0;
  for (bool decay : {true, false}) {
    for (std::size_t j = 0; j < specs.size(); ++j) {
      if (specs[j].tied() || specs[j].weight_decay != decay) continue;
      at = round_up(at, ealign);
      p.order.push_back(j);
      p.offsets.push_back(at);
      at += specs[j].shape.numel();
    }
    at = round_up(at, ealign);
    if (decay) p.decay_end = at;
  }
  p.used = at;
  return p;
}

// Brute force over random layers: every rule of the header, checked element by element.
TEST(ZeroFlatLayout, RandomLayersObeyEveryRule) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<ParamSpec> specs;
    const int n = static_cast<int>(rng() % 7);
    for (int j = 0; j < n; ++j) {
      const std::int64_t numel = 1 + static_cast<std::int64_t>(rng() % 300);
      const bool tied = rng() % 5 == 0;
      std::string name = "p";
      name += std::to_string(j);
      specs.push_back(spec(name, numel, rng() % 2 == 0, tied ? "x.weight" : ""));
    }
    const int world = 1 + static_cast<int>(rng() % 6);
    const std::size_t ebytes = rng() % 2 == 0 ? 2 : 4;
    const std::int64_t max_chunk = rng() % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % 700) - 20;
    SCOPED_TRACE(testing::Message() << "iter " << iter << " world " << world << " ebytes " << ebytes << " max_chunk " << max_chunk);
    const FlatLayout l = make_flat_layout(specs, world, ebytes, max_chunk);
    const std::int64_t ealign = 64 / static_cast<std::int64_t>(ebytes);
    const std::int64_t unit = ealign * world;
    ASSERT_EQ(l.ealign, ealign);
    ASSERT_EQ(l.world, world);

    // Slots: the plain aligned packing (world does not move anything), 64-byte aligned.
    const Packed ref = plain_packing(specs, ealign);
    ASSERT_EQ(l.slots.size(), ref.order.size());
    for (std::size_t s = 0; s < ref.order.size(); ++s) {
      EXPECT_EQ(l.slots[s].spec, ref.order[s]);
      EXPECT_EQ(l.slots[s].offset, ref.offsets[s]);
      EXPECT_EQ(l.slots[s].numel, specs[ref.order[s]].shape.numel());
      EXPECT_EQ(l.slots[s].weight_decay, specs[ref.order[s]].weight_decay);
      EXPECT_EQ(l.slots[s].offset * static_cast<std::int64_t>(ebytes) % 64, 0);
      // decayed slots inside [0, decay_end), the rest inside [decay_end, used)
      if (l.slots[s].weight_decay) {
        EXPECT_LE(l.slots[s].offset + l.slots[s].numel, l.decay_end);
      } else {
        EXPECT_GE(l.slots[s].offset, l.decay_end);
      }
      EXPECT_LE(l.slots[s].offset + l.slots[s].numel, l.used);
      EXPECT_EQ(l.slot_of(ref.order[s]), &l.slots[s]);
    }
    for (std::size_t j = 0; j < specs.size(); ++j) {
      if (specs[j].tied()) {
        EXPECT_EQ(l.slot_of(j), nullptr);
      }
    }
    EXPECT_EQ(l.decay_end, ref.decay_end);
    EXPECT_EQ(l.used, ref.used);
    EXPECT_EQ(l.numel, round_up(ref.used, unit));
    EXPECT_EQ(l.numel % unit, 0);
    EXPECT_EQ(l.shard_numel() * world, l.numel);

    // Chunks tile [0, numel) exactly; each a multiple of world · ealign; at most max_chunk
    // rounded up to the unit.
    if (l.numel == 0) {
      EXPECT_EQ(l.chunk_count(), 0);
      continue;
    }
    EXPECT_EQ(l.chunk % unit, 0);
    if (max_chunk > 0) {
      EXPECT_LE(l.chunk, round_up(max_chunk, unit));
    } else {
      EXPECT_EQ(l.chunk_count(), 1);
    }
    std::int64_t at = 0;
    std::vector<std::int64_t> shard_at(static_cast<std::size_t>(world), 0);
    for (std::int64_t k = 0; k < l.chunk_count(); ++k) {
      const FlatRange c = l.chunk_range(k);
      ASSERT_EQ(c.begin, at) << "chunk " << k;
      ASSERT_GT(c.size(), 0);
      EXPECT_EQ(c.size() % unit, 0) << "chunk " << k;
      if (k + 1 < l.chunk_count()) {
        EXPECT_EQ(c.size(), l.chunk);
      }
      // Pieces of all ranks tile the chunk, in rank order, equal in size.
      std::int64_t p_at = c.begin;
      for (int r = 0; r < world; ++r) {
        const FlatRange p = l.piece(k, r);
        ASSERT_EQ(p.begin, p_at) << "chunk " << k << " rank " << r;
        EXPECT_EQ(p.size() * world, c.size());
        EXPECT_EQ(p.begin * static_cast<std::int64_t>(ebytes) % 64, 0);
        // The shard holds pieces back to back.
        EXPECT_EQ(l.shard_offset(k), shard_at[static_cast<std::size_t>(r)]) << "chunk " << k << " rank " << r;
        shard_at[static_cast<std::size_t>(r)] += p.size();
        p_at = p.end;
      }
      EXPECT_EQ(p_at, c.end);
      at = c.end;
    }
    EXPECT_EQ(at, l.numel);
    for (int r = 0; r < world; ++r) EXPECT_EQ(shard_at[static_cast<std::size_t>(r)], l.shard_numel());
  }
}

// World 1 is the plain aligned packing, one chunk per layer without a limit, shard = buffer.
TEST(ZeroFlatLayout, WorldOneIsPlainPacking) {
  const auto specs = small_layer();
  for (std::size_t eb : {2u, 4u}) {
    const FlatLayout l = make_flat_layout(specs, 1, eb, 0);
    const Packed ref = plain_packing(specs, 64 / static_cast<std::int64_t>(eb));
    EXPECT_EQ(l.numel, ref.used);
    EXPECT_EQ(l.decay_end, ref.decay_end);
    EXPECT_EQ(l.chunk_count(), 1);
    EXPECT_EQ(l.shard_numel(), l.numel);
    EXPECT_EQ(l.piece(0, 0).begin, 0);
    EXPECT_EQ(l.piece(0, 0).end, l.numel);
  }
}

}  // namespace
}  // namespace dstrain
