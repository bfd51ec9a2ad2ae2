// The CUDA kernels against the CPU reference on the shared case tables (tests/unit/kernels/
// *_cases.h): the same inputs go through the same ops/kernels entry points, once with host tensors
// (CPU backend) and once with device tensors (dispatched to ops/cuda), and the results are compared.
//
// Exactness (stated per check): where both backends do the same IEEE fp32 operations in the same
// order and round once to nearest even, the results must be identical bit for bit: dropout (masks
// and values, all dtypes), the encoder (adds only, the CPU's summation order; whole tables and
// vocabulary shards), the vocabulary-parallel cross-entropy's row max, the residual of the
// fused residual+LayerNorm, and AdamW (optim.cu is built with -fmad=false; the 16-bit copy must be
// the RNE of the master). Everything else uses the case table's per-dtype tolerance (|gpu - cpu|
// <= atol + rtol·|cpu|), which is at least one 16-bit ulp: reduction order and FMA contraction
// differ between the backends, and a 16-bit store may then round to the neighbouring value.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "gpu_test.h"
#include "ops/cuda/cuda_check.h"
#include "ops/kernels/adamw.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/encoder.h"
#include "ops/kernels/gelu.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/lamb.h"
#include "ops/kernels/layernorm.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/sgd.h"
#include "ops/kernels/adadelta.h"
#include "ops/kernels/adagrad.h"
#include "ops/kernels/adamax.h"
#include "ops/kernels/asgd.h"
#include "ops/kernels/lion.h"
#include "ops/kernels/nadam.h"
#include "ops/kernels/optimizer_rule.h"
#include "ops/kernels/radam.h"
#include "ops/kernels/rmsprop.h"
#include "ops/kernels/rprop.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "ops/kernels/vocab_parallel_cross_entropy.h"
#include "tests/unit/kernels/adamw_cases.h"
#include "tests/unit/kernels/attention_cases.h"
#include "tests/unit/kernels/dropout_cases.h"
#include "tests/unit/kernels/encoder_cases.h"
#include "tests/unit/kernels/grad_norm_overflow_cases.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/lamb_cases.h"
#include "tests/unit/kernels/layernorm_cases.h"
#include "tests/unit/kernels/sgd_cases.h"
#include "tests/unit/kernels/matmul_cases.h"
#include "tests/unit/kernels/softmax_cross_entropy_cases.h"
#include "tests/unit/kernels/vocab_parallel_cross_entropy_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

// A device copy of host bytes (cudaMalloc'd; freed on destruction).
class Dev {
 public:
  Dev(const void* host, std::size_t bytes) : bytes_(bytes) {
    DSTRAIN_CUDA_CHECK(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
    if (bytes > 0) DSTRAIN_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
  }
  explicit Dev(Buf& b) : Dev(b.data(), static_cast<std::size_t>(b.size()) * dtype_size(b.dtype())) {}
  template <typename T>
  explicit Dev(const std::vector<T>& v) : Dev(v.data(), v.size() * sizeof(T)) {}
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(ptr_); }
  Tensor tensor(DType t, Shape s) const { return Tensor(ptr_, t, s, Device::cuda(0)); }
  void download(void* host) const {
    DSTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    if (bytes_ > 0) DSTRAIN_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost));
  }
  // The device contents as a host Buf of dtype t, n elements.
  Buf to_buf(DType t, std::int64_t n) const {
    Buf b(t, n);
    download(b.data());
    return b;
  }
  template <typename T>
  std::vector<T> to_vec() const {
    std::vector<T> v(bytes_ / sizeof(T));
    download(v.data());
    return v;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Bit-for-bit equality of two buffers of the same dtype; reports the first differing element.
void expect_identical(const Buf& gpu, const Buf& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  const std::size_t w = dtype_size(gpu.dtype());
  const auto* g = static_cast<const unsigned char*>(const_cast<Buf&>(gpu).data());
  const auto* c = static_cast<const unsigned char*>(const_cast<Buf&>(cpu).data());
  for (std::int64_t i = 0; i < gpu.size(); ++i) {
    if (std::memcmp(g + i * w, c + i * w, w) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << gpu.get(i) << " on the GPU but " << cpu.get(i) << " on the CPU (bit-exact expected)";
      return;
    }
  }
}

void expect_identical(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << gpu[i] << " on the GPU but " << cpu[i] << " on the CPU (bit-exact expected)";
      return;
    }
  }
}

// fp32 vector as a Buf (for expect_close against another fp32 result).
Buf f32_buf(const std::vector<float>& v) {
  Buf b(DType::fp32, static_cast<std::int64_t>(v.size()));
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}
std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::int64_t n, std::int64_t V) {
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(V - 1));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace

class GpuKernels : public ::testing::TestWithParam<DType> {};

// Forward: one add per element; backward: fp32 sums in the CPU's order (counting sort by token).
TEST_P(GpuKernels, EncoderBitExact) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  std::mt19937_64 rng(21);
  for (const EncoderCase& c : kEncoderCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, V = c.V, maxT = c.maxT;
    auto tok = random_tokens(rng, B * T, V);
    Buf wte(dt, V * C), wpe(dt, maxT * C), out(dt, B * T * C), dout(dt, B * T * C), dwte(dt, V * C), dwpe(dt, maxT * C);
    for (Buf* b : {&wte, &wpe, &dout, &dwte, &dwpe}) b->fill_uniform(rng, -1, 1);
    Dev d_tok(tok), d_wte(wte), d_wpe(wpe), d_out(out), d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
    std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, V), 0);
    Dev d_scratch(scratch);
    const Shape sc{static_cast<std::int64_t>(scratch.size())};

    encoder_forward(out.tensor({B, T, C}), Tensor(tok.data(), DType::int32, Shape{B, T}), wte.tensor({V, C}), wpe.tensor({maxT, C}));
    encoder_backward(dwte.tensor({V, C}), dwpe.tensor({maxT, C}), dout.tensor({B, T, C}), Tensor(tok.data(), DType::int32, Shape{B, T}),
                     Tensor(scratch.data(), DType::int32, sc));
    encoder_forward(d_out.tensor(dt, {B, T, C}), d_tok.tensor(DType::int32, {B, T}), d_wte.tensor(dt, {V, C}), d_wpe.tensor(dt, {maxT, C}));
    encoder_backward(d_dwte.tensor(dt, {V, C}), d_dwpe.tensor(dt, {maxT, C}), d_dout.tensor(dt, {B, T, C}), d_tok.tensor(DType::int32, {B, T}),
                     d_scratch.tensor(DType::int32, sc));
    expect_identical(d_out.to_buf(dt, B * T * C), out, "encoder out");
    expect_identical(d_dwte.to_buf(dt, V * C), dwte, "encoder dwte");
    expect_identical(d_dwpe.to_buf(dt, maxT * C), dwpe, "encoder dwpe");
  }
}

