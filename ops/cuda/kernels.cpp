// Host side of the CUDA kernels (ops/cuda/kernels.h): unpacks the checked Tensors into the
// launchers of elementwise.cu / rows.cu / optim.cu, and does the small host work the contracts
// need (token and target validation, encoder_backward's counting sort, the loss mean).
#include "ops/cuda/kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "ops/cuda/cast.h"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/compute_stream.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_launch.h"
#include "ops/error.h"

namespace dstrain::cuda {
namespace {

const cudaStream_t kStream = compute_stream();  // ordered with cudaMemcpy (ops/cuda/compute_stream.h)

// The entry point checked that all tensors share one device; make it current.
void use_device_of(const Tensor& t) {
  int current = -1;
  DSTRAIN_CUDA_CHECK(cudaGetDevice(&current));
  if (current != t.device.index) DSTRAIN_CUDA_CHECK(cudaSetDevice(t.device.index));
}

// Every non-null pointer 16-byte aligned: what cp.async, cuBLASLt's epilogue vectors and its bias
// pointer need.
bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Copies n int32 from device to host (synchronous).
std::vector<std::int32_t> to_host_i32(const Tensor& t, std::int64_t n) {
  std::vector<std::int32_t> h(static_cast<std::size_t>(n));
  if (n > 0) DSTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), t.data, static_cast<std::size_t>(n) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  return h;
}

// Device memory of the kernels whose reductions go through partial sums (fixed partitions, so the
// sums are deterministic): one growing buffer per device. cudaFree synchronises the device, so a
// buffer still read by queued kernels is never released early; after the first step of a run it
// no longer grows. A lease holds the lock while its caller queues the kernels that use the
// memory: work on a device's legacy default stream runs in enqueue order, so two ranks sharing a
// GPU (threads) never interleave their use of it.
class DeviceScratch {
 public:
  struct Lease {
    void* ptr;
    std::unique_lock<std::mutex> lock;
  };
  static Lease get(int device, std::size_t bytes, const char* op) {
    static DeviceScratch instance;
    return instance.lease(device, bytes, op);
  }

 private:
  Lease lease(int device, std::size_t bytes, const char* op) {
    if (device < 0 || device >= static_cast<int>(slots_.size())) fail("{}: device index {} out of range", op, device);
    std::unique_lock<std::mutex> lock(mu_);
    Slot& s = slots_[static_cast<std::size_t>(device)];
    if (s.bytes < bytes) {
      if (s.ptr != nullptr) DSTRAIN_CUDA_CHECK(cudaFree(s.ptr));
      s.ptr = nullptr;
      s.bytes = 0;
      DSTRAIN_CUDA_CHECK(cudaMalloc(&s.ptr, bytes));
      s.bytes = bytes;
    }
    return {s.ptr, std::move(lock)};
  }
  struct Slot {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  std::mutex mu_;
  std::array<Slot, 64> slots_{};
};

void check_tokens(const char* op, const std::vector<std::int32_t>& tok, std::int64_t V) {
  for (std::size_t i = 0; i < tok.size(); ++i) {
    if (tok[i] < 0 || tok[i] >= V) fail("{}: token {} at flat position {} is outside the vocabulary [0, {})", op, tok[i], i, V);
  }
}

void check_targets(const char* op, const std::vector<std::int32_t>& t, std::int64_t V) {
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] != -1 && (t[i] < 0 || t[i] >= V)) {
      fail("{}: target {} at position {} is neither -1 (ignored) nor in the real vocabulary [0, {})", op, t[i], i, V);
    }
  }
}

}  // namespace

void encoder_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, VocabShard shard) {
  use_device_of(out);
  const std::int64_t B = tokens.shape[0], T = tokens.shape[1], C = out.shape[2], V = wte.shape[0];
  check_tokens("encoder_forward", to_host_i32(tokens, B * T), shard.vocab > 0 ? shard.vocab : V);
  if (B * T * C == 0) return;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_encoder_forward(out.data, static_cast<const std::int32_t*>(tokens.data), wte.data, wpe.data, out.dtype,
                                                         B * T, T, C, shard.first, V, kStream));
}

void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor scratch, VocabShard shard) {
  use_device_of(dout);
  const std::int64_t B = tokens.shape[0], T = tokens.shape[1], C = dout.shape[2], V = dwte.shape[0], N = B * T;
  const std::vector<std::int32_t> tok = to_host_i32(tokens, N);
  check_tokens("encoder_backward", tok, shard.vocab > 0 ? shard.vocab : V);
  if (N * C == 0) return;
  // The CPU's counting sort (positions bucketed by table row, increasing within a bucket; tokens
  // outside a vocabulary shard left out), done on the host and uploaded into the int32 scratch:
  // order (n_in) then start (V + 1).
  auto row_of = [&](std::int64_t i) -> std::int64_t {
    const std::int64_t r = static_cast<std::int64_t>(tok[static_cast<std::size_t>(i)]) - shard.first;
    return r >= 0 && r < V ? r : -1;
  };
  std::vector<std::int32_t> host(static_cast<std::size_t>(N + V + 1), 0);
  std::int32_t* order = host.data();
  std::int32_t* start = order + N;
  for (std::int64_t i = 0; i < N; ++i)
    if (const std::int64_t r = row_of(i); r >= 0) ++start[r + 1];
  for (std::int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
  const std::int64_t n_in = start[V];
  for (std::int64_t i = 0; i < N; ++i)
    if (const std::int64_t r = row_of(i); r >= 0) order[start[r]++] = static_cast<std::int32_t>(i);
  for (std::int64_t v = V; v > 0; --v) start[v] = start[v - 1];
  start[0] = 0;
  DSTRAIN_CUDA_CHECK(cudaMemcpy(scratch.data, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  const auto* d_order = static_cast<const std::int32_t*>(scratch.data);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_encoder_backward(dwte.data, dwpe.data, dout.data, static_cast<const std::int32_t*>(tokens.data), d_order,
                                                          d_order + N, dout.dtype, B, T, C, shard.first, n_in, kStream));
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias, float eps) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_layernorm_forward(out.data, static_cast<float*>(mean.data), static_cast<float*>(rstd.data), inp.data,
                                                           weight.data, bias.data, inp.dtype, rows, C, eps, kStream));
}

