// Rank-aware logging: info goes to rank 0 only, warnings to every rank tagged with the rank.
#include <unistd.h>

#include <cstdio>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/error.h"
#include "ops/log.h"

using namespace dstrain;
using ::testing::HasSubstr;

namespace {

// Captures what is written to stderr while `fn` runs.
template <typename Fn>
std::string capture_stderr(Fn fn) {
  std::fflush(stderr);
  char path[] = "/tmp/dstrain_log_XXXXXX";
  const int fd = ::mkstemp(path);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  if (FILE* f = std::fopen(path, "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  ::close(fd);
  ::unlink(path);
  return text;
}

struct LogStateGuard {
  LogLevel level = log_level();
  ~LogStateGuard() {
    set_log_rank(0, 1);
    set_log_level(level);
  }
};

}  // namespace

TEST(Log, ParsesNamesAndDeepSpeedNumericLevels) {
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::debug);
  EXPECT_EQ(parse_log_level("info"), LogLevel::info);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::warning);
  EXPECT_EQ(parse_log_level("30"), LogLevel::warning);  // Python logging.WARNING
  EXPECT_EQ(parse_log_level("40"), LogLevel::error);
  EXPECT_EQ(parse_log_level("off"), LogLevel::off);
  EXPECT_THROW(parse_log_level("loud"), Error);
}

TEST(Log, InfoOnlyOnRankZeroWarningsOnEveryRankWithItsRank) {
  LogStateGuard guard;
  set_log_level(LogLevel::info);
  set_log_rank(0, 4);
  EXPECT_THAT(capture_stderr([] { log_info("step {}", 7); }), HasSubstr("[dstrain rank 0] step 7"));
  set_log_rank(3, 4);
  EXPECT_EQ(capture_stderr([] { log_info("step {}", 7); }), "");
  EXPECT_THAT(capture_stderr([] { log_warning("overflow in {}", "h.3.mlp"); }), HasSubstr("[dstrain rank 3] warning: overflow in h.3.mlp"));
}

TEST(Log, LevelFilters) {
  LogStateGuard guard;
  set_log_rank(0, 1);
  set_log_level(LogLevel::warning);
  EXPECT_EQ(capture_stderr([] { log_info("hidden"); }), "");
  EXPECT_THAT(capture_stderr([] { log_error("shown"); }), HasSubstr("[dstrain] error: shown"));
  set_log_level(LogLevel::off);
  EXPECT_EQ(capture_stderr([] { log_error("hidden"); }), "");
}
