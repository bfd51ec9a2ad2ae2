// bench_expert_parallel_cpu: mixture-of-experts expert parallelism (docs/parallelism.md §8) on
// local ranks (threads of one process): a small Mixtral-shaped model on W data-parallel ranks (DP W,
// ZeRO --stage) with the experts split over EP = 1, 2, 4 of them (expert_parallel.autoep_size).
// Never asserts; prints one column per EP.
//
//   1. The all-to-all bytes of one optimizer step, summed over the W ranks: what the mesh's EP
//      communicators counted (Communicator::stats(), kind all_to_all_v: the blocks sent to other
//      ranks) against the exact figure from the routing. Every sparse layer and micro-batch sends,
//      forward, each assignment (token, chosen expert) whose expert lives on another EP rank as one
//      row of C elements of the storage dtype (s bytes), and gets the expert's output row back;
//      backward sends d(output) of those rows to the experts and d(input) back: 4 x remote x C x s.
//      The routing is read from the layers' own counts exchange (models/moe_mlp.h: each sparse
//      layer's forward sends its E per-expert counts to the EP group before the rows move; a
//      Communicator wrapper between the engine and the mesh's EP group copies them), per rank,
//      layer and micro-batch, and checked against Engine::take_moe_report(), which the layers fill
//      from the same dispatch plan: the min / max over (layer, expert) of the tokens kept per step
//      must agree. Next to it the uniform-routing figure 4·Ls·N·k·C·s·(EP−1)/EP per rank and
//      micro-batch, and the counts exchange itself (all_to_all: E int32 per layer and micro-batch,
//      (EP−1)/EP of them sent; with one expert per rank, exchange_counts' W int64).
//   2. Step time (median of the timed steps on rank 0) and tokens/s over the same global batch.
//   3. Memory per rank (allocator statistics, max over ranks): the activation peak, whose MoE part
//      grows with EP because a dropless layer sizes its received rows for the worst case, every
//      peer routing every assignment to this rank: R = EP·N·k rows of xg, gate, up, h (saved) —
//      next to Ls·(EP−1)·N·k·(C + 3I)·s; and the buffers (the layers' scratch: d(h), d(up), d(xg),
//      the receive buffer, R rows each, and the send buffer of N·k rows).
//   4. Load: the tokens each expert kept per rank, step and layer (take_moe_report: min / max /
//      mean, max/mean), and the most rows one EP rank received in one layer and micro-batch against
//      the dropless buffer EP·N·k and the mean N·k.
//
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 build/bench/bench_expert_parallel_cpu     # ~1 min on 2 cores
//   OMP_NUM_THREADS=1 build/bench/bench_expert_parallel_cpu --dtype fp32 --eps 1,2,4 --steps 5
//
// The ranks are threads sharing this machine's cores: with more ranks than cores (4 on 2 here) the
// step time measures the engine's work and its synchronisation on shared cores — what expert
// parallelism costs in overhead — not the scaling of a network of devices. Bytes, counts and
// memory are exact. Figures measured: docs/parallelism.md §8.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "models/model.h"
#include "models/model_registry.h"
#include "models/moe_config.h"
#include "ops/error.h"
#include "ops/log.h"
#include "zero/device_mesh.h"
#include "zero/local_communicator.h"

namespace {

using namespace dstrain;
using Clock = std::chrono::steady_clock;

struct Args {
  // Mixtral's shape (GQA, 8 experts, top-2, SwiGLU experts, no shared expert), small enough that
  // the three EPs take about a minute on 2 cores.
  std::string model = "moe:L2-C64-H4-KV2-E8-K2-I128-V512-T64-aux0.02";
  long seq = 64, micro = 4, gas = 1, steps = 30, warmup = 2, stage = 1;
  int ranks = 4;
  std::vector<int> eps{1, 2, 4};
  // The sweep over the EPs runs this many times, interleaved; each EP's step time is its lowest
  // median (other work on shared cores only ever slows a run down), the counts those of the first.
  long repeats = 3;
  std::string dtype = "bf16";
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_expert_parallel_cpu: %s\n"
               "options: --model SPEC (moe:...) --seq T --micro B --gas G --steps N --warmup N --stage 0-3 --ranks W --eps 1,2,4\n"
               "         --dtype fp32|bf16 --repeats N (the sweep N times, interleaved: the lowest median step per EP)\n",
               why.c_str());
  std::exit(2);
}