void fused_residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor weight, Tensor bias,
                                      float eps) {
  use_device_of(a);
  const std::int64_t C = a.shape[a.shape.rank - 1], rows = C == 0 ? 0 : a.numel() / C;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_fused_residual_layernorm_forward(residual.data, out.data, static_cast<float*>(mean.data),
                                                                          static_cast<float*>(rstd.data), a.data, b.data, weight.data, bias.data,
                                                                          a.dtype, rows, C, eps, kStream));
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor mean, Tensor rstd) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  const DeviceScratch::Lease partials = DeviceScratch::get(inp.device.index, cuda_detail::column_partials_bytes(rows, C), "layernorm_backward");
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_layernorm_backward(dinp.data, dweight.data, dbias.data, dout.data, inp.data, weight.data,
                                                            static_cast<const float*>(mean.data), static_cast<const float*>(rstd.data), inp.dtype,
                                                            rows, C, static_cast<double*>(partials.ptr), kStream));
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  DSTRAIN_CUDA_CHECK(
      cuda_detail::launch_rmsnorm_forward(out.data, static_cast<float*>(rstd.data), inp.data, weight.data, inp.dtype, rows, C, eps, kStream));
}

void fused_residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, float eps) {
  use_device_of(a);
  const std::int64_t C = a.shape[a.shape.rank - 1], rows = C == 0 ? 0 : a.numel() / C;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_fused_residual_rmsnorm_forward(residual.data, out.data, static_cast<float*>(rstd.data), a.data, b.data,
                                                                        weight.data, a.dtype, rows, C, eps, kStream));
}

void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  const DeviceScratch::Lease partials = DeviceScratch::get(inp.device.index, cuda_detail::column_partials_bytes(rows, C), "rmsnorm_backward");
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rmsnorm_backward(dinp.data, dweight.data, dout.data, inp.data, weight.data,
                                                          static_cast<const float*>(rstd.data), inp.dtype, rows, C,
                                                          static_cast<double*>(partials.ptr), kStream));
}

void rmsnorm_shard_sum_squares(Tensor sums, Tensor inp) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rmsnorm_shard_sum_squares(static_cast<float*>(sums.data), inp.data, inp.dtype, rows, C, kStream));
}

void rmsnorm_shard_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, Tensor sums, std::int64_t n, float eps) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rmsnorm_shard_forward(out.data, static_cast<float*>(rstd.data), inp.data, weight.data,
                                                               static_cast<const float*>(sums.data), inp.dtype, rows, C, n, eps, kStream));
}

void rmsnorm_shard_backward_dot(Tensor dots, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rmsnorm_shard_backward_dot(static_cast<float*>(dots.data), dout.data, inp.data, weight.data,
                                                                    static_cast<const float*>(rstd.data), inp.dtype, rows, C, kStream));
}

void rmsnorm_shard_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, Tensor dots, std::int64_t n) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], rows = C == 0 ? 0 : inp.numel() / C;
  const DeviceScratch::Lease partials = DeviceScratch::get(inp.device.index, cuda_detail::column_partials_bytes(rows, C), "rmsnorm_shard_backward");
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rmsnorm_shard_backward(dinp.data, dweight.data, dout.data, inp.data, weight.data,
                                                                static_cast<const float*>(rstd.data), static_cast<const float*>(dots.data), inp.dtype,
                                                                rows, C, n, static_cast<double*>(partials.ptr), kStream));
}

void head_rmsnorm_forward(Tensor x, Tensor rstd, Tensor weight, std::int64_t head0, std::int64_t nheads, float eps) {
  use_device_of(x);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_head_rmsnorm_forward(x.data, static_cast<float*>(rstd.data), weight.data, x.dtype, x.shape[0] * x.shape[1],
                                                              x.shape[2], x.shape[3], head0, nheads, eps, kStream));
}

void head_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor inp, Tensor weight, Tensor rstd, std::int64_t head0, std::int64_t nheads) {
  use_device_of(inp);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_head_rmsnorm_backward(dx.data, dweight.data, inp.data, weight.data, static_cast<const float*>(rstd.data),
                                                               inp.dtype, inp.shape[0] * inp.shape[1], inp.shape[2], inp.shape[3], head0, nheads,
                                                               kStream));
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  use_device_of(gate);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_swiglu_forward(out.data, gate.data, up.data, gate.dtype, gate.numel(), kStream));
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  use_device_of(gate);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_swiglu_backward(dgate.data, dup.data, dout.data, gate.data, up.data, gate.dtype, gate.numel(), kStream));
}

