// Encoder (token + position embedding), CPU.
#include "ops/kernels/encoder.h"

#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

// Shapes common to forward and backward; returns {B, T, C, V}.
struct EncShape {
  std::int64_t B, T, C, V;
};

EncShape check_shapes(const char* op, const Tensor& x, const char* xname, const Tensor& tokens, const Tensor& wte, const char* wte_name,
                      const Tensor& wpe, const char* wpe_name) {
  require_rank(op, {"tokens", tokens}, 2, "(B, T)");
  require_dtype(op, {"tokens", tokens}, DType::int32);
  require_rank(op, {xname, x}, 3, "(B, T, C)");
  require_rank(op, {wte_name, wte}, 2, "(V, C)");
  require_rank(op, {wpe_name, wpe}, 2, "(maxT, C)");
  const EncShape s{tokens.shape[0], tokens.shape[1], x.shape[2], wte.shape[0]};
  require_shape(op, {xname, x}, Shape{s.B, s.T, s.C}, "(B, T, C) with B, T from tokens");
  require_shape(op, {wte_name, wte}, Shape{s.V, s.C}, "(V, C) with C from " + std::string(xname));
  if (wpe.shape[1] != s.C || wpe.shape[0] < s.T) {
    fail("{}: tensor '{}' has shape {} but (maxT, C) with maxT >= T = {} and C = {} is expected", op, wpe_name, wpe.shape.str(), s.T, s.C);
  }
  require_same_dtype(op, {{xname, x}, {wte_name, wte}, {wpe_name, wpe}});
  return s;
}

void check_tokens(const char* op, const std::int32_t* tok, std::int64_t n, std::int64_t V) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (tok[i] < 0 || tok[i] >= V) fail("{}: token {} at flat position {} is outside the vocabulary [0, {})", op, tok[i], i, V);
  }
}

// The whole vocabulary's size: the shard's, or the table's rows. Error when a shard does not lie
// inside it.
std::int64_t vocab_of(const char* op, const VocabShard& shard, std::int64_t rows) {
  if (shard.vocab == 0) return rows;
  if (shard.first < 0 || shard.first + rows > shard.vocab) {
    fail("{}: the table holds rows [{}, {}) of a vocabulary of {}; a shard must lie inside the vocabulary", op, shard.first, shard.first + rows,
         shard.vocab);
  }
  return shard.vocab;
}

}  // namespace

void encoder_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, VocabShard shard) {
  const char* op = "encoder_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"tokens", tokens}, {"wte", wte}, {"wpe", wpe}});
  const EncShape s = check_shapes(op, out, "out", tokens, wte, "wte", wpe, "wpe");
  const std::int64_t vocab = vocab_of(op, shard, s.V);
  DSTRAIN_RETURN_ON_CUDA(gpu, encoder_forward(out, tokens, wte, wpe, shard));  // validates the tokens there
  const auto* tok = static_cast<const std::int32_t*>(tokens.data);
  check_tokens(op, tok, s.B * s.T, vocab);
  const std::int64_t first = shard.first;
  cpu::dispatch_float(op, out.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* o = static_cast<T*>(out.data);
    const T* we = static_cast<const T*>(wte.data);
    const T* wp = static_cast<const T*>(wpe.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.B * s.T * C))
    for (std::int64_t bt = 0; bt < s.B * s.T; ++bt) {
      T* __restrict orow = o + bt * C;
      const std::int64_t row = static_cast<std::int64_t>(tok[bt]) - first;
      const T* __restrict prow = wp + (bt % s.T) * C;
      if (row < 0 || row >= s.V) {  // another rank's row: zeros
        for (std::int64_t c = 0; c < C; ++c) orow[c] = cpu::store<T>(cpu::load(prow[c]));
        continue;
      }
      const T* __restrict erow = we + row * C;
      for (std::int64_t c = 0; c < C; ++c) orow[c] = cpu::store<T>(cpu::load(erow[c]) + cpu::load(prow[c]));
    }
  });
}

std::size_t encoder_backward_scratch_elems(std::int64_t B, std::int64_t T, std::int64_t V) { return static_cast<std::size_t>(B * T + V + 1); }

