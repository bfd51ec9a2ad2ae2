// all_to_all and compressed_all_reduce on local ranks, W = 1..4, against a naive one-thread
// simulation of DeepSpeed's compressed_allreduce (deepspeed/runtime/comm/nccl.py) written here from
// its formulas — plain ±1 floats, no bit packing — compared bit for bit, over several calls so the
// worker and server error feedback state is checked too; and the bytes the counters show.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "zero/local_communicator.h"

using namespace dstrain;

namespace {

TEST(AllToAll, EveryShardReachesItsRank) {
  for (int w = 1; w <= 4; ++w) {
    for (std::int64_t n : {0, 1, 5}) {
      run_local_ranks(w, [&](Communicator& c) {
        const int r = c.rank();
        std::vector<std::int32_t> send(static_cast<std::size_t>(w * n)), recv(send.size(), -1);
        for (int j = 0; j < w; ++j)
          for (std::int64_t k = 0; k < n; ++k) send[static_cast<std::size_t>(j * n + k)] = r * 1000 + j * 100 + static_cast<int>(k);
        c.all_to_all(Tensor(send.data(), DType::int32, Shape{w * n}), Tensor(recv.data(), DType::int32, Shape{w * n}));
        for (int i = 0; i < w; ++i)
          for (std::int64_t k = 0; k < n; ++k) EXPECT_EQ(recv[static_cast<std::size_t>(i * n + k)], i * 1000 + r * 100 + k);
        EXPECT_EQ(c.stats().bytes_sent(CollectiveKind::all_to_all), static_cast<std::uint64_t>((w - 1) * n * 4));
        EXPECT_EQ(c.stats().call_count(CollectiveKind::all_to_all), 1u);
      });
    }
  }
}

// DeepSpeed's algorithm for W ranks at once. x[r]: rank r's buffer (overwritten with the result);
// we[r], se[r]: its errors.
float naive_scale(const std::vector<float>& v) {
  double sq = 0;
  for (float f : v) sq += static_cast<double>(f) * f;
  return static_cast<float>(static_cast<float>(std::sqrt(sq)) / std::sqrt(static_cast<double>(v.size())));
}
float pm1(float v) { return v >= 0.0f || v != v ? 1.0f : -1.0f; }

void naive_compressed_all_reduce(std::vector<std::vector<float>>& x, std::vector<std::vector<float>>& we, std::vector<std::vector<float>>& se) {
  const int w = static_cast<int>(x.size());
  const std::size_t n = x[0].size(), chunk = n / static_cast<std::size_t>(w);
  std::vector<float> scale(static_cast<std::size_t>(w));
  std::vector<std::vector<float>> signs(static_cast<std::size_t>(w));
  for (int r = 0; r < w; ++r) {
    std::vector<float> m(n);
    for (std::size_t i = 0; i < n; ++i) m[i] = x[r][i] + we[r][i];
    scale[r] = naive_scale(m);
    signs[r].resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      signs[r][i] = pm1(m[i]);
      we[r][i] = m[i] - scale[r] * signs[r][i];
    }
  }
  std::vector<float> server_scale(static_cast<std::size_t>(w));
  std::vector<std::vector<float>> server_sign(static_cast<std::size_t>(w), std::vector<float>(chunk));
  for (int s = 0; s < w; ++s) {  // rank s serves chunk s
    std::vector<float> y(chunk, 0.0f);
    for (int r = 0; r < w; ++r)
      for (std::size_t k = 0; k < chunk; ++k) y[k] += signs[r][s * chunk + k] * (scale[r] * (1.0f / static_cast<float>(w)));
    for (std::size_t k = 0; k < chunk; ++k) y[k] += se[s][k];
    server_scale[s] = naive_scale(y);
    for (std::size_t k = 0; k < chunk; ++k) {
      server_sign[s][k] = pm1(y[k]);
      se[s][k] = y[k] - server_scale[s] * server_sign[s][k];
    }
  }
  for (int r = 0; r < w; ++r)
    for (int s = 0; s < w; ++s)
      for (std::size_t k = 0; k < chunk; ++k) x[r][s * chunk + k] = server_scale[s] * server_sign[s][k];
}

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(CompressedAllReduce, EqualsDeepSpeedsAlgorithmWithErrorFeedback) {
  constexpr int kCalls = 5;
  for (int w = 1; w <= 4; ++w) {
    // chunk 8 (one byte, padded to a word), 24 (three bytes), 8·129 (odd word count).
    for (std::int64_t chunk : {8, 24, 8 * 129}) {
      const std::int64_t n = chunk * w;
      // inputs[call][rank]: random, with exact zeros (sign "+") and negative zeros.
      std::mt19937 gen(static_cast<unsigned>(w * 1000 + chunk));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<std::vector<std::vector<float>>> inputs(kCalls, std::vector<std::vector<float>>(static_cast<std::size_t>(w)));
      for (auto& call : inputs)
        for (auto& v : call) {
          v.resize(static_cast<std::size_t>(n));
          for (std::size_t i = 0; i < v.size(); ++i) v[i] = i % 11 == 0 ? 0.0f : i % 13 == 0 ? -0.0f : dist(gen);
        }
      // The naive reference, call after call.
      std::vector<std::vector<std::vector<float>>> want(kCalls);
      std::vector<std::vector<float>> we(static_cast<std::size_t>(w), std::vector<float>(static_cast<std::size_t>(n), 0.0f));
      std::vector<std::vector<float>> se(static_cast<std::size_t>(w), std::vector<float>(static_cast<std::size_t>(chunk), 0.0f));
      for (int k = 0; k < kCalls; ++k) {
        want[k] = inputs[k];
        naive_compressed_all_reduce(want[k], we, se);
      }
      run_local_ranks(w, [&](Communicator& c) {
        const int r = c.rank();
        std::vector<float> my_we(static_cast<std::size_t>(n), 0.0f), my_se(static_cast<std::size_t>(chunk), 0.0f);
        for (int k = 0; k < kCalls; ++k) {
          std::vector<float> buf = inputs[k][r];
          const CommStats before = c.stats();
          c.compressed_all_reduce(Tensor(buf.data(), DType::fp32, Shape{n}), Tensor(my_we.data(), DType::fp32, Shape{n}),
                                  Tensor(my_se.data(), DType::fp32, Shape{chunk}));
          for (std::int64_t i = 0; i < n; ++i)
            ASSERT_EQ(bits(buf[i]), bits(want[k][r][i])) << "W " << w << " chunk " << chunk << " call " << k << " rank " << r << " i " << i;
          // Bytes: one all_to_all and one all_gather of (W−1) slots of ⌈chunk/32⌉ + 1 words.
          const CommStats d = c.stats() - before;
          const std::uint64_t slot = static_cast<std::uint64_t>(((chunk / 8 + 3) / 4 + 1) * 4);
          EXPECT_EQ(d.bytes_sent(CollectiveKind::all_to_all), static_cast<std::uint64_t>(w - 1) * slot);
          EXPECT_EQ(d.bytes_sent(CollectiveKind::all_gather), static_cast<std::uint64_t>(w - 1) * slot);
          EXPECT_EQ(d.bytes_sent(CollectiveKind::all_reduce), 0u);
          if (w > 1 && chunk > 1000) {
            // ~1/32 of the fp32 all-reduce's ring volume (+ the scale word and the padding to whole words).
            const double fp32 = static_cast<double>(ring_bytes_sent(CollectiveKind::all_reduce, static_cast<std::uint64_t>(n) * 4, w));
            EXPECT_LE(static_cast<double>(d.total_bytes_sent()), fp32 / 30.0);
          }
        }
        // The error-feedback state after the calls.
        for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(my_we[i]), bits(we[r][i])) << "worker error, rank " << r << " i " << i;
        for (std::int64_t i = 0; i < chunk; ++i) ASSERT_EQ(bits(my_se[i]), bits(se[r][i])) << "server error, rank " << r << " i " << i;
      });
    }
  }
}

TEST(CompressedAllReduce, RefusesSizesDeepSpeedWouldPad) {
  run_local_ranks(2, [&](Communicator& c) {
    std::vector<float> buf(12), we(12), se(6);
    EXPECT_THROW(c.compressed_all_reduce(Tensor(buf.data(), DType::fp32, Shape{12}), Tensor(we.data(), DType::fp32, Shape{12}),
                                         Tensor(se.data(), DType::fp32, Shape{6})),
                 Error);
  });
}

}  // namespace
