// parse_hjson against trees written by hand from the Hjson spec and hjson-py 3.1.0's decoder.
//
// Trees are compared through dump(): it keeps key order and tells 1 from 1.0 (nlohmann prints a
// double as "1.0"), so a test fails if we type a number differently from hjson-py.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config_schema/hjson_reader.h"
#include "ops/error.h"

using dstrain::Error;
using dstrain::HjsonOptions;
using dstrain::parse_hjson;
using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

namespace {

Json parse(std::string_view text, bool reject_duplicates = true) {
  HjsonOptions opts;
  opts.source_name = "t.hjson";
  opts.reject_duplicate_keys = reject_duplicates;
  return parse_hjson(text, opts);
}

// Expected tree from strict JSON written in the test.
std::string tree(std::string_view json) { return Json::parse(json).dump(); }

std::string error_of(std::string_view text, bool reject_duplicates = true) {
  try {
    parse(text, reject_duplicates);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_TREE(text, json) EXPECT_EQ(parse(text).dump(), tree(json)) << "input: " << (text)

}  // namespace

// ---- plain JSON is Hjson ----

TEST(HjsonReader, StrictJsonGivesTheSameTreeAsNlohmann) {
  const char* text = R"({"train_batch_size": 32, "neg": -7, "big": 18446744073709551615,
    "lr": 0.00015, "name": "Adam", "on": true, "off": false, "none": null,
    "list": [1, "two", [3], {"four": 4}], "empty_obj": {}, "empty_list": [],
    "esc": "a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00"})";
  EXPECT_EQ(parse(text).dump(), Json::parse(text).dump());
}

TEST(HjsonReader, KeepsKeyOrderAsWritten) { EXPECT_EQ(parse(R"({"z": 1, "a": 2, "m": 3})").dump(), R"({"z":1,"a":2,"m":3})"); }

// ---- comments ----

TEST(HjsonReader, HashSlashAndBlockComments) {
  EXPECT_TREE(R"(# leading comment
{
  // a line comment
  "a": 1, # after a value
  "b": 2 // after a value without comma
  /* a block
     comment */ "c": /* inside */ 3,
  "d": 4 /* after */
})",
              R"({"a": 1, "b": 2, "c": 3, "d": 4})");
}

TEST(HjsonReader, CommentEndsANumberButNotAQuotelessString) {
  EXPECT_TREE("{\n a: 5 # five\n b: hello # not a comment\n c: x // neither\n}", R"({"a": 5, "b": "hello # not a comment", "c": "x // neither"})");
}

// ---- quoteless strings: they run to the end of the line ----

TEST(HjsonReader, BareWordRunsToEndOfLineCommaIncluded) {
  EXPECT_TREE("{\n  \"train_batch_size\": CONFIG_BATCH_SIZE,\n  \"stage\": ZERO_STAGE\n}",
              R"({"train_batch_size": "CONFIG_BATCH_SIZE,", "stage": "ZERO_STAGE"})");
}

TEST(HjsonReader, QuotelessStringTrimmedAndKeepsInnerText) {
  EXPECT_TREE("{\n a:   hello world   \n b: say \"hi\", {x} [y]\n c: http://host:80/p\n}",
              R"({"a": "hello world", "b": "say \"hi\", {x} [y]", "c": "http://host:80/p"})");
}

TEST(HjsonReader, LiteralOnlyWhenAloneBeforeATerminator) {
  EXPECT_TREE(
      "{\n a: 5 apples\n b: true that\n c: null,\n d: false  ,\n e: True\n f: nullx\n"
      " g: 1 // one\n h: 2 /* two */\n i: 3\t\n}",
      R"({"a": "5 apples", "b": "true that", "c": null, "d": false, "e": "True", "f": "nullx",
          "g": 1, "h": 2, "i": 3})");
}