namespace {

cuda_detail::MoeRouteParams route_params(const MoeRouting& r) {
  cuda_detail::MoeRouteParams p;
  p.top_k = r.top_k;
  p.sigmoid = r.sigmoid;
  p.renormalize = r.renormalize;
  p.scale = r.scale;
  p.n_group = r.n_group;
  p.topk_group = r.topk_group;
  return p;
}

}  // namespace

void moe_route_forward(Tensor scores, Tensor expert, Tensor weight, Tensor logits, const MoeRouting& r) {
  use_device_of(logits);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_route_forward(static_cast<float*>(scores.data), static_cast<std::int32_t*>(expert.data),
                                                           static_cast<float*>(weight.data), static_cast<const float*>(logits.data),
                                                           logits.shape[0], logits.shape[1], route_params(r), kStream));
}

void moe_route_backward(Tensor dlogits, Tensor dweight, Tensor scores, Tensor expert, Tensor /*weight*/, Tensor logits, Tensor aux_grad,
                        const MoeRouting& r) {
  use_device_of(logits);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_route_backward(
      static_cast<float*>(dlogits.data), static_cast<const float*>(dweight.data), static_cast<const float*>(scores.data),
      static_cast<const std::int32_t*>(expert.data), static_cast<const float*>(logits.data),
      aux_grad.empty() ? nullptr : static_cast<const float*>(aux_grad.data), logits.shape[0], logits.shape[1], route_params(r), kStream));
}

void moe_aux_stats(Tensor assigned, Tensor prob_sum, Tensor logits, std::int64_t top_k) {
  use_device_of(logits);
  const std::int64_t N = logits.shape[0], E = logits.shape[1];
  const DeviceScratch::Lease scratch = DeviceScratch::get(logits.device.index, cuda_detail::moe_aux_stats_scratch_bytes(N, E), "moe_aux_stats");
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_aux_stats(static_cast<double*>(assigned.data), static_cast<double*>(prob_sum.data),
                                                       static_cast<const float*>(logits.data), N, E, top_k, scratch.ptr, kStream));
}

void moe_dispatch_plan(Tensor slot_assignment, Tensor slot_of, Tensor counts, Tensor expert, std::int64_t capacity) {
  const char* op = "moe_dispatch_plan";
  use_device_of(expert);
  const std::int64_t N = expert.shape[0], k = expert.shape[1], E = counts.shape[0];
  std::int32_t bad = 0;
  {
    const DeviceScratch::Lease scratch = DeviceScratch::get(expert.device.index, cuda_detail::moe_plan_scratch_bytes(N * k, E), op);
    const std::int32_t* flag = nullptr;
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_dispatch_plan(static_cast<std::int32_t*>(slot_assignment.data), static_cast<std::int32_t*>(slot_of.data),
                                                             static_cast<std::int32_t*>(counts.data), static_cast<const std::int32_t*>(expert.data), N,
                                                             k, E, capacity, scratch.ptr, &flag, kStream));
    DSTRAIN_CUDA_CHECK(cudaMemcpy(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost));  // after the kernels (kStream is ordered with it)
  }
  if (bad == 0) return;
  // Name the first bad id in the CPU's order (choice j, then token t), as its Error does.
  const std::vector<std::int32_t> ex = to_host_i32(expert, N * k);
  for (std::int64_t j = 0; j < k; ++j)
    for (std::int64_t t = 0; t < N; ++t) {
      const std::int32_t e = ex[static_cast<std::size_t>(t * k + j)];
      if (e < 0 || e >= E) fail("{}: token {} choice {} names expert {}, outside [0, {})", op, t, j, e, E);
    }
  fail("{}: the device reported an expert id outside [0, {}) that the host copy does not show", op, E);
}

void moe_gather_rows(Tensor rows, Tensor x, Tensor slot_assignment, std::int64_t k, std::int64_t slots) {
  use_device_of(x);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_gather_rows(rows.data, x.data, static_cast<const std::int32_t*>(slot_assignment.data), x.dtype,
                                                         x.shape[0], x.shape[1], k, slots, kStream));
}

void moe_combine(Tensor out, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k) {
  use_device_of(out);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_combine(out.data, rows.data, static_cast<const std::int32_t*>(slot_of.data),
                                                     weight.empty() ? nullptr : static_cast<const float*>(weight.data), out.dtype, out.shape[0],
                                                     out.shape[1], k, rows.shape[0], kStream));
}

void moe_combine_backward(Tensor drows, Tensor dweight, Tensor dout, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k) {
  use_device_of(dout);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_combine_backward(drows.data, static_cast<float*>(dweight.data), dout.data, rows.data,
                                                              static_cast<const std::int32_t*>(slot_of.data), static_cast<const float*>(weight.data),
                                                              dout.dtype, dout.shape[0], dout.shape[1], k, rows.shape[0], kStream));
}

void moe_gated_add_forward(Tensor out, Tensor y, Tensor logit) {
  use_device_of(out);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_moe_gated_add_forward(out.data, y.data, logit.data, out.dtype, out.shape[0], out.shape[1], kStream));
}