long integer(const std::string& k, const char* v, long min) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < min) usage(fmt::format("{} {}: must be an integer >= {}", k, v, min));
  return x;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    const std::size_t e = s.find(sep, b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") usage("the options");
    if (i + 1 >= argc) usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--seq")
      a.seq = integer(k, v, 1);
    else if (k == "--micro")
      a.micro = integer(k, v, 1);
    else if (k == "--gas")
      a.gas = integer(k, v, 1);
    else if (k == "--steps")
      a.steps = integer(k, v, 1);
    else if (k == "--warmup")
      a.warmup = integer(k, v, 0);
    else if (k == "--repeats")
      a.repeats = integer(k, v, 1);
    else if (k == "--stage")
      a.stage = integer(k, v, 0);
    else if (k == "--ranks")
      a.ranks = static_cast<int>(integer(k, v, 1));
    else if (k == "--eps") {
      a.eps.clear();
      for (const std::string& s : split(v, ',')) a.eps.push_back(static_cast<int>(integer(k, s.c_str(), 1)));
    } else if (k == "--dtype") {
      a.dtype = v;
      if (a.dtype != "fp32" && a.dtype != "bf16") usage("--dtype " + a.dtype + ": fp32 or bf16");
    } else
      usage("unknown option " + k);
  }
  if (a.stage > 3) usage("ZeRO stages are 0-3");
  for (int ep : a.eps)
    if (a.ranks % ep != 0) usage(fmt::format("EP {} does not divide the {} ranks (--ranks)", ep, a.ranks));
  return a;
}

std::string ds_json(const Args& a, int ep) {
  const std::string prec = a.dtype == "bf16" ? R"(, "bf16": {"enabled": true})" : "";
  const std::string ep_key = ep > 1 ? fmt::format(R"(, "expert_parallel": {{"enabled": true, "autoep_size": {}}})", ep) : "";
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
      "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}}}},
      "zero_optimization": {{"stage": {}}}{}{}}})",
                     a.micro, a.gas, a.stage, prec, ep_key);
}

// Global sequence g's T tokens (and targets), a fixed LCG stream per sequence (bench_parallel_cpu's).
void sequence(long g, long T, long vocab, std::vector<std::int32_t>& in, std::vector<std::int32_t>& tg) {
  std::uint32_t s = 0x9e3779b9u * static_cast<std::uint32_t>(g + 1);
  std::int32_t prev = 0;
  for (long t = 0; t <= T; ++t) {
    s = s * 1664525u + 1013904223u;
    const auto x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
    if (t > 0) {
      in.push_back(prev);
      tg.push_back(x);
    }
    prev = x;
  }
}

// The mesh's EP communicator as the engine sees it: every collective forwarded to it (so its
// stats() count them, as without the wrapper), and the sparse layers' counts exchanges copied on
// the way — the per-expert counts of this rank's routing, one E-vector per sparse layer and
// micro-batch, in forward order. The layers exchange E int32 values (an all_to_all of EL per peer,
// engine/expert_parallel.cpp), or with one expert per rank exchange_counts' W int64.
class RoutingTap final : public Communicator {
 public:
  RoutingTap(Communicator& inner, std::int64_t experts) : Communicator(inner.rank(), inner.world_size()), inner_(inner), E_(experts) {}

  std::string_view backend() const override { return inner_.backend(); }
  void synchronize() override { inner_.synchronize(); }
  void order_compute_after_collectives() override { inner_.order_compute_after_collectives(); }
  void order_compute_after(std::uint64_t sequence) override {
    if (sequence != 0) inner_.order_compute_after_collectives();
  }

