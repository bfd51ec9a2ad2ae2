// A sparse decoder layer (LlamaBlock with a mixture-of-experts feed-forward) under expert
// parallelism, on EP = 2 and 4 local thread ranks, each with its own tokens x_r, against the whole
// layer (EP = 1, the same whole weights) run on each x_r on its own: the same outputs, input
// gradients and non-expert (router, attention, norm) gradients per rank, and each rank's expert
// weight gradients equal to (1/EP) · Σ_r of the whole layer's gradients of those experts (the 1/EP
// of models/expert_parallel.h). fp32 (within the GEMMs' reduction order) and bf16 (a bound derived
// from bf16's rounding), dropless and with a capacity that drops assignments, a skewed router (every
// token to the lowest experts: the other ranks' experts receive nothing and get exactly zero
// gradient), the load-balancing loss's term. Then the refusals: a layer run without its group or in
// a group of another size, and Architecture::check_expert_parallel's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/expert_parallel.h"
#include "models/llama/llama_config.h"
#include "models/llama/llama_family.h"
#include "models/llama/llama_layers.h"
#include "models/model.h"
#include "models/model_registry.h"
#include "models/param_split.h"
#include "models/tensor_parallel.h"
#include "models/moe_stats.h"
#include "ops/dtype.h"
#include "ops/error.h"
#include "zero/local_communicator.h"

namespace dstrain {
namespace {

constexpr std::int64_t B = 2, T = 8, C = 32, E = 8;

// An ExpertParallelGroup over a Communicator, as the engine provides one (a test-local copy: the
// models library does not link zero/).
class CommExpertGroup final : public ExpertParallelGroup {
 public:
  explicit CommExpertGroup(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.world_size(); }
  std::vector<std::int64_t> exchange_counts(std::span<const std::int64_t> send_counts, std::int64_t n) override {
    const int W = size();
    std::vector<std::int64_t> out(static_cast<std::size_t>(W * n));
    for (std::int64_t q = 0; q < n; ++q) {
      std::vector<std::int64_t> column(static_cast<std::size_t>(W));
      for (int j = 0; j < W; ++j) column[static_cast<std::size_t>(j)] = send_counts[static_cast<std::size_t>(j * n + q)];
      const std::vector<std::int64_t> got = c_.exchange_counts(column);
      for (int i = 0; i < W; ++i) out[static_cast<std::size_t>(i * n + q)] = got[static_cast<std::size_t>(i)];
    }
    return out;
  }
  void all_to_all_v(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv, std::span<const std::int64_t> recv_counts) override {
    c_.all_to_all_v(send, send_counts, recv, recv_counts);
  }

 private:
  Communicator& c_;
};

// A TensorParallelGroup over a Communicator (as engine/tensor_parallel.h's, test-local).
class CommTensorGroup final : public TensorParallelGroup {
 public:
  explicit CommTensorGroup(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.world_size(); }
  void sum(Tensor buf) override { c_.all_reduce(buf, ReduceOp::sum); }
  void max(Tensor buf) override { c_.all_reduce(buf, ReduceOp::max); }
  void all_gather(Tensor local, Tensor whole) override { c_.all_gather(local, whole); }
  void reduce_scatter(Tensor whole, Tensor local) override { c_.reduce_scatter(whole, local, ReduceOp::sum); }

 private:
  Communicator& c_;
};

// A group that is not the one the layer was built for.
class FakeGroup final : public ExpertParallelGroup {
 public:
  FakeGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::int64_t> exchange_counts(std::span<const std::int64_t>, std::int64_t) override { fail("FakeGroup: no exchange"); }
  void all_to_all_v(Tensor, std::span<const std::int64_t>, Tensor, std::span<const std::int64_t>) override { fail("FakeGroup: no exchange"); }