void moe_gated_add_backward(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit) {
  use_device_of(dout);
  DSTRAIN_CUDA_CHECK(
      cuda_detail::launch_moe_gated_add_backward(dy.data, dlogit.data, dout.data, y.data, logit.data, dout.dtype, dout.shape[0], dout.shape[1], kStream));
}

void rope_forward(Tensor out, Tensor inp, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset) {
  use_device_of(inp);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rope(out.data, inp.data, static_cast<const float*>(inv_freq.data), inp.dtype, inp.shape[0], inp.shape[1],
                                              inp.shape[2], inp.shape[3], rotate_heads, pos_offset, false, kStream));
}

void rope_backward(Tensor dinp, Tensor dout, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset) {
  use_device_of(dout);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_rope(dinp.data, dout.data, static_cast<const float*>(inv_freq.data), dout.dtype, dout.shape[0],
                                              dout.shape[1], dout.shape[2], dout.shape[3], rotate_heads, pos_offset, true, kStream));
}

void gelu_forward(Tensor out, Tensor inp) {
  use_device_of(inp);
  if (inp.numel() == 0) return;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_gelu_forward(out.data, inp.data, inp.dtype, inp.numel(), kStream));
}

void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  use_device_of(inp);
  if (inp.numel() == 0) return;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_gelu_backward(dinp.data, inp.data, dout.data, inp.dtype, inp.numel(), kStream));
}

void dropout_forward(Tensor out, Tensor inp, const DropoutParams& params) {
  use_device_of(inp);
  if (inp.numel() == 0) return;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_dropout(out.data, inp.data, inp.dtype, inp.numel(), params.p, params.rng, false, kStream));
}

void dropout_backward(Tensor dinp, Tensor dout, const DropoutParams& params) {
  use_device_of(dout);
  if (dout.numel() == 0) return;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_dropout(dinp.data, dout.data, dout.dtype, dout.numel(), params.p, params.rng, true, kStream));
}

namespace {
// The loss mean as the CPU computes it: double, in position order, over the non-ignored positions
// (the losses copied back: this is where a step's host synchronisation for the loss happens).
float mean_loss(const Tensor& losses, const std::vector<std::int32_t>& tg) {
  std::vector<float> loss(tg.size());
  if (!loss.empty()) DSTRAIN_CUDA_CHECK(cudaMemcpy(loss.data(), losses.data, loss.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double total = 0.0;
  std::int64_t count = 0;
  for (std::size_t i = 0; i < loss.size(); ++i) {
    if (tg[i] >= 0) {
      total += static_cast<double>(loss[i]);
      ++count;
    }
  }
  return count == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(count));
}
}  // namespace

float softmax_cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, std::int64_t V) {
  const char* op = "softmax_cross_entropy_forward";
  use_device_of(logits);
  const std::int64_t Vp = logits.shape[logits.shape.rank - 1], BT = lse.numel();
  const std::vector<std::int32_t> tg = to_host_i32(targets, BT);
  check_targets(op, tg, V);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_softmax_ce_forward(static_cast<float*>(losses.data), static_cast<float*>(lse.data), logits.data,
                                                            static_cast<const std::int32_t*>(targets.data), logits.dtype, BT, V, Vp, kStream));
  return mean_loss(losses, tg);
}

float softmax_cross_entropy_forward_backward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, float dloss, std::int64_t V) {
  const char* op = "softmax_cross_entropy_forward_backward";
  use_device_of(logits);
  const std::int64_t Vp = logits.shape[logits.shape.rank - 1], BT = lse.numel();
  const std::vector<std::int32_t> tg = to_host_i32(targets, BT);
  check_targets(op, tg, V);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_softmax_ce_fused(static_cast<float*>(losses.data), static_cast<float*>(lse.data), logits.data,
                                                          static_cast<const std::int32_t*>(targets.data), logits.dtype, BT, V, Vp, dloss, kStream));
  return mean_loss(losses, tg);
}

void softmax_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t V) {
  use_device_of(logits);
  const std::int64_t Vp = logits.shape[logits.shape.rank - 1], BT = lse.numel();
  check_targets("softmax_cross_entropy_backward", to_host_i32(targets, BT), V);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_softmax_ce_backward(dlogits.data, logits.data, static_cast<const float*>(lse.data),
                                                             static_cast<const std::int32_t*>(targets.data), logits.dtype, BT, V, Vp, dloss,
                                                             kStream));
}

// Vocabulary-parallel cross-entropy: the entry points checked the shapes (rows of the logits =
// elements of rowmax / lse / targets, stats 2 per row, valid <= Vr).
void vocab_shard_max(Tensor rowmax, Tensor logits, std::int64_t valid) {
  use_device_of(rowmax);
  const std::int64_t Vr = logits.shape[logits.shape.rank - 1], BT = rowmax.numel();
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_vocab_shard_max(static_cast<float*>(rowmax.data), logits.data, logits.dtype, BT, Vr, valid, kStream));
}

void vocab_shard_sum_exp(Tensor stats, Tensor logits, Tensor rowmax, Tensor targets, std::int64_t first, std::int64_t valid) {
  use_device_of(stats);
  const std::int64_t Vr = logits.shape[logits.shape.rank - 1], BT = rowmax.numel();
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_vocab_shard_sum_exp(static_cast<float*>(stats.data), logits.data, static_cast<const float*>(rowmax.data),
                                                             static_cast<const std::int32_t*>(targets.data), logits.dtype, BT, Vr, first, valid,
                                                             kStream));
}