// Tensor parallelism's vocabulary shards (VocabShard): the table holds rows [first, first + rows)
// of the vocabulary; a token outside them looks up zeros and adds to no row. Shards at row 0, in
// the middle and at the end of the vocabulary, and a shard that no token falls in (no dwte work).
TEST_P(GpuKernels, EncoderVocabShardsBitExact) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  std::mt19937_64 rng(29);
  constexpr int kShards = 3;
  for (const EncoderCase& c : kEncoderCases) {
    const std::int64_t B = c.B, T = c.T, C = c.C, vocab = c.V + 7, maxT = c.maxT;  // 3 shards of at least 2 rows each
    for (int r = 0; r < kShards; ++r) {
      for (const bool none_in_shard : {false, true}) {
        SCOPED_TRACE(fmt::format("{} shard {} of {}{}", c.name, r, kShards, none_in_shard ? ", no token in it" : ""));
        std::int64_t first = 0, rows = 0;
        for (int k = 0; k <= r; ++k) {
          first += rows;
          rows = vocab / kShards + (k < vocab % kShards ? 1 : 0);
        }
        auto tok = random_tokens(rng, B * T, vocab);
        if (none_in_shard)
          for (auto& t : tok) t = static_cast<std::int32_t>(r == 0 ? vocab - 1 : 0);
        Buf wte(dt, rows * C), wpe(dt, maxT * C), out(dt, B * T * C), dout(dt, B * T * C), dwte(dt, rows * C), dwpe(dt, maxT * C);
        for (Buf* b : {&wte, &wpe, &dout, &dwte, &dwpe}) b->fill_uniform(rng, -1, 1);
        Dev d_tok(tok), d_wte(wte), d_wpe(wpe), d_out(out), d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
        std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, rows), 0);
        Dev d_scratch(scratch);
        const Shape sc{static_cast<std::int64_t>(scratch.size())};
        const VocabShard shard{first, vocab};

        encoder_forward(out.tensor({B, T, C}), Tensor(tok.data(), DType::int32, Shape{B, T}), wte.tensor({rows, C}), wpe.tensor({maxT, C}), shard);
        encoder_backward(dwte.tensor({rows, C}), dwpe.tensor({maxT, C}), dout.tensor({B, T, C}), Tensor(tok.data(), DType::int32, Shape{B, T}),
                         Tensor(scratch.data(), DType::int32, sc), shard);
        encoder_forward(d_out.tensor(dt, {B, T, C}), d_tok.tensor(DType::int32, {B, T}), d_wte.tensor(dt, {rows, C}), d_wpe.tensor(dt, {maxT, C}),
                        shard);
        encoder_backward(d_dwte.tensor(dt, {rows, C}), d_dwpe.tensor(dt, {maxT, C}), d_dout.tensor(dt, {B, T, C}), d_tok.tensor(DType::int32, {B, T}),
                         d_scratch.tensor(DType::int32, sc), shard);
        expect_identical(d_out.to_buf(dt, B * T * C), out, "encoder out");
        expect_identical(d_dwte.to_buf(dt, rows * C), dwte, "encoder dwte");
        expect_identical(d_dwpe.to_buf(dt, maxT * C), dwpe, "encoder dwpe");
      }
    }
  }
}

TEST(GpuKernelsErrors, EncoderRejectsBadTokenOnDevice) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::vector<std::int32_t> tok{0, 1, 7, 2};  // 7 >= V = 4
  std::vector<float> wte(4 * 8, 0.0f), wpe(4 * 8, 0.0f), out(4 * 8, 0.0f);
  Dev d_tok(tok), d_wte(wte), d_wpe(wpe), d_out(out);
  expect_error(
      [&] {
        encoder_forward(d_out.tensor(DType::fp32, {2, 2, 8}), d_tok.tensor(DType::int32, {2, 2}), d_wte.tensor(DType::fp32, {4, 8}),
                        d_wpe.tensor(DType::fp32, {4, 8}));
      },
      {"encoder_forward", "token 7", "[0, 4)"});
  // A vocabulary shard checks tokens against the whole vocabulary, not its rows.
  std::vector<std::int32_t> tok2{0, 1, 9, 2};  // 9 >= vocab = 8; the shard holds rows [4, 8)
  Dev d_tok2(tok2);
  expect_error(
      [&] {
        encoder_forward(d_out.tensor(DType::fp32, {2, 2, 8}), d_tok2.tensor(DType::int32, {2, 2}), d_wte.tensor(DType::fp32, {4, 8}),
                        d_wpe.tensor(DType::fp32, {4, 8}), VocabShard{4, 8});
      },
      {"encoder_forward", "token 9", "[0, 8)"});
}

TEST_P(GpuKernels, LayernormMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol tol = kLayernormTols.of(dt);
  std::mt19937_64 rng(5);
  for (const LayernormCase& c : kLayernormCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t rows = c.B * c.T, C = c.C, n = rows * C;
    const Shape xs{c.B, c.T, C}, ws{C}, ms{c.B, c.T};
    Buf a(dt, n), b(dt, n), w(dt, C), bias(dt, C), out(dt, n), res(dt, n), dout(dt, n), dinp(dt, n), dw(dt, C), db(dt, C);
    for (Buf* x : {&a, &b, &w, &bias, &dout, &dinp, &dw, &db}) x->fill_uniform(rng, -1, 1);
    std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows));
    Dev d_a(a), d_b(b), d_w(w), d_bias(bias), d_out(out), d_res(res), d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db), d_mean(mean), d_rstd(rstd);
    auto ft = [&](std::vector<float>& v) { return Tensor(v.data(), DType::fp32, ms); };

    // Fused residual + LayerNorm, then the backward from its saved statistics.
    fused_residual_layernorm_forward(res.tensor(xs), out.tensor(xs), ft(mean), ft(rstd), a.tensor(xs), b.tensor(xs), w.tensor(ws), bias.tensor(ws));
    layernorm_backward(dinp.tensor(xs), dw.tensor(ws), db.tensor(ws), dout.tensor(xs), res.tensor(xs), w.tensor(ws), ft(mean), ft(rstd));
    fused_residual_layernorm_forward(d_res.tensor(dt, xs), d_out.tensor(dt, xs), d_mean.tensor(DType::fp32, ms), d_rstd.tensor(DType::fp32, ms),
                                     d_a.tensor(dt, xs), d_b.tensor(dt, xs), d_w.tensor(dt, ws), d_bias.tensor(dt, ws));
    layernorm_backward(d_dinp.tensor(dt, xs), d_dw.tensor(dt, ws), d_db.tensor(dt, ws), d_dout.tensor(dt, xs), d_res.tensor(dt, xs),
                       d_w.tensor(dt, ws), d_mean.tensor(DType::fp32, ms), d_rstd.tensor(DType::fp32, ms));
    expect_identical(d_res.to_buf(dt, n), res, "residual (one add, one rounding)");
    expect_close(d_out.to_buf(dt, n), out.values(), tol, "fused layernorm out " + dtype_label(dt));
    expect_close(f32_buf(d_mean.to_vec<float>()), as_double(mean), kLayernormTols.fp32, "mean");
    expect_close(f32_buf(d_rstd.to_vec<float>()), as_double(rstd), kLayernormTols.fp32, "rstd");
    expect_close(d_dinp.to_buf(dt, n), dinp.values(), tol, "dinp " + dtype_label(dt));
    expect_close(d_dw.to_buf(dt, C), dw.values(), tol, "dweight " + dtype_label(dt));
    expect_close(d_db.to_buf(dt, C), db.values(), tol, "dbias " + dtype_label(dt));

    // Plain LayerNorm on a (must equal the fused one on a's own values: checked against the CPU).
    Buf out2(dt, n);
    Dev d_out2(out2);
    layernorm_forward(out2.tensor(xs), ft(mean), ft(rstd), a.tensor(xs), w.tensor(ws), bias.tensor(ws));
    layernorm_forward(d_out2.tensor(dt, xs), d_mean.tensor(DType::fp32, ms), d_rstd.tensor(DType::fp32, ms), d_a.tensor(dt, xs), d_w.tensor(dt, ws),
                      d_bias.tensor(dt, ws));
    expect_close(d_out2.to_buf(dt, n), out2.values(), tol, "layernorm out " + dtype_label(dt));
    expect_close(f32_buf(d_rstd.to_vec<float>()), as_double(rstd), kLayernormTols.fp32, "layernorm rstd");
  }
}

