// JSON Lines documents: the texts of each line, and an error naming the file and line for each kind
// of bad line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/jsonl_documents.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

std::string jsonl_error(const std::filesystem::path& path, std::string_view key = "text") {
  std::vector<std::string> documents;
  try {
    read_jsonl_documents(path, key, documents);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(JsonlDocuments, EachLineIsOneDocumentBlankLinesSkipped) {
  TempDir dir;
  // Escapes, unicode, an embedded newline, other keys, CRLF line ends and blank lines.
  write_bytes(dir / "a.jsonl",
              "{\"text\": \"first\", \"id\": 1}\r\n"
              "\n"
              "  \t\n"
              "{\"meta\": {\"x\": [1, 2]}, \"text\": \"two\\nlines \\u00e9 \\ud83d\\ude00\"}\n"
              "{\"text\": \"\"}");  // no final newline; an empty text is a (empty) document
  std::vector<std::string> documents{"before"};
  read_jsonl_documents(dir / "a.jsonl", "text", documents);
  EXPECT_THAT(documents, ElementsAre("before", "first", "two\nlines \u00e9 \U0001F600", ""));

  write_bytes(dir / "b.jsonl", "{\"content\": \"c1\", \"text\": 5}\n{\"content\": \"c2\"}\n");
  documents.clear();
  read_jsonl_documents(dir / "b.jsonl", "content", documents);
  EXPECT_THAT(documents, ElementsAre("c1", "c2"));
}

TEST(JsonlDocuments, BadLinesAreNamedByFileAndLine) {
  TempDir dir;
  const auto path = dir / "bad.jsonl";
  const std::string good = "{\"text\": \"ok\"}\n";
  write_bytes(path, good + "\n" + "{\"text\": \"unterminated}\n");
  EXPECT_THAT(jsonl_error(path), HasSubstr(path.string() + ":3: not valid JSON"));
  write_bytes(path, good + "[\"text\"]\n");
  EXPECT_THAT(jsonl_error(path), HasSubstr(":2: the line is an array, not a JSON object"));
  write_bytes(path, good + good + "{\"body\": \"x\", \"title\": \"y\"}\n");
  const std::string missing = jsonl_error(path);
  EXPECT_THAT(missing, HasSubstr(":3: the object has no key \"text\" (it has \"body\", \"title\")"));
  EXPECT_THAT(missing, HasSubstr("--text-key"));
  write_bytes(path, "{\"text\": null}\n");
  EXPECT_THAT(jsonl_error(path), HasSubstr(":1: \"text\" is null, not a string"));
  write_bytes(path, "{\"text\": [\"a\", \"b\"]}\n");
  EXPECT_THAT(jsonl_error(path), HasSubstr(":1: \"text\" is an array, not a string"));
  write_bytes(path, "{\"text\": \"caf\xe9\"}\n");  // Latin-1, not UTF-8
  EXPECT_THAT(jsonl_error(path), HasSubstr(":1: not valid JSON"));
  write_bytes(path, "{\"text\": \"a\"} {\"text\": \"b\"}\n");  // two objects on one line
  EXPECT_THAT(jsonl_error(path), HasSubstr(":1: not valid JSON"));
  write_bytes(path, "\n \n");
  EXPECT_THAT(jsonl_error(path), HasSubstr("holds no documents"));
  EXPECT_THAT(jsonl_error(dir / "missing.jsonl"), HasSubstr("missing.jsonl"));
}