float vocab_parallel_losses(Tensor losses, Tensor lse, Tensor rowmax, Tensor stats, Tensor targets) {
  use_device_of(targets);
  const std::int64_t BT = targets.numel();
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_vocab_parallel_losses(static_cast<float*>(losses.data), static_cast<float*>(lse.data),
                                                               static_cast<const float*>(rowmax.data), static_cast<const float*>(stats.data),
                                                               static_cast<const std::int32_t*>(targets.data), BT, kStream));
  return mean_loss(losses, to_host_i32(targets, BT));  // the CPU's mean: double, position order
}

void vocab_shard_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t first,
                                        std::int64_t valid) {
  use_device_of(lse);  // the logits may be empty (Vr = 0), the per-row tensors are not
  const std::int64_t Vr = logits.shape[logits.shape.rank - 1], BT = lse.numel();
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_vocab_shard_ce_backward(dlogits.data, logits.data, static_cast<const float*>(lse.data),
                                                                 static_cast<const std::int32_t*>(targets.data), logits.dtype, BT, Vr, dloss, first,
                                                                 valid, kStream));
}

// fp16/bf16 with HS in {32, 64, 128} and 16-byte aligned tensors (cp.async) run on the
// tensor-core kernels (attention_tc.cu), multi-head and grouped KV heads alike; fp32 (which must
// match the CPU to fp32 rounding) and other head sizes on the warp-per-row kernels (attention.cu).
namespace {
bool use_attention_tc(DType t, std::int64_t C, std::int64_t NH, std::initializer_list<const void*> ptrs) {
  return NH > 0 && cuda_detail::attention_tc_supported(t, C / NH) && aligned16(ptrs);
}
}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor qkv, std::int64_t NH, std::int64_t NKV, const DropoutParams& dropout) {
  use_device_of(qkv);
  const std::int64_t B = qkv.shape[0], T = qkv.shape[1], C = qkv.shape[2] / (NH + 2 * NKV) * NH;
  if (use_attention_tc(qkv.dtype, C, NH, {out.data, qkv.data})) {
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_attention_forward_tc(out.data, static_cast<float*>(lse.data), qkv.data, qkv.dtype, B, T, C, NH, NKV,
                                                                dropout.p, dropout.rng, kStream));
    return;
  }
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_attention_forward(out.data, static_cast<float*>(lse.data), qkv.data, qkv.dtype, B, T, C, NH, NKV, dropout.p,
                                                           dropout.rng, kStream));
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, std::int64_t NH, std::int64_t NKV, Tensor scratch,
                        const DropoutParams& dropout) {
  use_device_of(qkv);
  const std::int64_t B = qkv.shape[0], T = qkv.shape[1], C = qkv.shape[2] / (NH + 2 * NKV) * NH;
  float* Dsum = static_cast<float*>(scratch.data) + B * T * C;  // the CPU's layout: dq (B*T*C), then D (B*NH*T)
  if (use_attention_tc(qkv.dtype, C, NH, {dqkv.data, dout.data, qkv.data, out.data})) {
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_attention_backward_tc(dqkv.data, dout.data, qkv.data, out.data, static_cast<const float*>(lse.data), Dsum,
                                                                 qkv.dtype, B, T, C, NH, NKV, dropout.p, dropout.rng, kStream));
    return;
  }
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_attention_backward(dqkv.data, dout.data, qkv.data, out.data, static_cast<const float*>(lse.data), Dsum,
                                                            qkv.dtype, B, T, C, NH, NKV, dropout.p, dropout.rng, kStream));
}

// Row-major nn.Linear as column-major GEMMs (see cublaslt.h):
//   out (BT, OC)  = inp (BT, C) · weightᵀ  ->  outᶜ (OC x BT) = W(C x OC)ᵀ · inpᶜ (C x BT)
//   dinp (BT, C) += dout · weight          ->  dinpᶜ (C x BT) += Wᶜ (C x OC) · doutᶜ (OC x BT)
//   dW (OC, C)   += doutᵀ · inp            ->  dWᶜ (C x OC) += inpᶜ (C x BT) · doutᶜ (OC x BT)ᵀ
namespace {
// The column-major GEMMs of the comment above, for out (BT, OC), inp (BT, C), weight (OC, C).
GemmArgs forward_gemm(const Tensor& out, const Tensor& inp, const Tensor& weight, std::int64_t BT, std::int64_t C, std::int64_t OC) {
  GemmArgs g;
  g.dtype = inp.dtype;
  g.transa = true;
  g.m = OC, g.n = BT, g.k = C;
  g.A = weight.data, g.lda = C;
  g.B = inp.data, g.ldb = C;
  g.D = out.data, g.ldd = OC;
  return g;
}
// dinp (BT, C) [+]= dout (BT, OC) · weight (OC, C); beta 1 accumulates.
GemmArgs dinp_gemm(const Tensor& dinp, const Tensor& dout, const Tensor& weight, std::int64_t BT, std::int64_t C, std::int64_t OC) {
  GemmArgs g;
  g.dtype = dout.dtype;
  g.m = C, g.n = BT, g.k = OC;
  g.A = weight.data, g.lda = C;
  g.B = dout.data, g.ldb = OC;
  g.D = dinp.data, g.ldd = C;
  g.beta = 1.0f;
  return g;
}
}  // namespace

