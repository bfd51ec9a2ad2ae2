// Mixture-of-experts routing and token movement, CPU (ops/kernels/moe.h). The router works per
// token in double (E is small; the result is rounded to fp32 once); the plan is a sequential
// stable counting sort (N·k steps); rows move in parallel over tokens or slots, each output row
// written by one thread, so the results do not depend on the thread count.
#include "ops/kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/error.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

void softmax_row(const float* l, double* p, std::int64_t E) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(l[e]));
  double s = 0.0;
  for (std::int64_t e = 0; e < E; ++e) s += (p[e] = std::exp(static_cast<double>(l[e]) - m));
  for (std::int64_t e = 0; e < E; ++e) p[e] /= s;
}

// The k best of v[0..E), higher first, the lower index on a tie.
void best_k(const double* v, std::int64_t E, std::int64_t k, std::vector<std::int64_t>& idx) {
  idx.resize(static_cast<std::size_t>(E));
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](std::int64_t a, std::int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(static_cast<std::size_t>(k));
}

void check_routing(const char* op, const MoeRouting& r, std::int64_t E) {
  if (r.top_k < 1 || r.top_k > E) fail("{}: top_k = {} must be between 1 and the {} experts", op, r.top_k, E);
  if (r.n_group < 1 || E % r.n_group != 0) fail("{}: n_group = {} must divide the {} experts", op, r.n_group, E);
  if (r.topk_group < 1 || r.topk_group > r.n_group) fail("{}: topk_group = {} must be between 1 and n_group = {}", op, r.topk_group, r.n_group);
  if (r.n_group > 1 && r.topk_group * (E / r.n_group) < r.top_k)
    fail("{}: {} eligible groups of {} experts hold fewer than top_k = {}", op, r.topk_group, E / r.n_group, r.top_k);
}

// The chosen experts of one token (best first) from its scores; `choice` is scratch of E.
void choose(const double* s, std::int64_t E, const MoeRouting& r, std::vector<double>& choice, std::vector<std::int64_t>& idx) {
  choice.assign(s, s + E);
  if (r.n_group > 1) {
    const std::int64_t G = r.n_group, per = E / G;
    std::vector<double> group(static_cast<std::size_t>(G));
    for (std::int64_t g = 0; g < G; ++g) {
      const double* v = s + g * per;
      if (r.sigmoid) {  // DeepSeek-V3: the sum of the group's two best
        double a = -std::numeric_limits<double>::infinity(), b = a;
        for (std::int64_t i = 0; i < per; ++i) {
          if (v[i] > a) {
            b = a;
            a = v[i];
          } else if (v[i] > b) {
            b = v[i];
          }
        }
        group[static_cast<std::size_t>(g)] = per >= 2 ? a + b : a;
      } else {  // DeepSeek-V2: the group's best
        group[static_cast<std::size_t>(g)] = *std::max_element(v, v + per);
      }
    }
    std::vector<std::int64_t> best;
    best_k(group.data(), G, r.topk_group, best);
    std::vector<char> keep(static_cast<std::size_t>(G), 0);
    for (std::int64_t g : best) keep[static_cast<std::size_t>(g)] = 1;
    for (std::int64_t e = 0; e < E; ++e)
      if (!keep[static_cast<std::size_t>(e / per)]) choice[static_cast<std::size_t>(e)] = -std::numeric_limits<double>::infinity();
  }
  best_k(choice.data(), E, r.top_k, idx);
}

}  // namespace

void moe_route_forward(Tensor scores, Tensor expert, Tensor weight, Tensor logits, const MoeRouting& r) {
  const char* op = "moe_route_forward";
  const bool gpu = cpu::on_cuda(op, {{"scores", scores}, {"expert", expert}, {"weight", weight}, {"logits", logits}});
  require_rank(op, {"logits", logits}, 2, "(N, E)");
  const std::int64_t N = logits.shape[0], E = logits.shape[1], k = r.top_k;
  check_routing(op, r, E);
  require_dtype(op, {"logits", logits}, DType::fp32);
  require_dtype(op, {"scores", scores}, DType::fp32);
  require_dtype(op, {"expert", expert}, DType::int32);
  require_dtype(op, {"weight", weight}, DType::fp32);
  require_shape(op, {"scores", scores}, logits.shape, "(the shape of logits)");
  require_shape(op, {"expert", expert}, Shape{N, k}, "(N, top_k)");
  require_shape(op, {"weight", weight}, Shape{N, k}, "(N, top_k)");
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_route_forward(scores, expert, weight, logits, r));
  const float* l = static_cast<const float*>(logits.data);
  float* sc = static_cast<float*>(scores.data);
  std::int32_t* ex = static_cast<std::int32_t*>(expert.data);
  float* w = static_cast<float*>(weight.data);
