// ParamCoordinator (zero/param_coordinator.h) with fake callbacks that record every gather, wait
// and release and track the live elements themselves. The reference is a small trace written out
// by hand — forward 0..3 then backward 3..0, layer 3 (a tied LM head) needing owner 0 as well as
// its own — with the reuse distances computed by hand below, and a randomized brute-force check
// of the invariants (live <= max_live at every event, needed owners gathered and waited before the
// call, prefetch within its bucket, the reuse rule with distances computed independently).
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ops/error.h"
#include "zero/param_coordinator.h"

namespace dstrain {
namespace {

// Owner sizes (elements): layer 0 = 10 (embedding), 1 = 20, 2 = 30, 3 = 40 (head: reads 0 too).
const std::vector<std::int64_t> kNumel{10, 20, 30, 40};
const std::vector<std::vector<std::size_t>> kNeeds{{0}, {1}, {2}, {3, 0}};
const std::vector<std::string> kNames{"embed", "h.0", "h.1", "head"};
// Forward 0..3, backward 3..0.
const std::vector<std::size_t> kTrace{0, 1, 2, 3, 3, 2, 1, 0};
//
// Reuse distances (elements of the owners needed by the calls strictly between two uses):
//   owner 0: pos 0 -> pos 3: calls 1, 2 = 20 + 30 = 50;  pos 3 -> 4: 0;  pos 4 -> 7: calls 2, 1 = 50
//   owner 1: pos 1 -> pos 6: 30 + 50 + 50 + 30 = 160
//   owner 2: pos 2 -> pos 5: 50 + 50 = 100
//   owner 3: pos 3 -> pos 4: 0

struct Fake {
  std::vector<std::int64_t> numel;
  std::int64_t max_live;
  std::vector<bool> gathered, waited;
  std::int64_t live = 0, peak = 0;
  std::uint64_t gathers = 0;
  std::vector<std::string> events;
  // Per before(): what it gathered / released (for the brute-force checks).
  std::vector<std::size_t> gathered_now, released_now;

  Fake(std::vector<std::int64_t> n, std::int64_t ml) : numel(std::move(n)), max_live(ml), gathered(numel.size()), waited(numel.size()) {}

