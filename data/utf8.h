// Text helpers the tokenizers share: the WHATWG UTF-8 decode-with-replacement that node (and so
// every JavaScript reference encoder our tests run) applies to text, code point <-> bytes, and
// replacing every occurrence of a string.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dstrain {

// WHATWG UTF-8 decode with replacement, re-encoded as UTF-8: each maximal invalid subsequence becomes
// U+FFFD. This is what node does to a file read as "utf8" before a JavaScript encoder sees it.
// Returns nullopt when `text` is valid UTF-8 already (the common case, which then costs no copy).
std::optional<std::string> replace_invalid_utf8(std::string_view text);

// Bytes of the UTF-8 sequence whose lead byte is `lead` (1 for ASCII and for a byte that cannot lead).
std::size_t utf8_sequence_length(unsigned char lead);

// Appends the UTF-8 bytes of code point `cp` (< 0x110000).
void append_utf8(std::string& out, char32_t cp);

// Decodes the UTF-8 character starting at `text[i]` (strict) into `cp` and advances `i`; false (and
// `i` unchanged) when the bytes there are not one valid UTF-8 character.
bool next_code_point(std::string_view text, std::size_t& i, char32_t& cp);

// Replaces every occurrence of `from` (non-empty) in `s` with `to`, left to right.
void replace_all(std::string& s, std::string_view from, std::string_view to);

}  // namespace dstrain
