// Well-formed UTF-8, one character at a time: the rule every reader of user text applies (Python's
// strict decoder, which DeepSpeed's config reader and the tokenizers' reference encoders use).
#pragma once

#include <cstddef>
#include <string_view>

namespace dstrain {

// The length of the valid UTF-8 character at text[i] (1 to 4), or 0 when the bytes there are not one
// (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, or cut short).
std::size_t utf8_char_length(std::string_view text, std::size_t i);

}  // namespace dstrain