  long step = -1;  // the step the next counts belong to (-1: warm-up, not kept)
  struct Counts {
    long step;
    std::vector<std::int64_t> per_expert;  // E
  };
  std::vector<Counts> counts;
  std::uint64_t other_all_to_alls = 0;  // all_to_alls that were not a counts exchange (expected: none)

 protected:
  void do_all_reduce(const Tensor& buf, ReduceOp op) override { inner_.all_reduce(buf, op); }
  void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) override { inner_.reduce_scatter(send, recv, op); }
  void do_all_gather(const Tensor& send, const Tensor& recv) override { inner_.all_gather(send, recv); }
  void do_broadcast(const Tensor& buf, int root) override { inner_.broadcast(buf, root); }
  void do_barrier() override { inner_.barrier(); }
  void do_all_to_all(const Tensor& send, const Tensor& recv) override {
    if (send.dtype == DType::int32 && send.numel() == E_ && send.device.is_cpu()) {
      const auto* v = static_cast<const std::int32_t*>(send.data);
      keep(std::vector<std::int64_t>(v, v + E_));
    } else {
      ++other_all_to_alls;
    }
    inner_.all_to_all(send, recv);
  }
  void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                       std::span<const std::int64_t> recv_counts) override {
    inner_.all_to_all_v(send, send_counts, recv, recv_counts);
  }
  void do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out) override {
    if (static_cast<std::int64_t>(send_counts.size()) == E_) keep(std::vector<std::int64_t>(send_counts.begin(), send_counts.end()));
    const std::vector<std::int64_t> got = inner_.exchange_counts(send_counts);
    std::copy(got.begin(), got.end(), out.begin());
  }
  void do_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> /*calls*/) override { inner_.send_recv(ops); }
  std::unique_ptr<Communicator> do_split(int color, int key) override { return inner_.split(color, key); }

 private:
  void keep(std::vector<std::int64_t> c) {
    if (step >= 0) counts.push_back({step, std::move(c)});
  }
  Communicator& inner_;
  std::int64_t E_;
};

struct RankOut {
  int ep_rank = 0, ep_group = 0;  // coordinate in its EP group, and which group (edp)
  CommStats ep;                   // the timed steps' bytes on the mesh's EP group
  CommStats data, expert_data;    // ... on the data group (ZeRO: everything but the experts) and the expert-data group
  std::vector<RoutingTap::Counts> counts;
  std::uint64_t other_all_to_alls = 0;
  std::vector<MoeStats::Report> reports;  // per timed step
  MemoryStats memory;
  float loss = 0.0f;
};

struct EpResult {
  int ep = 1;
  std::string error;
  double median_ms = 0.0, tokens_per_s = 0.0;
  std::vector<double> medians;  // every repeat's (the lowest is median_ms)
  std::vector<RankOut> ranks;
};

