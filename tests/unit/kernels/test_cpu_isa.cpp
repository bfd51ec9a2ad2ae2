// The CPU optimizer kernels on every instruction set this machine runs (ops/kernels/cpu_isa.h):
// each variant must give the scalar variant's bits exactly (the same fp32 operations in the same
// order, no FMA contraction), for every gradient dtype, 16-bit copy and mode, on a buffer large
// enough to be split over the threads and vectorised with a remainder. ISAs the CPU lacks are
// reported and skipped (the scalar variant always runs).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/adamw.h"
#include "ops/kernels/cpu_isa.h"
#include "ops/kernels/lion.h"
#include "ops/kernels/nadam.h"
#include "ops/kernels/optimizer_rule.h"
#include "ops/kernels/rmsprop.h"
#include "ops/kernels/rprop.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/matmul.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

// Fresh inputs for one kernel call, the same for every ISA (seeded), and the bytes of every
// output after the call.
struct Case {
  std::string name;
  std::function<std::vector<std::vector<unsigned char>>()> run;
};

std::vector<unsigned char> bytes_of(const void* p, std::size_t n) {
  std::vector<unsigned char> b(n);
  std::memcpy(b.data(), p, n);
  return b;
}

std::vector<float> uniform(std::int64_t n, double lo, double hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

Tensor f32(std::vector<float>& v) { return Tensor(v.data(), DType::fp32, Shape{static_cast<std::int64_t>(v.size())}); }

std::vector<Case> adamw_cases() {
  std::vector<Case> cases;
  for (const std::int64_t n : {std::int64_t{37}, std::int64_t{100003}}) {
    for (const DType gdt : kFloatDTypes) {
      for (const DType lowdt : {DType::fp32, DType::fp16, DType::bf16}) {  // fp32: no 16-bit copy
        for (const int mode : {0, 1, 2}) {                                 // decoupled, L2, decoupled + stochastic rounding
          if (mode == 2 && lowdt != DType::bf16) continue;
          const std::string name =
              "adamw n=" + std::to_string(n) + " grads " + dtype_label(gdt) + " copy " + dtype_label(lowdt) + " mode " + std::to_string(mode);
          cases.push_back({name, [=] {
                             std::vector<float> p = uniform(n, -1, 1, 1), m = uniform(n, -0.01, 0.01, 2), v = uniform(n, 0, 1e-4, 3);
                             Buf g(gdt, n), low(lowdt == DType::fp32 ? DType::bf16 : lowdt, n);
                             std::mt19937_64 rng(4);
                             g.fill_uniform(rng, -1, 1);
                             AdamWConfig c{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f};
                             c.decoupled_weight_decay = mode != 1;
                             c.stochastic_rounding = mode == 2;
                             c.rounding_key = RngKey{5, 7, 1, 0, 3};
                             adamw_update(f32(p), g.tensor({n}), f32(m), f32(v), lowdt == DType::fp32 ? Tensor() : low.tensor({n}), c);
                             return std::vector<std::vector<unsigned char>>{bytes_of(p.data(), p.size() * 4), bytes_of(m.data(), m.size() * 4),
                                                                            bytes_of(v.data(), v.size() * 4),
                                                                            bytes_of(low.data(), static_cast<std::size_t>(n) * 2)};
                           }});
        }
      }
    }
  }
  return cases;
}

// The element-wise optimizer rules (ops/kernels/optimizer_rule.h): one with a branch per element
// (Lion's sign, Rprop's three cases), one with division and sqrt and all three states (RMSprop
// centered with momentum), one with weight decay decoupled (NAdam).
std::vector<Case> rule_cases() {
  std::vector<Case> cases;
  const std::pair<const char*, RuleStep> steps[] = {
      {"lion", lion_step({.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1}, 0.5f)},
      {"rprop", rprop_step({}, 3, 1.0f)},
      {"rmsprop", rmsprop_step({.lr = 1e-3, .alpha = 0.9, .eps = 1e-8, .weight_decay = 0.1, .momentum = 0.9, .centered = true}, 0.5f)},
      {"nadam", nadam_step({.weight_decay = 0.1, .decoupled_weight_decay = true}, 4, 1.0f)},
  };
  for (const auto& [rule, step] : steps) {
    for (const DType gdt : kFloatDTypes) {
      for (const DType lowdt : {DType::fp32, DType::bf16}) {
        const std::int64_t n = 100003;
        const std::string name = std::string(rule) + " grads " + dtype_label(gdt) + " copy " + dtype_label(lowdt);
        cases.push_back(
            {name, [=, k = step] {
               std::vector<float> p = uniform(n, -1, 1, 1);
               std::vector<std::vector<float>> st;
               for (int j = 0; j < k.states; ++j) st.push_back(uniform(n, 0, 1e-2, 2 + static_cast<std::uint64_t>(j)));
               Buf g(gdt, n), low(DType::bf16, n);
               std::mt19937_64 rng(9);
               g.fill_uniform(rng, -1, 1);
               std::vector<Tensor> states;
               for (auto& s : st) states.push_back(f32(s));
               optimizer_rule_update(k, f32(p), g.tensor({n}), states, lowdt == DType::fp32 ? Tensor() : low.tensor({n}));
               std::vector<std::vector<unsigned char>> out{bytes_of(p.data(), p.size() * 4), bytes_of(low.data(), static_cast<std::size_t>(n) * 2)};
               for (auto& s : st) out.push_back(bytes_of(s.data(), s.size() * 4));
               return out;
             }});
      }
    }
  }
  return cases;
}

// Softmax cross-entropy's row loops (ops/cpu/softmax_cross_entropy_isa.h): its sums keep 16 lanes
// in a fixed order, so the losses, the log-sum-exps and the gradient are the same bits on every ISA.
// Rows of a vocabulary that is not a multiple of 16 (a tail) inside a padded width, one ignored
// target, logits spread wide enough that the running max rescales the sum.
std::vector<Case> cross_entropy_cases() {
  std::vector<Case> cases;
  for (const DType dt : kFloatDTypes) {
    cases.push_back({"softmax_cross_entropy " + dtype_label(dt), [=] {
                       const std::int64_t BT = 7, V = 1037, Vp = 1152;
                       Buf logits(dt, BT * Vp);
                       std::mt19937_64 rng(11);
                       logits.fill_uniform(rng, -8, 8);
                       std::vector<std::int32_t> t = {5, 1036, -1, 0, 700, 512, 3};
                       std::vector<float> losses(BT), lse(BT);
                       const Tensor tt(t.data(), DType::int32, Shape{BT});
                       const float mean = softmax_cross_entropy_forward(Tensor(losses.data(), DType::fp32, Shape{BT}),
                                                                        Tensor(lse.data(), DType::fp32, Shape{BT}), logits.tensor({BT, Vp}), tt, V);
                       Buf d(dt, BT * Vp);
                       softmax_cross_entropy_backward(d.tensor({BT, Vp}), logits.tensor({BT, Vp}), Tensor(lse.data(), DType::fp32, Shape{BT}), tt,
                                                      0.25f, V);
                       return std::vector<std::vector<unsigned char>>{bytes_of(&mean, 4), bytes_of(losses.data(), losses.size() * 4),
                                                                      bytes_of(lse.data(), lse.size() * 4),
                                                                      bytes_of(d.data(), static_cast<std::size_t>(BT * Vp) * dtype_size(dt))};
                     }});
  }
  return cases;
}

// The gradient reductions (ops/cpu/reduce_isa.h): grad_norm_overflow's 8 double lanes (a length
// that leaves a tail, an inf and a NaN counted) and the bias gradient's column sums in matmul's
// backward (OC not a multiple of the 64-column blocks nor of a vector), the same bits on every ISA.
std::vector<Case> reduction_cases() {
  std::vector<Case> cases;
  for (const DType dt : kFloatDTypes) {
    cases.push_back({"grad_norm_overflow " + dtype_label(dt), [=] {
                       const std::int64_t n = 100003;
                       Buf g(dt, n);
                       std::mt19937_64 rng(12);
                       g.fill_uniform(rng, -3, 3);
                       g.set(17, std::numeric_limits<double>::infinity());
                       g.set(n - 2, std::numeric_limits<double>::quiet_NaN());
                       const GradNormOverflow r = grad_norm_overflow(g.tensor({n}));
                       return std::vector<std::vector<unsigned char>>{bytes_of(&r.norm_sq, 8), bytes_of(&r.nonfinite, 8)};
                     }});
    cases.push_back({"matmul_backward bias " + dtype_label(dt), [=] {
                       const std::int64_t BT = 37, OC = 201, C = 3;
                       Buf dout(dt, BT * OC), dbias(dt, OC), inp(dt, BT * C), w(dt, OC * C);
                       std::mt19937_64 rng(13);
                       dout.fill_uniform(rng, -1, 1);
                       dbias.fill_uniform(rng, -1, 1);
                       std::vector<float> scratch(matmul_scratch_elems(dt, C));
                       matmul_backward(Tensor(), Tensor(), dbias.tensor({OC}), dout.tensor({BT, OC}), inp.tensor({BT, C}), w.tensor({OC, C}),
                                       scratch.empty() ? Tensor() : Tensor(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())}));
                       return std::vector<std::vector<unsigned char>>{bytes_of(dbias.data(), static_cast<std::size_t>(OC) * dtype_size(dt))};
                     }});
  }
  return cases;
}