TEST_P(GpuKernels, GeluMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol tol = kGeluTols.of(dt);
  std::mt19937_64 rng(9);
  for (const GeluCase& c : kGeluCases) {
    SCOPED_TRACE(c.name);
    Buf x(dt, c.n), y(dt, c.n), g(dt, c.n), dx(dt, c.n);
    x.fill_uniform(rng, -c.range, c.range);
    g.fill_uniform(rng, -1, 1);
    dx.fill_uniform(rng, -1, 1);
    Dev d_x(x), d_y(y), d_g(g), d_dx(dx);
    const Shape s{c.n};
    gelu_forward(y.tensor(s), x.tensor(s));
    gelu_backward(dx.tensor(s), x.tensor(s), g.tensor(s));
    gelu_forward(d_y.tensor(dt, s), d_x.tensor(dt, s));
    gelu_backward(d_dx.tensor(dt, s), d_x.tensor(dt, s), d_g.tensor(dt, s));
    expect_close(d_y.to_buf(dt, c.n), y.values(), tol, "gelu out " + dtype_label(dt));
    expect_close(d_dx.to_buf(dt, c.n), dx.values(), tol, "gelu dinp " + dtype_label(dt));
    // In place (out aliases inp).
    gelu_forward(d_x.tensor(dt, s), d_x.tensor(dt, s));
    expect_close(d_x.to_buf(dt, c.n), y.values(), tol, "gelu in place " + dtype_label(dt));
  }
}

// The same Philox stream on both backends: identical masks and values, bit for bit.
TEST_P(GpuKernels, DropoutBitExact) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  std::mt19937_64 rng(13);
  for (const DropoutCase& c : kDropoutCases) {
    SCOPED_TRACE(c.name);
    DropoutParams p;
    p.p = c.p;
    p.rng = RngKey{0x0123456789abcdefull, 7, 3, 2, 1};
    const Shape s{c.n};
    // Mask: dropout of all-ones; every element is exactly 0 or 1/(1-p) on both.
    Buf ones(dt, c.n), mask(dt, c.n);
    ones.fill(1.0);
    Dev d_ones(ones), d_mask(mask);
    dropout_forward(mask.tensor(s), ones.tensor(s), p);
    dropout_forward(d_mask.tensor(dt, s), d_ones.tensor(dt, s), p);
    expect_identical(d_mask.to_buf(dt, c.n), mask, "dropout mask");
    // Values: forward, in-place forward, and backward (+=).
    Buf x(dt, c.n), y(dt, c.n), dx(dt, c.n);
    x.fill_uniform(rng, -2, 2);
    dx.fill_uniform(rng, -1, 1);
    Dev d_x(x), d_y(y), d_dx(dx);
    dropout_forward(y.tensor(s), x.tensor(s), p);
    dropout_backward(dx.tensor(s), x.tensor(s), p);
    dropout_forward(d_y.tensor(dt, s), d_x.tensor(dt, s), p);
    dropout_backward(d_dx.tensor(dt, s), d_x.tensor(dt, s), p);
    expect_identical(d_y.to_buf(dt, c.n), y, "dropout out");
    expect_identical(d_dx.to_buf(dt, c.n), dx, "dropout dinp");
    dropout_forward(d_x.tensor(dt, s), d_x.tensor(dt, s), p);
    expect_identical(d_x.to_buf(dt, c.n), y, "dropout in place");
  }
}

TEST_P(GpuKernels, SoftmaxCrossEntropyMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol tol = kSoftmaxCrossEntropyTols.of(dt);
  std::mt19937_64 rng(17);
  for (const SoftmaxCrossEntropyCase& c : kSoftmaxCrossEntropyCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t BT = c.BT, V = c.V, Vp = c.Vp;
    Buf logits(dt, BT * Vp), dlogits(dt, BT * Vp);
    logits.fill_uniform(rng, -c.logit_range, c.logit_range);
    std::vector<std::int32_t> tg = random_tokens(rng, BT, V);
    if (c.ignore_every > 0)
      for (std::int64_t i = 0; i < BT; i += c.ignore_every) tg[static_cast<std::size_t>(i)] = -1;
    std::vector<float> losses(static_cast<std::size_t>(BT)), lse(static_cast<std::size_t>(BT));
    Dev d_logits(logits), d_dlogits(dlogits), d_tg(tg), d_losses(losses), d_lse(lse);
    const Shape ls{BT, Vp}, rs{BT};
    const float dloss = 1.0f / static_cast<float>(BT);
    const float mean = softmax_cross_entropy_forward(Tensor(losses.data(), DType::fp32, rs), Tensor(lse.data(), DType::fp32, rs), logits.tensor(ls),
                                                     Tensor(tg.data(), DType::int32, rs), V);
    softmax_cross_entropy_backward(dlogits.tensor(ls), logits.tensor(ls), Tensor(lse.data(), DType::fp32, rs), Tensor(tg.data(), DType::int32, rs),
                                   dloss, V);
    const float d_mean = softmax_cross_entropy_forward(d_losses.tensor(DType::fp32, rs), d_lse.tensor(DType::fp32, rs), d_logits.tensor(dt, ls),
                                                       d_tg.tensor(DType::int32, rs), V);
    softmax_cross_entropy_backward(d_dlogits.tensor(dt, ls), d_logits.tensor(dt, ls), d_lse.tensor(DType::fp32, rs), d_tg.tensor(DType::int32, rs),
                                   dloss, V);
    // Loss and lse are fp32 from the same (rounded) logits: the fp32 tolerance for every dtype.
    const Tol ftol = kSoftmaxCrossEntropyTols.fp32;
    expect_close(f32_buf(d_lse.to_vec<float>()), as_double(lse), ftol, "lse");
    expect_close(f32_buf(d_losses.to_vec<float>()), as_double(losses), ftol, "losses");
    EXPECT_NEAR(d_mean, mean, ftol.atol + ftol.rtol * std::abs(mean)) << "mean loss";
    expect_close(d_dlogits.to_buf(dt, BT * Vp), dlogits.values(), tol, "dlogits " + dtype_label(dt));
    // In place: dlogits overwrites the logits.
    softmax_cross_entropy_backward(d_logits.tensor(dt, ls), d_logits.tensor(dt, ls), d_lse.tensor(DType::fp32, rs), d_tg.tensor(DType::int32, rs),
                                   dloss, V);
    expect_close(d_logits.to_buf(dt, BT * Vp), dlogits.values(), tol, "dlogits in place " + dtype_label(dt));
    // Forward and backward in one kernel (online max and sum): the same losses, lse, mean and
    // dlogits, written over the logits.
    Dev f_logits(logits), f_losses(losses), f_lse(lse);
    const float f_mean = softmax_cross_entropy_forward_backward(f_losses.tensor(DType::fp32, rs), f_lse.tensor(DType::fp32, rs),
                                                                f_logits.tensor(dt, ls), d_tg.tensor(DType::int32, rs), dloss, V);
    expect_close(f32_buf(f_lse.to_vec<float>()), as_double(lse), ftol, "fused lse");
    expect_close(f32_buf(f_losses.to_vec<float>()), as_double(losses), ftol, "fused losses");
    EXPECT_NEAR(f_mean, mean, ftol.atol + ftol.rtol * std::abs(mean)) << "fused mean loss";
    expect_close(f_logits.to_buf(dt, BT * Vp), dlogits.values(), tol, "fused dlogits " + dtype_label(dt));
  }
}

