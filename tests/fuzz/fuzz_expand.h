// Repeat markers in fuzz inputs, so a mutation of a few bytes can make an input deep or large.
//
// Why: the bugs the third hardening round found by hand were a pickle nesting 100,000 lists, a
// tokenizer.json whose Sequence steps nest 20,000 deep and sizes whose arithmetic wraps. libFuzzer
// grows inputs a few bytes at a time up to -max_len (64 KiB in scripts/gates.sh): it cannot write
// 100,000 nested brackets. With a marker it needs only to change a count: the seeds hold markers
// with small counts (tests/fuzz/corpus/), and one mutated byte of a count makes the nesting 65,536
// deeper.
//
// Two markers, each a byte that never occurs in UTF-8 text (so the JSON-based targets read their
// inputs unchanged when no marker is meant), then a count N (3 bytes, little-endian):
//   0xFE N len A            A repeated N times;
//   0xFD N len A len M len B  A repeated N times, M, B repeated N times: balanced nesting
//                            ("[" ... "]", a pickle's EMPTY_LIST ... APPEND) from one count.
// Each len is 1 byte (A and B: 1..255, M: 0..255). A marker cut short by the end of the input is
// kept as it is. The expanded text stops growing at kMaxExpandedBytes (a repeat stops early, a
// nest's closing part included), 64 KiB like scripts/gates.sh's -max_len: every input stays fast
// (under ASan a 4 MiB pickle of nested lists took 15 s of the 20 s an input may take, and a mutated
// count reaches the cap often), and the readers run on a small stack instead (fuzz_small_stack.h),
// where a recursion without bound overflows at the depth 64 KiB reaches.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dstrain::fuzz {

constexpr std::uint8_t kRepeatMarker = 0xFE;
constexpr std::uint8_t kNestMarker = 0xFD;
constexpr std::size_t kMaxExpandedBytes = std::size_t{64} << 10;

namespace detail {

// Reads a length byte and that many bytes at `at`, advancing it; false when the input ends first
// or when the part must not be empty and is.
inline bool take_part(std::string_view in, std::size_t& at, bool may_be_empty, std::string_view& part) {
  if (at >= in.size()) return false;
  const std::size_t length = static_cast<std::uint8_t>(in[at]);
  if ((length == 0 && !may_be_empty) || in.size() - at - 1 < length) return false;
  part = in.substr(at + 1, length);
  at += 1 + length;
  return true;
}

inline void append_repeated(std::string& out, std::string_view chunk, std::size_t count) {
  for (std::size_t k = 0; k < count && out.size() + chunk.size() <= kMaxExpandedBytes; ++k) out.append(chunk);
}

}  // namespace detail

inline std::string expand_repeats(std::string_view in) {
  std::string out;
  std::size_t i = 0;
  while (i < in.size()) {
    const auto byte = static_cast<std::uint8_t>(in[i]);
    if ((byte != kRepeatMarker && byte != kNestMarker) || in.size() - i < 5) {
      out.push_back(in[i++]);
      continue;
    }
    const std::size_t count = static_cast<std::uint8_t>(in[i + 1]) | static_cast<std::size_t>(static_cast<std::uint8_t>(in[i + 2])) << 8 |
                              static_cast<std::size_t>(static_cast<std::uint8_t>(in[i + 3])) << 16;
    std::size_t at = i + 4;
    std::string_view open, middle, close;
    if (!detail::take_part(in, at, false, open) ||
        (byte == kNestMarker && (!detail::take_part(in, at, true, middle) || !detail::take_part(in, at, false, close)))) {
      out.push_back(in[i++]);
      continue;
    }
    if (byte == kRepeatMarker) {
      detail::append_repeated(out, open, count);
    } else {
      // As many closings as openings fit, so the nesting stays balanced when the cap cuts it.
      const std::size_t room = kMaxExpandedBytes > out.size() + middle.size() ? kMaxExpandedBytes - out.size() - middle.size() : 0;
      const std::size_t n = std::min(count, room / (open.size() + close.size()));
      detail::append_repeated(out, open, n);
      out.append(middle);
      detail::append_repeated(out, close, n);
    }
    i = at;
  }
  return out;
}

inline std::string expand_repeats(const std::uint8_t* data, std::size_t size) {
  return expand_repeats(std::string_view(reinterpret_cast<const char*>(data), size));
}

// An input that begins with `magic` (a mode of the target that builds the file's framing itself,
// so that mutations land in the part that matters): the rest, expanded.
inline bool strip_mode(std::string_view& in, std::string_view magic) {
  if (in.substr(0, magic.size()) != magic) return false;
  in.remove_prefix(magic.size());
  return true;
}

}  // namespace dstrain::fuzz