TEST(HjsonReader, ThingsThatLookLikeNumbersButAreStrings) {
  EXPECT_TREE(
      "{\n a: 01\n b: 1.\n c: .5\n d: 1e\n e: 0x10\n f: NaN\n g: -\n h: +1\n i: 1_000\n"
      " j: Infinity\n k: 1 2\n}",
      R"({"a": "01", "b": "1.", "c": ".5", "d": "1e", "e": "0x10", "f": "NaN", "g": "-",
                  "h": "+1", "i": "1_000", "j": "Infinity", "k": "1 2"})");
}

TEST(HjsonReader, NumberBeforeACommaOnTheSameLineEndsThere) {
  // At ',' the text so far is a number, so the value ends; a word would run on to the end of line.
  EXPECT_TREE("{\n a: 5, b: 6\n c: x, d: 7\n}", R"({"a": 5, "b": 6, "c": "x, d: 7"})");
}

TEST(HjsonReader, LiteralsInArrays) {
  EXPECT_TREE("{\n a: [1, true, null, -2.5]\n b: [\n  x y\n  3\n ]\n}", R"({"a": [1, true, null, -2.5], "b": ["x y", 3]})");
}

// ---- numbers ----

TEST(HjsonReader, IntegersStayIntegers) {
  const Json t = parse(R"({"a": 0, "b": 42, "c": -42, "d": 9223372036854775807,
      "e": -9223372036854775808, "f": 18446744073709551615})");
  EXPECT_TRUE(t["a"].is_number_unsigned());
  EXPECT_TRUE(t["c"].is_number_integer() && !t["c"].is_number_unsigned());
  EXPECT_EQ(t["d"].get<std::int64_t>(), INT64_MAX);
  EXPECT_EQ(t["e"].get<std::int64_t>(), INT64_MIN);
  EXPECT_EQ(t["f"].get<std::uint64_t>(), UINT64_MAX);
}

TEST(HjsonReader, IntegerBeyond64BitsBecomesADoubleLikeNlohmann) {
  const Json t = parse(R"({"a": 18446744073709551616, "b": -9223372036854775809})");
  EXPECT_TRUE(t["a"].is_number_float());
  EXPECT_DOUBLE_EQ(t["a"].get<double>(), 18446744073709551616.0);
  EXPECT_TRUE(t["b"].is_number_float());
}

TEST(HjsonReader, WholeFloatsBelow1e10CollapseToIntAsHjsonPyDoes) {
  // hjson-py: `if int(res) == res and abs(res) < 1e10: res = int(res)` (hjson-py issue #24).
  EXPECT_EQ(parse(R"({"a": 1.0, "b": 5e8, "c": -1.0, "d": 1.5e3, "e": 9999999999.0, "f": -0.0,
                      "g": 1E2, "h": 1e+2, "i": 2e-0})")
                .dump(),
            R"({"a":1,"b":500000000,"c":-1,"d":1500,"e":9999999999,"f":0,"g":100,"h":100,"i":2})");
}

TEST(HjsonReader, OtherFloatsStayDoubles) {
  const Json t = parse(R"({"a": 1e10, "b": 0.5, "c": 1.5e-3, "d": 15099494.4, "e": -2.5, "f": 5e20})");
  for (auto it = t.begin(); it != t.end(); ++it) EXPECT_TRUE(it->is_number_float()) << it.key();
  EXPECT_EQ(t["a"].get<double>(), 1e10);
  EXPECT_EQ(t["d"].get<double>(), 15099494.4);
  EXPECT_EQ(t["f"].get<double>(), 5e20);
}

TEST(HjsonReader, UnderflowIsZeroAndOverflowIsAnError) {
  EXPECT_EQ(parse(R"({"a": 1e-400})").dump(), R"({"a":0})");  // float 0.0, then collapsed
  EXPECT_EQ(error_of(R"({"a": 1e400})"), "t.hjson:1:7: the number 1e400 is too large for a 64-bit float; write a smaller number");
}

// ---- commas ----

TEST(HjsonReader, CommasMayBeOmittedBetweenLinesAndTrail) {
  EXPECT_TREE("{\n \"a\": 1\n \"b\": [1\n 2\n 3,\n ],\n \"c\": {\"d\": 4,},\n}", R"({"a": 1, "b": [1, 2, 3], "c": {"d": 4}})");
}