// The vocabulary-parallel cross-entropy shard by shard (first row 0, a middle shard, the last with
// padding columns, one without real columns), the group's max and sum done here as the
// tensor-parallel group does them, each backend's pipeline from its own values. The row max and the
// target's logit are exact on both (bit for bit); Σ exp, lse, the losses and the mean within the
// fp32 tolerance; dlogits (written over a filled buffer, and in place) within the dtype's.
TEST_P(GpuKernels, VocabParallelCrossEntropyMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol tol = kVocabParallelTols.of(dt), ftol = kVocabParallelTols.fp32;
  std::mt19937_64 rng(71);
  for (const VocabParallelCase& c : kVocabParallelCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t BT = c.BT;
    std::vector<std::int32_t> tg = random_tokens(rng, BT, c.V);
    if (c.ignore_every > 0)
      for (std::int64_t i = 0; i < BT; i += c.ignore_every) tg[static_cast<std::size_t>(i)] = -1;
    std::int64_t n = 0;
    for (const std::int32_t t : tg) n += t >= 0 ? 1 : 0;
    const float dloss = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
    const Shape rs{BT}, ss{BT, 2};
    const auto f32 = [](std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); };
    const Tensor h_tg(tg.data(), DType::int32, rs);
    Dev d_tg(tg);

    // Phase 1 per shard; the group's max.
    std::vector<Buf> shards;
    std::vector<std::unique_ptr<Dev>> d_shards;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    std::vector<float> cpu_max(static_cast<std::size_t>(BT), kNegInf), gpu_max(static_cast<std::size_t>(BT), kNegInf);
    for (int r = 0; r < c.ranks; ++r) {
      const VocabShardPiece p = vocab_shard_piece(c, r);
      const Shape ls{BT, p.rows};
      Buf x(dt, BT * p.rows);
      x.fill_uniform(rng, -c.logit_range, c.logit_range);
      for (std::int64_t i = 0; i < BT; ++i)
        for (std::int64_t v = p.valid; v < p.rows; ++v) x.set(i * p.rows + v, 1000.0);  // padding must never contribute
      shards.push_back(std::move(x));
      d_shards.push_back(std::make_unique<Dev>(shards.back()));
      std::vector<float> m(static_cast<std::size_t>(BT), 5.0f);
      Dev d_m(m);
      vocab_shard_max(f32(m, rs), shards.back().tensor(ls), p.valid);
      vocab_shard_max(d_m.tensor(DType::fp32, rs), d_shards.back()->tensor(dt, ls), p.valid);
      const std::vector<float> gm = d_m.to_vec<float>();
      expect_identical(gm, m, fmt::format("rowmax of shard {}", r));
      for (std::size_t i = 0; i < m.size(); ++i) {
        cpu_max[i] = std::max(cpu_max[i], m[i]);
        gpu_max[i] = std::max(gpu_max[i], gm[i]);
      }
    }
    // Phase 2 per shard against the group's max; the group's sum (fp32, in rank order).
    Dev d_max(gpu_max);
    std::vector<float> cpu_stats(static_cast<std::size_t>(2 * BT), 0.0f), gpu_stats(static_cast<std::size_t>(2 * BT), 0.0f);
    for (int r = 0; r < c.ranks; ++r) {
      const VocabShardPiece p = vocab_shard_piece(c, r);
      const Shape ls{BT, p.rows};
      std::vector<float> st(static_cast<std::size_t>(2 * BT), 9.0f);
      Dev d_st(st);
      vocab_shard_sum_exp(f32(st, ss), shards[static_cast<std::size_t>(r)].tensor(ls), f32(cpu_max, rs), h_tg, p.first, p.valid);
      vocab_shard_sum_exp(d_st.tensor(DType::fp32, ss), d_shards[static_cast<std::size_t>(r)]->tensor(dt, ls), d_max.tensor(DType::fp32, rs),
                          d_tg.tensor(DType::int32, rs), p.first, p.valid);
      const std::vector<float> gst = d_st.to_vec<float>();
      std::vector<float> sums, gsums, target_logits, gtarget_logits;
      for (std::int64_t i = 0; i < BT; ++i) {
        sums.push_back(st[static_cast<std::size_t>(2 * i)]);
        gsums.push_back(gst[static_cast<std::size_t>(2 * i)]);
        target_logits.push_back(st[static_cast<std::size_t>(2 * i + 1)]);
        gtarget_logits.push_back(gst[static_cast<std::size_t>(2 * i + 1)]);
      }
      expect_close(f32_buf(gsums), as_double(sums), ftol, fmt::format("sum of exp of shard {}", r));
      expect_identical(gtarget_logits, target_logits, fmt::format("target logit of shard {}", r));
      for (std::size_t k = 0; k < st.size(); ++k) {
        cpu_stats[k] += st[k];
        gpu_stats[k] += gst[k];
      }
    }
    // Phase 3: lse, losses and the mean (on the host from a copy, in position order).
    std::vector<float> losses(static_cast<std::size_t>(BT), 3.0f), lse(static_cast<std::size_t>(BT), 3.0f);
    Dev d_losses(losses), d_lse(lse), d_stats(gpu_stats);
    const float mean = vocab_parallel_losses(f32(losses, rs), f32(lse, rs), f32(cpu_max, rs), f32(cpu_stats, ss), h_tg);
    const float d_mean = vocab_parallel_losses(d_losses.tensor(DType::fp32, rs), d_lse.tensor(DType::fp32, rs), d_max.tensor(DType::fp32, rs),
                                               d_stats.tensor(DType::fp32, ss), d_tg.tensor(DType::int32, rs));
    expect_close(f32_buf(d_lse.to_vec<float>()), as_double(lse), ftol, "lse");
    expect_close(f32_buf(d_losses.to_vec<float>()), as_double(losses), ftol, "losses");
    EXPECT_NEAR(d_mean, mean, ftol.atol + ftol.rtol * std::abs(mean)) << "mean loss";
    if (n == 0) {
      EXPECT_EQ(d_mean, 0.0f) << "every target ignored";
    }
    // Backward per shard from each backend's lse: over a filled buffer, then in place.
    for (int r = 0; r < c.ranks; ++r) {
      const VocabShardPiece p = vocab_shard_piece(c, r);
      const Shape ls{BT, p.rows};
      Buf dl(dt, BT * p.rows);
      dl.fill(7.0);
      Dev d_dl(dl);
      Buf& x = shards[static_cast<std::size_t>(r)];
      Dev& d_x = *d_shards[static_cast<std::size_t>(r)];
      vocab_shard_cross_entropy_backward(dl.tensor(ls), x.tensor(ls), f32(lse, rs), h_tg, dloss, p.first, p.valid);
      vocab_shard_cross_entropy_backward(d_dl.tensor(dt, ls), d_x.tensor(dt, ls), d_lse.tensor(DType::fp32, rs), d_tg.tensor(DType::int32, rs), dloss,
                                         p.first, p.valid);
      expect_close(d_dl.to_buf(dt, BT * p.rows), dl.values(), tol, fmt::format("dlogits of shard {} {}", r, dtype_label(dt)));
      vocab_shard_cross_entropy_backward(d_x.tensor(dt, ls), d_x.tensor(dt, ls), d_lse.tensor(DType::fp32, rs), d_tg.tensor(DType::int32, rs), dloss,
                                         p.first, p.valid);
      expect_identical(d_x.to_buf(dt, BT * p.rows), d_dl.to_buf(dt, BT * p.rows), fmt::format("dlogits of shard {} in place", r));
    }
  }
}

