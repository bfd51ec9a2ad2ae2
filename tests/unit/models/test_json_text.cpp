// formats/json_text: the JSON every reader of a user's file parses, refused in the project's words.
#include <gtest/gtest.h>

#include <string>

#include "formats/json_text.h"
#include "ops/error.h"

namespace dstrain {
namespace {

std::string nested(std::size_t depth, char open, char close) { return std::string(depth, open) + std::string(depth, close); }

std::string error_of(const std::string& text) {
  try {
    (void)parse_json_text(text, "test file 'x.json'");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A tokenizer.json nesting 200,000 levels parsed, then was copied recursively and overflowed the
// stack: text that deep is refused before the parse, naming the file, the limit and the line.
TEST(JsonText, NestingBeyondTheLimitIsRefusedBeforeParsing) {
  const std::string deep = "{\"a\": 1,\n\"b\": " + nested(100000, '[', ']') + "}";
  const std::string why = error_of(deep);
  EXPECT_NE(why.find("test file 'x.json' nests arrays and objects more than 512 levels deep (at line 2)"), std::string::npos) << why;
  EXPECT_NE(error_of("{\"k\": " + std::string(600, '{') + "}").find("more than 512 levels"), std::string::npos);
}

TEST(JsonText, NestingUpToTheLimitParses) {
  EXPECT_EQ(error_of(nested(kMaxJsonNesting, '[', ']')), "");
  EXPECT_NE(error_of(nested(kMaxJsonNesting + 1, '[', ']')), "");
}

// Brackets inside strings (escaped quotes included) are text, not nesting.
TEST(JsonText, BracketsInsideStringsAreNotNesting) {
  const std::string text = "{\"merges\": [\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]}";
  EXPECT_EQ(error_of(text), "");
  EXPECT_EQ(parse_json_text(text, "x")["merges"][0].get<std::string>().size(), 2001u);
}

}  // namespace
}  // namespace dstrain
