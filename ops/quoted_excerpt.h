// Text from a user's file, quoted into a message: escaped, and cut when long.
//
// Errors name the value that is wrong, but that value comes from a file dstrain did not write: a
// 5 MB merge entry of a damaged tokenizer.json, or a checkpoint's `latest` that is a link to
// /etc/passwd. Echoed whole, it floods the terminal (or a log) and may carry control characters
// that move the cursor or hide the rest of the message. So every such value goes through here:
// at most `max_chars` characters, control and invalid bytes escaped, the full size given when cut.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dstrain {

inline constexpr std::size_t kQuotedExcerptChars = 80;

// `text` in double quotes, escaped as a C string (\" \\ \n \r \t, other control characters and
// bytes that are not UTF-8 as \xNN; valid UTF-8 characters kept, C1 controls as \u{NN}). When
// `text` holds more than `max_chars` characters: its first `max_chars`, then `… (N bytes)`, N the
// size of the whole text, e.g. "root:x:0:0:root:/root:/bin/bash\nd…" (2874 bytes).
std::string quoted_excerpt(std::string_view text, std::size_t max_chars = kQuotedExcerptChars);

// As quoted_excerpt, without the surrounding quotes and with '"' and '\' kept as they are: for
// text that is already a rendering, such as a JSON value's dump ([\"a\", \"b\"]).
std::string excerpt(std::string_view text, std::size_t max_chars = kQuotedExcerptChars);

}  // namespace dstrain