EpResult run_ep(const Args& a, const std::shared_ptr<const Architecture>& arch, int ep) {
  EpResult res;
  res.ep = ep;
  const int world = a.ranks;
  res.ranks.resize(static_cast<std::size_t>(world));
  config::ConfigOptions copts;
  copts.world_size = world;
  const config::DsConfig cfg = config::parse_ds_config(config::Json::parse(ds_json(a, ep)), copts);
  const std::int64_t E = arch->moe_config()->num_experts;
  std::mutex mu;
  std::vector<double> ms;
  run_local_ranks(world, [&](Communicator& comm) {
    MeshGroups mesh = make_mesh_groups(comm, make_mesh_shape(world, 1, 1, 1, ep));
    RankOut& out = res.ranks[static_cast<std::size_t>(comm.rank())];
    out.ep_rank = mesh.coord.ep;
    out.ep_group = mesh.coord.edp;
    RoutingTap tap(*mesh.ep, E);
    EngineOptions o;
    o.seed = 1;
    o.comm = mesh.data.get();
    o.sequence_length = a.seq;
    if (ep > 1) {
      o.expert_parallel = &tap;
      o.expert_data = mesh.expert_data.get();
    }
    Engine e = initialize(make_model(arch, {0, 1}, {0, 1}, {mesh.coord.ep, ep}), cfg, o);
    const int r = comm.rank();
    std::vector<double> mine;
    for (long k = 0; k < a.warmup + a.steps; ++k) {
      const bool timed = k >= a.warmup;
      tap.step = timed ? k - a.warmup : -1;
      // This rank's micro-batches of step k: global sequences ((k·GAS + g)·W + r)·B + b.
      std::vector<std::vector<std::int32_t>> in(static_cast<std::size_t>(a.gas)), tg(static_cast<std::size_t>(a.gas));
      for (long g = 0; g < a.gas; ++g)
        for (long b = 0; b < a.micro; ++b)
          sequence(((k * a.gas + g) * world + r) * a.micro + b, a.seq, arch->vocab_size(), in[static_cast<std::size_t>(g)],
                   tg[static_cast<std::size_t>(g)]);
      const Shape bt{a.micro, a.seq};
      (void)e.take_moe_report();
      const CommStats before = mesh.ep->stats(), data0 = mesh.data->stats(), edata0 = mesh.expert_data->stats();
      const auto t0 = Clock::now();
      for (long g = 0; g < a.gas; ++g) {
        e.forward(Batch{Tensor(in[static_cast<std::size_t>(g)].data(), DType::int32, bt),
                        Tensor(tg[static_cast<std::size_t>(g)].data(), DType::int32, bt)});
        e.backward();
        e.step();
      }
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (timed) {
        mine.push_back(t);
        const auto add = [](CommStats& to, const CommStats& d) {
          for (std::size_t i = 0; i < to.bytes.size(); ++i) {
            to.bytes[i] += d.bytes[i];
            to.calls[i] += d.calls[i];
          }
        };
        add(out.ep, mesh.ep->stats() - before);
        add(out.data, mesh.data->stats() - data0);
        add(out.expert_data, mesh.expert_data->stats() - edata0);
        out.reports.push_back(e.take_moe_report());
      }
    }
    out.counts = std::move(tap.counts);
    out.other_all_to_alls = tap.other_all_to_alls;
    out.memory = e.report().memory;
    out.loss = e.state().last_step_loss;
    if (r == 0) {
      std::lock_guard<std::mutex> lock(mu);
      ms = mine;
    }
  });
  std::sort(ms.begin(), ms.end());
  res.median_ms = ms.size() % 2 == 1 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  const double tokens = static_cast<double>(world) * static_cast<double>(a.gas * a.micro * a.seq);
  res.tokens_per_s = res.median_ms > 0 ? tokens / (res.median_ms / 1000.0) : 0.0;
  return res;
}

// What the routing says one EP's run must have done, and the load it put on the experts.
struct Derived {
  double a2av_exact = 0.0;          // bytes per step, summed over ranks: 4 × remote × C × s
  double remote = 0.0;              // remote assignments per step, summed over ranks
  double a2av_uniform = 0.0;        // 4·Ls·N·k·C·s·(EP−1)/EP per rank and micro-batch, × W × GAS
  double counts_exact = 0.0;        // the counts exchanges' bytes per step, summed over ranks
  std::size_t exchanges = 0;        // counts vectors captured (timed steps, all ranks)
  bool counts_match_report = true;  // the captured counts agree with take_moe_report (min, max per rank and step)
  std::string mismatch;
  double kept_min = 0.0, kept_max = 0.0, kept_mean = 0.0;  // take_moe_report over (rank, step)
  double dropped = 0.0;                                    // assignments a capacity dropped per step, summed over ranks
  std::int64_t recv_max = 0;                               // most rows one EP rank received in one layer and micro-batch
};

