// quoted_excerpt / excerpt: a file's text in a message, escaped and cut, against hand-written strings.
#include <string>

#include <gtest/gtest.h>

#include "ops/quoted_excerpt.h"

using namespace dstrain;

namespace {

TEST(QuotedExcerpt, ShortTextIsQuotedWhole) {
  EXPECT_EQ(quoted_excerpt("global_step10"), "\"global_step10\"");
  EXPECT_EQ(quoted_excerpt(""), "\"\"");
  EXPECT_EQ(excerpt("[\"a\", \"b\"]"), "[\"a\", \"b\"]");
}

TEST(QuotedExcerpt, ControlCharactersQuotesAndInvalidBytesAreEscaped) {
  EXPECT_EQ(quoted_excerpt("a\"b\\c\nd\te\r"), R"("a\"b\\c\nd\te\r")");
  // ESC [ 2 J (clear the screen), DEL, a C1 control (U+009B, CSI), a stray continuation byte and
  // a cut-short 3-byte character: none reaches the terminal as it is.
  EXPECT_EQ(quoted_excerpt("\x1b[2J\x7f\xc2\x9bx\x80y\xe2\x82"), R"("\x1B[2J\x7F\u{9B}x\x80y\xE2\x82")");
  // Valid UTF-8 stays readable (GPT-2's byte-level tokens are such characters).
  EXPECT_EQ(quoted_excerpt("\xc4\xa0the \xe2\x80\xa6"), "\"\xc4\xa0the \xe2\x80\xa6\"");
}

TEST(QuotedExcerpt, LongTextIsCutAtCharactersAndNamesItsSize) {
  const std::string passwd = "root:x:0:0:root:/root:/bin/bash\n" + std::string(5'000'000, 'a');
  const std::string q = quoted_excerpt(passwd, 40);
  EXPECT_EQ(q, "\"root:x:0:0:root:/root:/bin/bash\\naaaaaaaa\xe2\x80\xa6\" (5000032 bytes)");
  EXPECT_EQ(quoted_excerpt(std::string(80, 'b')), "\"" + std::string(80, 'b') + "\"");  // exactly the limit: whole
  EXPECT_EQ(quoted_excerpt(std::string(81, 'b')), "\"" + std::string(80, 'b') + "\xe2\x80\xa6\" (81 bytes)");
  // Characters, not bytes: a 2-byte character is never split.
  EXPECT_EQ(excerpt("\xc3\xa9\xc3\xa9\xc3\xa9", 2), "\xc3\xa9\xc3\xa9\xe2\x80\xa6 (6 bytes)");
}

}  // namespace