 private:
  int rank_, size_;
};

struct Case {
  DType dtype = DType::fp32;
  int ep = 2;
  std::int64_t top_k = 2;
  double capacity_factor = 0.0;  // > 0: DeepSpeed's capacity (min_capacity 1), drops assignments
  bool skewed = false;           // router weights 0: every token to experts 0 .. k-1
  bool aux = false;              // the load-balancing loss in the objective
  bool drop_tokens = true;       // DeepSpeed's drop_tokens: false keeps every assignment whatever the capacity factor
  std::string name() const {
    return std::string(dtype_name(dtype)) + " EP" + std::to_string(ep) + " k" + std::to_string(top_k) + (capacity_factor > 0 ? " capacity" : "") +
           (drop_tokens ? "" : " nodrop") + (skewed ? " skewed" : "") + (aux ? " aux" : "");
  }
};

LlamaConfig config_of(const Case& c) {
  LlamaConfig cfg = llama_config_from_spec("llama:L1-C32-H2-I24-V61-T8");
  cfg.model_type = "mixtral";
  cfg.moe.num_experts = E;
  cfg.moe.top_k = c.top_k;
  cfg.moe.expert_intermediate_size = 24;
  cfg.moe.norm_topk_prob = true;
  if (c.capacity_factor > 0) {
    cfg.moe.capacity_factor = c.capacity_factor;
    cfg.moe.min_capacity = 1;
  }
  cfg.moe.drop_tokens = c.drop_tokens;
  if (c.aux) {
    cfg.moe.router_aux_loss_coef = 0.3;
    cfg.moe.output_router_logits = true;
  }
  return cfg;
}

// Host memory for a list of tensors (8-byte aligned: some scratch is fp64).
struct Tensors {
  std::vector<std::vector<double>> mem;
  std::vector<Tensor> t;
  void add(const Shape& shape, DType dtype) {
    const std::size_t bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
    mem.emplace_back(bytes / 8 + 1, 0.0);
    t.emplace_back(mem.back().data(), dtype, shape);
  }
};

Tensors alloc(const std::vector<ActivationSpec>& specs) {
  Tensors out;
  out.mem.reserve(specs.size());
  for (const ActivationSpec& s : specs) out.add(s.shape, s.dtype);
  return out;
}

Tensors alloc_params(const std::vector<ParamSpec>& specs, DType dtype) {
  Tensors out;
  out.mem.reserve(specs.size());
  for (const ParamSpec& s : specs) out.add(s.shape, dtype);
  return out;
}

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<float> f(static_cast<std::size_t>(t.numel()));
  convert(t.data, t.dtype, f.data(), DType::fp32, f.size());
  return {f.begin(), f.end()};
}

void from_doubles(const Tensor& t, const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  convert(f.data(), DType::fp32, t.data, t.dtype, f.size());
}

bool is_expert(const std::string& name) { return name.find("mlp.experts.") != std::string::npos; }

// What one rank's layer gives for its tokens.
struct Result {
  std::vector<double> out, dx;
  std::vector<std::vector<double>> grads;  // in params() order
  std::int64_t dropped = 0;                // assignments a capacity dropped
};

// Forward and backward of `layer` on x with d(out) = dout; `params` as the layer's specs.
Result run_layer(LlamaBlock& layer, const Tensors& params, const std::vector<double>& x, const std::vector<double>& dout, DType S,
                 ExpertParallelGroup* group, TensorParallelGroup* tp = nullptr) {
  const LayerDims dims{B, T, S};
  const std::vector<ParamSpec> specs = layer.params();
  Tensors grads = alloc_params(specs, S);
  Tensors saved = alloc(layer.saved_activations(dims));
  Tensors scratch = alloc(layer.scratch(dims));
  Tensors io;
  io.add(Shape{B, T, C}, S);  // input
  io.add(Shape{B, T, C}, S);  // output
  io.add(Shape{B, T, C}, S);  // d(output)
  io.add(Shape{B, T, C}, S);  // d(input)
  from_doubles(io.t[0], x);
  from_doubles(io.t[2], dout);
  MoeStats stats;
  stats.begin();
  ForwardArgs f;
  f.dims = dims;
  f.input = io.t[0];
  f.output = io.t[1];
  f.params = params.t;
  f.saved = saved.t;
  f.scratch = scratch.t;
  f.moe = &stats;  // the aux loss's term only where the config asks for it
  f.expert_parallel = group;
  f.tensor_parallel = tp;
  layer.forward(f);
  BackwardArgs b;
  b.dims = dims;
  b.input = io.t[0];
  b.output = io.t[1];
  b.dout = io.t[2];
  b.dinput = io.t[3];
  b.params = params.t;
  b.grads = grads.t;
  b.saved = saved.t;
  b.scratch = scratch.t;
  b.moe = &stats;
  b.expert_parallel = group;
  b.tensor_parallel = tp;
  layer.backward(b);
  Result r;
  r.out = to_doubles(io.t[1]);
  r.dx = to_doubles(io.t[3]);
  for (const Tensor& g : grads.t) r.grads.push_back(to_doubles(g));
  r.dropped = stats.take_report().dropped;
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Bounds: fp32 within the GEMMs' reduction order; bf16 from its unit roundoff u = 2^-9 (the EP
// rows run through the same GEMMs as the whole layer's; an expert gradient is one rounding of the
// sum over every rank's rows against the whole layer's EP roundings, summed: EP + 1 roundings).
struct Bounds {
  double act;   // out, dx, non-expert grads: relative to the tensor's largest magnitude
  double grad;  // expert grads, per rank summed
};
Bounds bounds_of(const Case& c) {
  if (c.dtype == DType::fp32) return {2e-6, 1e-5};
  const double u = std::ldexp(1.0, -9);
  return {4 * u, (c.ep + 1) * 2 * u};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = rel * std::max(max_abs(want), 1e-30);
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " got " << got[at] << " want " << want[at] << " (max |want| " << max_abs(want) << ")";
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const LlamaConfig cfg = config_of(c);
  const DType S = c.dtype;
  const int W = c.ep;
  // The whole layer and its weights.
  LlamaBlock whole(cfg, 0);
  const std::vector<ParamSpec> whole_specs = whole.params();
  Tensors whole_params = alloc_params(whole_specs, S);
  std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(W));
  for (std::size_t i = 0; i < whole_specs.size(); ++i) {
    const ParamSpec& s = whole_specs[i];
    std::vector<double> v(static_cast<std::size_t>(s.shape.numel()));
    const bool norm = s.name.find("norm") != std::string::npos;
    std::normal_distribution<double> d(norm ? 1.0 : 0.0, norm ? 0.2 : 1.0 / std::sqrt(static_cast<double>(s.shape[s.shape.rank - 1])));
    for (double& e : v) e = d(rng);
    if (c.skewed && s.name.ends_with("mlp.gate.weight")) std::fill(v.begin(), v.end(), 0.0);
    from_doubles(whole_params.t[i], v);
  }
  std::vector<std::vector<double>> xs(static_cast<std::size_t>(W)), douts(static_cast<std::size_t>(W));
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int r = 0; r < W; ++r) {
    for (std::int64_t i = 0; i < B * T * C; ++i) xs[static_cast<std::size_t>(r)].push_back(nd(rng));
    for (std::int64_t i = 0; i < B * T * C; ++i) douts[static_cast<std::size_t>(r)].push_back(nd(rng));
  }
  // The reference: the whole layer on each rank's tokens.
  std::vector<Result> ref;
  for (int r = 0; r < W; ++r) ref.push_back(run_layer(whole, whole_params, xs[static_cast<std::size_t>(r)], douts[static_cast<std::size_t>(r)], S, nullptr));
  // Expert parallelism on W thread ranks.
  std::vector<Result> got(static_cast<std::size_t>(W));
  std::vector<std::vector<ParamSpec>> ep_specs(static_cast<std::size_t>(W));
  run_local_ranks(W, [&](Communicator& comm) {
    const int r = comm.rank();
    LlamaBlock layer(cfg, 0, {}, {}, ExpertParallelRank{r, W});
    const std::vector<ParamSpec> specs = layer.params();
    ep_specs[static_cast<std::size_t>(r)] = specs;
    Tensors params = alloc_params(specs, S);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      // This rank's experts are a contiguous block of the whole stack (dim 0).
      const Tensor& w = whole_params.t[i];
      const std::size_t bytes = params.t[i].nbytes();
      const std::size_t offset = specs[i].is_piece() ? static_cast<std::size_t>(r) * bytes : 0;
      std::memcpy(params.t[i].data, static_cast<const char*>(w.data) + offset, bytes);
    }
    CommExpertGroup group(comm);
    got[static_cast<std::size_t>(r)] = run_layer(layer, params, xs[static_cast<std::size_t>(r)], douts[static_cast<std::size_t>(r)], S, &group);
  });
  const Bounds bd = bounds_of(c);
  for (int r = 0; r < W; ++r) {
    const std::string rank = "rank " + std::to_string(r);
    const Result& g = got[static_cast<std::size_t>(r)];
    const Result& w = ref[static_cast<std::size_t>(r)];
    // Each rank drops by its own tokens (DeepSpeed's capacity from the local gates): as the whole layer.
    EXPECT_EQ(g.dropped, w.dropped) << rank;
    if (c.capacity_factor > 0 && c.drop_tokens) {
      EXPECT_GT(w.dropped, 0) << rank << ": the capacity drops assignments";
    } else {
      EXPECT_EQ(g.dropped, 0) << rank << ": nothing is dropped";
    }
    expect_close(g.out, w.out, bd.act, rank + " output");
    expect_close(g.dx, w.dx, bd.act, rank + " d(input)");
    const std::vector<ParamSpec>& specs = ep_specs[static_cast<std::size_t>(r)];
    ASSERT_EQ(specs.size(), whole_specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& s = specs[i];
      if (!is_expert(s.name)) {
        EXPECT_FALSE(s.is_piece()) << s.name;
        expect_close(g.grads[i], w.grads[i], bd.act, rank + " " + s.name);
        continue;
      }
      // The piece: E/EP whole experts, rank r's, of the whole stack.
      ASSERT_TRUE(s.is_piece()) << s.name;
      EXPECT_EQ(s.piece.whole, whole_specs[i].shape) << s.name;
      EXPECT_EQ(s.piece.rank, r);
      EXPECT_EQ(s.piece.ranks, W);
      EXPECT_EQ(s.shape[0], E / W) << s.name;
      const std::size_t n = g.grads[i].size(), first = static_cast<std::size_t>(r) * n;
      std::vector<double> want(n, 0.0), summands;
      for (int q = 0; q < W; ++q)
        for (std::size_t k = 0; k < n; ++k) want[k] += ref[static_cast<std::size_t>(q)].grads[i][first + k] / W;
      for (int q = 0; q < W; ++q) summands.push_back(max_abs(ref[static_cast<std::size_t>(q)].grads[i]));
      // Relative to the summands' magnitude (a sum may cancel).
      const double scale = *std::max_element(summands.begin(), summands.end());
      double worst = 0;
      for (std::size_t k = 0; k < n; ++k) worst = std::max(worst, std::fabs(g.grads[i][k] - want[k]));
      EXPECT_LE(worst, bd.grad * std::max(scale, 1e-30)) << rank << " " << s.name << " (scale " << scale << ")";
      // An expert no rank sent a token to: exactly zero.
      const std::size_t per = n / static_cast<std::size_t>(E / W);
      for (std::size_t e = 0; e < n / per; ++e) {
        bool idle = true;
        for (std::size_t k = e * per; k < (e + 1) * per; ++k) idle = idle && want[k] == 0.0;
        if (!idle) continue;
        for (std::size_t k = e * per; k < (e + 1) * per; ++k)
          ASSERT_EQ(g.grads[i][k], 0.0) << rank << " " << s.name << " local expert " << e << " received no token";
      }
    }
  }
  if (c.skewed) {
    // Every token went to experts 0 .. k-1, all on rank 0: the others' expert gradients are zero.
    for (int r = 1; r < W; ++r)
      for (std::size_t i = 0; i < ep_specs[static_cast<std::size_t>(r)].size(); ++i) {
        if (is_expert(ep_specs[static_cast<std::size_t>(r)][i].name)) {
          EXPECT_EQ(max_abs(got[static_cast<std::size_t>(r)].grads[i]), 0.0) << "rank " << r << " " << ep_specs[static_cast<std::size_t>(r)][i].name;
        }
      }
    for (std::size_t i = 0; i < ep_specs[0].size(); ++i) {
      if (is_expert(ep_specs[0][i].name)) {
        EXPECT_GT(max_abs(got[0].grads[i]), 0.0) << ep_specs[0][i].name;
      }
    }
  }
}