Derived derive(const Args& a, const MoeConfig& moe, std::int64_t C, std::int64_t Ls, const EpResult& r) {
  Derived d;
  const int W = a.ranks, EP = r.ep;
  const std::int64_t E = moe.num_experts, k = moe.top_k, EL = E / EP, N = a.micro * a.seq;
  const double s = a.dtype == "bf16" ? 2.0 : 4.0, steps = static_cast<double>(a.steps);
  d.a2av_uniform = 4.0 * static_cast<double>(Ls * N * k * C) * s * (EP - 1) / EP * W * static_cast<double>(a.gas);
  const std::uint64_t per_exchange = EP == 1  ? 0
                                     : EL > 1 ? ring_bytes_sent(CollectiveKind::all_to_all, static_cast<std::uint64_t>(E) * 4, EP)
                                              : ring_bytes_sent(CollectiveKind::all_to_all, 8ull * EP, EP);
  d.counts_exact = static_cast<double>(per_exchange) * static_cast<double>(Ls * a.gas) * W;
  // Exact bytes: each captured E-vector is one sparse layer's routing on one micro-batch of one rank.
  std::int64_t remote = 0;
  for (const RankOut& o : r.ranks) {
    d.exchanges += o.counts.size();
    for (const RoutingTap::Counts& c : o.counts)
      for (std::int64_t e = 0; e < E; ++e)
        if (e / EL != o.ep_rank) remote += c.per_expert[static_cast<std::size_t>(e)];
  }
  d.remote = static_cast<double>(remote) / steps;
  d.a2av_exact = 4.0 * static_cast<double>(remote) * static_cast<double>(C) * s / steps;
  // The engine's report over (rank, step): tokens each (layer, expert) kept in the step.
  double sum = 0.0, n = 0.0;
  d.kept_min = std::numeric_limits<double>::infinity();
  for (const RankOut& o : r.ranks)
    for (const MoeStats::Report& rep : o.reports) {
      d.kept_min = std::min(d.kept_min, rep.min);
      d.kept_max = std::max(d.kept_max, rep.max);
      d.dropped += static_cast<double>(rep.dropped) / steps;
      sum += rep.mean * static_cast<double>(rep.layers * rep.experts);
      n += static_cast<double>(rep.layers * rep.experts);
    }
  d.kept_mean = n > 0 ? sum / n : 0.0;
  if (EP == 1) return d;
  // The captured counts against the report: per rank and step, each sparse layer's counts summed
  // over the micro-batches; the min and max over (layer, expert) must be the report's.
  const std::size_t per_step = static_cast<std::size_t>(Ls * a.gas);
  for (std::size_t ri = 0; ri < r.ranks.size(); ++ri) {
    const RankOut& o = r.ranks[ri];
    if (o.counts.size() != per_step * static_cast<std::size_t>(a.steps)) {
      d.counts_match_report = false;
      d.mismatch = fmt::format("rank {} exchanged counts {} times, expected {} (Ls x GAS x steps)", ri, o.counts.size(), per_step * a.steps);
      continue;
    }
    for (long st = 0; st < a.steps; ++st) {
      std::vector<std::vector<double>> kept(static_cast<std::size_t>(Ls), std::vector<double>(static_cast<std::size_t>(E), 0.0));
      for (std::size_t i = 0; i < per_step; ++i) {
        const RoutingTap::Counts& c = o.counts[static_cast<std::size_t>(st) * per_step + i];
        if (c.step != st) d.counts_match_report = false;
        for (std::int64_t e = 0; e < E; ++e)
          kept[i % static_cast<std::size_t>(Ls)][static_cast<std::size_t>(e)] += static_cast<double>(c.per_expert[static_cast<std::size_t>(e)]);
      }
      double mn = std::numeric_limits<double>::infinity(), mx = 0.0;
      for (const auto& l : kept)
        for (double x : l) {
          mn = std::min(mn, x);
          mx = std::max(mx, x);
        }
      const MoeStats::Report& rep = o.reports[static_cast<std::size_t>(st)];
      if (mn != rep.min || mx != rep.max) {
        d.counts_match_report = false;
        d.mismatch = fmt::format("rank {} step {}: captured min/max {}/{}, take_moe_report {}/{}", ri, st, mn, mx, rep.min, rep.max);
      }
    }
  }
  // Rows received: EP rank j of group g, exchange i (layer, micro-batch) of step st = Σ over the
  // group's ranks of their counts for j's experts.
  for (std::size_t i = 0; i < per_step * static_cast<std::size_t>(a.steps); ++i) {
    std::vector<std::int64_t> recv(static_cast<std::size_t>(W), 0);  // [group·EP + j]
    for (const RankOut& o : r.ranks) {
      if (i >= o.counts.size()) continue;
      for (std::int64_t e = 0; e < E; ++e)
        recv[static_cast<std::size_t>(o.ep_group * EP + e / EL)] += o.counts[i].per_expert[static_cast<std::size_t>(e)];
    }
    for (std::int64_t x : recv) d.recv_max = std::max(d.recv_max, x);
  }
  return d;
}