TEST(HjsonReader, QuotedValuesNeedNoCommaEvenOnOneLine) {
  // hjson-py only looks for the next key after a value; a comma is optional.
  EXPECT_TREE(R"({"a": "x" "b": "y" "c": [1] "d": {}})", R"({"a": "x", "b": "y", "c": [1], "d": {}})");
}

// ---- member names ----

TEST(HjsonReader, UnquotedKeys) {
  EXPECT_TREE("{\n zero_optimization: { stage: 2 }\n a-b.c$: 1\n spaced   : 2\n \"quoted key\": 3\n}",
              R"({"zero_optimization": {"stage": 2}, "a-b.c$": 1, "spaced": 2, "quoted key": 3})");
}

TEST(HjsonReader, KeyMayBeFollowedByALineBreakBeforeTheColon) { EXPECT_TREE("{\n abc\n : 1\n}", R"({"abc": 1})"); }

// ---- single-quoted and multiline strings ----

TEST(HjsonReader, SingleQuotedStrings) {
  EXPECT_TREE(R"({'a': 'it\'s', "b": 'say "hi"', 'c': "it's", d: '', e: 'x\n\u0041'})",
              R"({"a": "it's", "b": "say \"hi\"", "c": "it's", "d": "", "e": "x\nA"})");
}