#pragma omp parallel if (cpu::parallel_worth(N * E * 8))
  {
    std::vector<double> s(static_cast<std::size_t>(E)), choice;
    std::vector<std::int64_t> idx;
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < N; ++t) {
      const float* lt = l + t * E;
      if (r.sigmoid) {
        for (std::int64_t e = 0; e < E; ++e) s[static_cast<std::size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(lt[e])));
      } else {
        softmax_row(lt, s.data(), E);
      }
      for (std::int64_t e = 0; e < E; ++e) sc[t * E + e] = static_cast<float>(s[static_cast<std::size_t>(e)]);
      choose(s.data(), E, r, choice, idx);
      double sum = r.sigmoid ? 1e-20 : 0.0;
      for (std::int64_t e : idx) sum += s[static_cast<std::size_t>(e)];
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t e = idx[static_cast<std::size_t>(j)];
        ex[t * k + j] = static_cast<std::int32_t>(e);
        const double v = r.renormalize ? s[static_cast<std::size_t>(e)] / sum : s[static_cast<std::size_t>(e)];
        w[t * k + j] = static_cast<float>(v * r.scale);
      }
    }
  }
}

void moe_route_backward(Tensor dlogits, Tensor dweight, Tensor scores, Tensor expert, Tensor weight, Tensor logits, Tensor aux_grad,
                        const MoeRouting& r) {
  const char* op = "moe_route_backward";
  const bool gpu = cpu::on_cuda(
      op, {{"dlogits", dlogits}, {"dweight", dweight}, {"scores", scores}, {"expert", expert}, {"weight", weight}, {"logits", logits}, {"aux_grad", aux_grad}});
  require_rank(op, {"logits", logits}, 2, "(N, E)");
  const std::int64_t N = logits.shape[0], E = logits.shape[1], k = r.top_k;
  check_routing(op, r, E);
  for (const Arg& a : {Arg{"dlogits", dlogits}, Arg{"scores", scores}}) require_shape(op, a, logits.shape, "(the shape of logits)");
  for (const Arg& a : {Arg{"dweight", dweight}, Arg{"expert", expert}, Arg{"weight", weight}}) require_shape(op, a, Shape{N, k}, "(N, top_k)");
  for (const Arg& a : {Arg{"dlogits", dlogits}, Arg{"dweight", dweight}, Arg{"scores", scores}, Arg{"weight", weight}, Arg{"logits", logits}})
    require_dtype(op, a, DType::fp32);
  require_dtype(op, {"expert", expert}, DType::int32);
  if (!aux_grad.empty()) {
    require_dtype(op, {"aux_grad", aux_grad}, DType::fp32);
    require_shape(op, {"aux_grad", aux_grad}, Shape{E}, "(E)");
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_route_backward(dlogits, dweight, scores, expert, weight, logits, aux_grad, r));
  float* dl = static_cast<float*>(dlogits.data);
  const float* dw = static_cast<const float*>(dweight.data);
  const float* sc = static_cast<const float*>(scores.data);
  const std::int32_t* ex = static_cast<const std::int32_t*>(expert.data);
  const float* l = static_cast<const float*>(logits.data);
  const float* aux = aux_grad.empty() ? nullptr : static_cast<const float*>(aux_grad.data);
  // The ids index the scores and ds: one outside [0, E) would read and write out of bounds.
  for (std::int64_t t = 0; t < N; ++t)
    for (std::int64_t j = 0; j < k; ++j)
      if (ex[t * k + j] < 0 || ex[t * k + j] >= E) fail("{}: token {} choice {} names expert {}, outside [0, {})", op, t, j, ex[t * k + j], E);
#pragma omp parallel if (cpu::parallel_worth(N * E * 8))
  {
    std::vector<double> ds(static_cast<std::size_t>(E)), p(static_cast<std::size_t>(E));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < N; ++t) {
      std::fill(ds.begin(), ds.end(), 0.0);
      const float* st = sc + t * E;
      const std::int32_t* et = ex + t * k;
      // weights w_j = scale · s_j / D (D = Σ_i s_i (+1e-20)), or scale · s_j
      if (r.renormalize) {
        double D = r.sigmoid ? 1e-20 : 0.0, dot = 0.0;
        for (std::int64_t j = 0; j < k; ++j) D += st[et[j]];
        for (std::int64_t j = 0; j < k; ++j) dot += static_cast<double>(dw[t * k + j]) * st[et[j]];
        for (std::int64_t j = 0; j < k; ++j) ds[static_cast<std::size_t>(et[j])] += r.scale * (dw[t * k + j] / D - dot / (D * D));
      } else {
        for (std::int64_t j = 0; j < k; ++j) ds[static_cast<std::size_t>(et[j])] += static_cast<double>(r.scale) * dw[t * k + j];
      }
      float* dlt = dl + t * E;
      if (r.sigmoid) {
        for (std::int64_t e = 0; e < E; ++e) {
          const double s = st[e];
          dlt[e] = static_cast<float>(ds[static_cast<std::size_t>(e)] * s * (1.0 - s));
        }
      } else {
        double dot = 0.0;
        for (std::int64_t e = 0; e < E; ++e) dot += ds[static_cast<std::size_t>(e)] * st[e];
        for (std::int64_t e = 0; e < E; ++e) dlt[e] = static_cast<float>(st[e] * (ds[static_cast<std::size_t>(e)] - dot));
      }
      if (aux != nullptr) {  // + d/dlogits of Σ_e aux[e]·softmax(logits)[e]
        softmax_row(l + t * E, p.data(), E);
        double dot = 0.0;
        for (std::int64_t e = 0; e < E; ++e) dot += static_cast<double>(aux[e]) * p[static_cast<std::size_t>(e)];
        for (std::int64_t e = 0; e < E; ++e) dlt[e] += static_cast<float>(p[static_cast<std::size_t>(e)] * (aux[e] - dot));
      }
    }
  }
}

