// Matmul, CPU: OpenBLAS cblas_sgemm, either directly (fp32) or per widened tile (fp16, and bf16
// where oneDNN's bf16 matmul cannot run); bf16 through oneDNN's matmul primitive on the bf16
// operands where it can (ops/cpu/cpu_bf16_gemm.h).
//
// The GEMMs are called outside any OpenMP region: OpenBLAS runs its own thread pool, and nesting
// it in ours would oversubscribe the cores.
#include "ops/kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/cpu/reduce_isa.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_bf16_gemm.h"
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/matmul_check.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

constexpr std::int64_t R = kMatmulTile;

int blas_int(std::int64_t v) { return static_cast<int>(v); }

// dst (rows x cols, leading dim ldd) <- src (rows x cols, leading dim lds), widened to fp32.
template <typename T>
void widen(float* dst, std::int64_t ldd, const T* src, std::int64_t lds, std::int64_t rows, std::int64_t cols) {
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * cols))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict s = src + r * lds;
    float* __restrict d = dst + r * ldd;
    for (std::int64_t c = 0; c < cols; ++c) d[c] = cpu::load(s[c]);
  }
}

// dst (rows x cols, ld ldd, storage T) <- src fp32 (+ bias per column when given).
template <typename T>
void narrow(T* dst, std::int64_t ldd, const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, const T* bias) {
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * cols))
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict s = src + r * lds;
    T* __restrict d = dst + r * ldd;
    if (bias) {
      for (std::int64_t c = 0; c < cols; ++c) d[c] = cpu::store<T>(s[c] + cpu::load(bias[c]));
    } else {
      for (std::int64_t c = 0; c < cols; ++c) d[c] = cpu::store<T>(s[c]);
    }
  }
}

using cpu::MmShape;

MmShape check_inp_weight(const char* op, const Tensor& inp, const Tensor& weight) {
  require_present(op, {"inp", inp});
  if (inp.shape.rank < 1) fail("{}: tensor 'inp' has shape {} but (BT, C) is expected", op, inp.shape.str());
  require_rank(op, {"weight", weight}, 2, "(OC, C)");
  MmShape s;
  s.C = inp.shape[inp.shape.rank - 1];
  s.BT = s.C == 0 ? 0 : inp.numel() / s.C;
  s.OC = weight.shape[0];
  if (weight.shape[1] != s.C) {
    fail("{}: tensor 'weight' has shape {} but (OC, C) with C = {} (the last dimension of inp {}) is expected", op, weight.shape.str(), s.C,
         inp.shape.str());
  }
  return s;
}

Shape out_shape(const Tensor& inp, std::int64_t OC) {
  Shape s = inp.shape;
  s.dims[static_cast<std::size_t>(s.rank - 1)] = OC;
  return s;
}

void check_scratch(const char* op, const Tensor& scratch, DType storage, std::int64_t C) {
  const std::size_t need = matmul_scratch_elems(storage, C);
  if (need == 0) return;
  if (scratch.empty() || scratch.dtype != DType::fp32 || static_cast<std::size_t>(scratch.numel()) < need) {
    fail("{}: {} storage needs an fp32 scratch of at least matmul_scratch_elems = 2*{}*C + {}^2 = {} elements (C = {}), got {}", op,
         dtype_name(storage), R, R, need, C, scratch.empty() ? std::string("none") : scratch.str());
  }
}

// Whether a bf16 matmul runs oneDNN's bf16 primitive (else the widened tiles).
template <typename T>
bool onednn_bf16() {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return cpu_bf16_gemm() == CpuBf16Gemm::onednn;
  } else {
    return false;
  }
}

template <typename T>
void forward_impl(const char* op, T* out, const T* inp, const T* w, const T* bias, float* scratch, const MmShape& s) {
  const std::int64_t BT = s.BT, C = s.C, OC = s.OC;
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (onednn_bf16<T>()) {  // (BT, C) · (OC, C)ᵀ + bias
      cpu::onednn_bf16_gemm(op, false, true, BT, OC, C, inp, w, bias, out, false);
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(BT), blas_int(OC), blas_int(C), 1.0f, inp, blas_int(C), w, blas_int(C), 0.0f, out,
                blas_int(OC));
    if (bias) {
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(BT * OC))
      for (std::int64_t r = 0; r < BT; ++r) {
        float* __restrict o = out + r * OC;
        for (std::int64_t c = 0; c < OC; ++c) o[c] += bias[c];
      }
    }
  } else {
    float* at = scratch;          // (R, C) rows of inp
    float* wt = scratch + R * C;  // (R, C) rows of weight
    float* ot = wt + R * C;       // (R, R) out tile
    for (std::int64_t j0 = 0; j0 < OC; j0 += R) {
      const std::int64_t rj = std::min(R, OC - j0);
      widen(wt, C, w + j0 * C, C, rj, C);
      for (std::int64_t i0 = 0; i0 < BT; i0 += R) {
        const std::int64_t ri = std::min(R, BT - i0);
        widen(at, C, inp + i0 * C, C, ri, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(ri), blas_int(rj), blas_int(C), 1.0f, at, blas_int(C), wt, blas_int(C), 0.0f,
                    ot, blas_int(rj));
        narrow(out + i0 * OC + j0, OC, ot, rj, ri, rj, bias ? bias + j0 : nullptr);
      }
    }
  }
}

