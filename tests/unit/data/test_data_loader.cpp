// DataLoader and EvalLoader on hand-made token files, against hand-worked windows and the data-order
// rule of data_loader.h; the shuffle against values computed by an independent Python
// implementation of the spec in window_shuffle.h and against splitmix64's published outputs.
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/data_loader.h"
#include "data/eval_loader.h"
#include "data/token_file.h"
#include "data/window_shuffle.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

namespace {

// A token file whose token at position i is i: then a row's first input names its window (i·T).
std::filesystem::path position_file(const TempDir& dir, std::size_t count, std::string_view name = "pos.bin") {
  std::vector<std::int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), 0);
  const auto path = dir / name;
  write_token_file(path, tokens);
  return path;
}

DataLoaderOptions options(std::size_t B, std::size_t T, int gas = 1, int world = 1, int rank = 0, bool shuffle = true, std::uint64_t seed = 0) {
  DataLoaderOptions o;
  o.micro_batch_size = B;
  o.sequence_length = T;
  o.gradient_accumulation_steps = gas;
  o.world_size = world;
  o.rank = rank;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

struct Batch {
  std::vector<std::int32_t> inputs, targets;
};

Batch load(const DataLoader& loader, int micro_step) {
  const std::size_t n = loader.options().micro_batch_size * loader.options().sequence_length;
  Batch b{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  loader.load_micro_batch(micro_step, b.inputs, b.targets);
  return b;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The expected window stream, built from the epochs' orders laid end to end (the rule in
// data_loader.h); the orders themselves are pinned against Python below.
std::vector<std::size_t> expected_stream(std::size_t windows, std::uint64_t seed, std::size_t length, bool shuffle) {
  std::vector<std::size_t> stream;
  for (std::uint64_t epoch = 0; stream.size() < length; ++epoch) {
    std::vector<std::size_t> order(windows);
    if (shuffle)
      order = shuffled_window_order(windows, seed, epoch);
    else
      std::iota(order.begin(), order.end(), std::size_t{0});
    stream.insert(stream.end(), order.begin(), order.end());
  }
  stream.resize(length);
  return stream;
}

}  // namespace

// ---- the shuffle -----------------------------------------------------------------------------

TEST(WindowShuffle, Mix64IsSplitmix64) {
  // splitmix64 seeded with 1234567 (Vigna's reference generator): its first three outputs, as listed
  // with the reference code; each is mix64(seed + k·0x9e3779b97f4a7c15).
  std::uint64_t state = 1234567;
  const std::uint64_t expected[] = {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL};
  for (const std::uint64_t e : expected) {
    state += 0x9e3779b97f4a7c15ULL;
    EXPECT_EQ(mix64(state), e);
  }
  EXPECT_EQ(mix64(0), 0u);
}

TEST(WindowShuffle, MatchesAnIndependentImplementationOfTheSpec) {
  // Computed by a Python transcription of the spec in window_shuffle.h (arbitrary-precision integers
  // masked to 64 bits), so any drift of the C++ from the documented algorithm shows here, and the order
  // cannot depend on the compiler or the standard library.
  EXPECT_THAT(shuffled_window_order(10, 0, 0), ElementsAre(6, 3, 2, 9, 8, 1, 4, 7, 0, 5));
  EXPECT_THAT(shuffled_window_order(10, 0, 1), ElementsAre(2, 1, 8, 4, 9, 6, 5, 7, 3, 0));
  EXPECT_THAT(shuffled_window_order(10, 42, 0), ElementsAre(2, 8, 9, 7, 1, 4, 6, 0, 5, 3));
  EXPECT_THAT(shuffled_window_order(7, 1234, 3), ElementsAre(3, 1, 5, 6, 0, 4, 2));
  EXPECT_THAT(shuffled_window_order(2, 0, 0), ElementsAre(0, 1));
  EXPECT_THAT(shuffled_window_order(1, 5, 5), ElementsAre(0));
  EXPECT_TRUE(shuffled_window_order(0, 5, 5).empty());
  WindowShuffleStream stream(42, 0);
  EXPECT_EQ(stream.next(), 0x9d591bb7266b13f3ULL);
  EXPECT_EQ(stream.next(), 0x733a550e28bd9590ULL);
  EXPECT_EQ(stream.next(), 0x34d61dbd015a27d8ULL);
}

TEST(WindowShuffle, IsAPermutationAndDependsOnSeedAndEpoch) {
  for (const std::size_t n : {3u, 17u, 100u, 1000u}) {
    for (const std::uint64_t seed : {0u, 1u, 99u}) {
      for (const std::uint64_t epoch : {0u, 1u, 7u}) {
        std::vector<std::size_t> order = shuffled_window_order(n, seed, epoch);
        EXPECT_EQ(order, shuffled_window_order(n, seed, epoch)) << "not repeatable";
        std::sort(order.begin(), order.end());
        std::vector<std::size_t> identity(n);
        std::iota(identity.begin(), identity.end(), std::size_t{0});
        EXPECT_EQ(order, identity) << "n " << n << " seed " << seed << " epoch " << epoch;
      }
    }
  }
  // 100! orders: two equal ones from different keys would be a broken key, not chance.
  EXPECT_NE(shuffled_window_order(100, 1, 0), shuffled_window_order(100, 2, 0));
  EXPECT_NE(shuffled_window_order(100, 1, 0), shuffled_window_order(100, 1, 1));
  std::vector<std::size_t> identity(100);
  std::iota(identity.begin(), identity.end(), std::size_t{0});
  EXPECT_NE(shuffled_window_order(100, 1, 0), identity);
}

TEST(WindowShuffle, BelowIsUniformOverSmallRanges) {
  // 3 does not divide 2^64: a plain modulo would be biased by 1 in 2^63, invisible here, but a wrong
  // range (off by one) or a stuck stream is not. 30000 draws: each count within 5 sigma of 10000.
  WindowShuffleStream stream(7, 0);
  std::map<std::uint64_t, int> counts;
  for (int i = 0; i < 30000; ++i) ++counts[stream.below(3)];
  ASSERT_EQ(counts.size(), 3u);
  for (const auto& [value, count] : counts) {
    EXPECT_LT(value, 3u);
    EXPECT_NEAR(count, 10000, 5 * 82);
  }
  EXPECT_EQ(stream.below(1), 0u);
}

// ---- windows and batches ---------------------------------------------------------------------

TEST(DataLoader, WindowsOfAHandMadeFile) {
  TempDir dir;
  // 11 tokens, T = 3: N = (11 - 1) / 3 = 3 windows: [0..3], [3..6], [6..9]; tokens 9 and 10 unused
  // (token 9 is the last target of window 2).
  const std::vector<std::int32_t> tokens = {50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60};
  write_token_file(dir / "t.bin", tokens);
  DataLoader loader = DataLoader::open(dir / "t.bin", options(1, 3, 1, 1, 0, /*shuffle=*/false));
  EXPECT_EQ(loader.window_count(), 3u);
  EXPECT_EQ(loader.train_batch_size(), 1u);
  Batch b = load(loader, 0);
  EXPECT_THAT(b.inputs, ElementsAre(50, 51, 52));
  EXPECT_THAT(b.targets, ElementsAre(51, 52, 53));
  loader.advance_step();
  b = load(loader, 0);
  EXPECT_THAT(b.inputs, ElementsAre(53, 54, 55));
  EXPECT_THAT(b.targets, ElementsAre(54, 55, 56));
  loader.advance_step();
  b = load(loader, 0);
  EXPECT_THAT(b.inputs, ElementsAre(56, 57, 58));
  EXPECT_THAT(b.targets, ElementsAre(57, 58, 59));
  loader.advance_step();  // wraps into epoch 1, file order again
  EXPECT_EQ(loader.state(), (DataLoaderState{1, 0}));
  b = load(loader, 0);
  EXPECT_THAT(b.inputs, ElementsAre(50, 51, 52));
}

TEST(DataLoader, ExactlyOneWindowNeedsTPlusOneTokens) {
  TempDir dir;
  write_token_file(dir / "five.bin", std::vector<std::int32_t>{1, 2, 3, 4, 5});
  const DataLoader loader = DataLoader::open(dir / "five.bin", options(1, 4));
  EXPECT_EQ(loader.window_count(), 1u);
  const Batch b = load(loader, 0);
  EXPECT_THAT(b.inputs, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(b.targets, ElementsAre(2, 3, 4, 5));
}

TEST(DataLoader, FileTooSmallNamesFileCountAndT) {
  TempDir dir;
  write_token_file(dir / "four.bin", std::vector<std::int32_t>{1, 2, 3, 4});
  const std::string message = error_of([&] { (void)DataLoader::open(dir / "four.bin", options(1, 4)); });
  EXPECT_THAT(message, HasSubstr((dir / "four.bin").string()));
  EXPECT_THAT(message, HasSubstr("holds 4 tokens"));
  EXPECT_THAT(message, HasSubstr("sequence of 4 tokens"));
  EXPECT_THAT(message, HasSubstr("5"));
  write_token_file(dir / "empty.bin", std::vector<std::int32_t>{});
  EXPECT_THAT(error_of([&] { (void)DataLoader::open(dir / "empty.bin", options(1, 1)); }), HasSubstr("holds 0 tokens"));
}

TEST(DataLoader, TargetsAreInputsShiftedByOne) {
  TempDir dir;
  const auto path = position_file(dir, 1000);
  DataLoader loader = DataLoader::open(path, options(4, 16, 1, 1, 0, true, 3));
  for (int step = 0; step < 20; ++step) {
    const Batch b = load(loader, 0);
    const std::vector<std::size_t> windows = loader.micro_batch_windows(0);
    for (std::size_t row = 0; row < 4; ++row) {
      for (std::size_t t = 0; t < 16; ++t) {
        // Token value = file position, so the expectation is arithmetic, not the loader's own copy.
        EXPECT_EQ(b.inputs[row * 16 + t], static_cast<std::int32_t>(windows[row] * 16 + t));
        EXPECT_EQ(b.targets[row * 16 + t], static_cast<std::int32_t>(windows[row] * 16 + t + 1));
      }
    }
    loader.advance_step();
  }
}

TEST(DataLoader, StreamCrossesEpochsWithEachEpochsOwnOrder) {
  TempDir dir;
  // 26 tokens, T = 5: N = 5 windows; TBS = 2 (B 2): steps take stream positions 0-1, 2-3, 4-5 (crosses
  // into epoch 1), 6-7, 8-9, 10-11 (crosses into epoch 2).
  const auto path = position_file(dir, 26);
  DataLoader loader = DataLoader::open(path, options(2, 5, 1, 1, 0, true, 11));
  const auto e0 = shuffled_window_order(5, 11, 0), e1 = shuffled_window_order(5, 11, 1), e2 = shuffled_window_order(5, 11, 2);
  const std::vector<std::vector<std::size_t>> expected = {{e0[0], e0[1]}, {e0[2], e0[3]}, {e0[4], e1[0]},
                                                          {e1[1], e1[2]}, {e1[3], e1[4]}, {e2[0], e2[1]}};
  const std::vector<DataLoaderState> states = {{0, 0}, {0, 2}, {0, 4}, {1, 1}, {1, 3}, {2, 0}};
  for (std::size_t step = 0; step < expected.size(); ++step) {
    EXPECT_EQ(loader.state(), states[step]) << "step " << step;
    EXPECT_EQ(loader.epoch(), states[step].epoch);
    EXPECT_EQ(loader.global_batch_windows(), expected[step]) << "step " << step;
    const Batch b = load(loader, 0);
    EXPECT_EQ(b.inputs[0], static_cast<std::int32_t>(expected[step][0] * 5));
    EXPECT_EQ(b.inputs[5], static_cast<std::int32_t>(expected[step][1] * 5));
    loader.advance_step();
  }
  // Different epochs, different orders (for this seed; 5! = 120 orders).
  EXPECT_NE(e0, e1);
}

TEST(DataLoader, BatchLargerThanTheFileRepeatsWindowsAcrossEpochs) {
  TempDir dir;
  const auto path = position_file(dir, 7);  // T = 3: N = 2
  DataLoader loader = DataLoader::open(path, options(5, 3, 1, 1, 0, /*shuffle=*/false));
  EXPECT_THAT(loader.global_batch_windows(), ElementsAre(0, 1, 0, 1, 0));
  loader.advance_step();  // stream position 5 = epoch 2, position 1
  EXPECT_EQ(loader.state(), (DataLoaderState{2, 1}));
  EXPECT_THAT(loader.global_batch_windows(), ElementsAre(1, 0, 1, 0, 1));
}

TEST(DataLoader, RanksAndMicroStepsPartitionTheGlobalBatch) {
  TempDir dir;
  // N = 37 windows of T = 3; TBS = 16 throughout, so every (W, GAS) must see the same global batches.
  // Steps 0..5 cover stream positions 0..95: epochs 0, 1 and part of 2, steps 2 and 4 straddling two.
  const std::size_t T = 3, N = 37, TBS = 16;
  const auto path = position_file(dir, N * T + 1);
  for (const bool shuffle : {false, true}) {
    const std::vector<std::size_t> stream = expected_stream(N, 5, 6 * TBS, shuffle);
    for (const int world : {1, 2, 4}) {
      for (const int gas : {1, 2, 4}) {
        const std::size_t B = TBS / static_cast<std::size_t>(world * gas);
        std::vector<DataLoader> ranks;
        for (int r = 0; r < world; ++r) ranks.push_back(DataLoader::open(path, options(B, T, gas, world, r, shuffle, 5)));
        for (std::size_t step = 0; step < 6; ++step) {
          const std::vector<std::size_t> expected(stream.begin() + static_cast<std::ptrdiff_t>(step * TBS),
                                                  stream.begin() + static_cast<std::ptrdiff_t>((step + 1) * TBS));
          // Place each rank's rows where the documented rule puts them; every slot must be filled exactly
          // once (the slices are disjoint and cover the batch) with the expected window.
          std::vector<std::size_t> assembled(TBS, SIZE_MAX);
          std::multiset<std::size_t> union_of_ranks;
          for (int r = 0; r < world; ++r) {
            EXPECT_EQ(ranks[static_cast<std::size_t>(r)].global_batch_windows(), expected);
            for (int m = 0; m < gas; ++m) {
              const Batch b = load(ranks[static_cast<std::size_t>(r)], m);
              for (std::size_t row = 0; row < B; ++row) {
                const auto window = static_cast<std::size_t>(b.inputs[row * T]) / T;
                const std::size_t slot = (static_cast<std::size_t>(m * world + r)) * B + row;
                EXPECT_EQ(assembled[slot], SIZE_MAX) << "slot " << slot << " filled twice";
                assembled[slot] = window;
                union_of_ranks.insert(window);
              }
            }
          }
          const std::string where =
              "W " + std::to_string(world) + " GAS " + std::to_string(gas) + " step " + std::to_string(step) + (shuffle ? " shuffled" : " in order");
          EXPECT_EQ(assembled, expected) << where;
          EXPECT_EQ(union_of_ranks, std::multiset<std::size_t>(expected.begin(), expected.end())) << where;
          for (DataLoader& loader : ranks) loader.advance_step();
        }
      }
    }
  }
}

TEST(DataLoader, NextMicroBatchWalksMicroStepsThenSteps) {
  TempDir dir;
  const auto path = position_file(dir, 41);  // T = 4: N = 10, file order
  // W = 2, rank 1, GAS = 2, B = 1: TBS 4; step k, micro-step m takes global slot m·2 + 1.
  DataLoader loader = DataLoader::open(path, options(1, 4, 2, 2, 1, /*shuffle=*/false));
  std::vector<std::int32_t> in(4), tg(4);
  const std::vector<std::int32_t> first_inputs = {4, 12, 20, 28, 36, 4};  // windows 1, 3, 5, 7, 9, 1 (epoch 1)
  for (std::size_t i = 0; i < first_inputs.size(); ++i) {
    EXPECT_EQ(loader.micro_step(), static_cast<int>(i % 2));
    loader.next_micro_batch(in, tg);
    EXPECT_EQ(in[0], first_inputs[i]) << "call " << i;
  }
  EXPECT_EQ(loader.state(), (DataLoaderState{1, 2}));
}

TEST(DataLoader, SameSeedSameBatchesAnotherSeedOthers) {
  TempDir dir;
  const auto path = position_file(dir, 64 * 8 + 1);  // N = 64 windows of T = 8
  DataLoader a = DataLoader::open(path, options(4, 8, 1, 1, 0, true, 1234));
  DataLoader b = DataLoader::open(path, options(4, 8, 1, 1, 0, true, 1234));
  DataLoader c = DataLoader::open(path, options(4, 8, 1, 1, 0, true, 1235));
  bool any_difference = false;
  for (int step = 0; step < 40; ++step) {
    EXPECT_EQ(load(a, 0).inputs, load(b, 0).inputs);
    any_difference = any_difference || load(a, 0).inputs != load(c, 0).inputs;
    a.advance_step();
    b.advance_step();
    c.advance_step();
  }
  EXPECT_TRUE(any_difference);
}

TEST(DataLoader, ResumeFromStateContinuesTheSameBatchesAtAnyWorldSize) {
  TempDir dir;
  const auto path = position_file(dir, 23 * 4 + 1);  // N = 23 windows of T = 4
  DataLoader run = DataLoader::open(path, options(6, 4, 1, 1, 0, true, 9));
  for (int i = 0; i < 7; ++i) run.advance_step();  // 42 windows in: epoch 1, position 19
  const DataLoaderState saved = run.state();
  EXPECT_EQ(saved, (DataLoaderState{1, 19}));

  DataLoader resumed = DataLoader::open(path, options(6, 4, 1, 1, 0, true, 9));
  resumed.set_state(saved);
  // The same TBS on 2 ranks x GAS 3 x B 1.
  std::vector<DataLoader> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(DataLoader::open(path, options(1, 4, 3, 2, r, true, 9)));
    ranks.back().set_state(saved);
  }
  for (int step = 0; step < 5; ++step) {
    EXPECT_EQ(load(resumed, 0).inputs, load(run, 0).inputs) << "step " << step;
    EXPECT_EQ(ranks[0].global_batch_windows(), run.global_batch_windows());
    EXPECT_EQ(ranks[1].global_batch_windows(), run.global_batch_windows());
    run.advance_step();
    resumed.advance_step();
    for (DataLoader& r : ranks) r.advance_step();
  }
  const std::string message = error_of([&] { resumed.set_state({0, 23}); });
  EXPECT_THAT(message, HasSubstr("position 23"));
  EXPECT_THAT(message, HasSubstr("23 windows"));
  EXPECT_THAT(message, HasSubstr(path.string()));
}

TEST(DataLoader, SetStateRestartsAtMicroStepZero) {
  TempDir dir;
  const auto path = position_file(dir, 41);
  DataLoader loader = DataLoader::open(path, options(1, 4, 2, 1, 0, false));
  std::vector<std::int32_t> in(4), tg(4);
  loader.next_micro_batch(in, tg);
  EXPECT_EQ(loader.micro_step(), 1);
  EXPECT_EQ(loader.state(), (DataLoaderState{0, 0}));  // the step in progress
  loader.set_state(loader.state());
  EXPECT_EQ(loader.micro_step(), 0);
  loader.next_micro_batch(in, tg);
  EXPECT_EQ(in[0], 0);
}

TEST(DataLoader, TokensBeyondTheVocabularyAreReportedWhereTheyAre) {
  TempDir dir;
  // Bytes-tokenizer ids (< 256) except one 300 at position 9, inside window 2 of T = 4 (tokens 8..12).
  std::vector<std::int32_t> tokens(21, 65);
  tokens[9] = 300;
  write_token_file(dir / "bad.bin", tokens);
  DataLoaderOptions o = options(1, 4, 1, 1, 0, false);
  o.vocab_size = 256;
  DataLoader loader = DataLoader::open(dir / "bad.bin", o);
  std::vector<std::int32_t> in(4), tg(4);
  loader.next_micro_batch(in, tg);  // window 0: fine, checked lazily
  loader.next_micro_batch(in, tg);  // window 1 (tokens 4..8): fine
  std::string message = error_of([&] { loader.next_micro_batch(in, tg); });
  EXPECT_THAT(message, HasSubstr("token 300 at position 9"));
  EXPECT_THAT(message, HasSubstr("vocabulary size 256"));
  EXPECT_THAT(message, HasSubstr((dir / "bad.bin").string()));

  message = error_of([&] { loader.validate(256); });
  EXPECT_THAT(message, HasSubstr("token 300 at position 9"));
  EXPECT_EQ(error_of([&] { loader.validate(301); }), "no error");
  // The last token of a window is a target only; it is checked too (window 1 ends at position 8).
  tokens[9] = 65;
  tokens[8] = 256;
  write_token_file(dir / "bad2.bin", tokens);
  DataLoader loader2 = DataLoader::open(dir / "bad2.bin", o);
  loader2.advance_step();
  EXPECT_THAT(error_of([&] { (void)load(loader2, 0); }), HasSubstr("token 256 at position 8"));
}

// Version 2 (uint32) files: Llama 3 / Qwen ids above 65535 reach the batch intact, and an id past
// the model's vocabulary is refused as in a uint16 file.
TEST(DataLoader, WideTokenFilesLoadAndAreCheckedAgainstTheVocabulary) {
  TempDir dir;
  std::vector<std::int32_t> tokens;
  for (std::int32_t i = 0; i < 13; ++i) tokens.push_back(128000 + i);  // T = 4: windows [0..4], [4..8], [8..12]
  tokens[10] = 151935;
  write_token_file(dir / "wide.bin", tokens, TokenWidth::uint32);
  DataLoaderOptions o = options(1, 4, 1, 1, 0, /*shuffle=*/false);
  o.vocab_size = 151936;
  DataLoader loader = DataLoader::open(dir / "wide.bin", o);
  EXPECT_EQ(loader.window_count(), 3u);
  Batch b = load(loader, 0);
  EXPECT_THAT(b.inputs, ElementsAre(128000, 128001, 128002, 128003));
  EXPECT_THAT(b.targets, ElementsAre(128001, 128002, 128003, 128004));
  EXPECT_EQ(error_of([&] { loader.validate(151936); }), "no error");

  o.vocab_size = 128256;  // Llama 3's vocabulary: 151935 does not belong to it
  DataLoader llama = DataLoader::open(dir / "wide.bin", o);
  EXPECT_THAT(error_of([&] { llama.validate(128256); }), HasSubstr("token 151935 at position 10"));
  llama.advance_step();
  llama.advance_step();
  EXPECT_THAT(error_of([&] { (void)load(llama, 0); }), HasSubstr("vocabulary size 128256"));

  EvalLoaderOptions e;
  e.batch_size = 1;
  e.sequence_length = 4;
  e.vocab_size = 151936;
  EvalLoader eval = EvalLoader::open(dir / "wide.bin", e);
  std::vector<std::int32_t> in(4), tg(4);
  ASSERT_TRUE(eval.next(in, tg));
  EXPECT_THAT(in, ElementsAre(128000, 128001, 128002, 128003));
}

TEST(DataLoader, BadOptionsAndBuffersAreNamed) {
  TempDir dir;
  const auto path = position_file(dir, 100);
  EXPECT_THAT(error_of([&] { (void)DataLoader::open(path, options(1, 4, 1, 2, 2)); }), HasSubstr("rank 2"));
  EXPECT_THAT(error_of([&] { (void)DataLoader::open(path, options(0, 4)); }), HasSubstr("micro_batch_size"));
  EXPECT_THAT(error_of([&] { (void)DataLoader::open(path, options(1, 0)); }), HasSubstr("sequence_length"));
  EXPECT_THAT(error_of([&] { (void)DataLoader::open(path, options(1, 4, 0)); }), HasSubstr("gradient_accumulation_steps"));
  EXPECT_THAT(error_of([&] { (void)DataLoader::open(dir / "missing.bin", options(1, 4)); }), HasSubstr((dir / "missing.bin").string()));
  const DataLoader loader = DataLoader::open(path, options(2, 4, 2));
  std::vector<std::int32_t> small(7), right(8);
  EXPECT_THAT(error_of([&] { loader.load_micro_batch(0, small, right); }), HasSubstr("need 8 each"));
  EXPECT_THAT(error_of([&] { loader.load_micro_batch(2, right, right); }), HasSubstr("micro-step 2"));
}

// ---- evaluation ------------------------------------------------------------------------------

TEST(EvalLoader, ReadsTheFileOnceInOrderInterleavingRanks) {
  TempDir dir;
  const auto path = position_file(dir, 10 * 3 + 2);  // T = 3: N = 10 windows
  // W = 2, B = 2: G = 10 / 2 = 5 global batches, global batch g = windows 2g, 2g + 1; rank r takes
  // g = 2j + r, so 3 rounds each, rank 1's third (g = 5 >= G) a padding batch that does not count.
  std::vector<std::vector<std::int32_t>> first_inputs(2);
  std::vector<std::vector<bool>> counts(2);
  for (int r = 0; r < 2; ++r) {
    EvalLoaderOptions o;
    o.batch_size = 2;
    o.sequence_length = 3;
    o.world_size = 2;
    o.rank = r;
    EvalLoader loader = EvalLoader::open(path, o);
    EXPECT_EQ(loader.batch_count(), 3u);
    EXPECT_EQ(loader.total_batches(), 5u);
    std::vector<std::int32_t> in(6), tg(6);
    for (int pass = 0; pass < 2; ++pass) {  // reset() gives the same batches again
      std::vector<std::int32_t> firsts;
      std::vector<bool> counted;
      while (loader.next(in, tg)) {
        firsts.push_back(in[0]);
        firsts.push_back(in[3]);
        counted.push_back(loader.last_counts());
        EXPECT_EQ(tg[2], in[2] + 1);
      }
      if (pass == 0) {
        first_inputs[static_cast<std::size_t>(r)] = firsts;
        counts[static_cast<std::size_t>(r)] = counted;
      } else {
        EXPECT_EQ(firsts, first_inputs[static_cast<std::size_t>(r)]);
      }
      loader.reset();
    }
  }
  // rank 0: windows 0, 1 / 4, 5 / 8, 9; rank 1: windows 2, 3 / 6, 7 / padding = 0, 1 (first input = 3·window).
  EXPECT_THAT(first_inputs[0], ElementsAre(0, 3, 12, 15, 24, 27));
  EXPECT_THAT(first_inputs[1], ElementsAre(6, 9, 18, 21, 0, 3));
  EXPECT_THAT(counts[0], ElementsAre(true, true, true));
  EXPECT_THAT(counts[1], ElementsAre(true, true, false));
}

// The batches that count are the same G for every world size: W = 3 with max_batches 5 counts
// global batches 0..4 exactly once (one rank alone would evaluate those), not ceil(5 / 3) · 3 = 6.
TEST(EvalLoader, CountsExactlyMaxBatchesForAnyWorldSize) {
  TempDir dir;
  const auto path = position_file(dir, 20 * 2 + 1);  // T = 2: N = 20 windows; B = 1
  for (int W : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE("W = " + std::to_string(W));
    std::multiset<std::int32_t> counted_windows;
    std::size_t rounds = 0;
    for (int r = 0; r < W; ++r) {
      EvalLoaderOptions o;
      o.batch_size = 1;
      o.sequence_length = 2;
      o.world_size = W;
      o.rank = r;
      o.max_batches = 5;
      EvalLoader loader = EvalLoader::open(path, o);
      EXPECT_EQ(loader.total_batches(), 5u);
      std::vector<std::int32_t> in(2), tg(2);
      std::size_t n = 0;
      while (loader.next(in, tg)) {
        ++n;
        if (loader.last_counts()) counted_windows.insert(in[0] / 2);
      }
      if (r == 0) rounds = n;
      EXPECT_EQ(n, rounds);  // every rank runs the same number of batches
      EXPECT_EQ(n, (5u + static_cast<std::size_t>(W) - 1) / static_cast<std::size_t>(W));
    }
    EXPECT_EQ(counted_windows, (std::multiset<std::int32_t>{0, 1, 2, 3, 4}));
  }
}

TEST(EvalLoader, MaxBatchesCapsAndTooSmallFilesAreNamed) {
  TempDir dir;
  const auto path = position_file(dir, 10 * 3 + 1);
  EvalLoaderOptions o;
  o.batch_size = 1;
  o.sequence_length = 3;
  o.max_batches = 4;
  EXPECT_EQ(EvalLoader::open(path, o).batch_count(), 4u);
  o.max_batches = 50;
  EXPECT_EQ(EvalLoader::open(path, o).batch_count(), 10u);  // all the file holds
  o.batch_size = 11;
  const std::string message = error_of([&] { (void)EvalLoader::open(path, o); });
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("31 tokens"));
  EXPECT_THAT(message, HasSubstr("needs 34 tokens"));
  EvalLoaderOptions bad = o;
  bad.batch_size = 1;
  bad.rank = 1;
  EXPECT_THAT(error_of([&] { (void)EvalLoader::open(path, bad); }), HasSubstr("rank 1"));
}