void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, Tensor /*scratch*/) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], BT = C == 0 ? 0 : inp.numel() / C, OC = weight.shape[0];
  if (BT == 0 || OC == 0) return;  // C == 0 counts as BT == 0, as on the CPU
  GemmArgs g = forward_gemm(out, inp, weight, BT, C, OC);
  // The bias epilogue needs a 16-byte aligned bias (a slice of a flat parameter buffer may not be):
  // otherwise a separate add (for 16-bit storage that rounds twice: within the matmul tolerance).
  const bool epilogue = bias.data != nullptr && aligned16({bias.data});
  g.bias = epilogue ? bias.data : nullptr;
  CublasLtContext::get(inp.device.index).gemm(g, kStream);
  if (bias.data != nullptr && !epilogue) DSTRAIN_CUDA_CHECK(cuda_detail::launch_add_bias(out.data, bias.data, out.dtype, BT, OC, kStream));
}

void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor /*scratch*/) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], BT = C == 0 ? 0 : inp.numel() / C, OC = weight.shape[0];
  if (C == 0 && !dbias.empty() && OC > 0 && dout.numel() > 0) {
    // An input with no columns (a tensor-parallel rank holding no heads): the bias gradient alone,
    // by the same kernel as every other call (the CPU's rule, ops/cpu/matmul.cpp).
    const std::int64_t rows = dout.numel() / OC;
    const DeviceScratch::Lease partials = DeviceScratch::get(dout.device.index, cuda_detail::column_partials_bytes(rows, OC), "matmul_backward");
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_matmul_dbias(dbias.data, dout.data, dout.dtype, rows, OC, static_cast<double*>(partials.ptr), kStream));
    return;
  }
  if (BT == 0 || OC == 0 || C == 0) return;
  CublasLtContext& ctx = CublasLtContext::get(inp.device.index);
  if (!dbias.empty()) {
    const DeviceScratch::Lease partials = DeviceScratch::get(inp.device.index, cuda_detail::column_partials_bytes(BT, OC), "matmul_backward");
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_matmul_dbias(dbias.data, dout.data, dout.dtype, BT, OC, static_cast<double*>(partials.ptr), kStream));
  }
  if (!dinp.empty()) ctx.gemm(dinp_gemm(dinp, dout, weight, BT, C, OC), kStream);
  if (!dweight.empty()) {
    GemmArgs g;
    g.dtype = inp.dtype;
    g.transb = true;
    g.m = C, g.n = OC, g.k = BT;
    g.A = inp.data, g.lda = C;
    g.B = dout.data, g.ldb = OC;
    g.D = dweight.data, g.ldd = C;
    g.beta = 1.0f;
    ctx.gemm(g, kStream);
  }
}

namespace {
// cuBLASLt's GELU epilogues read and write the aux matrix in 16-byte vectors: its leading dimension
// must be a multiple of 8 elements and every pointer 16-byte aligned.
bool gelu_epilogue_fits(std::int64_t ld, std::initializer_list<const void*> ptrs) { return ld % 8 == 0 && aligned16(ptrs); }
}  // namespace

void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, Tensor scratch) {
  use_device_of(inp);
  const std::int64_t C = inp.shape[inp.shape.rank - 1], BT = C == 0 ? 0 : inp.numel() / C, OC = weight.shape[0];
  if (BT == 0 || OC == 0) return;
  if (C > 0 && gelu_epilogue_fits(OC, {out.data, pre.data, bias.data, inp.data, weight.data})) {
    GemmArgs g = forward_gemm(out, inp, weight, BT, C, OC);
    g.bias = bias.data;
    g.act = GemmArgs::Act::gelu_aux;
    g.aux = pre.data, g.ldaux = OC;
    if (CublasLtContext::get(inp.device.index).try_gemm(g, kStream)) return;
  }
  matmul_forward(pre, inp, weight, bias, scratch);
  gelu_forward(out, pre);
}

void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dy, Tensor out, Tensor pre, Tensor weight, Tensor dout_scratch,
                          Tensor scratch) {
  use_device_of(out);
  const std::int64_t C = out.shape[out.shape.rank - 1], BT = C == 0 ? 0 : out.numel() / C, OC = weight.shape[0];
  if (BT == 0 || C == 0) return;
  if (OC == 0) return zero_tensor(dpre);  // dy · weight is empty: dpre = gelu'(pre) · 0
  // d(out) = dy · weight: the dinp GEMM of matmul_backward, written (beta 0). With DGELU in its
  // epilogue it lands as dpre = gelu'(pre) ⊙ d(out) directly; else in dout_scratch, then GELU's
  // backward.
  CublasLtContext& ctx = CublasLtContext::get(out.device.index);
  GemmArgs g = dinp_gemm(dpre, dy, weight, BT, C, OC);
  g.beta = 0.0f;
  bool fused = false;
  if (gelu_epilogue_fits(C, {dpre.data, pre.data, dy.data, weight.data})) {
    GemmArgs f = g;
    f.act = GemmArgs::Act::dgelu;
    f.aux = pre.data, f.ldaux = C;
    fused = ctx.try_gemm(f, kStream);
  }
  if (!fused) {
    g.D = dout_scratch.data;
    ctx.gemm(g, kStream);
    zero_tensor(dpre);
    gelu_backward(dpre, pre, dout_scratch);
  }
  matmul_backward(Tensor{}, dweight, dbias, dy, out, weight, scratch);
}