void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor scratch, VocabShard shard) {
  const char* op = "encoder_backward";
  const bool gpu = cpu::on_cuda(op, {{"dwte", dwte}, {"dwpe", dwpe}, {"dout", dout}, {"tokens", tokens}, {"scratch", scratch}});
  const EncShape s = check_shapes(op, dout, "dout", tokens, dwte, "dwte", dwpe, "dwpe");
  require_present(op, {"scratch", scratch});
  require_dtype(op, {"scratch", scratch}, DType::int32);
  const std::size_t need = encoder_backward_scratch_elems(s.B, s.T, s.V);
  if (static_cast<std::size_t>(scratch.numel()) < need) {
    fail("{}: scratch has {} int32 elements but B*T + V + 1 = {} are needed (B={}, T={}, V={})", op, scratch.numel(), need, s.B, s.T, s.V);
  }
  const std::int64_t vocab = vocab_of(op, shard, s.V);
  DSTRAIN_RETURN_ON_CUDA(gpu, encoder_backward(dwte, dwpe, dout, tokens, scratch, shard));
  const auto* tok = static_cast<const std::int32_t*>(tokens.data);
  const std::int64_t N = s.B * s.T, C = s.C, V = s.V;
  check_tokens(op, tok, N, vocab);
  // The table row of position i, or -1 when its token is another rank's.
  auto row_of = [&](std::int64_t i) -> std::int64_t {
    const std::int64_t r = static_cast<std::int64_t>(tok[i]) - shard.first;
    return r >= 0 && r < V ? r : -1;
  };

  // Counting sort of this table's positions by row: start[v] .. start[v+1] index into order[],
  // which holds the n_in positions whose token is one of the table's rows.
  auto* order = static_cast<std::int32_t*>(scratch.data);  // (B*T)
  std::int32_t* start = order + N;                         // (V + 1)
  for (std::int64_t v = 0; v <= V; ++v) start[v] = 0;
  for (std::int64_t i = 0; i < N; ++i)
    if (const std::int64_t r = row_of(i); r >= 0) ++start[r + 1];
  for (std::int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
  const std::int64_t n_in = start[V];
  // Fill positions in increasing order per row; start[v] is advanced and restored after.
  for (std::int64_t i = 0; i < N; ++i)
    if (const std::int64_t r = row_of(i); r >= 0) order[start[r]++] = static_cast<std::int32_t>(i);
  for (std::int64_t v = V; v > 0; --v) start[v] = start[v - 1];
  start[0] = 0;

  cpu::dispatch_float(op, dout.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* dwe = static_cast<T*>(dwte.data);
    T* dwp = static_cast<T*>(dwpe.data);
    const T* g = static_cast<const T*>(dout.data);
    // Channels in blocks of 64 so the fp32 accumulator stays on the stack (no allocation).
    constexpr std::int64_t kBlock = 64;
    const std::int64_t nblocks = (C + kBlock - 1) / kBlock;
    // wte: one task per (bucket, channel block), a bucket being the run of sorted positions of one
    // token; each dwte row is written by exactly one task. Tasks are indexed by the bucket's first
    // sorted position, so the loop is over B*T, not over the (mostly unused) vocabulary.
#pragma omp parallel for schedule(dynamic, 8) if (cpu::parallel_worth(n_in * C))
    for (std::int64_t task = 0; task < n_in * nblocks; ++task) {
      const std::int64_t k0 = task / nblocks, c0 = (task % nblocks) * kBlock;
      const std::int64_t v = row_of(order[k0]);
      if (start[v] != k0) continue;  // not the first position of its bucket
      const std::int32_t lo = start[v], hi = start[v + 1];
      const std::int64_t cn = (C - c0 < kBlock) ? C - c0 : kBlock;
      float acc[kBlock] = {};
      for (std::int32_t k = lo; k < hi; ++k) {
        const T* __restrict row = g + static_cast<std::int64_t>(order[k]) * C + c0;
        for (std::int64_t c = 0; c < cn; ++c) acc[c] += cpu::load(row[c]);
      }
      T* __restrict drow = dwe + v * C + c0;
      for (std::int64_t c = 0; c < cn; ++c) drow[c] = cpu::store<T>(cpu::load(drow[c]) + acc[c]);
    }
    // wpe: one task per (t, channel block), summing over b in order.
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.B * s.T * C))
    for (std::int64_t task = 0; task < s.T * nblocks; ++task) {
      const std::int64_t t = task / nblocks, c0 = (task % nblocks) * kBlock;
      const std::int64_t cn = (C - c0 < kBlock) ? C - c0 : kBlock;
      float acc[kBlock] = {};
      for (std::int64_t b = 0; b < s.B; ++b) {
        const T* __restrict row = g + (b * s.T + t) * C + c0;
        for (std::int64_t c = 0; c < cn; ++c) acc[c] += cpu::load(row[c]);
      }
      T* __restrict drow = dwp + t * C + c0;
      for (std::int64_t c = 0; c < cn; ++c) drow[c] = cpu::store<T>(cpu::load(drow[c]) + acc[c]);
    }
  });
}

}  // namespace dstrain
