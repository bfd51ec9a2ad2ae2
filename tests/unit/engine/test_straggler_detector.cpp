// StragglerDetector (train/straggler_detector.h): the median (odd and even counts), who is named
// and at which step (after K consecutive slow steps, once per episode), recovery re-arming, the
// reported means, factor 0 off, and bad settings refused naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/error.h"
#include "train/straggler_detector.h"

namespace {

using dstrain::Straggler;
using dstrain::StragglerDetector;

std::vector<int> ranks_of(const std::vector<Straggler>& named) {
  std::vector<int> r;
  for (const Straggler& s : named) r.push_back(s.rank);
  return r;
}

TEST(StragglerDetector, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(StragglerDetector::median(std::vector<double>{3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(StragglerDetector::median(std::vector<double>{4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(StragglerDetector::median(std::vector<double>{1.0, 1.0, 1.0, 9.0}), 1.0);
  EXPECT_DOUBLE_EQ(StragglerDetector::median(std::vector<double>{5.0}), 5.0);
  EXPECT_DOUBLE_EQ(StragglerDetector::median(std::vector<double>{}), 0.0);
}

TEST(StragglerDetector, NamesARankAfterKConsecutiveSlowStepsOncePerEpisode) {
  StragglerDetector d(2.0, 3);
  const std::vector<double> even{1.0, 1.0, 1.0, 1.0};
  const std::vector<double> slow2{1.0, 1.0, 3.0, 1.0};  // median 1.0: rank 2 at 3x
  EXPECT_TRUE(d.observe(even).empty());
  EXPECT_TRUE(d.observe(slow2).empty());  // 1 slow step
  EXPECT_TRUE(d.observe(slow2).empty());  // 2
  const std::vector<Straggler> named = d.observe(slow2);  // 3: named
  ASSERT_EQ(ranks_of(named), std::vector<int>{2});
  EXPECT_DOUBLE_EQ(named[0].seconds, 3.0);
  EXPECT_DOUBLE_EQ(named[0].median, 1.0);
  EXPECT_DOUBLE_EQ(named[0].ratio, 3.0);
  EXPECT_TRUE(d.observe(slow2).empty());  // still slow: the same episode, not named again
  EXPECT_TRUE(d.observe(slow2).empty());
  EXPECT_TRUE(d.observe(even).empty());   // recovered: re-armed
  EXPECT_TRUE(d.observe(slow2).empty());
  EXPECT_TRUE(d.observe(slow2).empty());
  EXPECT_EQ(ranks_of(d.observe(slow2)), std::vector<int>{2});  // a new episode
}

TEST(StragglerDetector, AnInterruptedRunOfSlowStepsStartsOver) {
  StragglerDetector d(2.0, 2);
  const std::vector<double> slow0{5.0, 1.0, 1.0};
  const std::vector<double> even{1.0, 1.0, 1.0};
  EXPECT_TRUE(d.observe(slow0).empty());
  EXPECT_TRUE(d.observe(even).empty());
  EXPECT_TRUE(d.observe(slow0).empty());
  EXPECT_EQ(ranks_of(d.observe(slow0)), std::vector<int>{0});
}

TEST(StragglerDetector, ExactlyTheFactorIsNotSlowAndTheMeansCoverTheLastKSteps) {
  StragglerDetector d(2.0, 2);
  EXPECT_TRUE(d.observe(std::vector<double>{2.0, 1.0, 1.0}).empty());  // 2.0 is not > 2 x 1.0
  EXPECT_TRUE(d.observe(std::vector<double>{2.0, 1.0, 1.0}).empty());
  EXPECT_TRUE(d.observe(std::vector<double>{3.0, 1.0, 1.0}).empty());
  const std::vector<Straggler> named = d.observe(std::vector<double>{5.0, 2.0, 2.0});
  ASSERT_EQ(ranks_of(named), std::vector<int>{0});
  EXPECT_DOUBLE_EQ(named[0].seconds, 4.0);  // (3 + 5) / 2
  EXPECT_DOUBLE_EQ(named[0].median, 1.5);   // (1 + 2) / 2
  EXPECT_NEAR(named[0].ratio, 4.0 / 1.5, 1e-12);
}

TEST(StragglerDetector, SeveralRanksAtOnceInRankOrderAndEvenCountMedian) {
  StragglerDetector d(1.5, 1);
  // Median of {1, 1, 4, 4, 1, 1} = 1: ranks 2 and 3 are slow.
  EXPECT_EQ(ranks_of(d.observe(std::vector<double>{1.0, 1.0, 4.0, 4.0, 1.0, 1.0})), (std::vector<int>{2, 3}));
  // Median of {1, 1, 1, 2, 2, 10} = 1.5: only rank 3 (10 > 2.25), already named; rank 2 recovered.
  EXPECT_TRUE(d.observe(std::vector<double>{1.0, 2.0, 2.0, 10.0, 1.0, 1.0}).empty());
  EXPECT_EQ(ranks_of(d.observe(std::vector<double>{1.0, 1.0, 4.0, 1.0, 1.0, 1.0})), std::vector<int>{2});
}

TEST(StragglerDetector, FactorZeroIsOff) {
  StragglerDetector d(0.0, 1);
  EXPECT_FALSE(d.enabled());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(d.observe(std::vector<double>{1.0, 1.0, 100.0}).empty());
}

TEST(StragglerDetector, BadSettingsAreRefusedNamingTheFlag) {
  for (const double f : {0.5, 1.0, -2.0}) {
    try {
      StragglerDetector d(f, 3);
      ADD_FAILURE() << "factor " << f << " accepted";
    } catch (const dstrain::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--straggler-factor"), std::string::npos) << e.what();
    }
  }
  try {
    StragglerDetector d(2.0, 0);
    ADD_FAILURE() << "steps 0 accepted";
  } catch (const dstrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--straggler-steps"), std::string::npos) << e.what();
  }
}

}  // namespace