// AdamW: the same fp32 operations in the same order (optim.cu has no FMA contraction): master
// params, m and v bit for bit over several steps; the 16-bit copy is the RNE of the master.
TEST_P(GpuKernels, AdamWBitExact) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType gt = GetParam();
  std::mt19937_64 rng(23);
  for (const AdamWCase& c0 : kAdamWCases) {
    for (int variant = 0; variant < 4; ++variant) {                   // AdamW; Adam + L2; no bias correction; stochastic rounding of a bf16 copy
      for (DType lowp_t : {DType::fp32, DType::fp16, DType::bf16}) {  // fp32 here: no 16-bit copy
        AdamWConfig cfg = c0.config;
        if (variant == 1) {
          cfg.decoupled_weight_decay = false;
          cfg.weight_decay = cfg.weight_decay == 0.0f ? 0.01f : cfg.weight_decay;
        }
        if (variant == 2) cfg.bias_correction = false;
        if (variant == 3) {
          cfg.stochastic_rounding = true;
          cfg.rounding_key = RngKey{5, 1, 2, 0, 4};
          cfg.rounding_offset = 12345;
        }
        SCOPED_TRACE(std::string(c0.name) + " variant " + std::to_string(variant) + " copy " + dtype_label(lowp_t));
        const std::int64_t n = c0.n;
        const Shape s{n};
        std::vector<float> p(static_cast<std::size_t>(n)), m(p.size()), v(p.size());
        for (std::size_t i = 0; i < p.size(); ++i) {
          p[i] = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
          m[i] = static_cast<float>(std::uniform_real_distribution<double>(-0.1, 0.1)(rng));
          v[i] = static_cast<float>(std::uniform_real_distribution<double>(0, 0.01)(rng));
        }
        Buf lowp(lowp_t == DType::fp32 ? DType::fp16 : lowp_t, n);
        Dev d_p(p), d_m(m), d_v(v), d_lowp(lowp);
        auto ft = [&](std::vector<float>& x) { return Tensor(x.data(), DType::fp32, s); };
        for (int step = 0; step < c0.steps; ++step, ++cfg.step) {
          Buf g(gt, n);
          g.fill_uniform(rng, -1, 1);
          Dev d_g(g);
          const Tensor low = lowp_t == DType::fp32 ? Tensor() : lowp.tensor(s);
          const Tensor d_low = lowp_t == DType::fp32 ? Tensor() : d_lowp.tensor(lowp_t, s);
          adamw_update(ft(p), g.tensor(s), ft(m), ft(v), low, cfg);
          adamw_update(d_p.tensor(DType::fp32, s), d_g.tensor(gt, s), d_m.tensor(DType::fp32, s), d_v.tensor(DType::fp32, s), d_low, cfg);
        }
        const std::vector<float> gp = d_p.to_vec<float>();
        expect_identical(gp, p, "params");
        expect_identical(d_m.to_vec<float>(), m, "m");
        expect_identical(d_v.to_vec<float>(), v, "v");
        if (lowp_t != DType::fp32) {
          Buf want(lowp_t, n);  // RNE of the GPU's own master (ops/dtype.h rounding)
          for (std::int64_t i = 0; i < n; ++i) want.set(i, gp[static_cast<std::size_t>(i)]);
          if (!(cfg.stochastic_rounding && lowp_t == DType::bf16)) {
            expect_identical(d_lowp.to_buf(lowp_t, n), want, "16-bit params copy (RNE of the master)");
          }
          expect_identical(d_lowp.to_buf(lowp_t, n), lowp, "16-bit params copy (CPU)");
        }
      }
    }
  }
}

// cuBLASLt (fp32: TF32 off; 16-bit: tensor cores, fp32 accumulation) against OpenBLAS. The case
// table's tolerance with atol scaled by sqrt(K) for the reduction length K of each product.
TEST_P(GpuKernels, MatmulMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol base = kMatmulTols.of(dt);
  std::mt19937_64 rng(29);
  for (const MatmulCase& c : kMatmulCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t BT = c.BT, C = c.C, OC = c.OC;
    Buf inp(dt, BT * C), w(dt, OC * C), bias(dt, OC), out(dt, BT * OC), dout(dt, BT * OC), dinp(dt, BT * C), dw(dt, OC * C), db(dt, OC);
    for (Buf* b : {&inp, &w, &bias, &dout, &dinp, &dw, &db}) b->fill_uniform(rng, -1, 1);
    std::vector<float> scratch(matmul_scratch_elems(dt, C) + 1, 0.0f);
    Dev d_inp(inp), d_w(w), d_bias(bias), d_out(out), d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db), d_scratch(scratch);
    const Shape is{BT, C}, ws{OC, C}, bs{OC}, os{BT, OC}, ss{static_cast<std::int64_t>(scratch.size())};
    const Tensor hb = c.bias ? bias.tensor(bs) : Tensor(), db_t = c.bias ? d_bias.tensor(dt, bs) : Tensor();
    matmul_forward(out.tensor(os), inp.tensor(is), w.tensor(ws), hb, Tensor(scratch.data(), DType::fp32, ss));
    matmul_backward(dinp.tensor(is), dw.tensor(ws), db.tensor(bs), dout.tensor(os), inp.tensor(is), w.tensor(ws),
                    Tensor(scratch.data(), DType::fp32, ss));
    matmul_forward(d_out.tensor(dt, os), d_inp.tensor(dt, is), d_w.tensor(dt, ws), db_t, d_scratch.tensor(DType::fp32, ss));
    matmul_backward(d_dinp.tensor(dt, is), d_dw.tensor(dt, ws), d_db.tensor(dt, bs), d_dout.tensor(dt, os), d_inp.tensor(dt, is), d_w.tensor(dt, ws),
                    d_scratch.tensor(DType::fp32, ss));
    auto scaled = [&](std::int64_t K) { return Tol{base.atol * std::sqrt(static_cast<double>(K)), base.rtol}; };
    expect_close(d_out.to_buf(dt, BT * OC), out.values(), scaled(C), "matmul out " + dtype_label(dt));
    if (c.bias) {  // a bias one element into its buffer (not 16-byte aligned): the path without the epilogue
      Buf shifted(dt, OC + 1);
      for (std::int64_t k = 0; k < OC; ++k) shifted.set(k + 1, bias.get(k));
      Dev d_shifted(shifted);
      const Tensor unaligned(static_cast<char*>(d_shifted.tensor(dt, {OC + 1}).data) + dtype_size(dt), dt, bs, Device::cuda(0));
      matmul_forward(d_out.tensor(dt, os), d_inp.tensor(dt, is), d_w.tensor(dt, ws), unaligned, d_scratch.tensor(DType::fp32, ss));
      expect_close(d_out.to_buf(dt, BT * OC), out.values(), scaled(C), "matmul out, unaligned bias " + dtype_label(dt));
    }
    expect_close(d_dinp.to_buf(dt, BT * C), dinp.values(), scaled(OC), "matmul dinp " + dtype_label(dt));
    expect_close(d_dw.to_buf(dt, OC * C), dw.values(), scaled(BT), "matmul dweight " + dtype_label(dt));
    expect_close(d_db.to_buf(dt, OC), db.values(), scaled(BT), "matmul dbias " + dtype_label(dt));
  }
}