void moe_aux_stats(Tensor assigned, Tensor prob_sum, Tensor logits, std::int64_t top_k) {
  const char* op = "moe_aux_stats";
  const bool gpu = cpu::on_cuda(op, {{"assigned", assigned}, {"prob_sum", prob_sum}, {"logits", logits}});
  require_rank(op, {"logits", logits}, 2, "(N, E)");
  require_dtype(op, {"logits", logits}, DType::fp32);
  const std::int64_t N = logits.shape[0], E = logits.shape[1];
  if (top_k < 1 || top_k > E) fail("{}: top_k = {} must be between 1 and the {} experts", op, top_k, E);
  for (const Arg& a : {Arg{"assigned", assigned}, Arg{"prob_sum", prob_sum}}) {
    require_dtype(op, a, DType::fp64);
    require_shape(op, a, Shape{E}, "(E)");
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_aux_stats(assigned, prob_sum, logits, top_k));
  double* as = static_cast<double*>(assigned.data);
  double* ps = static_cast<double*>(prob_sum.data);
  std::fill(as, as + E, 0.0);
  std::fill(ps, ps + E, 0.0);
  std::vector<double> p(static_cast<std::size_t>(E));
  std::vector<std::int64_t> idx;
  for (std::int64_t t = 0; t < N; ++t) {  // in token order: the sums do not depend on threads
    softmax_row(static_cast<const float*>(logits.data) + t * E, p.data(), E);
    for (std::int64_t e = 0; e < E; ++e) ps[e] += p[static_cast<std::size_t>(e)];
    best_k(p.data(), E, top_k, idx);
    for (std::int64_t e : idx) as[e] += 1.0;
  }
}

