// bench_pipeline_cpu: pipeline parallelism (docs/parallelism.md §7) on local ranks (threads of one
// process) or, built with the MPI backend and run under mpiexec with --comm mpi, on MPI processes.
// Never asserts; rank 0 prints.
//
// Part 1, the bubble: 1F1B and Megatron's interleaved 1F1B (V = 2) on --stages P stages (DP 1), for
// m = 4, 8, 16, 32 micro-batches per step: each stage's idle fraction — 1 - (its forward and
// backward time) / (the step's wall time), PipelineEngine's own clocks, median over --steps steps
// after a warm-up step — beside the textbook bubble (P-1)/(m+P-1) and (P-1)/(V·m+P-1), and the
// schedule simulator's figure (engine/pipeline_schedule.h) for the forward/backward times measured.
// Part 2, activation memory per stage: the activation sets a stage allocates (all up front: the
// engine allocates nothing during a step) under 1F1B (min(P - s, m) micro-batches in flight) and
// under GPipe (all m), m = 8.
// Part 3, step time of 3D layouts against data parallelism alone on --ranks W ranks (default 8),
// the same global batch: DP W, PP 2 x DP W/2, PP 4 x DP W/4, PP 2 x DP W/4 x TP 2 (ZeRO-1, fp32).
//
//   OMP_NUM_THREADS=1 build/bench/bench_pipeline_cpu                         # local ranks, ~2 min on 2 cores
//   OMP_NUM_THREADS=1 mpiexec -n 4 build/bench/bench_pipeline_cpu --comm mpi --part 1 --stages 4
//
// The ranks share this machine's cores: with more ranks than cores a stage's "compute" includes
// the time its thread waits for a core, which the idle fraction then hides — the figures are
// clean when ranks <= cores (P = 2 here on 2 cores). Figures measured: docs/parallelism.md §7.7.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "engine/pipeline_engine.h"
#include "engine/pipeline_schedule.h"
#include "models/model.h"
#include "models/model_registry.h"
#include "models/pipeline_stage.h"
#include "models/stage_partition.h"
#include "ops/log.h"
#include "zero/device_mesh.h"
#include "zero/local_communicator.h"
#ifdef DSTRAIN_BENCH_MPI
#include "zero/mpi_communicator.h"
#include "zero/mpi_process.h"
#endif

namespace {

using namespace dstrain;
using Clock = std::chrono::steady_clock;

struct Args {
  int part = 0;  // 0: all three
  std::string comm = "local";
  // Blocks of equal cost and a small head, so that a uniform partition balances the stages' compute
  // (the bubble formulas assume balanced stages; a heavy head makes the last stage the bottleneck).
  std::string model = "gpt2:L8-C128-H4-V256-T128";
  std::string partition = "uniform";
  long seq = 128, micro = 1, steps = 3;
  int stages = 2;
  int ranks = 8;
  std::vector<int> micro_batches{4, 8, 16, 32};
  bool blocking = false;  // --blocking: transfers do not overlap compute (PipelineEngine::set_overlap(false))
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_pipeline_cpu: %s\n"
               "options: --part 0|1|2|3 --comm local|mpi --model SPEC --partition uniform|parameters|type:RE --seq T --micro B --steps N\n"
               "         --stages P (parts 1, 2) --ranks W (part 3)\n"
               "         --micro-batches 4,8,16,32 (part 1) --blocking (transfers do not overlap compute)\n",
               why.c_str());
  std::exit(2);
}