// Cases for the tensor-core path (ops/cuda/attention_tc.cu: fp16/bf16, HS in {32, 64, 128};
// 64-key blocks, forward blocks of 128 or 64 queries, dK/dV query tiles of 64 or 32 at HS = 128
// or with dropout): one exact tile, several tiles, T not a multiple of 64 (or of 32), every
// supported HS, dropout, and GPT-2's layout at T = 1024.
// For fp32 they run the warp-per-row kernels.
const AttentionCase kAttentionTcCases[] = {
    {"tc_T1", 1, 1, 64, 1, 0.0f},               // HS = 64, a single key
    {"tc_hs64_one_tile", 1, 64, 128, 2, 0.0f},  // exactly one 64 x 64 tile, all of it diagonal
    {"tc_hs64_partial", 2, 200, 256, 4, 0.0f},  // 4 query blocks, the last with 8 rows
    {"tc_hs32", 2, 130, 128, 4, 0.0f},          // HS = 32, last block of 2 rows
    {"tc_hs128", 1, 161, 256, 2, 0.0f},         // HS = 128: 3 blocks, 6 dK/dV query tiles of 32
    {"tc_hs64_dropout", 2, 100, 128, 2, 0.1f},
    {"tc_hs32_dropout", 1, 77, 96, 3, 0.15f},
    {"tc_hs128_dropout", 1, 97, 256, 2, 0.2f},
    {"tc_gpt2_T1024", 1, 1024, 768, 12, 0.0f},  // GPT-2 124M's attention at T = 1024
};

// Flash-style attention (with and without probability dropout, the same Philox elements) against
// the CPU's: the case table's per-dtype tolerance; lse in fp32 with the fp32 tolerance.
TEST_P(GpuKernels, AttentionMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol tol = kAttentionTols.of(dt);
  std::mt19937_64 rng(31);
  std::vector<AttentionCase> cases(std::begin(kAttentionCases), std::end(kAttentionCases));
  cases.insert(cases.end(), std::begin(kAttentionTcCases), std::end(kAttentionTcCases));
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, NH = c.NH;
    DropoutParams dp;
    dp.p = c.dropout_p;
    dp.rng = RngKey{99, 4, 1, 0, 2};
    Buf qkv(dt, B * T * 3 * C), out(dt, B * T * C), dout(dt, B * T * C), dqkv(dt, B * T * 3 * C);
    for (Buf* b : {&qkv, &dout, &dqkv}) b->fill_uniform(rng, -1, 1);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    Dev d_qkv(qkv), d_out(out), d_dout(dout), d_dqkv(dqkv), d_lse(lse), d_scratch(scratch);
    const Shape qs{B, T, 3 * C}, os{B, T, C}, ls{B, NH, T}, ss{static_cast<std::int64_t>(scratch.size())};
    const Tensor hl(lse.data(), DType::fp32, ls), hs(scratch.data(), DType::fp32, ss);
    attention_forward(out.tensor(os), hl, qkv.tensor(qs), NH, dp);
    attention_backward(dqkv.tensor(qs), dout.tensor(os), qkv.tensor(qs), out.tensor(os), hl, NH, hs, dp);
    attention_forward(d_out.tensor(dt, os), d_lse.tensor(DType::fp32, ls), d_qkv.tensor(dt, qs), NH, dp);
    attention_backward(d_dqkv.tensor(dt, qs), d_dout.tensor(dt, os), d_qkv.tensor(dt, qs), d_out.tensor(dt, os), d_lse.tensor(DType::fp32, ls), NH,
                       d_scratch.tensor(DType::fp32, ss), dp);
    expect_close(d_out.to_buf(dt, B * T * C), out.values(), tol, "attention out " + dtype_label(dt));
    expect_close(f32_buf(d_lse.to_vec<float>()), as_double(lse), kAttentionTols.fp32, "attention lse");
    expect_close(d_dqkv.to_buf(dt, B * T * 3 * C), dqkv.values(), tol, "attention dqkv " + dtype_label(dt));
  }
}

// Grouped KV heads on the tensor-core path (fp16/bf16, HS in {32, 64, 128}): 1, 2 and all KV
// heads; groups of 2 to 4 query heads whose dK/dV blocks run several heads' query tiles through
// one pipeline (T not a multiple of the 64-key block or of the 32- and 64-query tiles); dropout
// (the query head's Philox elements); SmolLM-135M's grouping at T = 256. For fp32 they run the
// warp-per-row kernels.
const GqaAttentionCase kGqaAttentionTcCases[] = {
    {"tc_kv4_of_8_T1", 1, 1, 8, 4, 32, 0.0f},
    {"tc_mqa_hs64", 2, 200, 4, 1, 64, 0.0f},  // NKV = 1: one dK/dV block per key block runs 4 heads
    {"tc_kv2_of_4_hs32", 1, 130, 4, 2, 32, 0.0f},
    {"tc_kv_all_hs64", 1, 100, 3, 3, 64, 0.0f},      // NKV = NH: G = 1
    {"tc_kv3_of_9_smollm", 2, 256, 9, 3, 64, 0.0f},  // SmolLM-135M's attention
    {"tc_mqa_hs128", 1, 161, 4, 1, 128, 0.0f},       // dK/dV query tiles of 32
    {"tc_kv2_of_6_hs64_dropout", 2, 77, 6, 2, 64, 0.1f},
    {"tc_kv2_of_8_hs128_dropout", 1, 97, 8, 2, 128, 0.2f},
};