class CpuIsaTest : public ::testing::Test {
 protected:
  void TearDown() override { set_cpu_isa(detected_cpu_isa()); }
};

void expect_same_bits_on_every_isa(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    set_cpu_isa(CpuIsa::scalar);
    const auto want = c.run();
    for (const CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_isa_supported(isa)) continue;
      set_cpu_isa(isa);
      const auto got = c.run();
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        ASSERT_EQ(got[k], want[k]) << "output " << k << " differs between " << cpu_isa_name(isa) << " and scalar";
      }
    }
  }
}

}  // namespace

TEST_F(CpuIsaTest, DetectionAndChoice) {
  EXPECT_TRUE(cpu_isa_supported(CpuIsa::scalar));
  const CpuIsa d = detected_cpu_isa();
  EXPECT_TRUE(cpu_isa_supported(d));
  if (d == CpuIsa::avx512) {
    EXPECT_TRUE(cpu_isa_supported(CpuIsa::avx2));
  }
  for (const CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa)) {
      std::printf("[ NOTE     ] this CPU has no %s: its variant is not exercised here\n", std::string(cpu_isa_name(isa)).c_str());
      const std::string name(cpu_isa_name(isa));
      expect_error([&] { set_cpu_isa(isa); }, {"set_cpu_isa", name.c_str()});
    }
  }
  set_cpu_isa(CpuIsa::scalar);
  EXPECT_EQ(cpu_isa(), CpuIsa::scalar);
}

TEST_F(CpuIsaTest, AdamWSameBitsOnEveryIsa) { expect_same_bits_on_every_isa(adamw_cases()); }

TEST_F(CpuIsaTest, OptimizerRulesSameBitsOnEveryIsa) { expect_same_bits_on_every_isa(rule_cases()); }

TEST_F(CpuIsaTest, CrossEntropySameBitsOnEveryIsa) { expect_same_bits_on_every_isa(cross_entropy_cases()); }

TEST_F(CpuIsaTest, GradientReductionsSameBitsOnEveryIsa) { expect_same_bits_on_every_isa(reduction_cases()); }