void moe_dispatch_plan(Tensor slot_assignment, Tensor slot_of, Tensor counts, Tensor expert, std::int64_t capacity) {
  const char* op = "moe_dispatch_plan";
  const bool gpu = cpu::on_cuda(op, {{"slot_assignment", slot_assignment}, {"slot_of", slot_of}, {"counts", counts}, {"expert", expert}});
  require_rank(op, {"expert", expert}, 2, "(N, top_k)");
  require_rank(op, {"counts", counts}, 1, "(E)");
  const std::int64_t N = expert.shape[0], k = expert.shape[1], E = counts.shape[0];
  for (const Arg& a : {Arg{"slot_assignment", slot_assignment}, Arg{"slot_of", slot_of}, Arg{"counts", counts}, Arg{"expert", expert}})
    require_dtype(op, a, DType::int32);
  require_shape(op, {"slot_assignment", slot_assignment}, Shape{N * k}, "(N·top_k)");
  require_shape(op, {"slot_of", slot_of}, Shape{N * k}, "(N·top_k)");
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_dispatch_plan(slot_assignment, slot_of, counts, expert, capacity));
  const std::int32_t* ex = static_cast<const std::int32_t*>(expert.data);
  std::int32_t* sa = static_cast<std::int32_t*>(slot_assignment.data);
  std::int32_t* so = static_cast<std::int32_t*>(slot_of.data);
  std::int32_t* cn = static_cast<std::int32_t*>(counts.data);
  std::fill(cn, cn + E, 0);
  // Pass 1: how many each expert keeps, in slot order (choice j, then token t).
  for (std::int64_t j = 0; j < k; ++j)
    for (std::int64_t t = 0; t < N; ++t) {
      const std::int32_t e = ex[t * k + j];
      if (e < 0 || e >= E) fail("{}: token {} choice {} names expert {}, outside [0, {})", op, t, j, e, E);
      if (capacity < 0 || cn[e] < capacity) ++cn[e];
    }
  std::vector<std::int64_t> next(static_cast<std::size_t>(E));
  std::int64_t total = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    next[static_cast<std::size_t>(e)] = total;
    total += cn[e];
  }
  std::fill(sa, sa + N * k, -1);
  std::vector<std::int64_t> taken(static_cast<std::size_t>(E), 0);
  for (std::int64_t j = 0; j < k; ++j)
    for (std::int64_t t = 0; t < N; ++t) {
      const std::int64_t a = t * k + j;
      const std::int32_t e = ex[a];
      if (taken[static_cast<std::size_t>(e)] < cn[e]) {
        const std::int64_t s = next[static_cast<std::size_t>(e)] + taken[static_cast<std::size_t>(e)]++;
        sa[s] = static_cast<std::int32_t>(a);
        so[a] = static_cast<std::int32_t>(s);
      } else {
        so[a] = -1;
      }
    }
}

void moe_gather_rows(Tensor rows, Tensor x, Tensor slot_assignment, std::int64_t k, std::int64_t slots) {
  const char* op = "moe_gather_rows";
  const bool gpu = cpu::on_cuda(op, {{"rows", rows}, {"x", x}, {"slot_assignment", slot_assignment}});
  require_rank(op, {"x", x}, 2, "(N, C)");
  require_rank(op, {"rows", rows}, 2, "(slots, C)");
  require_same_dtype(op, {{"rows", rows}, {"x", x}});
  require_dtype(op, {"slot_assignment", slot_assignment}, DType::int32);
  const std::int64_t N = x.shape[0], C = x.shape[1];
  if (rows.shape[1] != C || slots < 0 || slots > rows.shape[0] || slots > slot_assignment.numel() || k < 1)
    fail("{}: {} slots of width {} do not fit rows {} / slot_assignment {} (k = {})", op, slots, C, rows.str(), slot_assignment.str(), k);
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_gather_rows(rows, x, slot_assignment, k, slots));
  const std::int32_t* sa = static_cast<const std::int32_t*>(slot_assignment.data);
  const std::size_t row_bytes = static_cast<std::size_t>(C) * dtype_size(x.dtype);
  for (std::int64_t s = 0; s < slots; ++s)
    if (sa[s] < 0 || sa[s] / k >= N) fail("{}: slot {} holds assignment {}, not one of the {} tokens' x {}", op, s, sa[s], N, k);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(slots * C))
  for (std::int64_t s = 0; s < slots; ++s)
    std::copy_n(static_cast<const char*>(x.data) + static_cast<std::size_t>(sa[s] / k) * row_bytes, row_bytes,
                static_cast<char*>(rows.data) + static_cast<std::size_t>(s) * row_bytes);
}