template <typename T>
void backward_impl(const char* opname, T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, float* scratch, const MmShape& s) {
  const std::int64_t BT = s.BT, C = s.C, OC = s.OC;
  if (db) {  // column sums of dout, blocks of 64 columns in parallel, rows in order (the loop per ISA)
    constexpr std::int64_t kBlock = 64;
    const std::int64_t nblocks = (OC + kBlock - 1) / kBlock;
    const auto column_sums = cpu::isa_select(cpu::scalar::column_sums_range, cpu::avx2::column_sums_range, cpu::avx512::column_sums_range);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(BT * OC))
    for (std::int64_t blk = 0; blk < nblocks; ++blk) {
      const std::int64_t c0 = blk * kBlock, cn = std::min(kBlock, OC - c0);
      double acc[kBlock] = {};
      column_sums(dtype_of<T>(), acc, dout + c0, BT, OC, cn);
      for (std::int64_t c = 0; c < cn; ++c) db[c0 + c] = cpu::store<T>(static_cast<float>(cpu::load(db[c0 + c]) + acc[c]));
    }
  }
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (onednn_bf16<T>()) {
      // dinp (BT, C) += dout (BT, OC) · weight (OC, C);  dweight (OC, C) += dout (BT, OC)ᵀ · inp (BT, C)
      if (dinp) cpu::onednn_bf16_gemm(opname, false, false, BT, C, OC, dout, w, nullptr, dinp, true);
      if (dw) cpu::onednn_bf16_gemm(opname, true, false, OC, C, BT, dout, inp, nullptr, dw, true);
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (dinp) {  // (BT, C) += (BT, OC) · (OC, C)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(BT), blas_int(C), blas_int(OC), 1.0f, dout, blas_int(OC), w, blas_int(C), 1.0f,
                  dinp, blas_int(C));
    }
    if (dw) {  // (OC, C) += (BT, OC)ᵀ · (BT, C)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(OC), blas_int(C), blas_int(BT), 1.0f, dout, blas_int(OC), inp, blas_int(C), 1.0f,
                  dw, blas_int(C));
    }
  } else {
    float* acc = scratch;         // (R, C) fp32 accumulator of the output tile
    float* op = scratch + R * C;  // (R, C) widened operand rows (weight or inp)
    float* gt = op + R * C;       // (R, R) widened dout tile
    if (dinp) {
      for (std::int64_t i0 = 0; i0 < BT; i0 += R) {
        const std::int64_t ri = std::min(R, BT - i0);
        widen(acc, C, dinp + i0 * C, C, ri, C);
        for (std::int64_t k0 = 0; k0 < OC; k0 += R) {
          const std::int64_t rk = std::min(R, OC - k0);
          widen(gt, rk, dout + i0 * OC + k0, OC, ri, rk);
          widen(op, C, w + k0 * C, C, rk, C);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(ri), blas_int(C), blas_int(rk), 1.0f, gt, blas_int(rk), op, blas_int(C),
                      1.0f, acc, blas_int(C));
        }
        narrow<T>(dinp + i0 * C, C, acc, C, ri, C, nullptr);
      }
    }
    if (dw) {
      for (std::int64_t j0 = 0; j0 < OC; j0 += R) {
        const std::int64_t rj = std::min(R, OC - j0);
        widen(acc, C, dw + j0 * C, C, rj, C);
        for (std::int64_t i0 = 0; i0 < BT; i0 += R) {
          const std::int64_t ri = std::min(R, BT - i0);
          widen(gt, rj, dout + i0 * OC + j0, OC, ri, rj);
          widen(op, C, inp + i0 * C, C, ri, C);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(rj), blas_int(C), blas_int(ri), 1.0f, gt, blas_int(rj), op, blas_int(C), 1.0f,
                      acc, blas_int(C));
        }
        narrow<T>(dw + j0 * C, C, acc, C, rj, C, nullptr);
      }
    }
  }
}

void check_blas_range(const char* op, const MmShape& s) {
  const std::int64_t lim = 2147483647;
  if (s.BT > lim || s.C > lim || s.OC > lim) fail("{}: dimensions BT={}, C={}, OC={} exceed BLAS's 32-bit int", op, s.BT, s.C, s.OC);
}

}  // namespace