long integer(const std::string& k, const char* v, long min) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < min) usage(fmt::format("{} {}: must be an integer >= {}", k, v, min));
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") usage("the options");
    if (k == "--blocking") {
      a.blocking = true;
      continue;
    }
    if (i + 1 >= argc) usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--part") {
      a.part = static_cast<int>(integer(k, v, 0));
    } else if (k == "--comm") {
      a.comm = v;
      if (a.comm != "local" && a.comm != "mpi") usage("--comm: local or mpi");
    } else if (k == "--model") {
      a.model = v;
    } else if (k == "--partition") {
      a.partition = v;
    } else if (k == "--seq") {
      a.seq = integer(k, v, 1);
    } else if (k == "--micro") {
      a.micro = integer(k, v, 1);
    } else if (k == "--steps") {
      a.steps = integer(k, v, 1);
    } else if (k == "--stages") {
      a.stages = static_cast<int>(integer(k, v, 2));
    } else if (k == "--ranks") {
      a.ranks = static_cast<int>(integer(k, v, 1));
    } else if (k == "--micro-batches") {
      a.micro_batches.clear();
      std::string s = v;
      for (std::size_t b = 0; b <= s.size();) {
        const std::size_t e = s.find(',', b);
        a.micro_batches.push_back(static_cast<int>(integer(k, s.substr(b, e == std::string::npos ? std::string::npos : e - b).c_str(), 1)));
        if (e == std::string::npos) break;
        b = e + 1;
      }
    } else {
      usage("unknown option " + k);
    }
  }
  return a;
}

// One layout's run: world = pp x dp x tp ranks, `gas` micro-batches per step of `micro` sequences.
struct Layout {
  int pp = 1, dp = 1, tp = 1, vstages = 1;
  PipelineScheduleKind schedule = PipelineScheduleKind::one_f_one_b;
  int gas = 1;
  long micro = 1;
  int world() const { return pp * dp * tp; }
};

// What each rank measured, gathered to every rank in rank order.
struct Figures {
  static constexpr int kPerRank = 4;  // median step s, median compute s, activation bytes, last loss
  std::vector<double> v;
  double at(int rank, int k) const { return v[static_cast<std::size_t>(rank * kPerRank + k)]; }
};

std::string ds_json(const Layout& l) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
      "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4, "weight_decay": 0.0}}}},
      "zero_optimization": {{"stage": 1}}, "tensor_parallel": {{"autotp_size": {}}}{}}})",
                     l.micro, l.gas, l.tp, l.pp > 1 ? fmt::format(R"(, "pipeline": {{"stages": {}}})", l.pp) : std::string());
}

// Global sequence g: a fixed LCG stream, so every layout trains on the same global batch.
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

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x.size() % 2 == 1 ? x[x.size() / 2] : 0.5 * (x[x.size() / 2 - 1] + x[x.size() / 2]);
}