namespace {

void check_combine(const char* op, const Tensor& out, const Tensor& rows, const Tensor& slot_of, const Tensor& weight, std::int64_t k) {
  require_rank(op, {"out", out}, 2, "(N, C)");
  require_rank(op, {"rows", rows}, 2, "(slots, C)");
  require_same_dtype(op, {{"out", out}, {"rows", rows}});
  require_dtype(op, {"slot_of", slot_of}, DType::int32);
  const std::int64_t N = out.shape[0];
  if (k < 1 || rows.shape[1] != out.shape[1]) fail("{}: rows {} and out {} differ in width (k = {})", op, rows.str(), out.str(), k);
  require_shape(op, {"slot_of", slot_of}, Shape{N * k}, "(N·k)");
  if (!weight.empty()) {
    require_dtype(op, {"weight", weight}, DType::fp32);
    require_shape(op, {"weight", weight}, Shape{N, k}, "(N, k)");
  }
}

}  // namespace

void moe_combine(Tensor out, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k) {
  const char* op = "moe_combine";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"rows", rows}, {"slot_of", slot_of}, {"weight", weight}});
  check_combine(op, out, rows, slot_of, weight, k);
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_combine(out, rows, slot_of, weight, k));
  const std::int64_t N = out.shape[0], C = out.shape[1], R = rows.shape[0];
  const std::int32_t* so = static_cast<const std::int32_t*>(slot_of.data);
  for (std::int64_t a = 0; a < N * k; ++a)
    if (so[a] >= R) fail("{}: assignment {} names slot {}, beyond the {} rows", op, a, so[a], R);
  const float* w = weight.empty() ? nullptr : static_cast<const float*>(weight.data);
  cpu::dispatch_float(op, out.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* o = static_cast<T*>(out.data);
    const T* y = static_cast<const T*>(rows.data);
#pragma omp parallel if (cpu::parallel_worth(N * k * C))
    {
      std::vector<float> acc(static_cast<std::size_t>(C));
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < N; ++t) {
        for (std::int64_t c = 0; c < C; ++c) acc[static_cast<std::size_t>(c)] = cpu::load(o[t * C + c]);
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int32_t s = so[t * k + j];
          if (s < 0) continue;
          const float wj = w != nullptr ? w[t * k + j] : 1.0f;
          for (std::int64_t c = 0; c < C; ++c) acc[static_cast<std::size_t>(c)] += wj * cpu::load(y[s * C + c]);
        }
        for (std::int64_t c = 0; c < C; ++c) o[t * C + c] = cpu::store<T>(acc[static_cast<std::size_t>(c)]);
      }
    }
  });
}