MmShape cpu::check_matmul_forward_args(const char* op, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                       const Tensor& scratch) {
  const MmShape s = check_inp_weight(op, inp, weight);
  require_shape(op, {"out", out}, out_shape(inp, s.OC), "(BT, OC) with OC = weight.shape[0]");
  if (!bias.empty()) require_shape(op, {"bias", bias}, Shape{s.OC}, "(OC) with OC = weight.shape[0]");
  require_same_dtype(op, {{"inp", inp}, {"weight", weight}, {"out", out}, {"bias", bias}});
  check_scratch(op, scratch, inp.dtype, s.C);
  check_blas_range(op, s);
  return s;
}

MmShape cpu::check_matmul_backward_args(const char* op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                        const Tensor& inp, const Tensor& weight, const Tensor& scratch) {
  const MmShape s = check_inp_weight(op, inp, weight);
  require_shape(op, {"dout", dout}, out_shape(inp, s.OC), "(BT, OC) with OC = weight.shape[0]");
  if (!dinp.empty()) require_shape(op, {"dinp", dinp}, inp.shape, "(the shape of inp)");
  if (!dweight.empty()) require_shape(op, {"dweight", dweight}, weight.shape, "(the shape of weight)");
  if (!dbias.empty()) require_shape(op, {"dbias", dbias}, Shape{s.OC}, "(OC)");
  require_same_dtype(op, {{"inp", inp}, {"weight", weight}, {"dout", dout}, {"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}});
  check_scratch(op, scratch, inp.dtype, s.C);
  check_blas_range(op, s);
  return s;
}

std::size_t matmul_scratch_elems(DType storage, std::int64_t C) {
  if (storage == DType::fp32) return 0;
  return static_cast<std::size_t>(2 * R * C + R * R);
}

void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, Tensor scratch) {
  const char* op = "matmul_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}, {"scratch", scratch}});
  const MmShape s = cpu::check_matmul_forward_args(op, out, inp, weight, bias, scratch);
  DSTRAIN_RETURN_ON_CUDA(gpu, matmul_forward(out, inp, weight, bias, scratch));
  if (s.BT == 0 || s.OC == 0) return;
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    if (s.C == 0) {  // empty reduction: out = bias (BLAS rejects K = 0 leading dimensions)
      T* o = static_cast<T*>(out.data);
      const T* b = bias.empty() ? nullptr : static_cast<const T*>(bias.data);
      for (std::int64_t i = 0; i < s.BT * s.OC; ++i) o[i] = b ? b[i % s.OC] : cpu::store<T>(0.0f);
      return;
    }
    forward_impl<T>(op, static_cast<T*>(out.data), static_cast<const T*>(inp.data), static_cast<const T*>(weight.data),
                    bias.empty() ? nullptr : static_cast<const T*>(bias.data), static_cast<float*>(scratch.data), s);
  });
}

void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor scratch) {
  const char* op = "matmul_backward";
  const bool gpu =
      cpu::on_cuda(op,
                   {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}, {"dout", dout}, {"inp", inp}, {"weight", weight}, {"scratch", scratch}});
  const MmShape s = cpu::check_matmul_backward_args(op, dinp, dweight, dbias, dout, inp, weight, scratch);
  DSTRAIN_RETURN_ON_CUDA(gpu, matmul_backward(dinp, dweight, dbias, dout, inp, weight, scratch));
  if (s.C == 0 && !dbias.empty() && s.OC > 0) {
    // An input with no columns (a tensor-parallel rank holding no heads) still has a bias
    // gradient: the column sums of dout, by the same code as every other call, so that ranks
    // whose replicated bias gradients must agree get the same bits.
    const MmShape rows{dout.numel() / s.OC, 0, s.OC};
    cpu::dispatch_float(op, dout.dtype, [&]<typename T>(cpu::TypeTag<T>) {
      backward_impl<T>(op, nullptr, nullptr, static_cast<T*>(dbias.data), static_cast<const T*>(dout.data), nullptr, nullptr, nullptr, rows);
    });
    return;
  }
  if (s.BT == 0 || s.OC == 0 || s.C == 0) return;
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    backward_impl<T>(op, dinp.empty() ? nullptr : static_cast<T*>(dinp.data), dweight.empty() ? nullptr : static_cast<T*>(dweight.data),
                     dbias.empty() ? nullptr : static_cast<T*>(dbias.data), static_cast<const T*>(dout.data), static_cast<const T*>(inp.data),
                     static_cast<const T*>(weight.data), static_cast<float*>(scratch.data), s);
  });
}

}  // namespace dstrain