// This rank's part of a layout (every rank of `world` calls it), then every rank's figures.
Figures run_rank(Communicator& world, const Layout& l, const Args& a, long steps) {
  const auto arch = model_architecture(a.model);
  config::ConfigOptions copts;
  copts.world_size = world.world_size();
  const config::DsConfig cfg = config::parse_ds_config(config::Json::parse(ds_json(l)), copts);
  MeshGroups mesh = make_mesh_groups(world, make_mesh_shape(world.world_size(), l.tp, 1, l.pp));
  const MeshCoord c = mesh.coord;
  EngineOptions o;
  o.seed = 1;
  o.comm = mesh.data.get();
  o.tensor_parallel = mesh.tp.get();
  o.sequence_length = a.seq;
  Model model = make_model(arch, {c.tp, l.tp, true}, {});
  std::unique_ptr<Communicator> ties;
  if (l.pp > 1) {
    const StageParts parts = partition_layers(model.layers, static_cast<std::size_t>(l.pp * l.vstages), a.partition);
    model = make_pipeline_stage_model(std::move(model), parts, l.pp, c.pp);
    ties = make_pipeline_ties_group(world, mesh, model);
    o.pipeline = mesh.pp.get();
    o.pipeline_ties = ties.get();
    o.pipeline_in_flight = PipelineEngine::in_flight(l.schedule, l.pp, c.pp, l.gas, l.vstages);
  }
  Engine e = initialize(std::move(model), cfg, o);
  std::optional<PipelineEngine> pipe;
  if (l.pp > 1) {
    pipe.emplace(e, *mesh.pp, l.schedule, l.vstages);
    pipe->set_overlap(!a.blocking);
  }
  // This data rank's micro-batches of the global batch (gas x dp x micro sequences).
  std::vector<std::vector<std::int32_t>> in(static_cast<std::size_t>(l.gas)), tg(static_cast<std::size_t>(l.gas));
  std::vector<Batch> batches;
  for (int m = 0; m < l.gas; ++m) {
    for (long b = 0; b < l.micro; ++b) sequence((m * l.dp + c.dp) * l.micro + b, a.seq, arch->vocab_size(), in[static_cast<std::size_t>(m)], tg[static_cast<std::size_t>(m)]);
    const Shape bt{l.micro, a.seq};
    batches.push_back(Batch{Tensor(in[static_cast<std::size_t>(m)].data(), DType::int32, bt), Tensor(tg[static_cast<std::size_t>(m)].data(), DType::int32, bt)});
  }
  std::vector<double> step_s, compute_s;
  for (long k = 0; k < 1 + steps; ++k) {
    const auto t0 = Clock::now();
    if (pipe) {
      pipe->train_batch(batches);
    } else {
      for (const Batch& b : batches) {
        e.forward(b);
        e.backward();
        e.step();
      }
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (k == 0) continue;  // warm-up
    step_s.push_back(pipe ? pipe->last_step_seconds() : s);
    compute_s.push_back(pipe ? pipe->last_compute_seconds() : s);
  }
  Figures f;
  f.v.assign(static_cast<std::size_t>(world.world_size() * Figures::kPerRank), 0.0);
  const auto at = static_cast<std::size_t>(world.rank() * Figures::kPerRank);
  f.v[at] = median(step_s);
  f.v[at + 1] = median(compute_s);
  f.v[at + 2] = static_cast<double>(e.report().memory[MemoryPurpose::activations].peak);
  f.v[at + 3] = e.state().last_step_loss;
  world.all_reduce(Tensor(f.v.data(), DType::fp64, Shape{static_cast<std::int64_t>(f.v.size())}), ReduceOp::sum);
  return f;
}

// Runs `l` on the run's ranks: threads of this process, or (mpi) this process's rank of the world
// when the layout has as many ranks as there are processes.
Figures run_layout(const Layout& l, const Args& a, long steps, Communicator* mpi_world) {
  if (mpi_world != nullptr) return run_rank(*mpi_world, l, a, steps);
  Figures out;
  run_local_ranks(l.world(), [&](Communicator& comm) {
    Figures f = run_rank(comm, l, a, steps);
    if (comm.rank() == 0) out = std::move(f);
  });
  return out;
}

void part1(const Args& a, Communicator* mpi, bool lead) {
  const int P = a.stages;
  if (lead) {
    std::printf("\n## Part 1: the bubble, %s on %d stages, micro-batch %ld x %ld tokens, %ld steps\n", a.model.c_str(), P, a.micro, a.seq, a.steps);
    std::printf("idle = 1 - compute / step per stage (median over steps); ideal = (P-1)/(m+P-1), interleaved (P-1)/(V·m+P-1); sim = the\n"
                "simulator with the measured forward:backward ratio\n");
    std::printf("%-24s %4s | %-24s | %7s %7s | %9s\n", "schedule", "m", "idle per stage", "ideal", "sim", "step ms");
  }
  for (const auto& [kind, V] : {std::pair{PipelineScheduleKind::one_f_one_b, 1}, std::pair{PipelineScheduleKind::interleaved, 2}}) {
    for (int m : a.micro_batches) {
      if (kind == PipelineScheduleKind::interleaved && m % P != 0) continue;
      Layout l;
      l.pp = P;
      l.vstages = V;
      l.schedule = kind;
      l.gas = m;
      l.micro = a.micro;
      const Figures f = run_layout(l, a, a.steps, mpi);
      if (!lead) continue;
      std::string idle;
      double step = 0.0, compute_total = 0.0;
      for (int s = 0; s < P; ++s) {
        idle += fmt::format("{:.3f} ", 1.0 - f.at(s, 1) / f.at(s, 0));
        step = std::max(step, f.at(s, 0));
        compute_total += f.at(s, 1);
      }
      // The simulator with a stage's measured compute split 1:2 (forward : backward, GPT's ratio).
      const double per_micro = compute_total / P / m;
      const PipelineSimulation sim = simulate_pipeline(kind, P, m, V, per_micro / 3.0, 2.0 * per_micro / 3.0);
      double sim_idle = 0.0;
      for (double x : sim.idle_fraction) sim_idle += x / static_cast<double>(P);
      std::printf("%-24s %4d | %-24s | %7.3f %7.3f | %9.1f\n", describe_schedule(kind, V).c_str(), m, idle.c_str(), ideal_bubble_fraction(kind, P, m, V),
                  sim_idle, step * 1e3);
    }
  }
}

void part2(const Args& a, Communicator* mpi, bool lead) {
  const int P = a.stages, m = 8;
  if (lead) {
    std::printf("\n## Part 2: activation memory per stage (allocated up front), %d stages, m = %d\n", P, m);
    std::printf("%-10s | %s\n", "schedule", "activations per stage (MiB)");
  }
  for (PipelineScheduleKind kind : {PipelineScheduleKind::one_f_one_b, PipelineScheduleKind::gpipe}) {
    Layout l;
    l.pp = P;
    l.schedule = kind;
    l.gas = m;
    l.micro = a.micro;
    const Figures f = run_layout(l, a, 1, mpi);
    if (!lead) continue;
    std::string row;
    for (int s = 0; s < P; ++s) row += fmt::format("{:8.2f} ", f.at(s, 2) / (1 << 20));
    std::printf("%-10s | %s\n", describe_schedule(kind, 1).c_str(), row.c_str());
  }
}

void part3(const Args& a, Communicator* mpi, bool lead) {
  const int W = mpi != nullptr ? mpi->world_size() : a.ranks;
  const int gas = 8;  // micro-batches per step at DP = W: every layout trains gas x W x micro sequences per step
  if (lead) {
    std::printf("\n## Part 3: step time on %d ranks, %s, the same global batch of %ld sequences (ZeRO-1, fp32)\n", W, a.model.c_str(),
                static_cast<long>(gas) * W * a.micro);
    std::printf("%-26s | %9s | %11s | %10s\n", "layout", "step ms", "tokens/s", "loss");
  }
  for (const auto& [pp, tp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
    if (W % (pp * tp) != 0) continue;
    Layout l;
    l.pp = pp;
    l.tp = tp;
    l.dp = W / (pp * tp);
    l.micro = a.micro;
    // Global batch = gas x DP x micro: every layout keeps gas x DP = 8 x W.
    l.gas = 8 * W / l.dp;
    const Figures f = run_layout(l, a, a.steps, mpi);
    if (!lead) continue;
    double step = 0.0;
    for (int r = 0; r < W; ++r) step = std::max(step, f.at(r, 0));
    const double tokens = static_cast<double>(l.gas) * l.dp * l.micro * a.seq;
    std::printf("%-26s | %9.1f | %11.0f | %10.5f\n", describe_mesh(make_mesh_shape(W, tp, 1, pp)).substr(0, 26).c_str(), step * 1e3, tokens / step,
                f.at(W - 1, 3));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  set_log_level(LogLevel::warning);
  try {
    Communicator* mpi = nullptr;
#ifdef DSTRAIN_BENCH_MPI
    std::optional<MpiWorld> mw;
    std::unique_ptr<MpiCommunicator> mc;
    if (a.comm == "mpi") {
      mw.emplace(init_mpi());
      mc = std::make_unique<MpiCommunicator>();
      mpi = mc.get();
    }
#else
    if (a.comm == "mpi") usage("--comm mpi: this build has no MPI backend (configure with DSTRAIN_MPI)");
#endif
    const bool lead = mpi == nullptr || mpi->rank() == 0;
    if (lead) std::printf("# bench_pipeline_cpu: %s, model %s, T %ld\n", mpi != nullptr ? "MPI processes" : "local ranks (threads)", a.model.c_str(), a.seq);
    if (a.part == 0 || a.part == 1) part1(a, mpi, lead);
    if (a.part == 0 || a.part == 2) part2(a, mpi, lead);
    if (a.part == 0 || a.part == 3) part3(a, mpi, lead);
#ifdef DSTRAIN_BENCH_MPI
    mc.reset();
    if (mw) finalize_mpi();
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline_cpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