void moe_combine_backward(Tensor drows, Tensor dweight, Tensor dout, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k) {
  const char* op = "moe_combine_backward";
  const bool gpu = cpu::on_cuda(op, {{"drows", drows}, {"dweight", dweight}, {"dout", dout}, {"rows", rows}, {"slot_of", slot_of}, {"weight", weight}});
  check_combine(op, dout, rows, slot_of, weight, k);
  require_present(op, {"weight", weight});
  require_same_dtype(op, {{"drows", drows}, {"rows", rows}});
  require_shape(op, {"drows", drows}, rows.shape, "(the shape of rows)");
  require_dtype(op, {"dweight", dweight}, DType::fp32);
  require_shape(op, {"dweight", dweight}, weight.shape, "(N, k)");
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_combine_backward(drows, dweight, dout, rows, slot_of, weight, k));
  const std::int64_t N = dout.shape[0], C = dout.shape[1], R = rows.shape[0];
  const std::int32_t* so = static_cast<const std::int32_t*>(slot_of.data);
  for (std::int64_t a = 0; a < N * k; ++a)
    if (so[a] >= R) fail("{}: assignment {} names slot {}, beyond the {} rows", op, a, so[a], R);
  const float* w = static_cast<const float*>(weight.data);
  float* dw = static_cast<float*>(dweight.data);
  cpu::dispatch_float(op, dout.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* d = static_cast<const T*>(dout.data);
    const T* y = static_cast<const T*>(rows.data);
    T* dy = static_cast<T*>(drows.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(N * k * C))
    for (std::int64_t t = 0; t < N; ++t) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t s = so[t * k + j];
        if (s < 0) {
          dw[t * k + j] = 0.0f;
          continue;
        }
        const float wj = w[t * k + j];
        double dot = 0.0;
        for (std::int64_t c = 0; c < C; ++c) {
          const float g = cpu::load(d[t * C + c]);
          dot += static_cast<double>(g) * cpu::load(y[s * C + c]);
          dy[s * C + c] = cpu::store<T>(wj * g);
        }
        dw[t * k + j] = static_cast<float>(dot);
      }
    }
  });
}

void moe_gated_add_forward(Tensor out, Tensor y, Tensor logit) {
  const char* op = "moe_gated_add_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"y", y}, {"logit", logit}});
  require_rank(op, {"out", out}, 2, "(N, C)");
  require_shape(op, {"y", y}, out.shape, "(the shape of out)");
  require_shape(op, {"logit", logit}, Shape{out.shape[0]}, "(N)");
  require_same_dtype(op, {{"out", out}, {"y", y}, {"logit", logit}});
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_gated_add_forward(out, y, logit));
  const std::int64_t N = out.shape[0], C = out.shape[1];
  cpu::dispatch_float(op, out.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* o = static_cast<T*>(out.data);
    const T* v = static_cast<const T*>(y.data);
    const T* g = static_cast<const T*>(logit.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(N * C))
    for (std::int64_t t = 0; t < N; ++t) {
      const float s = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(cpu::load(g[t])))));
      for (std::int64_t c = 0; c < C; ++c) o[t * C + c] = cpu::store<T>(cpu::load(o[t * C + c]) + s * cpu::load(v[t * C + c]));
    }
  });
}

void moe_gated_add_backward(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit) {
  const char* op = "moe_gated_add_backward";
  const bool gpu = cpu::on_cuda(op, {{"dy", dy}, {"dlogit", dlogit}, {"dout", dout}, {"y", y}, {"logit", logit}});
  require_rank(op, {"dout", dout}, 2, "(N, C)");
  for (const Arg& a : {Arg{"dy", dy}, Arg{"y", y}}) require_shape(op, a, dout.shape, "(the shape of dout)");
  for (const Arg& a : {Arg{"dlogit", dlogit}, Arg{"logit", logit}}) require_shape(op, a, Shape{dout.shape[0]}, "(N)");
  require_same_dtype(op, {{"dy", dy}, {"dlogit", dlogit}, {"dout", dout}, {"y", y}, {"logit", logit}});
  DSTRAIN_RETURN_ON_CUDA(gpu, moe_gated_add_backward(dy, dlogit, dout, y, logit));
  const std::int64_t N = dout.shape[0], C = dout.shape[1];
  cpu::dispatch_float(op, dout.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* o = static_cast<T*>(dy.data);
    T* dg = static_cast<T*>(dlogit.data);
    const T* d = static_cast<const T*>(dout.data);
    const T* v = static_cast<const T*>(y.data);
    const T* g = static_cast<const T*>(logit.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(N * C))
    for (std::int64_t t = 0; t < N; ++t) {
      const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(cpu::load(g[t]))));
      double dot = 0.0;
      for (std::int64_t c = 0; c < C; ++c) {
        const float gc = cpu::load(d[t * C + c]);
        dot += static_cast<double>(gc) * cpu::load(v[t * C + c]);
        o[t * C + c] = cpu::store<T>(static_cast<float>(s) * gc);
      }
      dg[t] = cpu::store<T>(static_cast<float>(dot * s * (1.0 - s)));
    }
  });
}

}  // namespace dstrain
