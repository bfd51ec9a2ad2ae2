#include "data/utf8.h"

namespace dstrain {

std::optional<std::string> replace_invalid_utf8(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  bool changed = false;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    int needed = 0;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b <= 0x7F)
      needed = 0;
    else if (b >= 0xC2 && b <= 0xDF)
      needed = 1;
    else if (b >= 0xE0 && b <= 0xEF) {
      needed = 2;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      needed = 3;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    } else
      needed = -1;
    std::size_t seen = 0;
    bool ok = needed >= 0;
    if (ok) {
      for (; seen < static_cast<std::size_t>(needed); ++seen) {
        const std::size_t j = i + 1 + seen;
        if (j >= text.size()) {
          ok = false;
          break;
        }
        const auto c = static_cast<unsigned char>(text[j]);
        if (c < lower || c > upper) {
          ok = false;
          break;
        }
        lower = 0x80;
        upper = 0xBF;
      }
    }
    if (ok) {
      if (changed) out.append(text.substr(i, 1 + seen));
      i += 1 + seen;
      continue;
    }
    if (!changed) {
      out.assign(text.substr(0, i));
      changed = true;
    }
    out.append(kReplacement);
    // The lead byte and the continuation bytes accepted so far form the maximal subpart; the byte
    // that broke the sequence starts the next one.
    i += 1 + (needed > 0 ? seen : 0);
  }
  if (!changed) return std::nullopt;
  return out;
}

std::size_t utf8_sequence_length(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  return 1;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool next_code_point(std::string_view text, std::size_t& i, char32_t& cp) {
  if (i >= text.size()) return false;
  const auto lead = static_cast<unsigned char>(text[i]);
  std::size_t extra;
  if (lead < 0x80) {
    cp = lead;
    extra = 0;
  } else if ((lead & 0xE0) == 0xC0) {
    cp = lead & 0x1F;
    extra = 1;
  } else if ((lead & 0xF0) == 0xE0) {
    cp = lead & 0x0F;
    extra = 2;
  } else if ((lead & 0xF8) == 0xF0) {
    cp = lead & 0x07;
    extra = 3;
  } else
    return false;
  if (i + 1 + extra > text.size()) return false;
  for (std::size_t k = 1; k <= extra; ++k) {
    const auto c = static_cast<unsigned char>(text[i + k]);
    if ((c & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (c & 0x3F);
  }
  i += 1 + extra;
  return true;
}

// Builds a new string rather than replacing in place: GCC 12 warns falsely (-Wrestrict) on the latter.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0;;) {
    const std::size_t at = s.find(from, i);
    if (at == std::string::npos) {
      out.append(s, i, std::string::npos);
      break;
    }
    out.append(s, i, at - i);
    out.append(to);
    i = at + from.size();
  }
  s = std::move(out);
}

}  // namespace dstrain