// Grouped KV heads against the CPU's: the CPU tests' GQA case table (head sizes the tensor-core
// kernels do not take: the warp-per-row kernels of attention.cu) and the tensor-core cases above.
TEST_P(GpuKernels, GqaAttentionMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tol tol = kAttentionTols.of(dt);
  std::mt19937_64 rng(32);
  std::vector<GqaAttentionCase> cases(std::begin(kGqaAttentionCases), std::end(kGqaAttentionCases));
  cases.insert(cases.end(), std::begin(kGqaAttentionTcCases), std::end(kGqaAttentionTcCases));
  for (const GqaAttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, C = NH * c.HS, W = (NH + 2 * NKV) * c.HS;
    const AttentionHeads heads{NH, NKV};
    DropoutParams dp;
    dp.p = c.dropout_p;
    dp.rng = RngKey{98, 4, 1, 0, 2};
    Buf qkv(dt, B * T * W), out(dt, B * T * C), dout(dt, B * T * C), dqkv(dt, B * T * W);
    for (Buf* b : {&qkv, &dout, &dqkv}) b->fill_uniform(rng, -1, 1);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    Dev d_qkv(qkv), d_out(out), d_dout(dout), d_dqkv(dqkv), d_lse(lse), d_scratch(scratch);
    const Shape qs{B, T, W}, os{B, T, C}, ls{B, NH, T}, ss{static_cast<std::int64_t>(scratch.size())};
    const Tensor hl(lse.data(), DType::fp32, ls), hs(scratch.data(), DType::fp32, ss);
    attention_forward(out.tensor(os), hl, qkv.tensor(qs), heads, dp);
    attention_backward(dqkv.tensor(qs), dout.tensor(os), qkv.tensor(qs), out.tensor(os), hl, heads, hs, dp);
    attention_forward(d_out.tensor(dt, os), d_lse.tensor(DType::fp32, ls), d_qkv.tensor(dt, qs), heads, dp);
    attention_backward(d_dqkv.tensor(dt, qs), d_dout.tensor(dt, os), d_qkv.tensor(dt, qs), d_out.tensor(dt, os), d_lse.tensor(DType::fp32, ls), heads,
                       d_scratch.tensor(DType::fp32, ss), dp);
    expect_close(d_out.to_buf(dt, B * T * C), out.values(), tol, "gqa attention out " + dtype_label(dt));
    expect_close(f32_buf(d_lse.to_vec<float>()), as_double(lse), kAttentionTols.fp32, "gqa attention lse");
    expect_close(d_dqkv.to_buf(dt, B * T * W), dqkv.values(), Tol{tol.atol * 2, tol.rtol * 2}, "gqa attention dqkv " + dtype_label(dt));
  }
}

// SGD (optim.cu, -fmad=false): bit for bit with the CPU, as AdamW.
TEST_P(GpuKernels, SgdBitExact) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType gt = GetParam();
  std::mt19937_64 rng(37);
  for (const SgdCase& c0 : kSgdCases) {
    for (DType lowp_t : {DType::fp32, DType::fp16, DType::bf16}) {  // fp32: no 16-bit copy
      SCOPED_TRACE(std::string(c0.name) + " copy " + dtype_label(lowp_t));
      SgdConfig cfg = c0.config;
      const std::int64_t n = c0.n;
      const Shape s{n};
      std::vector<float> p(static_cast<std::size_t>(n)), buf(p.size(), 0.0f);
      for (float& x : p) x = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
      Buf lowp(lowp_t == DType::fp32 ? DType::fp16 : lowp_t, n);
      Dev d_p(p), d_buf(buf), d_lowp(lowp);
      for (int step = 0; step < c0.steps; ++step, ++cfg.step) {
        Buf g(gt, n);
        g.fill_uniform(rng, -1, 1);
        Dev d_g(g);
        const bool mom = cfg.momentum != 0.0f;
        sgd_update(Tensor(p.data(), DType::fp32, s), g.tensor(s), mom ? Tensor(buf.data(), DType::fp32, s) : Tensor(),
                   lowp_t == DType::fp32 ? Tensor() : lowp.tensor(s), cfg);
        sgd_update(d_p.tensor(DType::fp32, s), d_g.tensor(gt, s), mom ? d_buf.tensor(DType::fp32, s) : Tensor(),
                   lowp_t == DType::fp32 ? Tensor() : d_lowp.tensor(lowp_t, s), cfg);
      }
      expect_identical(d_p.to_vec<float>(), p, "sgd params");
      expect_identical(d_buf.to_vec<float>(), buf, "sgd momentum buffer");
      if (lowp_t != DType::fp32) expect_identical(d_lowp.to_buf(lowp_t, n), lowp, "sgd 16-bit params copy");
    }
  }
}

// grad_norm_overflow: the GPU sums in a different (fixed) order, so norm_sq agrees within the
// case table's double-rounding tolerance (rel 1e-12); the non-finite count exactly. scale_grads:
// one multiply and one rounding, bit for bit.
TEST_P(GpuKernels, GradNormOverflowAndScale) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType gt = GetParam();
  std::mt19937_64 rng(41);
  for (const GradNormOverflowCase& c : kGradNormOverflowCases) {
    SCOPED_TRACE(c.name);
    const Shape s{c.n};
    Buf g(gt, c.n);
    g.fill_uniform(rng, -3, 3);
    for (int with_nonfinite = 0; with_nonfinite < 2; ++with_nonfinite) {
      if (with_nonfinite) {
        g.set(c.n / 2, INFINITY);
        g.set(c.n - 1, NAN);
      }
      Dev d_g(g);
      const GradNormOverflow want = grad_norm_overflow(g.tensor(s));
      const GradNormOverflow got = grad_norm_overflow(d_g.tensor(gt, s));
      EXPECT_EQ(got.nonfinite, want.nonfinite);
      if (!with_nonfinite) {
        EXPECT_NEAR(got.norm_sq, want.norm_sq, kGradNormOverflowTol.rtol * want.norm_sq) << "norm_sq";
      }
      EXPECT_EQ(grad_norm_overflow(d_g.tensor(gt, s)).norm_sq, got.norm_sq) << "not deterministic run to run";
      if (!with_nonfinite) {
        scale_grads(g.tensor(s), 0.37f);
        scale_grads(d_g.tensor(gt, s), 0.37f);
        expect_identical(d_g.to_buf(gt, c.n), g, "scale_grads");
      }
    }
  }
}