TEST(MoeExpertParallel, Fp32DroplessMatchesTheWholeLayerPerRank) {
  for (const int ep : {2, 4}) check_case({DType::fp32, ep, 2, 0.0, false, false});
}

TEST(MoeExpertParallel, Fp32TopOneAndTheLoadBalancingLoss) {
  check_case({DType::fp32, 2, 1, 0.0, false, true});
  check_case({DType::fp32, 4, 2, 0.0, false, true});
}

TEST(MoeExpertParallel, Fp32CapacityDropsAsEachRanksOwnTokensDecide) {
  for (const int ep : {2, 4}) check_case({DType::fp32, ep, 2, 0.5, false, false});
}

// DeepSpeed's drop_tokens false (deepspeed/moe/sharded_moe.py: the capacity becomes the largest
// expert's count, so nothing is dropped): the same weights and tokens through the layer with a
// capacity factor of 0.5 drop assignments with drop_tokens, none without it — its outputs and
// gradients then the dropless layer's, bit for bit — and under expert parallelism as well.
TEST(MoeExpertParallel, DropTokensFalseDropsNothingWhateverTheCapacityFactor) {
  const auto run = [](const Case& c) {
    LlamaBlock layer(config_of(c), 0);
    const std::vector<ParamSpec> specs = layer.params();
    Tensors params = alloc_params(specs, c.dtype);
    std::mt19937_64 rng(77);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      std::vector<double> v(static_cast<std::size_t>(specs[i].shape.numel()));
      for (double& e : v) e = specs[i].name.find("norm") != std::string::npos ? 1.0 : 0.3 * nd(rng);
      from_doubles(params.t[i], v);
    }
    std::vector<double> x, dout;
    for (std::int64_t i = 0; i < B * T * C; ++i) x.push_back(nd(rng));
    for (std::int64_t i = 0; i < B * T * C; ++i) dout.push_back(nd(rng));
    return run_layer(layer, params, x, dout, c.dtype, nullptr);
  };
  const Case dropping{DType::fp32, 1, 2, 0.5};
  Case keeping = dropping;
  keeping.drop_tokens = false;
  const Result dropped = run(dropping), kept = run(keeping), dropless = run(Case{DType::fp32, 1, 2, 0.0});
  EXPECT_GT(dropped.dropped, 0);
  EXPECT_EQ(kept.dropped, 0);
  EXPECT_EQ(kept.out, dropless.out);
  EXPECT_EQ(kept.dx, dropless.dx);
  EXPECT_EQ(kept.grads, dropless.grads);
  EXPECT_NE(dropped.out, dropless.out);
  for (const int ep : {2, 4}) check_case({DType::fp32, ep, 2, 0.5, false, false, false});
}