TEST(HjsonReader, MultilineStringStripsIndentOfTheOpeningQuotes) {
  const std::string text =
      "{\n"
      "  text:\n"
      "    '''\n"
      "    first line\n"
      "      indented\n"
      "    it's 'quoted' ''\n"
      "    '''\n"
      "  one: '''single'''\n"
      "}";
  EXPECT_TREE(text, R"({"text": "first line\n  indented\nit's 'quoted' ''", "one": "single"})");
}

TEST(HjsonReader, MultilineStringDropsCarriageReturns) { EXPECT_TREE("{\r\n  a: '''\r\n  x\r\n  y\r\n  '''\r\n}", R"({"a": "x\ny"})"); }

TEST(HjsonReader, MultilineIndentIsCountedInCharactersNotBytes) {
  // "é: " is 3 characters (4 bytes), so 3 of the 4 spaces are indentation.
  EXPECT_TREE("é: '''\n    x\n   '''", R"({"é": " x"})");
}

TEST(HjsonReader, QuotelessStringsAreTrimmedLikePythonStrip) {
  // str.strip() also removes Unicode spaces such as NO-BREAK SPACE (U+00A0).
  EXPECT_TREE("{\n a: \xC2\xA0x y\xC2\xA0 \n}", R"({"a": "x y"})");
}

// ---- root ----

TEST(HjsonReader, RootBracesMayBeOmittedWhenTheTextHasSeveralLines) {
  EXPECT_TREE("# config\ntrain_batch_size: 8\nfp16: { enabled: true }\n", R"({"train_batch_size": 8, "fp16": {"enabled": true}})");
}

TEST(HjsonReader, ASingleLineWithoutBracesIsASingleValue) {
  EXPECT_EQ(parse("5").dump(), "5");
  EXPECT_EQ(parse("a: 1").dump(), R"("a: 1")");  // hjson-py: one line is one value, here a string
  EXPECT_EQ(parse("[1, 2]").dump(), "[1,2]");
}

TEST(HjsonReader, ByteOrderMarkIsSkipped) { EXPECT_TREE("\xEF\xBB\xBF{\"a\": 1}", R"({"a": 1})"); }

// ---- duplicate keys ----

TEST(HjsonReader, DuplicateKeyAtTopLevel) {
  EXPECT_EQ(error_of("{\n  \"train_batch_size\": 8,\n  \"train_batch_size\": 16\n}"),
            "t.hjson:3:3: duplicate key \"train_batch_size\" (also at line 2) in the top-level "
            "object; DeepSpeed rejects duplicate keys — keep one");
}

TEST(HjsonReader, AllDuplicatesReportedWithTheirPaths) {
  const std::string text =
      "{\n"                                                                    // 1
      "  \"a\": 1,\n"                                                          // 2
      "  \"zero_optimization\": {\n"                                           // 3
      "    \"stage\": 2,\n"                                                    // 4
      "    \"offload_param\": {\"device\": \"cpu\", \"device\": \"nvme\"},\n"  // 5
      "    \"stage\": 3\n"                                                     // 6
      "  },\n"                                                                 // 7
      "  \"list\": [{\"x\": 1, \"x\": 2}],\n"                                  // 8
      "  \"a\": 2,\n"                                                          // 9
      "  \"a\": 3\n"                                                           // 10
      "}";
  EXPECT_EQ(error_of(text),
            "t.hjson:5:40: duplicate key \"device\" (also at line 5) in object at "
            "\"zero_optimization.offload_param\"; DeepSpeed rejects duplicate keys — keep one\n"
            "t.hjson:6:5: duplicate key \"stage\" (also at line 4) in object at "
            "\"zero_optimization\"; DeepSpeed rejects duplicate keys — keep one\n"
            "t.hjson:8:21: duplicate key \"x\" (also at line 8) in object at \"list[0]\"; "
            "DeepSpeed rejects duplicate keys — keep one\n"
            "t.hjson:9:3: duplicate key \"a\" (also at lines 2, 10) in the top-level object; "
            "DeepSpeed rejects duplicate keys — keep one");
}

TEST(HjsonReader, UnquotedAndQuotedSpellingsOfAKeyAreDuplicates) {
  EXPECT_THAT(error_of("{\n stage: 1\n \"stage\": 2\n}"), HasSubstr("t.hjson:3:2: duplicate key \"stage\""));
}

TEST(HjsonReader, WithoutTheCheckTheLastValueWinsAtTheFirstPosition) {
  // Python dict(pairs): the key keeps its first position, the value is the last one.
  EXPECT_EQ(parse(R"({"a": 1, "b": 2, "a": 3})", /*reject_duplicates=*/false).dump(), R"({"a":3,"b":2})");
}

// ---- syntax errors: line:column of the offending character ----

TEST(HjsonReader, MissingColon) {
  EXPECT_EQ(error_of("{\"a\": 1,\n \"b\" 2}"), "t.hjson:2:6: expected ':' after the key \"b\" but found '2'; write \"b\": value");
  EXPECT_EQ(error_of("{\n  \"tag_validation\"=\"Warn\"\n}"),
            "t.hjson:2:19: expected ':' after the key \"tag_validation\" but found '='; write "
            "\"tag_validation\": value");
}

TEST(HjsonReader, ColumnsCountCodePointsNotBytes) {
  EXPECT_THAT(error_of(R"({"é": "x" "b" 2})"), HasSubstr("t.hjson:1:15: expected ':' after the key \"b\""));
}

TEST(HjsonReader, StringErrors) {
  EXPECT_EQ(error_of("{\"a\": \"abc\n}"),
            "t.hjson:1:11: line break inside a quoted string (the string opens at line 1, column "
            "7); add the closing quote, write \\n for a line break, or use a '''multiline''' string");
  EXPECT_EQ(error_of("{\"a\": \"x\ty\"}"), "t.hjson:1:9: control character U+0009 inside a quoted string; write it as the escape \\t");
  EXPECT_EQ(error_of("{\"a\": \"abc"), "t.hjson:1:7: this string is never closed; add the closing \"");
  EXPECT_THAT(error_of(R"({"a": "x\q"})"), HasSubstr("t.hjson:1:9: invalid escape '\\q' in a string"));
  EXPECT_THAT(error_of(R"({"a": "\u12G4"})"), HasSubstr("t.hjson:1:8: invalid \\u escape"));
  EXPECT_THAT(error_of(R"({"a": "\ud83d"})"), HasSubstr("t.hjson:1:8: \\uD83D is half of a UTF-16 surrogate pair"));
  EXPECT_EQ(error_of("{\n a: '''\n  never closed\n}"), "t.hjson:2:5: this ''' multiline string is never closed; end it with '''");
}

TEST(HjsonReader, StructureErrors) {
  EXPECT_EQ(error_of("{\n  \"a\": 1\n"),
            "t.hjson:3:1: the input ends inside the object that opens at line 1, column 1; add the "
            "missing '}'");
  EXPECT_EQ(error_of("{\"a\": [1, 2"),
            "t.hjson:1:12: the input ends inside the array that opens at line 1, column 7; add the "
            "missing ']'");
  EXPECT_EQ(error_of("{\"a\": }"),
            "t.hjson:1:7: found '}' where the value of \"a\" was expected; write the value (a "
            "number, \"string\", true, false, null, {...} or [...])");
  EXPECT_EQ(error_of("{\"a\": 1}}"),
            "t.hjson:1:9: unexpected '}' after the end of the top-level value; remove it, or look "
            "for an extra '}' or ']' before it");
  EXPECT_THAT(error_of("{\"a\": 1,, \"b\": 2}"), HasSubstr("t.hjson:1:9: found ',' where a key name was expected"));
  EXPECT_EQ(error_of("{: 1}"), "t.hjson:1:2: found ':' with no key name before it; an empty key must be quoted: \"\": value");
}

TEST(HjsonReader, DocumentationPlaceholdersFailWhereHjsonPyFails) {
  // From DeepSpeed's docs: `[true|false]` reads as the string "true|false]," and the next key
  // then lands in the array, so the ':' after it is where hjson-py gives up.
  EXPECT_THAT(error_of("{\n  \"stage\": [0|1|2|3],\n  \"overlap_comm\": [true|false]\n}"),
              HasSubstr("t.hjson:3:17: found ':' where the value of \"stage[2]\" was expected"));
  // `...` as a placeholder line: the unquoted key "..." runs into the next line.
  EXPECT_THAT(error_of("{\n  \"amp\": {\n    \"enabled\": true,\n    ...\n    \"opt_level\": \"O1\"\n  }\n}"),
              HasSubstr("t.hjson:5:5: expected ':' after the key name \"...\" but found "
                        "'\"opt_level\"'; a key without quotes cannot contain whitespace"));
  EXPECT_THAT(error_of("{\n  \"offload_param\": {\n    \"device\": \"cpu\",\n    ...\n  }\n}"),
              HasSubstr("t.hjson:5:3: found '}' where a key name was expected (after \"...\")"));
}

TEST(HjsonReader, WhitespaceInsideAnUnquotedKey) {
  EXPECT_THAT(error_of("{a b: 1}"), HasSubstr("t.hjson:1:4: expected ':' after the key name \"a\" but found 'b'"));
}

TEST(HjsonReader, EmptyInputAndCommentsOnly) {
  EXPECT_THAT(error_of(""), HasSubstr("t.hjson:1:1: there is no value"));
  EXPECT_THAT(error_of("# only a comment\n  "), HasSubstr("t.hjson:2:3: there is no value"));
}

TEST(HjsonReader, UnterminatedBlockComment) {
  EXPECT_EQ(error_of("{\"a\": 1 /* open\n}"), "t.hjson:1:9: this /* comment is never closed; end it with */");
}

TEST(HjsonReader, InvalidUtf8) {
  EXPECT_EQ(error_of("{\"a\": \"x\xFFy\"}"), "t.hjson:1:9: byte 0xFF is not valid UTF-8; save the config as UTF-8 text");
}

TEST(HjsonReader, NestingDepthIsBounded) {
  const std::string deep(5000, '[');
  EXPECT_THAT(error_of(deep), HasSubstr("nested more than 1000 levels"));
  std::string ok = std::string(100, '[') + std::string(100, ']');
  EXPECT_NO_THROW(parse(ok));
}

TEST(HjsonReader, SourceNameDefaultsToString) {
  try {
    parse_hjson("{");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::StartsWith("<string>:1:2: "));
  }
}