  ParamCoordinatorCallbacks callbacks() {
    return {[this](std::size_t o) {
              EXPECT_FALSE(gathered[o]) << "owner " << o << " gathered twice";
              EXPECT_GT(numel[o], 0) << "owner " << o << " has nothing partitioned";
              gathered[o] = true;
              waited[o] = false;
              live += numel[o];
              peak = std::max(peak, live);
              ++gathers;
              EXPECT_LE(live, max_live) << "max_live exceeded by gathering owner " << o;
              events.push_back("G" + std::to_string(o));
              gathered_now.push_back(o);
            },
            [this](std::size_t o) {
              EXPECT_TRUE(gathered[o]) << "wait for owner " << o << " that is not gathered";
              waited[o] = true;
              events.push_back("W" + std::to_string(o));
            },
            [this](std::size_t o) {
              EXPECT_TRUE(gathered[o]) << "release of owner " << o << " that is not gathered";
              gathered[o] = false;
              waited[o] = false;
              live -= numel[o];
              events.push_back("R" + std::to_string(o));
              released_now.push_back(o);
            }};
  }
};

// Calls layer i as the engine does; checks that every owner it needs (with elements) is gathered
// and waited for when the layer runs.
void call(ParamCoordinator& pc, Fake& f, const std::vector<std::vector<std::size_t>>& needs, std::size_t i) {
  f.gathered_now.clear();
  f.released_now.clear();
  pc.before(i);
  for (std::size_t o : needs[i]) {
    if (f.numel[o] == 0) continue;
    EXPECT_TRUE(f.gathered[o] && f.waited[o]) << "layer " << i << " runs without owner " << o;
  }
  f.events.push_back("[" + std::to_string(i) + "]");
  EXPECT_EQ(pc.live(), f.live);
  pc.after(i);
}

std::string joined(const std::vector<std::string>& ev) {
  std::string s;
  for (const auto& e : ev) {
    if (!s.empty()) s.push_back(' ');
    s.append(e);
  }
  return s;
}

// Runs kTrace once, checks the coordinator's counters against the fake's, returns the events.
std::string run_trace(const ParamCoordinatorSettings& s, Fake& f) {
  ParamCoordinator pc(kNumel, kNeeds, kNames, s, f.callbacks());
  pc.begin_pass(kTrace);
  for (std::size_t i : kTrace) call(pc, f, kNeeds, i);
  EXPECT_TRUE(pc.prefetching());
  EXPECT_EQ(pc.gathers(), f.gathers);
  EXPECT_EQ(pc.peak_live(), f.peak);
  pc.end_pass();
  EXPECT_EQ(f.live, 0);
  EXPECT_EQ(pc.live(), 0);
  return joined(f.events);
}

TEST(ZeroParamCoordinator, NoPrefetchNoReuse) {
  // prefetch off; max_reuse_distance 0 keeps only owners used by the very next call (distance 0):
  // the head's two owners between its forward (pos 3) and backward (pos 4).
  Fake f(kNumel, 1'000'000);
  const std::string ev = run_trace({.prefetch_bucket = 0, .max_live = 1'000'000, .max_reuse_distance = 0}, f);
  EXPECT_EQ(ev,
            "G0 W0 [0] R0 "
            "G1 W1 [1] R1 "
            "G2 W2 [2] R2 "
            "G0 G3 W0 W3 [3] "
            "W0 W3 [3] R0 R3 "
            "G2 W2 [2] R2 "
            "G1 W1 [1] R1 "
            "G0 W0 [0] R0");
  EXPECT_EQ(f.gathers, 8u);
  EXPECT_EQ(f.peak, 50);
}

TEST(ZeroParamCoordinator, PrefetchWithinBucket) {
  // prefetch_bucket 30: after the needed owners, owners of the next calls are issued in trace
  // order while this call's prefetch stays <= 30 elements; it stops at the first that does not fit.
  //   pos 0: needs 0; prefetch 1 (20), 2 would make 50: stop
  //   pos 1: prefetch 2 (30); the head's 0 would make 40: stop
  //   pos 2: prefetch 0 (10); 3 would make 50: stop
  //   pos 3: gather 3; (pos 4 has all); prefetch 2 (30), 1 would make 50: stop
  //   pos 4: prefetch 1 (20); pos 7's 0 is still gathered. After: 0 released (distance 50), 3 too
  //   pos 5: prefetch 0 (10)
  Fake f(kNumel, 1'000'000);
  const std::string ev = run_trace({.prefetch_bucket = 30, .max_live = 1'000'000, .max_reuse_distance = 0}, f);
  EXPECT_EQ(ev,
            "G0 G1 W0 [0] R0 "
            "G2 W1 [1] R1 "
            "G0 W2 [2] R2 "
            "G3 G2 W0 W3 [3] "
            "G1 W0 W3 [3] R0 R3 "
            "G0 W2 [2] R2 "
            "W1 [1] R1 "
            "W0 [0] R0");
  EXPECT_EQ(f.gathers, 8u);
}

TEST(ZeroParamCoordinator, ReuseDistanceKeepsNearbyOwners) {
  // max_reuse_distance 50: owner 0 is kept across pos 0 -> 3 (distance 50) and pos 4 -> 7 (50);
  // owners 1 (160) and 2 (100) are released.
  Fake f(kNumel, 1'000'000);
  const std::string ev = run_trace({.prefetch_bucket = 0, .max_live = 1'000'000, .max_reuse_distance = 50}, f);
  EXPECT_EQ(ev,
            "G0 W0 [0] "
            "G1 W1 [1] R1 "
            "G2 W2 [2] R2 "
            "G3 W0 W3 [3] "
            "W0 W3 [3] R3 "
            "G2 W2 [2] R2 "
            "G1 W1 [1] R1 "
            "W0 [0] R0");
  EXPECT_EQ(f.gathers, 6u);
  // One element less: owner 0 is released both times, as with distance 0.
  Fake g(kNumel, 1'000'000);
  run_trace({.prefetch_bucket = 0, .max_live = 1'000'000, .max_reuse_distance = 49}, g);
  EXPECT_EQ(g.gathers, 8u);
}

TEST(ZeroParamCoordinator, MaxLiveEvictsKeptOwnersFarthestFirst) {
  // Everything would be kept (reuse distance 1e9) but at most 80 elements live. At pos 3 the head
  // needs 3 (40 more) with 0, 1, 2 live (60): owners it does not need are released, the one used
  // farthest ahead first — 1 (next use in 80 elements) before 2 (50) — until 40 fit.
  Fake f(kNumel, 80);
  const std::string ev = run_trace({.prefetch_bucket = 0, .max_live = 80, .max_reuse_distance = 1'000'000'000}, f);
  EXPECT_EQ(ev,
            "G0 W0 [0] "
            "G1 W1 [1] "
            "G2 W2 [2] "
            "R1 G3 W0 W3 [3] "
            "W0 W3 [3] R3 "
            "W2 [2] R2 "
            "G1 W1 [1] R1 "
            "W0 [0] R0");
  EXPECT_EQ(f.peak, 80);
}

TEST(ZeroParamCoordinator, MaxLiveBoundsPrefetchAndKeptOwners) {
  // Prefetch everything it can (bucket 1000) and keep everything (reuse 1e9) under max_live 80:
  //   pos 0: 0, then prefetch 1, 2 (live 60); 3 would make 100: stop
  //   pos 3: evict 1 (farthest), gather 3 (live 80); prefetching 1 again would exceed 80
  //   pos 4: after it 3 is released (never used again): live 40
  //   pos 5: prefetch 1 (live 60)
  Fake f(kNumel, 80);
  const std::string ev = run_trace({.prefetch_bucket = 1000, .max_live = 80, .max_reuse_distance = 1'000'000'000}, f);
  EXPECT_EQ(ev,
            "G0 G1 G2 W0 [0] "
            "W1 [1] "
            "W2 [2] "
            "R1 G3 W0 W3 [3] "
            "W0 W3 [3] R3 "
            "G1 W2 [2] R2 "
            "W1 [1] R1 "
            "W0 [0] R0");
  EXPECT_EQ(f.peak, 80);
}

TEST(ZeroParamCoordinator, MaxLiveExactlyOneLayer) {
  // max_live = the head's 50: every call still runs, never more than 50 live.
  for (std::int64_t prefetch : {0, 30, 1000}) {
    for (std::int64_t reuse : {0, 50, 1'000'000'000}) {
      SCOPED_TRACE(testing::Message() << "prefetch " << prefetch << " reuse " << reuse);
      Fake f(kNumel, 50);
      run_trace({.prefetch_bucket = prefetch, .max_live = 50, .max_reuse_distance = reuse}, f);
      EXPECT_LE(f.peak, 50);
    }
  }
}

TEST(ZeroParamCoordinator, DeviationTurnsPrefetchOffButStaysCorrect) {
  // Prefetch everything; the calls go 0, 2 (the trace says 1), 1, 3.
  Fake f(kNumel, 1'000'000);
  ParamCoordinator pc(kNumel, kNeeds, kNames, {.prefetch_bucket = 1000, .max_live = 1'000'000, .max_reuse_distance = 0}, f.callbacks());
  pc.begin_pass(kTrace);
  EXPECT_TRUE(pc.prefetching());
  call(pc, f, kNeeds, 0);
  EXPECT_TRUE(pc.prefetching());
  call(pc, f, kNeeds, 2);
  EXPECT_FALSE(pc.prefetching());
  call(pc, f, kNeeds, 1);
  call(pc, f, kNeeds, 3);
  EXPECT_FALSE(pc.prefetching());
  // pos 0 prefetches 1, 2, 3 (and releases 0: distance 50). After the deviation nothing is
  // prefetched, and every owner is released after its call (no trace: no known reuse).
  EXPECT_EQ(joined(f.events),
            "G0 G1 G2 G3 W0 [0] R0 "
            "W2 [2] R2 "
            "W1 [1] R1 "
            "G0 W0 W3 [3] R0 R3");
  pc.end_pass();
  EXPECT_EQ(f.live, 0);
  // A new pass follows the trace again.
  pc.begin_pass(kTrace);
  EXPECT_TRUE(pc.prefetching());
  f.events.clear();
  call(pc, f, kNeeds, 0);
  EXPECT_EQ(joined(f.events), "G0 G1 G2 G3 W0 [0] R0");
  pc.end_pass();
  EXPECT_EQ(f.live, 0);
}

TEST(ZeroParamCoordinator, DeviationPastTheTraceEnd) {
  // More calls than the trace has: the extra one deviates and is still served.
  Fake f(kNumel, 1'000'000);
  ParamCoordinator pc(kNumel, kNeeds, kNames, {.prefetch_bucket = 0, .max_live = 1'000'000, .max_reuse_distance = 0}, f.callbacks());
  const std::vector<std::size_t> fwd{0, 1};
  pc.begin_pass(fwd);
  call(pc, f, kNeeds, 0);
  call(pc, f, kNeeds, 1);
  call(pc, f, kNeeds, 3);
  EXPECT_FALSE(pc.prefetching());
  EXPECT_EQ(joined(f.events), "G0 W0 [0] R0 G1 W1 [1] R1 G0 G3 W0 W3 [3] R0 R3");
  pc.end_pass();
  EXPECT_EQ(f.live, 0);
}

TEST(ZeroParamCoordinator, EndPassReleasesEverything) {
  // Keep everything (reuse 1e9), stop after the forward: 0..3 are live; end_pass releases them.
  Fake f(kNumel, 1'000'000);
  ParamCoordinator pc(kNumel, kNeeds, kNames, {.prefetch_bucket = 0, .max_live = 1'000'000, .max_reuse_distance = 1'000'000'000}, f.callbacks());
  pc.begin_pass(kTrace);
  for (std::size_t i : {0u, 1u, 2u, 3u}) call(pc, f, kNeeds, i);
  EXPECT_EQ(f.live, 100);
  EXPECT_EQ(pc.live(), 100);
  f.events.clear();
  pc.end_pass();
  EXPECT_EQ(joined(f.events), "R0 R1 R2 R3");
  EXPECT_EQ(f.live, 0);
  EXPECT_EQ(pc.live(), 0);
  EXPECT_EQ(pc.peak_live(), 100);
  pc.reset_peak();
  EXPECT_EQ(pc.peak_live(), 0);
  // begin_pass also releases what a previous pass left.
  pc.begin_pass(kTrace);
  call(pc, f, kNeeds, 0);
  EXPECT_EQ(f.live, 10);
  f.events.clear();
  pc.begin_pass(kTrace);
  EXPECT_EQ(joined(f.events), "R0");
  EXPECT_EQ(f.live, 0);
}

TEST(ZeroParamCoordinator, PersistentOwnersAreNeverGathered) {
  // Owner 1 has nothing partitioned (numel 0: persistent): never gathered, waited or released.
  const std::vector<std::int64_t> numel{10, 0, 30, 40};
  Fake f(numel, 1'000'000);
  ParamCoordinator pc(numel, kNeeds, kNames, {.prefetch_bucket = 1000, .max_live = 1'000'000, .max_reuse_distance = 0}, f.callbacks());
  pc.begin_pass(kTrace);
  for (std::size_t i : kTrace) call(pc, f, kNeeds, i);
  pc.end_pass();
  for (const auto& e : f.events) EXPECT_TRUE(e.find('1') == std::string::npos || e == "[1]") << e;
  EXPECT_EQ(f.live, 0);
}

TEST(ZeroParamCoordinator, LayerNeedingMoreThanMaxLiveIsAnError) {
  Fake f(kNumel, 45);
  try {
    ParamCoordinator pc(kNumel, kNeeds, kNames, {.prefetch_bucket = 0, .max_live = 45, .max_reuse_distance = 0}, f.callbacks());
    ADD_FAILURE() << "no error for a layer needing 50 > 45 elements";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("stage3_max_live_parameters"), std::string::npos) << m;
    EXPECT_NE(m.find("head"), std::string::npos) << m;
    EXPECT_NE(m.find("50"), std::string::npos) << m;
  }
  // 50 fits exactly.
  EXPECT_NO_THROW(ParamCoordinator(kNumel, kNeeds, kNames, {.prefetch_bucket = 0, .max_live = 50, .max_reuse_distance = 0}, f.callbacks()));
  // A persistent owner does not count: the head needs only its own 40.
  EXPECT_NO_THROW(ParamCoordinator({0, 20, 30, 40}, kNeeds, kNames, {.prefetch_bucket = 0, .max_live = 45, .max_reuse_distance = 0}, f.callbacks()));
  // An owner index out of range and mismatched lists are errors too.
  EXPECT_THROW(ParamCoordinator(kNumel, {{0}, {1}, {2}, {3, 7}}, kNames, {}, f.callbacks()), Error);
  EXPECT_THROW(ParamCoordinator(kNumel, kNeeds, {"a", "b"}, {}, f.callbacks()), Error);
}

TEST(ZeroParamCoordinator, DuplicateNeedsCountOnce) {
  // A layer listing its owner twice needs it once (50, not 90, against max_live 50).
  const std::vector<std::vector<std::size_t>> needs{{0}, {1}, {2}, {3, 0, 3}};
  Fake f(kNumel, 50);
  ParamCoordinator pc(kNumel, needs, kNames, {.prefetch_bucket = 0, .max_live = 50, .max_reuse_distance = 0}, f.callbacks());
  pc.begin_pass(kTrace);
  for (std::size_t i : kTrace) call(pc, f, needs, i);
  pc.end_pass();
  EXPECT_EQ(f.live, 0);
}

// Reference for the brute force: the elements the calls strictly between trace position p and the
// next use of `owner` need; -1 when it is not used again.
std::int64_t ref_distance(const std::vector<std::size_t>& trace, const std::vector<std::set<std::size_t>>& needs,
                          const std::vector<std::int64_t>& numel, std::size_t p, std::size_t owner) {
  std::int64_t d = 0;
  for (std::size_t q = p + 1; q < trace.size(); ++q) {
    if (needs[trace[q]].count(owner) != 0) return d;
    for (std::size_t o : needs[trace[q]]) d += numel[o];
  }
  return -1;
}

TEST(ZeroParamCoordinator, RandomTracesKeepEveryInvariant) {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 300; ++iter) {
    const std::size_t L = 2 + rng() % 6;
    std::vector<std::int64_t> numel(L);
    for (auto& n : numel) n = rng() % 5 == 0 ? 0 : 1 + static_cast<std::int64_t>(rng() % 100);
    std::vector<std::vector<std::size_t>> needs(L);
    std::vector<std::set<std::size_t>> need_set(L);
    std::vector<std::string> names(L);
    std::int64_t biggest = 0;
    for (std::size_t i = 0; i < L; ++i) {
      needs[i].push_back(i);
      if (rng() % 3 == 0) needs[i].push_back(rng() % L);
      for (std::size_t o : needs[i])
        if (numel[o] > 0) need_set[i].insert(o);
      std::int64_t t = 0;
      for (std::size_t o : need_set[i]) t += numel[o];
      biggest = std::max(biggest, t);
      names[i] = "layer" + std::to_string(i);
    }
    ParamCoordinatorSettings s;
    s.prefetch_bucket = rng() % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % 300);
    s.max_live = biggest + static_cast<std::int64_t>(rng() % 3 == 0 ? 0 : rng() % 300);
    s.max_reuse_distance = rng() % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % 300);
    // Trace: forward, backward with a random recompute segment in between (as checkpointing does).
    std::vector<std::size_t> trace;
    for (std::size_t i = 0; i < L; ++i) trace.push_back(i);
    for (std::size_t i = L; i-- > 0;) {
      if (rng() % 3 == 0)
        for (std::size_t j = i - std::min<std::size_t>(i, rng() % 2); j <= i; ++j) trace.push_back(j);
      trace.push_back(i);
    }
    // Calls: the trace, sometimes with a deviation at a random point (then random layers).
    std::vector<std::size_t> calls = trace;
    const bool deviate = rng() % 3 == 0;
    if (deviate) {
      const std::size_t at = rng() % calls.size();
      calls.resize(at);
      const std::size_t extra = rng() % 8;
      for (std::size_t k = 0; k < extra; ++k) calls.push_back(rng() % L);
    }
    SCOPED_TRACE(testing::Message() << "iter " << iter << " L " << L << " prefetch " << s.prefetch_bucket << " max_live " << s.max_live << " reuse "
                                    << s.max_reuse_distance << (deviate ? " deviating" : ""));
    Fake f(numel, s.max_live);
    ParamCoordinator pc(numel, needs, names, s, f.callbacks());
    for (int pass = 0; pass < 2; ++pass) {
      pc.begin_pass(trace);
      bool on_trace = true;
      for (std::size_t p = 0; p < calls.size(); ++p) {
        const std::size_t i = calls[p];
        if (p >= trace.size() || trace[p] != i) on_trace = false;
        call(pc, f, needs, i);
        ASSERT_FALSE(testing::Test::HasFailure());
        // before(): gathers beyond the needed owners are prefetch: only on the trace, within the bucket.
        std::int64_t prefetched = 0;
        for (std::size_t o : f.gathered_now)
          if (need_set[i].count(o) == 0) prefetched += numel[o];
        if (!on_trace) {
          EXPECT_EQ(prefetched, 0);
        }
        EXPECT_LE(prefetched, std::max<std::int64_t>(s.prefetch_bucket, 0));
        // Nothing this call needs was released before it ran.
        EXPECT_EQ(pc.prefetching(), on_trace);
        // after(): the reuse rule, distances computed here.
        for (std::size_t o : need_set[i]) {
          const std::int64_t d = on_trace ? ref_distance(trace, need_set, numel, p, o) : -1;
          const bool keep = d >= 0 && d <= s.max_reuse_distance;
          EXPECT_EQ(f.gathered[o], keep) << "call " << p << " (layer " << i << ") owner " << o << " distance " << d;
        }
        ASSERT_FALSE(testing::Test::HasFailure());
      }
      pc.end_pass();
      EXPECT_EQ(f.live, 0);
      for (std::size_t o = 0; o < L; ++o) EXPECT_FALSE(f.gathered[o]);
      EXPECT_EQ(pc.gathers(), f.gathers);
      EXPECT_LE(f.peak, s.max_live);
      EXPECT_EQ(pc.peak_live(), f.peak);
    }
  }
}

}  // namespace
}  // namespace dstrain