TEST(MoeExpertParallel, SkewedRouterSendsEverythingToOneRankAndTheOthersReceiveNothing) {
  for (const int ep : {2, 4})
    for (const std::int64_t k : {1, 2}) check_case({DType::fp32, ep, k, 0.0, true, false});
  check_case({DType::fp32, 4, 2, 0.5, true, false});  // the capacity bounds what rank 0 receives
}

TEST(MoeExpertParallel, Bf16WithinItsRounding) {
  for (const int ep : {2, 4}) check_case({DType::bf16, ep, 2, 0.0, false, false});
  check_case({DType::bf16, 2, 2, 0.5, false, true});
  check_case({DType::bf16, 4, 2, 0.0, true, false});
}

TEST(MoeExpertParallel, TheReceiveBuffersHoldTheWorstCase) {
  const LlamaConfig dropless = config_of({DType::fp32, 4, 2, 0.0, false, false});
  const LlamaConfig capped = config_of({DType::fp32, 4, 2, 0.5, false, false});
  const LayerDims dims{B, T, DType::fp32};
  const auto rows_of = [&](const LlamaConfig& cfg, ExpertParallelRank ep, const char* name) -> std::int64_t {
    LlamaBlock layer(cfg, 0, {}, {}, ep);
    std::vector<ActivationSpec> all = layer.saved_activations(dims);
    for (const ActivationSpec& s : layer.scratch(dims)) all.push_back(s);
    for (const ActivationSpec& s : all)
      if (s.name == name) return s.shape[0];
    ADD_FAILURE() << name << " not declared";
    return -1;
  };
  const std::int64_t M = B * T * 2;
  EXPECT_EQ(rows_of(dropless, {}, "moe_xg"), M);
  EXPECT_EQ(rows_of(dropless, {}, "moe_ep_recv"), 0);
  EXPECT_EQ(rows_of(dropless, {1, 4}, "moe_xg"), 4 * M);  // every peer may route everything here
  EXPECT_EQ(rows_of(dropless, {1, 4}, "moe_ep_recv"), 4 * M);
  EXPECT_EQ(rows_of(dropless, {1, 4}, "moe_ep_send"), M);
  EXPECT_EQ(rows_of(dropless, {1, 4}, "moe_y"), M);
  // capacity max(1, ceil(2·16·0.5/8)) = 2 per expert and source: at most E·2 rows arrive
  EXPECT_EQ(rows_of(capped, {1, 4}, "moe_xg"), E * 2);
  EXPECT_EQ(rows_of(capped, {1, 4}, "moe_gate"), E * 2);
  // drop_tokens false: the capacity no longer bounds anything, the dropless worst case again.
  const LlamaConfig kept = config_of({DType::fp32, 4, 2, 0.5, false, false, false});
  EXPECT_EQ(rows_of(kept, {1, 4}, "moe_xg"), 4 * M);
}