std::string mib(std::uint64_t b) { return fmt::format("{:.3f}", static_cast<double>(b) / (1024.0 * 1024.0)); }
std::string mibd(double b) { return fmt::format("{:.3f}", b / (1024.0 * 1024.0)); }
std::string num(double x) { return fmt::format("{:.0f}", x); }

std::uint64_t max_over_ranks(const EpResult& r, MemoryPurpose p) {
  std::uint64_t x = 0;
  for (const RankOut& o : r.ranks) x = std::max<std::uint64_t>(x, o.memory[p].peak);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    set_log_level(LogLevel::warning);
    const auto arch = model_architecture(a.model);
    const MoeConfig* moe = arch->moe_config();
    if (moe == nullptr || !moe->active()) usage("--model " + a.model + " has no experts (a moe: descriptor)");
    const std::int64_t C = arch->n_embd(), L = arch->n_layer(), Ls = moe->sparse_layers(L), E = moe->num_experts, k = moe->top_k,
                       I = moe->expert_intermediate_size, N = a.micro * a.seq;
    const double s = a.dtype == "bf16" ? 2.0 : 4.0;
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
    fmt::print("bench_expert_parallel_cpu: nproc {}, {} local ranks (threads of this process), OMP_NUM_THREADS={}, OPENBLAS_NUM_THREADS={}\n",
               std::thread::hardware_concurrency(), a.ranks, omp != nullptr ? omp : "(unset)", blas != nullptr ? blas : "(unset)");
    fmt::print(
        "model {} ({:.3f}M parameters; L {}, sparse layers Ls {}, C {}, E {}, top-k {}, expert width I {}); world {} (DP {}; EP splits it), "
        "ZeRO {}, {} (s = {} B); micro-batch {} x T {} = N {} tokens per rank, GAS {}; {} warm-up + {} timed steps, {} repeats\n",
        a.model, arch->parameter_count() / 1e6, L, Ls, C, E, k, I, a.ranks, a.ranks, a.stage, a.dtype, s, a.micro, a.seq, N, a.gas, a.warmup, a.steps,
        a.repeats);
    if (static_cast<unsigned>(a.ranks) > std::thread::hardware_concurrency())
      fmt::print("NOTE: {} ranks on {} cores: step times measure the engine's work and synchronisation on shared cores (overheads), not scaling\n",
                 a.ranks, std::thread::hardware_concurrency());
    std::vector<EpResult> rs;
    std::vector<Derived> ds;
    const auto t0 = Clock::now();
    for (long rep = 0; rep < a.repeats; ++rep) {
      for (std::size_t i = 0; i < a.eps.size(); ++i) {
        EpResult r;
        try {
          r = run_ep(a, arch, a.eps[i]);
        } catch (const std::exception& e) {
          r.ep = a.eps[i];
          r.error = e.what();
        }
        if (rep == 0) {
          r.medians = {r.median_ms};
          rs.push_back(std::move(r));
          ds.push_back(rs.back().error.empty() ? derive(a, *moe, C, Ls, rs.back()) : Derived{});
        } else if (r.error.empty() && rs[i].error.empty()) {
          rs[i].medians.push_back(r.median_ms);
          if (r.median_ms < rs[i].median_ms) {
            rs[i].median_ms = r.median_ms;
            rs[i].tokens_per_s = r.tokens_per_s;
          }
        }
      }
    }
    const auto row = [&](const std::string& label, auto&& cell) {
      fmt::print("{:<58}", label);
      for (std::size_t i = 0; i < rs.size(); ++i) fmt::print(" {:>13}", rs[i].error.empty() ? cell(rs[i], ds[i]) : std::string("error"));
      fmt::print("\n");
    };
    using R = const EpResult&;
    using D = const Derived&;
    const auto a2av = [](R r) {
      std::uint64_t b = 0;
      for (const RankOut& o : r.ranks) b += o.ep.bytes_sent(CollectiveKind::all_to_all_v);
      return b;
    };
    const auto a2a = [](R r) {
      std::uint64_t b = 0;
      for (const RankOut& o : r.ranks) b += o.ep.bytes_sent(CollectiveKind::all_to_all);
      return b;
    };
    const double steps = static_cast<double>(a.steps);
    // The EP = 1 run (if any, and it ran): the baseline of the ratios below.
    const EpResult* base = nullptr;
    for (const EpResult& r : rs)
      if (r.ep == 1 && r.error.empty()) base = &r;
    fmt::print("{:<58}", "EP (expert_parallel.autoep_size)");
    for (const EpResult& r : rs) fmt::print(" {:>13}", r.ep);
    fmt::print("\n");
    fmt::print("-- 1. all-to-all bytes per optimizer step, summed over the {} ranks (mesh EP communicators' stats) --\n", a.ranks);
    row("all_to_all_v: measured", [&](R r, D) { return num(static_cast<double>(a2av(r)) / steps); });
    row("all_to_all_v: exact, 4 x remote x C x s (routing)", [&](R, D d) { return num(d.a2av_exact); });
    row("  measured / exact", [&](R r, D d) {
      return d.a2av_exact > 0 ? fmt::format("{:.6f}", static_cast<double>(a2av(r)) / steps / d.a2av_exact)
                              : std::string(a2av(r) == 0 ? "0 = 0" : "-");
    });
    row("  remote assignments (token, expert) per step", [](R, D d) { return num(d.remote); });
    row("all_to_all_v: uniform, 4·Ls·N·k·C·s·(EP-1)/EP x W x GAS", [](R, D d) { return num(d.a2av_uniform); });
    row("  measured / uniform", [&](R r, D d) {
      return d.a2av_uniform > 0 ? fmt::format("{:.4f}", static_cast<double>(a2av(r)) / steps / d.a2av_uniform) : std::string("-");
    });
    row("all_to_all_v calls per rank per step (4 x Ls x GAS)", [&](R r, D) {
      std::uint64_t c = 0;
      for (const RankOut& o : r.ranks) c += o.ep.call_count(CollectiveKind::all_to_all_v);
      return fmt::format("{:.0f}", static_cast<double>(c) / steps / a.ranks);
    });
    row("counts exchange (all_to_all): measured", [&](R r, D) { return num(static_cast<double>(a2a(r)) / steps); });
    row("counts exchange: (EP-1)/EP x E x 4 B x Ls x GAS x W", [](R, D d) { return num(d.counts_exact); });
    fmt::print("   (one expert per rank, E = EP: exchange_counts' W int64 instead, (EP-1) x 8 B per layer and micro-batch)\n");
    fmt::print("-- 2. throughput (rank 0's median step; every rank's tokens; {} ranks on {} cores: overheads, not scaling) --\n", a.ranks,
               std::thread::hardware_concurrency());
    row(fmt::format("step ms (median; lowest of {} repeats)", a.repeats), [](R r, D) { return fmt::format("{:.1f}", r.median_ms); });
    row("  the repeats' medians", [](R r, D) {
      std::string x;
      for (double m : r.medians) x += fmt::format("{}{:.0f}", x.empty() ? "" : "/", m);
      return x;
    });
    row("tokens/s", [](R r, D) { return fmt::format("{:.0f}", r.tokens_per_s); });
    row("  x EP=1", [&](R r, D) { return base != nullptr ? fmt::format("{:.2f}", r.tokens_per_s / base->tokens_per_s) : std::string("-"); });
    row("ZeRO: data group bytes per step, rank 0", [&](R r, D) { return num(static_cast<double>(r.ranks[0].data.total_bytes_sent()) / steps); });
    row("ZeRO: expert-data group bytes per step, rank 0",
        [&](R r, D) { return r.ep > 1 ? num(static_cast<double>(r.ranks[0].expert_data.total_bytes_sent()) / steps) : std::string("-"); });
    row("loss after the last step (rank 0)", [](R r, D) { return fmt::format("{:.4f}", r.ranks[0].loss); });
    fmt::print("-- 3. memory per rank, MiB (allocator peaks, max over ranks) --\n");
    row("params + grads + optimizer (held)", [](R r, D) {
      std::uint64_t x = 0;
      for (const RankOut& o : r.ranks)
        x = std::max<std::uint64_t>(x, o.memory[MemoryPurpose::params].current + o.memory[MemoryPurpose::grads].current +
                                           o.memory[MemoryPurpose::optimizer].current);
      return mib(x);
    });
    row("activations (peak)", [](R r, D) { return mib(max_over_ranks(r, MemoryPurpose::activations)); });
    row("  - EP=1", [&](R r, D) {
      if (base == nullptr) return std::string("-");
      return mibd(static_cast<double>(max_over_ranks(r, MemoryPurpose::activations)) -
                  static_cast<double>(max_over_ranks(*base, MemoryPurpose::activations)));
    });
    row("  Ls·(EP-1)·N·k·(C+3I)·s: xg, gate, up, h of EP·N·k rows",
        [&](R r, D) { return mibd(static_cast<double>(Ls * (r.ep - 1) * N * k * (C + 3 * I)) * s); });
    row("buffers (peak: the layers' scratch, ZeRO's buckets)", [](R r, D) { return mib(max_over_ranks(r, MemoryPurpose::buffers)); });
    row("total (peak)", [](R r, D) {
      std::uint64_t x = 0;
      for (const RankOut& o : r.ranks) x = std::max<std::uint64_t>(x, o.memory.total.peak);
      return mib(x);
    });
    fmt::print("-- 4. load (tokens an expert kept per rank, step and layer: take_moe_report; mean = GAS·N·k/E) --\n");
    row("kept per (rank, step, layer, expert): min", [](R, D d) { return num(d.kept_min); });
    row("kept per (rank, step, layer, expert): max", [](R, D d) { return num(d.kept_max); });
    row("  max / mean", [](R, D d) { return d.kept_mean > 0 ? fmt::format("{:.2f}", d.kept_max / d.kept_mean) : std::string("-"); });
    row("assignments dropped by a capacity, per step", [](R, D d) { return num(d.dropped); });
    row("rows one EP rank received (layer, micro-batch): max", [&](R r, D d) { return r.ep > 1 ? fmt::format("{}", d.recv_max) : std::string("-"); });
    row("  mean N·k | dropless buffer EP·N·k", [&](R r, D) { return fmt::format("{}|{}", N * k, r.ep * N * k); });
    row("routing captured = take_moe_report (min, max)", [&](R r, D d) {
      if (r.ep == 1) return std::string("-");
      bool other = false;
      for (const RankOut& o : r.ranks) other = other || o.other_all_to_alls != 0;
      return std::string(d.counts_match_report && !other ? "yes" : "NO");
    });
    for (std::size_t i = 0; i < rs.size(); ++i) {
      if (!rs[i].error.empty()) fmt::print("EP {}: error: {}\n", rs[i].ep, rs[i].error);
      if (!ds[i].mismatch.empty()) fmt::print("EP {}: {}\n", rs[i].ep, ds[i].mismatch);
    }
    fmt::print(
        "(exact: each sparse layer's per-expert counts of each rank and micro-batch, as the layer sent them to its EP group before the rows;\n"
        " remote = the assignments whose expert another EP rank holds; 4 = forward x and y, backward d(y) and d(x), one row of C each way)\n");
    fmt::print("\nwall time {:.1f} s\n", std::chrono::duration<double>(Clock::now() - t0).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_expert_parallel_cpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