GradNormOverflow grad_norm_overflow(Tensor grads) {
  const std::int64_t n = grads.numel();
  if (n == 0) return {};
  use_device_of(grads);
  std::vector<double> host(2 * cuda_detail::kNormBlocks);
  {
    const DeviceScratch::Lease scratch = DeviceScratch::get(grads.device.index, host.size() * sizeof(double), "grad_norm_overflow");
    auto* partials = static_cast<double*>(scratch.ptr);
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_grad_norm_partials(grads.data, grads.dtype, n, partials, kStream));
    DSTRAIN_CUDA_CHECK(cudaMemcpy(host.data(), partials, host.size() * sizeof(double), cudaMemcpyDeviceToHost));
  }
  GradNormOverflow r;
  for (unsigned b = 0; b < cuda_detail::kNormBlocks; ++b) r += GradNormOverflow{host[2 * b], host[2 * b + 1]};
  return r;
}

void scale_grads(Tensor grads, float factor) {
  use_device_of(grads);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_scale(grads.data, grads.dtype, grads.numel(), factor, kStream));
}

void quantize_blocks(Tensor packed, Tensor x, int bits, std::int64_t block) {
  use_device_of(x);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_quantize_blocks(static_cast<std::int32_t*>(packed.data), x.data, x.dtype, x.numel(), bits, block, kStream));
}

void dequantize_blocks(Tensor out, Tensor packed, int bits, std::int64_t block, bool accumulate) {
  use_device_of(out);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_dequantize_blocks(out.data, static_cast<const std::int32_t*>(packed.data), out.dtype, out.numel(), bits,
                                                           block, accumulate, kStream));
}

void lamb_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, std::span<const TensorRange> ranges, Tensor lamb_coeffs,
                 const LambConfig& c) {
  use_device_of(params);
  const auto nr = static_cast<std::int64_t>(ranges.size());
  if (nr == 0) return;
  if (nr > 2147483647) fail("lamb_update: {} tensor ranges exceed the CUDA grid", nr);
  // step_size exactly as ops/cpu/lamb.cpp.
  float step_size = c.lr;
  if (c.bias_correction) {
    const double t = static_cast<double>(c.step);
    const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), t));
    const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), t));
    step_size = c.lr * std::sqrt(bc2) / bc1;
  }
  // Scratch: ranges (2 int64 per range), then the partials (2 * kLambSlices doubles per range).
  const std::size_t range_bytes = static_cast<std::size_t>(nr) * 2 * sizeof(std::int64_t);
  const std::size_t need = range_bytes + static_cast<std::size_t>(nr) * 2 * cuda_detail::kLambSlices * sizeof(double);
  const DeviceScratch::Lease buf = DeviceScratch::get(params.device.index, need, "lamb_update");
  std::vector<std::int64_t> host(static_cast<std::size_t>(nr) * 2);
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    host[2 * k] = ranges[k].offset;
    host[2 * k + 1] = ranges[k].numel;
  }
  // Synchronous copy: also orders this step after the previous one's use of the buffer.
  DSTRAIN_CUDA_CHECK(cudaMemcpy(buf.ptr, host.data(), range_bytes, cudaMemcpyHostToDevice));
  auto* d_ranges = static_cast<const std::int64_t*>(buf.ptr);
  auto* partials = reinterpret_cast<double*>(static_cast<char*>(buf.ptr) + range_bytes);  // range_bytes is a multiple of 16
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_lamb(static_cast<float*>(params.data), grads.data, grads.dtype, static_cast<float*>(m.data),
                                              static_cast<float*>(v.data), params_lowp.data, params_lowp.dtype, d_ranges, nr, partials,
                                              static_cast<float*>(lamb_coeffs.data), step_size, c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_scale,
                                              c.max_coeff, c.min_coeff, c.eps_inside_sqrt, kStream));
}

