#include "train/monitor/python_format.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <system_error>

namespace dstrain {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";

  // Shortest round-trip digits come from to_chars (the same guarantee as Python's dtoa mode 0);
  // we only re-lay them out by Python's rules.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  (void)ec;                                                        // 64 bytes always suffice for a double in scientific form
  std::string_view sci(buf, static_cast<std::size_t>(end - buf));  // "-1.2345e-05"
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const auto e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int decpt = exp10 + 1;  // value = 0.DIGITS x 10^decpt

  // Python (pystrtod.c, format_float_short, repr mode): exponent form when decpt <= -4 or decpt > 16.
  if (decpt <= -4 || decpt > 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out;
  }
  const int n = static_cast<int>(digits.size());
  if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<std::size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(decpt));
    out.push_back('.');
    out += digits.substr(static_cast<std::size_t>(decpt));
  }
  return out;
}

double python_round(double value, int ndigits) {
  if (!std::isfinite(value)) return value;
  // fmt's fixed formatting is correctly rounded from the exact binary value, half-to-even on exact
  // ties, which is what Python's round() does through its own dtoa.
  const std::string text = fmt::format("{:.{}f}", value, ndigits);
  return std::strtod(text.c_str(), nullptr);
}

std::string python_format_g(double value) { return fmt::format("{:g}", value); }

}  // namespace dstrain