// LAMB: m and v bit for bit (same fp32 operations, -fmad=false); the trust ratio comes from norms
// summed in double in another order, so params, the 16-bit copy and the coefficients get the case
// table's tolerance. Padding between tensors must stay untouched.
TEST_P(GpuKernels, LambMatchesCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType gt = GetParam();
  const Tol tol = kLambTols.of(gt);
  std::mt19937_64 rng(43);
  for (const LambCase& c0 : kLambCases) {
    for (DType lowp_t : {DType::fp32, DType::bf16}) {  // fp32: no 16-bit copy
      SCOPED_TRACE(std::string(c0.name) + " copy " + dtype_label(lowp_t));
      LambConfig cfg = c0.config;
      std::vector<TensorRange> ranges;
      std::int64_t n = 0;
      for (std::int64_t k = 0; k < c0.tensors; ++k) {
        const std::int64_t len = c0.tensor_numel + (k == c0.tensors - 1 ? 7 : 0);
        ranges.push_back(TensorRange{n, len});
        n += len + c0.padding;
      }
      const Shape s{n}, cs{c0.tensors};
      std::vector<float> p(static_cast<std::size_t>(n)), m(p.size(), 0.0f), v(p.size(), 0.0f), coeffs(static_cast<std::size_t>(c0.tensors), 0.0f);
      for (float& x : p) x = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
      Buf lowp(DType::bf16, n);
      Dev d_p(p), d_m(m), d_v(v), d_lowp(lowp), d_coeffs(coeffs);
      for (int step = 0; step < c0.steps; ++step, ++cfg.step) {
        Buf g(gt, n);
        g.fill_uniform(rng, -1, 1);
        Dev d_g(g);
        auto ft = [&](std::vector<float>& x, const Shape& sh) { return Tensor(x.data(), DType::fp32, sh); };
        lamb_update(ft(p, s), g.tensor(s), ft(m, s), ft(v, s), lowp_t == DType::fp32 ? Tensor() : lowp.tensor(s), ranges, ft(coeffs, cs), cfg);
        lamb_update(d_p.tensor(DType::fp32, s), d_g.tensor(gt, s), d_m.tensor(DType::fp32, s), d_v.tensor(DType::fp32, s),
                    lowp_t == DType::fp32 ? Tensor() : d_lowp.tensor(lowp_t, s), ranges, d_coeffs.tensor(DType::fp32, cs), cfg);
      }
      const std::vector<float> gp = d_p.to_vec<float>();
      expect_close(f32_buf(gp), as_double(p), tol, "lamb params");
      expect_identical(d_m.to_vec<float>(), m, "lamb m");
      expect_identical(d_v.to_vec<float>(), v, "lamb v");
      expect_close(f32_buf(d_coeffs.to_vec<float>()), as_double(coeffs), tol, "lamb trust ratios");
      if (lowp_t != DType::fp32) {  // the RNE of the GPU's own master inside the ranges, padding untouched (0)
        Buf want(lowp_t, n);
        for (const TensorRange& r : ranges)
          for (std::int64_t i = r.offset; i < r.offset + r.numel; ++i) want.set(i, gp[static_cast<std::size_t>(i)]);
        expect_identical(d_lowp.to_buf(lowp_t, n), want, "lamb 16-bit copy (RNE of the master)");
      }
    }
  }
}

// The element-wise optimizer rules (optimizer_rule.cu, -fmad=false, the rule headers' own
// element functions): bit for bit with the CPU over 7 steps, every state and the 16-bit copy.
TEST_P(GpuKernels, OptimizerRulesBitExact) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  const DType gt = GetParam();
  std::mt19937_64 rng(41);
  using StepOf = RuleStep (*)(std::int64_t t);
  const std::pair<const char*, StepOf> rules[] = {
      {"adagrad",
       [](std::int64_t t) { return adagrad_step({.lr = 0.1, .lr_decay = 0.01, .weight_decay = 0.1, .initial_accumulator_value = 0.5}, t, 0.5f); }},
      {"lion", [](std::int64_t) { return lion_step({.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1}, 1.0f); }},
      {"rmsprop",
       [](std::int64_t) { return rmsprop_step({.lr = 1e-3, .weight_decay = 0.1, .momentum = 0.9, .centered = true, .maximize = true}, 1.0f); }},
      {"adamax", [](std::int64_t t) { return adamax_step({.weight_decay = 0.1}, t, 1.0f); }},
      {"nadam", [](std::int64_t t) { return nadam_step({.weight_decay = 0.1, .decoupled_weight_decay = true}, t, 1.0f); }},
      {"radam", [](std::int64_t t) { return radam_step({.weight_decay = 0.1}, t, 1.0f); }},
      {"adadelta", [](std::int64_t) { return adadelta_step({.weight_decay = 0.1}, 1.0f); }},
      {"asgd", [](std::int64_t t) { return asgd_step({.lr = 0.05, .lambd = 0.01, .t0 = 2}, t, 1.0f); }},
      {"rprop", [](std::int64_t t) { return rprop_step({}, t, 1.0f); }},
  };
  const std::int64_t n = 4099;
  const Shape s{n};
  for (const auto& [name, step_of] : rules) {
    for (DType lowp_t : {DType::fp32, DType::fp16, DType::bf16}) {  // fp32: no 16-bit copy
      SCOPED_TRACE(std::string(name) + " copy " + dtype_label(lowp_t));
      const int nstates = step_of(1).states;
      std::vector<float> p(static_cast<std::size_t>(n));
      for (float& x : p) x = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
      std::vector<std::vector<float>> st(static_cast<std::size_t>(nstates), std::vector<float>(p.size(), 0.0f));
      Buf lowp(lowp_t == DType::fp32 ? DType::fp16 : lowp_t, n);
      Dev d_p(p), d_lowp(lowp);
      std::vector<std::unique_ptr<Dev>> d_st;
      for (auto& v : st) d_st.push_back(std::make_unique<Dev>(v));
      for (std::int64_t t = 1; t <= 7; ++t) {
        Buf g(gt, n);
        g.fill_uniform(rng, -1, 1);
        Dev d_g(g);
        std::vector<Tensor> hs, ds;
        for (auto& v : st) hs.push_back(Tensor(v.data(), DType::fp32, s));
        for (auto& d : d_st) ds.push_back(d->tensor(DType::fp32, s));
        optimizer_rule_update(step_of(t), Tensor(p.data(), DType::fp32, s), g.tensor(s), hs, lowp_t == DType::fp32 ? Tensor() : lowp.tensor(s));
        optimizer_rule_update(step_of(t), d_p.tensor(DType::fp32, s), d_g.tensor(gt, s), ds,
                              lowp_t == DType::fp32 ? Tensor() : d_lowp.tensor(lowp_t, s));
      }
      expect_identical(d_p.to_vec<float>(), p, "params");
      for (std::size_t j = 0; j < st.size(); ++j) expect_identical(d_st[j]->to_vec<float>(), st[j], "state " + std::to_string(j));
      if (lowp_t != DType::fp32) expect_identical(d_lowp.to_buf(lowp_t, n), lowp, "16-bit params copy");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuKernels, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// The dispatch layer needs no GPU: tensors of one call on different devices are an Error naming
// both, before any CUDA call.
TEST(GpuKernelsDispatch, MixedDevicesAreAnError) {
  std::vector<float> a(6, 0.0f), b(6, 0.0f);
  const Tensor host(a.data(), DType::fp32, Shape{6});
  const Tensor dev(b.data(), DType::fp32, Shape{6}, Device::cuda(0));
  expect_error([&] { gelu_forward(host, dev); }, {"gelu_forward", "different devices", "cuda:0"});
  expect_error([&] { dropout_forward(dev, host, DropoutParams{}); }, {"dropout_forward", "different devices"});
}