// Newton–Schulz: row-major X (n x m) is column-major Xᵀ, so the row-major product P·Q is the
// column-major Qᵀ·Pᵀ: A = X·Xᵀ, A·A and B·X become column-major GEMMs with swapped operands.
// B = b·A + c·A·A is computed as c·((b/c)·A + A·A): cuBLASLt's GEMM here has beta but no alpha.
void newton_schulz(Tensor x, Tensor workspace, const NewtonSchulzConfig& c) {
  use_device_of(x);
  const std::int64_t rows = x.shape[0], cols = x.shape[1];
  if (rows == 0 || cols == 0) return;
  const bool tall = rows > cols;
  const std::int64_t n = std::min(rows, cols), m = std::max(rows, cols);
  float* g = static_cast<float*>(x.data);
  float* X = static_cast<float*>(workspace.data);
  float* Y = X + n * m;
  float* A = Y + n * m;
  float* B = A + n * n;
  CublasLtContext& ctx = CublasLtContext::get(x.device.index);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_load(g, X, n, m, tall, kStream));
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_normalise(X, n * m, c.eps, kStream));
  for (int s = 0; s < c.steps; ++s) {
    GemmArgs xxt;  // A (n x n) = X·Xᵀ
    xxt.m = n, xxt.n = n, xxt.k = m;
    xxt.transa = true;
    xxt.A = X, xxt.lda = m;
    xxt.B = X, xxt.ldb = m;
    xxt.D = A, xxt.ldd = n;
    ctx.gemm(xxt, kStream);
    if (c.c != 0.0f) {
      DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_scale(B, A, n * n, c.b / c.c, kStream));
      GemmArgs aa;  // B += A·A
      aa.m = n, aa.n = n, aa.k = n;
      aa.A = A, aa.lda = n;
      aa.B = A, aa.ldb = n;
      aa.D = B, aa.ldd = n;
      aa.beta = 1.0f;
      ctx.gemm(aa, kStream);
      DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_scale(B, B, n * n, c.c, kStream));
    } else {
      DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_scale(B, A, n * n, c.b, kStream));
    }
    DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_scale(Y, X, n * m, c.a, kStream));
    GemmArgs bx;  // Y += B·X
    bx.m = m, bx.n = n, bx.k = n;
    bx.A = X, bx.lda = m;
    bx.B = B, bx.ldb = n;
    bx.D = Y, bx.ldd = m;
    bx.beta = 1.0f;
    ctx.gemm(bx, kStream);
    std::swap(X, Y);
  }
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_ns_store(g, X, n, m, tall, kStream));
}

void sgd_update(Tensor params, Tensor grads, Tensor momentum_buffer, Tensor params_lowp, const SgdConfig& c) {
  use_device_of(params);
  const float gs = c.maximize ? -c.grad_scale : c.grad_scale;  // as ops/cpu/sgd.cpp
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_sgd(static_cast<float*>(params.data), grads.data, grads.dtype, static_cast<float*>(momentum_buffer.data),
                                             params_lowp.data, params_lowp.dtype, params.numel(), c.lr, c.momentum, 1.0f - c.dampening,
                                             c.weight_decay, gs, c.step == 1, c.nesterov, kStream));
}

void optimizer_rule_update(const RuleStep& step, Tensor params, Tensor grads, std::span<const Tensor> states, Tensor params_lowp) {
  use_device_of(params);
  float* ptrs[3] = {nullptr, nullptr, nullptr};
  for (std::size_t j = 0; j < states.size() && j < 3; ++j) ptrs[j] = static_cast<float*>(states[j].data);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_optimizer_rule(step, static_cast<float*>(params.data), grads.data, grads.dtype, ptrs, params_lowp.data,
                                                        params_lowp.dtype, params.numel(), kStream));
}

void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const AdamWConfig& c) {
  use_device_of(params);
  // Bias corrections exactly as ops/cpu/adamw.cpp: in double, rounded to float once.
  const double t = static_cast<double>(c.step);
  const float bc1 = c.bias_correction ? static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), t)) : 1.0f;
  const float bc2 = c.bias_correction ? static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), t)) : 1.0f;
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_adamw(static_cast<float*>(params.data), grads.data, grads.dtype, static_cast<float*>(m.data),
                                               static_cast<float*>(v.data), params_lowp.data, params_lowp.dtype, params.numel(), c.lr, c.beta1,
                                               c.beta2, c.eps, c.weight_decay, c.grad_scale, bc1, bc2, c.decoupled_weight_decay,
                                               cuda_detail::StochasticRounding{c.stochastic_rounding, c.rounding_key, c.rounding_offset}, kStream));
}

void zero_tensor(Tensor t) {
  use_device_of(t);
  DSTRAIN_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), kStream));
}

void copy_tensor(Tensor dst, Tensor src) {
  use_device_of(dst.device.is_cuda() ? dst : src);
  // cudaMemcpy, not Async: host memory on either side is done with when it returns (pageable
  // memory would make the Async form synchronous anyway); device to device stays stream-ordered.
  DSTRAIN_CUDA_CHECK(cudaMemcpy(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault));
}

void copy_rows(Tensor dst, std::int64_t dst_offset, std::int64_t dst_pitch, Tensor src, std::int64_t src_offset, std::int64_t src_pitch,
               std::int64_t rows, std::int64_t width) {
  use_device_of(dst);
  const std::size_t es = dtype_size(dst.dtype);
  DSTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + static_cast<std::size_t>(dst_offset) * es, static_cast<std::size_t>(dst_pitch) * es,
                                       static_cast<const char*>(src.data) + static_cast<std::size_t>(src_offset) * es,
                                       static_cast<std::size_t>(src_pitch) * es, static_cast<std::size_t>(width) * es, static_cast<std::size_t>(rows),
                                       cudaMemcpyDeviceToDevice, kStream));
}

void convert_tensor(Tensor dst, Tensor src) {
  use_device_of(dst);
  cuda_convert(src.data, src.dtype, dst.data, dst.dtype, static_cast<std::size_t>(dst.numel()), kStream);
}

void residual_forward(Tensor out, Tensor a, Tensor b) {
  use_device_of(out);
  DSTRAIN_CUDA_CHECK(cuda_detail::launch_residual_add(out.data, a.data, b.data, out.dtype, out.numel(), kStream));
}

}  // namespace dstrain::cuda