// Tensor parallelism and expert parallelism compose: 4 thread ranks, TP 2 (the attention cut, the
// experts whole per TP rank) x EP 2 (the two data-parallel ranks of each TP rank form its EP
// group); each TP rank exchanges within its own EP group. Against the whole layer per data rank.
TEST(MoeExpertParallel, ComposesWithTensorParallelism) {
  const LlamaConfig cfg = config_of({DType::fp32, 2, 2, 0.0, false, false});
  const DType S = DType::fp32;
  LlamaBlock whole(cfg, 0);
  const std::vector<ParamSpec> whole_specs = whole.params();
  Tensors whole_params = alloc_params(whole_specs, S);
  std::mt19937_64 rng(99);
  for (std::size_t i = 0; i < whole_specs.size(); ++i) {
    const ParamSpec& s = whole_specs[i];
    const bool norm = s.name.find("norm") != std::string::npos;
    std::normal_distribution<double> d(norm ? 1.0 : 0.0, norm ? 0.2 : 1.0 / std::sqrt(static_cast<double>(s.shape[s.shape.rank - 1])));
    std::vector<double> v(static_cast<std::size_t>(s.shape.numel()));
    for (double& e : v) e = d(rng);
    from_doubles(whole_params.t[i], v);
  }
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<std::vector<double>> xs(2), douts(2);
  for (int d = 0; d < 2; ++d)
    for (std::int64_t i = 0; i < B * T * C; ++i) {
      xs[static_cast<std::size_t>(d)].push_back(nd(rng));
      douts[static_cast<std::size_t>(d)].push_back(nd(rng));
    }
  std::vector<Result> ref;
  for (int d = 0; d < 2; ++d) ref.push_back(run_layer(whole, whole_params, xs[static_cast<std::size_t>(d)], douts[static_cast<std::size_t>(d)], S, nullptr));
  std::vector<Result> got(4);
  std::vector<std::vector<ParamSpec>> specs_of(4);
  run_local_ranks(4, [&](Communicator& world) {
    const int r = world.rank(), d = r / 2, t = r % 2;
    const std::unique_ptr<Communicator> tp_comm = world.split(d, t);  // the TP group: one data rank's two TP ranks
    const std::unique_ptr<Communicator> ep_comm = world.split(t, d);  // the EP group: one TP rank of each data rank
    LlamaBlock layer(cfg, 0, TensorParallelRank{t, 2}, {}, ExpertParallelRank{d, 2});
    const std::vector<ParamSpec> specs = layer.params();
    specs_of[static_cast<std::size_t>(r)] = specs;
    Tensors params = alloc_params(specs, S);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (is_expert(specs[i].name)) {
        const std::size_t bytes = params.t[i].nbytes();
        std::memcpy(params.t[i].data, static_cast<const char*>(whole_params.t[i].data) + static_cast<std::size_t>(d) * bytes, bytes);
      } else {
        copy_whole_to_piece(whole_params.t[i], params.t[i], specs[i].split, specs[i].is_piece() ? 2 : 1, specs[i].is_piece() ? t : 0, specs[i].name);
      }
    }
    CommExpertGroup eg(*ep_comm);
    CommTensorGroup tg(*tp_comm);
    got[static_cast<std::size_t>(r)] = run_layer(layer, params, xs[static_cast<std::size_t>(d)], douts[static_cast<std::size_t>(d)], S, &eg, &tg);
  });
  for (int r = 0; r < 4; ++r) {
    const int d = r / 2, t = r % 2;
    const std::string who = "data rank " + std::to_string(d) + " TP rank " + std::to_string(t);
    const Result& g = got[static_cast<std::size_t>(r)];
    const Result& w = ref[static_cast<std::size_t>(d)];
    expect_close(g.out, w.out, 1e-5, who + " output");
    expect_close(g.dx, w.dx, 1e-5, who + " d(input)");
    const std::vector<ParamSpec>& specs = specs_of[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& s = specs[i];
      std::vector<double> want(g.grads[i].size(), 0.0);
      if (is_expert(s.name)) {
        ASSERT_EQ(s.piece.rank, d) << s.name;
        const std::size_t n = want.size();
        for (int q = 0; q < 2; ++q)
          for (std::size_t k = 0; k < n; ++k) want[k] += ref[static_cast<std::size_t>(q)].grads[i][static_cast<std::size_t>(d) * n + k] / 2;
      } else {
        // The whole layer's gradient, cut as this TP rank's piece.
        std::vector<float> wg(w.grads[i].begin(), w.grads[i].end()), piece(want.size());
        copy_whole_to_piece(Tensor(wg.data(), DType::fp32, whole_specs[i].shape), Tensor(piece.data(), DType::fp32, s.shape), s.split,
                            s.is_piece() ? 2 : 1, s.is_piece() ? t : 0, s.name);
        want.assign(piece.begin(), piece.end());
      }
      expect_close(g.grads[i], want, 1e-5, who + " " + s.name);
    }
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(MoeExpertParallel, ALayerRunWithoutItsGroupOrInAnotherGroupIsAnError) {
  const LlamaConfig cfg = config_of({DType::fp32, 2, 2, 0.0, false, false});
  LlamaBlock layer(cfg, 0, {}, {}, ExpertParallelRank{1, 2});
  Tensors params = alloc_params(layer.params(), DType::fp32);
  const std::vector<double> x(static_cast<std::size_t>(B * T * C), 0.5);
  const std::string missing = error_of([&] { run_layer(layer, params, x, x, DType::fp32, nullptr); });
  EXPECT_NE(missing.find("layers.0"), std::string::npos) << missing;
  EXPECT_NE(missing.find("expert-parallel rank 1 of 2"), std::string::npos) << missing;
  EXPECT_NE(missing.find("expert_parallel"), std::string::npos) << missing;
  FakeGroup three(1, 3);
  const std::string other = error_of([&] { run_layer(layer, params, x, x, DType::fp32, &three); });
  EXPECT_NE(other.find("layers.0"), std::string::npos) << other;
  EXPECT_NE(other.find("rank 1 of 3"), std::string::npos) << other;
  FakeGroup wrong_rank(0, 2);
  EXPECT_NE(error_of([&] { run_layer(layer, params, x, x, DType::fp32, &wrong_rank); }).find("rank 0 of 2"), std::string::npos);
}

TEST(MoeExpertParallel, CheckExpertParallelRefusesWhatCannotBeSplit) {
  const auto moe = std::make_shared<LlamaArchitecture>(config_of({DType::fp32, 2, 2, 0.0, false, false}));
  EXPECT_NO_THROW(moe->check_expert_parallel(1));
  EXPECT_NO_THROW(moe->check_expert_parallel(2));
  EXPECT_NO_THROW(moe->check_expert_parallel(8));
  const std::string three = error_of([&] { moe->check_expert_parallel(3); });
  for (const char* part : {"expert_parallel.autoep_size 3", "num_local_experts", "8 experts", "1, 2, 4, 8"})
    EXPECT_NE(three.find(part), std::string::npos) << part << " in: " << three;
  EXPECT_NE(error_of([&] { moe->check_expert_parallel(16); }).find("num_local_experts"), std::string::npos);
  EXPECT_NE(error_of([&] { moe->check_expert_parallel(0); }).find("expert_parallel.autoep_size 0"), std::string::npos);
  EXPECT_THROW(moe->make_parallel_layers({}, {}, ExpertParallelRank{0, 3}), Error);
  // qwen-style configs name num_experts
  LlamaConfig q = config_of({DType::fp32, 2, 2, 0.0, false, false});
  q.model_type = "qwen3_moe";
  q.qk_norm = true;
  EXPECT_NE(error_of([&] { LlamaArchitecture(q).check_expert_parallel(3); }).find("num_experts = 8"), std::string::npos);
  // A dense model has no experts.
  const auto dense = std::make_shared<LlamaArchitecture>(llama_config_from_spec("llama:L1-C32-H2-I24-V61-T8"));
  EXPECT_NO_THROW(dense->check_expert_parallel(1));
  const std::string none = error_of([&] { dense->check_expert_parallel(2); });
  EXPECT_NE(none.find("expert_parallel.autoep_size 2"), std::string::npos) << none;
  EXPECT_NE(none.find("no experts"), std::string::npos) << none;
  EXPECT_THROW(dense->make_parallel_layers({}, {}, ExpertParallelRank{0, 2}), Error);
  // The default Architecture (GPT-2): only one rank.
  const auto gpt2 = model_architecture("gpt2:L1-C32-H2-V61-T8");
  EXPECT_NO_THROW(gpt2->check_expert_parallel(1));
  const std::string g = error_of([&] { gpt2->check_expert_parallel(2); });
  EXPECT_NE(g.find("expert_parallel.autoep_size"), std::string::npos) << g;
  EXPECT_NE(g.find("no experts"), std::string::npos) << g;
  EXPECT_THROW(make_model(gpt2, {}, {}, ExpertParallelRank{0, 2}), Error);
  EXPECT_EQ(make_model(gpt2, {}, {}, ExpertParallelRank{0, 1}).layers.size(), make_model(gpt2).layers.size());
}

TEST(MoeExpertParallel, MakeModelBuildsOneRanksExpertsAndTheArchitectureStaysWhole) {
  const auto arch = std::make_shared<LlamaArchitecture>(config_of({DType::fp32, 2, 2, 0.0, false, false}));
  const Model m = make_model(arch, {}, {}, ExpertParallelRank{1, 4});
  EXPECT_EQ(m.expert_parallel.rank, 1);
  EXPECT_EQ(m.expert_parallel.ranks, 4);
  const Model whole = make_model(arch);
  ASSERT_EQ(m.layers.size(), whole.layers.size());
  std::int64_t local = 0, all = 0;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const std::vector<ParamSpec> p = m.layers[i]->params(), w = whole.layers[i]->params();
    ASSERT_EQ(p.size(), w.size());
    for (std::size_t j = 0; j < p.size(); ++j) {
      local += p[j].shape.numel();
      all += w[j].shape.numel();
      EXPECT_EQ(p[j].whole_shape(), w[j].shape) << p[j].name;
      if (is_expert(p[j].name)) {
        EXPECT_EQ(p[j].shape[0], E / 4) << p[j].name;
        EXPECT_EQ(p[j].split.kind, SplitKind::experts);
      } else {
        EXPECT_EQ(p[j].shape, w[j].shape) << p[j].name;
      }
    }
  }
  EXPECT_LT(local, all);
  // What the architecture answers is the whole model's.
  double stored = 0;
  for (const auto& l : whole.layers)
    for (const ParamSpec& p : l->params())
      if (!p.tied()) stored += static_cast<double>(p.shape.numel());
  EXPECT_EQ(arch->stored_parameter_count(), stored);
  for (const HfParamName& n : arch->hf_param_names())
    if (n.param.find("experts.") != std::string::npos && n.name.find("experts.7.") != std::string::npos) return;  // expert 7 still named
  ADD_FAILURE() << "the Hugging Face names lost the last expert";
}

}  // namespace
}  // namespace dstrain
