// RoPE, CPU: parallel over tokens; each (token, head) rotates its D/2 pairs. The angle is the fp32
// product position · inv_freq, as Hugging Face computes it, and its cos/sin are taken in double
// and rounded once (the CUDA kernel uses sincosf: within an ulp or two of this).
#include "ops/kernels/rope.h"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

struct RopeShape {
  std::int64_t B, T, H, D;
};

RopeShape check_rope(const char* op, const char* oname, const Tensor& out, const char* iname, const Tensor& inp, const Tensor& inv_freq,
                     std::int64_t rotate_heads, std::int64_t pos_offset) {
  require_present(op, {iname, inp});
  if (inp.shape.rank != 4) fail("{}: tensor '{}' has shape {} but (B, T, H, D) is expected", op, iname, inp.shape.str());
  const RopeShape s{inp.shape[0], inp.shape[1], inp.shape[2], inp.shape[3]};
  if (s.D % 2 != 0)
    fail("{}: tensor '{}' has shape {}: the head size D = {} must be even (rotate-half pairs j and j + D/2)", op, iname, inp.shape.str(), s.D);
  require_shape(op, {oname, out}, inp.shape, "(the shape of " + std::string(iname) + ")");
  require_same_dtype(op, {{iname, inp}, {oname, out}});
  require_shape(op, {"inv_freq", inv_freq}, Shape{s.D / 2}, "(D/2) with D the last dimension of " + std::string(iname));
  require_dtype(op, {"inv_freq", inv_freq}, DType::fp32);
  if (rotate_heads < 0 || rotate_heads > s.H) {
    fail("{}: rotate_heads = {} but tensor '{}' has H = {} heads (shape {}); expected 0 <= rotate_heads <= H", op, rotate_heads, iname, s.H,
         inp.shape.str());
  }
  if (pos_offset < 0) fail("{}: pos_offset = {} must be >= 0", op, pos_offset);
  return s;
}

// sign = +1: forward rotation; -1: its transpose (the backward). cos and sin depend on the position
// only, so they are taken once per position (T·D/2 pairs) and shared by the B sequences: the
// double-precision sin/cos otherwise cost more than the rotation itself at Llama's widths.
template <typename T>
void rope_impl(T* out, const T* inp, const float* inv_freq, const RopeShape& s, std::int64_t rotate_heads, std::int64_t pos_offset, float sign) {
  const std::int64_t h = s.D / 2, rows = s.B * s.T, row = s.H * s.D;
  std::vector<float> cs(static_cast<std::size_t>(s.T * h * 2));  // position t: cos at [2(t·h + j)], sign·sin after it
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.T * h * 64))
  for (std::int64_t t = 0; t < s.T; ++t) {
    const auto pos = static_cast<float>(t + pos_offset);
    for (std::int64_t j = 0; j < h; ++j) {
      const double angle = static_cast<double>(pos * inv_freq[j]);  // fp32 product, as Hugging Face
      cs[static_cast<std::size_t>(2 * (t * h + j))] = static_cast<float>(std::cos(angle));
      cs[static_cast<std::size_t>(2 * (t * h + j) + 1)] = sign * static_cast<float>(std::sin(angle));
    }
  }
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * row * 4))
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* cst = cs.data() + 2 * (r % s.T) * h;
    T* o = out + r * row;
    const T* x = inp + r * row;
    for (std::int64_t j = 0; j < h; ++j) {
      const float c = cst[2 * j], sn = cst[2 * j + 1];
      for (std::int64_t hd = 0; hd < rotate_heads; ++hd) {
        const std::int64_t k = hd * s.D + j;
        const float x1 = cpu::load(x[k]), x2 = cpu::load(x[k + h]);  // both read before either is written (in place)
        o[k] = cpu::store<T>(x1 * c - x2 * sn);
        o[k + h] = cpu::store<T>(x2 * c + x1 * sn);
      }
    }
    if (o != x) {
      for (std::int64_t k = rotate_heads * s.D; k < row; ++k) o[k] = x[k];
    }
  }
}

}  // namespace

std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta, const RopeScaling& sc) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    fail("rope: the head size (head_dim, or hidden_size / num_attention_heads) is {}; it must be even and positive", head_dim);
  if (!(theta > 0)) fail("rope: rope_theta = {} must be > 0", theta);
  if (sc.kind != RopeScaling::Kind::none && !(sc.factor > 0)) fail("rope: rope_scaling.factor = {} must be > 0", sc.factor);
  if (sc.kind == RopeScaling::Kind::llama3) {
    if (!(sc.high_freq_factor > sc.low_freq_factor)) {
      fail("rope: rope_scaling (llama3) needs high_freq_factor > low_freq_factor, got high_freq_factor = {}, low_freq_factor = {}",
           sc.high_freq_factor, sc.low_freq_factor);
    }
    if (!(sc.low_freq_factor > 0) || !(sc.original_max_position_embeddings > 0)) {
      fail("rope: rope_scaling (llama3) needs low_freq_factor > 0 and original_max_position_embeddings > 0, got {} and {}", sc.low_freq_factor,
           sc.original_max_position_embeddings);
    }
  }
  const std::int64_t h = head_dim / 2;
  std::vector<float> out(static_cast<std::size_t>(h));
  const double low_wavelen = sc.original_max_position_embeddings / sc.low_freq_factor;
  const double high_wavelen = sc.original_max_position_embeddings / sc.high_freq_factor;
  for (std::int64_t j = 0; j < h; ++j) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(head_dim));
    if (sc.kind == RopeScaling::Kind::linear) {
      f /= sc.factor;
    } else if (sc.kind == RopeScaling::Kind::llama3) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= sc.factor;
      } else if (!(wavelen < high_wavelen)) {
        const double s = (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
        f = (1.0 - s) * f / sc.factor + s * f;
      }
    }
    out[static_cast<std::size_t>(j)] = static_cast<float>(f);
  }
  return out;
}

void rope_forward(Tensor out, Tensor inp, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset) {
  const char* op = "rope_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"inp", inp}, {"inv_freq", inv_freq}});
  const RopeShape s = check_rope(op, "out", out, "inp", inp, inv_freq, rotate_heads, pos_offset);
  DSTRAIN_RETURN_ON_CUDA(gpu, rope_forward(out, inp, inv_freq, rotate_heads, pos_offset));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    rope_impl<T>(static_cast<T*>(out.data), static_cast<const T*>(inp.data), static_cast<const float*>(inv_freq.data), s, rotate_heads, pos_offset,
                 1.0f);
  });
}

void rope_backward(Tensor dinp, Tensor dout, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset) {
  const char* op = "rope_backward";
  const bool gpu = cpu::on_cuda(op, {{"dinp", dinp}, {"dout", dout}, {"inv_freq", inv_freq}});
  const RopeShape s = check_rope(op, "dinp", dinp, "dout", dout, inv_freq, rotate_heads, pos_offset);
  DSTRAIN_RETURN_ON_CUDA(gpu, rope_backward(dinp, dout, inv_freq, rotate_heads, pos_offset));
  cpu::dispatch_float(op, dout.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    rope_impl<T>(static_cast<T*>(dinp.data), static_cast<const T*>(dout.data), static_cast<const float*>(inv_freq.data), s, rotate_heads, pos_offset,
                 -1.0f);
  });
}

}  // namespace dstrain
