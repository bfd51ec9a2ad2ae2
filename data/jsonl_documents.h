// Documents from JSON Lines files, the format most fine-tuning data sets come in: one JSON object per
// line, its text under one key ("text" unless told otherwise). `dstrain prepare-data --format jsonl`.
//
// Each non-blank line is one document. Lines holding only spaces, tabs or a CR (a trailing newline,
// Windows line ends) are skipped. Anything else that is not a JSON object with a string under the
// key is an Error naming the file and the 1-based line: invalid JSON (including bytes that are not
// UTF-8), a value that is not an object, a missing key (listing the keys the line has), or a value
// that is not a string, or a key given twice in one object. A file whose texts are all empty, or an
// empty key, is an Error too. The whole file is checked before any document is used. docs/data.md §6.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain {

// Appends the documents of `file` to `documents`. Throws Error as above, or naming the file when it
// cannot be read.
void read_jsonl_documents(const std::filesystem::path& file, std::string_view text_key, std::vector<std::string>& documents);

}  // namespace dstrain
