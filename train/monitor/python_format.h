// Number formatting exactly as Python prints it, for files and lines a DeepSpeed user compares
// with DeepSpeed's own (csv_monitor writes str(float); the flops profiler prints round(x, 2)).
#pragma once

#include <string>

namespace dstrain {

// Python's repr(float) / str(float): the shortest digits that round-trip, fixed notation with at
// least one fractional digit ("65536.0", "0.0001") when the decimal exponent is in [-4, 16),
// otherwise scientific with a signed two-digit-minimum exponent ("1e-05", "1.5e+16"); "nan",
// "inf", "-inf", "-0.0".
std::string python_float_repr(double value);

// Python's round(value, ndigits) for ndigits >= 0: the double nearest to the decimal value rounded
// half-to-even from the exact binary value (so round(2.675, 2) = 2.67, as in Python).
double python_round(double value, int ndigits);

// Python's f"{value:g}" (six significant digits, trailing zeros dropped), which is C's %g.
std::string python_format_g(double value);

}  // namespace dstrain
