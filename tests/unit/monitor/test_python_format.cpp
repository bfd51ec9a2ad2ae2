// Python's number formatting: expected strings are what CPython 3 prints (repr(x), round(x, 2)).
#include <gtest/gtest.h>

#include <limits>

#include "train/monitor/python_format.h"

namespace dstrain {
namespace {

TEST(PythonFloatRepr, MatchesCPython) {
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(python_float_repr(65536.0), "65536.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.0003), "0.0003");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(6e-05), "6e-05");
  EXPECT_EQ(python_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(9999999999999998.0), "9999999999999998.0");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e22), "1e+22");
  EXPECT_EQ(python_float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(python_float_repr(12345.678), "12345.678");
  EXPECT_EQ(python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(python_float_repr(5e-324), "5e-324");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float_repr(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(python_float_repr(10.957), "10.957");
}

TEST(PythonRound, HalfEvenOnTheBinaryValue) {
  EXPECT_EQ(python_round(2.675, 2), 2.67);  // 2.675 is 2.67499999... in binary
  EXPECT_EQ(python_round(0.125, 2), 0.12);  // exact tie: half to even
  EXPECT_EQ(python_round(0.375, 2), 0.38);
  EXPECT_EQ(python_round(124.439808, 2), 124.44);
}

TEST(PythonFormatG, MatchesCPython) {
  EXPECT_EQ(python_format_g(124.44), "124.44");
  EXPECT_EQ(python_format_g(2.0), "2");
  EXPECT_EQ(python_format_g(1e6), "1e+06");
  EXPECT_EQ(python_format_g(0.0001), "0.0001");
  EXPECT_EQ(python_format_g(123456.7), "123457");
}

}  // namespace
}  // namespace dstrain
