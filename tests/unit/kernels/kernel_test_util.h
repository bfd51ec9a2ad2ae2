// Shared helpers for the kernel tests: typed host buffers, random fills, tolerance checks, and a
// central-difference gradient probe. The CUDA tests (tests/gpu/) reuse these with the same case
// tables, so nothing here depends on the CPU backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ops/dtype.h"
#include "ops/tensor.h"

namespace dstrain::test {

// Absolute and relative tolerance: |got - want| <= atol + rtol * |want|.
struct Tol {
  double atol = 0;
  double rtol = 0;
};
// One tolerance per storage dtype (the case tables carry one of these per op).
struct DTypeTols {
  Tol fp32, fp16, bf16;
  Tol of(DType t) const { return t == DType::fp32 ? fp32 : (t == DType::fp16 ? fp16 : bf16); }
};

inline constexpr DType kFloatDTypes[] = {DType::fp32, DType::fp16, DType::bf16};

// A host buffer of n elements of a floating storage dtype, read and written as double.
class Buf {
 public:
  Buf() = default;
  Buf(DType t, std::int64_t n) : type_(t), n_(n), bytes_(static_cast<std::size_t>(n) * dtype_size(t) + 16, 0) {}
  DType dtype() const { return type_; }
  std::int64_t size() const { return n_; }
  void* data() { return bytes_.data(); }
  Tensor tensor(Shape s) {
    EXPECT_EQ(s.numel(), n_);
    return Tensor(data(), type_, s);
  }
  double get(std::int64_t i) const {
    switch (type_) {
      case DType::fp32:
        return reinterpret_cast<const float*>(bytes_.data())[i];
      case DType::fp16:
        return static_cast<float>(reinterpret_cast<const fp16_t*>(bytes_.data())[i]);
      case DType::bf16:
        return static_cast<float>(reinterpret_cast<const bf16_t*>(bytes_.data())[i]);
      default:
        return 0;
    }
  }
  // Stores v rounded to the storage dtype.
  void set(std::int64_t i, double v) {
    switch (type_) {
      case DType::fp32:
        reinterpret_cast<float*>(bytes_.data())[i] = static_cast<float>(v);
        break;
      case DType::fp16:
        reinterpret_cast<fp16_t*>(bytes_.data())[i] = fp16_t(static_cast<float>(v));
        break;
      case DType::bf16:
        reinterpret_cast<bf16_t*>(bytes_.data())[i] = bf16_t(static_cast<float>(v));
        break;
      default:
        break;
    }
  }
  // All values as double (after rounding to the storage type: the reference sees what the kernel sees).
  std::vector<double> values() const {
    std::vector<double> v(static_cast<std::size_t>(n_));
    for (std::int64_t i = 0; i < n_; ++i) v[static_cast<std::size_t>(i)] = get(i);
    return v;
  }
  void fill_uniform(std::mt19937_64& rng, double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (std::int64_t i = 0; i < n_; ++i) set(i, d(rng));
  }
  void fill(double v) {
    for (std::int64_t i = 0; i < n_; ++i) set(i, v);
  }

 private:
  DType type_ = DType::fp32;
  std::int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

// GELU (tanh approximation) and its derivative in double: the reference of the GELU ops.
inline double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
inline double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

inline std::vector<double> random_vec(std::mt19937_64& rng, std::size_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// Expects got[i] ~ want[i] for every i; reports the worst element.
inline void expect_close(const Buf& got, const std::vector<double>& want, Tol tol, const std::string& what) {
  ASSERT_EQ(static_cast<std::size_t>(got.size()), want.size()) << what;
  double worst = 0;
  std::int64_t worst_i = -1;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double w = want[static_cast<std::size_t>(i)], g = got.get(i);
    const double excess = std::abs(g - w) - (tol.atol + tol.rtol * std::abs(w));
    if (!(excess <= 0) && (worst_i < 0 || excess > worst || std::isnan(g))) {
      worst = excess;
      worst_i = i;
    }
  }
  if (worst_i >= 0) {
    ADD_FAILURE() << what << ": element " << worst_i << " is " << got.get(worst_i) << ", reference " << want[static_cast<std::size_t>(worst_i)]
                  << " (atol " << tol.atol << ", rtol " << tol.rtol << ")";
  }
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double excess = std::abs(got[i] - want[i]) - (tol.atol + tol.rtol * std::abs(want[i]));
    if (!(excess <= 0)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << want[i] << " (atol " << tol.atol << ", rtol " << tol.rtol
                    << ")";
      return;
    }
  }
}

// Central difference of a scalar loss with respect to one fp32 element x[i]:
// (L(x + h) - L(x - h)) / (x+h - (x-h)), using the step actually representable in fp32.
template <typename Loss>
double central_difference(float* x, std::int64_t i, double h, Loss&& loss) {
  const float orig = x[i];
  const float xp = static_cast<float>(orig + h), xm = static_cast<float>(orig - h);
  x[i] = xp;
  const double lp = loss();
  x[i] = xm;
  const double lm = loss();
  x[i] = orig;
  return (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
}

// Up to k distinct random indices in [0, n): finite differences probe a sample, not every element.
inline std::vector<std::int64_t> sample_indices(std::mt19937_64& rng, std::int64_t n, std::int64_t k) {
  std::vector<std::int64_t> idx;
  if (n <= k) {
    for (std::int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  std::uniform_int_distribution<std::int64_t> d(0, n - 1);
  for (std::int64_t j = 0; j < k; ++j) idx.push_back(d(rng));
  return idx;
}

// Finite-difference tolerance: fp32 forward noise divided by the step dominates.
inline constexpr Tol kFdTol{2e-3, 2e-2};

inline std::string dtype_label(DType t) { return std::string(dtype_name(t)); }
// Test-name generator for suites parameterised by the storage dtype.
inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& p) { return dtype_label(p.param); }

// Expects f() to throw dstrain::Error whose message contains every one of the given fragments.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected dstrain::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "message '" << msg << "' lacks '" << frag << "'";
  }
}

}  // namespace dstrain::test
