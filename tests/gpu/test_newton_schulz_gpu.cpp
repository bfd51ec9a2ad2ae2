// newton_schulz (ops/kernels/newton_schulz.h) on the GPU against the CPU backend (OpenBLAS sgemm):
// tall, wide, square and a GPT-2-sized matrix; both are fp32 iterations, so they agree to fp32
// rounding amplified by the five iterations (the tolerance below).
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/newton_schulz.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

TEST(NewtonSchulzGpu, MatchesTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{7, 19}, {19, 7}, {64, 64}, {768, 3072}, {1, 5}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const Shape s{rows, cols};
    Buf g(DType::fp32, rows * cols);
    for (std::int64_t i = 0; i < rows * cols; ++i) g.set(i, nd(rng));
    const std::int64_t wn = newton_schulz_workspace_numel(rows, cols);
    std::vector<float> host(static_cast<std::size_t>(rows * cols)), ws(static_cast<std::size_t>(wn));
    for (std::int64_t i = 0; i < rows * cols; ++i) host[static_cast<std::size_t>(i)] = static_cast<float>(g.get(i));
    newton_schulz(Tensor(host.data(), DType::fp32, s), Tensor(ws.data(), DType::fp32, Shape{wn}));
    DeviceTensors d;
    const Tensor dx = d.put(g, s), dws = d.zeros(DType::fp32, Shape{wn});
    newton_schulz(dx, dws);
    const Buf got = DeviceTensors::get(dx);
    double worst = 0.0;
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      const double want = host[static_cast<std::size_t>(i)], diff = std::abs(got.get(i) - want);
      worst = std::max(worst, diff);
      ASSERT_LE(diff, 1e-4 + 1e-4 * std::abs(want)) << "element " << i;
    }
    std::printf("MEASURE newton_schulz %lld x %lld: GPU vs CPU max |diff| %.3g\n", static_cast<long long>(rows), static_cast<long long>(cols), worst);
  }
}

}  // namespace
