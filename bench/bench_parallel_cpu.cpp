// bench_parallel_cpu: tensor and sequence parallelism (docs/parallelism.md) on a DP x SP x TP mesh
// of local ranks (threads of one process, zero/device_mesh.h's groups over the local backend).
// Never asserts.
//
// Part 1, per model (a Llama shape and a GPT-2 one) and per mesh of --ranks ranks (default 4:
// DP-only, TP 2, TP 4, SP 2, SP 4, TP 2 x SP 2), side by side: the median step time after warm-up
// and tokens/s on the SAME global batch (--global-batch sequences of --seq tokens: a DP rank's
// micro-batch is global-batch / DP, an SP rank holds seq / SP tokens of each), the bytes rank 0
// sent in the last step on each group (tp, sp, data: Communicator::stats(), ring volume) next to
// the bytes docs/parallelism.md's formulas predict, and rank 0's memory by purpose (allocator
// statistics: params + grads + optimizer held after the step; peaks of activations, buffers and
// of the total).
//
// Part 2, the longest sequence that trains within --cap-mib per rank at SP = 1, 2, 4 (world = SP,
// DP = 1, micro-batch --cap-batch): the per-rank peak of ALL the engine's memory (the allocator's
// total) is probed by doubling T from --cap-start and then bisecting to --cap-quantum tokens. A
// probe builds the SP ranks' engines at T and reads the peak: the engine allocates every
// activation, scratch and buffer when it is built and nothing during a step (bench_activation_memory
// relies on the same; tests/unit/engine checks it), so the peak after construction is the step's.
// The program then runs one real step at T_max for each SP and prints that step's peak (and the
// peak one quantum above, which exceeds the cap): if the step's peak differed from the construction
// figure the search is redone with a step at every probe (--cap-step-each on does that from the
// start; it costs minutes: attention's work grows as T²).
//
//   build/bench/bench_parallel_cpu                                  # defaults: ~2-3 min on 2 cores
//   build/bench/bench_parallel_cpu --part 1 --seq 512 --global-batch 8 --steps 5
//   build/bench/bench_parallel_cpu --part 2 --cap-mib 1024 --cap-model llama:L8-C512-H8-KV4-I1376-V8192
//
// Figures measured on a 2-core machine: docs/parallelism.md §6.
// The ranks are threads sharing this machine's cores: step times measure the engine's work plus
// its synchronisation on shared cores, not a network; bytes and memory are exact counts.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "models/model.h"
#include "models/model_registry.h"
#include "ops/log.h"
#include "zero/device_mesh.h"
#include "zero/local_communicator.h"

namespace {

using namespace dstrain;
using Clock = std::chrono::steady_clock;

struct MeshSpec {
  int dp = 1, sp = 1, tp = 1;
};

struct Args {
  int part = 0;  // 0: both
  std::string llama = "llama:L4-C256-H8-KV4-I688-V2048";
  std::string gpt2 = "gpt2:L4-C256-H8-V2048";
  std::vector<std::string> models;  // --models: replaces the two above
  long global_batch = 4, seq = 256, steps = 3, warmup = 1, stage = 0;
  int ranks = 4;
  std::vector<MeshSpec> meshes;  // empty: the issue's six (for --ranks 4)
  // Megatron's sequence parallelism under TP (models/residual_shards.h; train's default is on);
  // off here by default, the figures of docs/parallelism.md §6.1.
  bool megatron_sp = false;
  // part 2
  std::string cap_model = "llama:L4-C256-H8-KV4-I688-V2048";
  long cap_mib = 256, cap_batch = 1, cap_start = 512, cap_quantum = 64, cap_stage = 0;
  std::vector<int> cap_sps{1, 2, 4};
  bool cap_step_each = false;
  bool cap_verify = true;
  // ALST's tiles at SP > 1, as `dstrain train` sets them (train/rank_trainer.cpp): the loss in
  // tiles of 64 MiB of logits, the MLP in tiles of n_embd positions.
  bool cap_alst = true;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_parallel_cpu: %s\n"
               "options: --part 0|1|2 (0: both)\n"
               "  part 1: --llama SPEC --gpt2 SPEC (or --models SPEC,SPEC,...) --global-batch G --seq T --steps N --warmup N\n"
               "          --stage 0-3 --ranks W --meshes DPxSPxTP,... (e.g. 4x1x1,2x1x2) --megatron-sp on|off\n"
               "  part 2: --cap-model SPEC --cap-mib M --cap-batch B --cap-start T --cap-quantum Q --cap-sps 1,2,4 --cap-stage 0-3\n"
               "          --cap-step-each on|off (a real step at every probe) --cap-verify on|off (a real step at T_max)\n"
               "          --cap-alst on|off (ALST's tiled loss and MLP at SP > 1, as train sets them; default on)\n",
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

bool on_off(const std::string& k, const std::string& v) {
  if (v != "on" && v != "off") usage(k + " " + v + ": on or off");
  return v == "on";
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") usage("the options");
    if (i + 1 >= argc) usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--part")
      a.part = static_cast<int>(integer(k, v, 0));
    else if (k == "--llama")
      a.llama = v;
    else if (k == "--gpt2")
      a.gpt2 = v;
    else if (k == "--models")
      a.models = split(v, ',');
    else if (k == "--global-batch")
      a.global_batch = integer(k, v, 1);
    else if (k == "--seq")
      a.seq = integer(k, v, 1);
    else if (k == "--steps")
      a.steps = integer(k, v, 1);
    else if (k == "--warmup")
      a.warmup = integer(k, v, 0);
    else if (k == "--stage")
      a.stage = integer(k, v, 0);
    else if (k == "--ranks")
      a.ranks = static_cast<int>(integer(k, v, 1));
    else if (k == "--meshes") {
      for (const std::string& m : split(v, ',')) {
        const auto d = split(m, 'x');
        if (d.size() != 3) usage("--meshes " + m + ": DPxSPxTP");
        a.meshes.push_back({static_cast<int>(integer(k, d[0].c_str(), 1)), static_cast<int>(integer(k, d[1].c_str(), 1)),
                            static_cast<int>(integer(k, d[2].c_str(), 1))});
      }
    } else if (k == "--cap-model")
      a.cap_model = v;
    else if (k == "--cap-mib")
      a.cap_mib = integer(k, v, 1);
    else if (k == "--cap-batch")
      a.cap_batch = integer(k, v, 1);
    else if (k == "--cap-start")
      a.cap_start = integer(k, v, 1);
    else if (k == "--cap-quantum")
      a.cap_quantum = integer(k, v, 1);
    else if (k == "--cap-stage")
      a.cap_stage = integer(k, v, 0);
    else if (k == "--cap-sps") {
      a.cap_sps.clear();
      for (const std::string& s : split(v, ',')) a.cap_sps.push_back(static_cast<int>(integer(k, s.c_str(), 1)));
    } else if (k == "--cap-step-each")
      a.cap_step_each = on_off(k, v);
    else if (k == "--megatron-sp")
      a.megatron_sp = on_off(k, v);
    else if (k == "--cap-alst")
      a.cap_alst = on_off(k, v);
    else if (k == "--cap-verify")
      a.cap_verify = on_off(k, v);
    else
      usage("unknown option " + k);
  }
  if (a.stage > 3 || a.cap_stage > 3) usage("ZeRO stages are 0-3");
  if (a.models.empty()) a.models = {a.llama, a.gpt2};
  if (a.meshes.empty()) {
    if (a.ranks == 4)
      a.meshes = {{4, 1, 1}, {2, 1, 2}, {1, 1, 4}, {2, 2, 1}, {1, 4, 1}, {1, 2, 2}};
    else
      a.meshes = {{a.ranks, 1, 1}};
  }
  for (const MeshSpec& m : a.meshes) {
    if (m.dp * m.sp * m.tp != a.ranks) usage(fmt::format("mesh {}x{}x{} is not {} ranks (--ranks)", m.dp, m.sp, m.tp, a.ranks));
    if (a.global_batch % m.dp != 0) usage(fmt::format("--global-batch {} does not divide by DP {}", a.global_batch, m.dp));
    if (a.seq % m.sp != 0) usage(fmt::format("--seq {} does not divide by SP {}", a.seq, m.sp));
  }
  if (a.cap_quantum % 4 != 0) usage("--cap-quantum must divide by 4 (every SP of 1, 2, 4)");
  return a;
}

// The spec with its -T<n> (if any) replaced by -T<T>: the positions the run needs.
std::string with_positions(const std::string& spec, long T) {
  std::string s = spec;
  for (std::size_t p = s.find("-T"); p != std::string::npos; p = s.find("-T", p + 1)) {
    std::size_t e = p + 2;
    while (e < s.size() && s[e] >= '0' && s[e] <= '9') ++e;
    if (e > p + 2 && (e == s.size() || s[e] == '-')) {
      s.erase(p, e - p);
      break;
    }
  }
  return s + fmt::format("-T{}", T);  // the descriptors read their fields in any order
}

// The attention shape from the descriptor: heads, key/value heads, head size (GPT-2: NKV = NH).
struct Heads {
  long C = 0, L = 0, NH = 0, NKV = 0, HS = 0;
  bool llama = false;
};

long field(const std::string& spec, const std::string& key, long fallback) {
  for (const std::string& f : split(spec.substr(spec.find(':') + 1), '-')) {
    if (f.size() > key.size() && f.compare(0, key.size(), key) == 0 && f[key.size()] >= '0' && f[key.size()] <= '9')
      return std::atol(f.c_str() + key.size());
  }
  return fallback;
}

Heads heads_of(const std::string& spec, const Architecture& arch) {
  Heads h;
  h.llama = spec.rfind("llama:", 0) == 0;
  h.C = arch.n_embd();
  h.L = arch.n_layer();
  h.NH = field(spec, "H", 0);
  h.NKV = h.llama ? field(spec, "KV", h.NH) : h.NH;
  h.HS = h.llama ? field(spec, "D", h.NH > 0 ? h.C / h.NH : 0) : (h.NH > 0 ? h.C / h.NH : 0);
  return h;
}

std::string ds_json(long micro, long stage, int tp, int sp) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
      "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}}}},
      "zero_optimization": {{"stage": {}}}, "tensor_parallel": {{"autotp_size": {}}}, "sequence_parallel_size": {}}})",
                     micro, stage, tp, sp);
}

// Global sequence g's T tokens (and targets), a fixed LCG stream per sequence: every mesh trains on
// the same global batch.
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

struct RankOut {
  CommStats tp, sp, data;  // the last step's bytes on each group
  MemoryStats memory;
  ZeroReport zero;
  float loss = 0.0f;
};

struct MeshResult {
  MeshSpec mesh;
  std::string error;
  double median_ms = 0.0, tokens_per_s = 0.0;
  std::vector<RankOut> ranks;
};

// One mesh: every rank builds its model piece and engine, trains warmup + steps steps on its share
// of the global batch, and reports the last step's bytes per group and its memory.
MeshResult run_mesh(const Args& a, const std::string& spec, const MeshSpec& m) {
  MeshResult res;
  res.mesh = m;
  const int world = m.dp * m.sp * m.tp;
  res.ranks.resize(static_cast<std::size_t>(world));
  const long micro = a.global_batch / m.dp, Tl = a.seq / m.sp;
  const auto arch = model_architecture(with_positions(spec, a.seq));
  config::ConfigOptions copts;
  copts.world_size = world;
  const config::DsConfig cfg = config::parse_ds_config(config::Json::parse(ds_json(micro, a.stage, m.tp, m.sp)), copts);
  std::mutex mu;
  std::vector<double> ms;
  run_local_ranks(world, [&](Communicator& comm) {
    MeshGroups mesh = make_mesh_groups(comm, make_mesh_shape(world, m.tp, m.sp));
    const MeshCoord c = mesh.coord;
    EngineOptions o;
    o.seed = 1;
    o.comm = mesh.data.get();
    o.tensor_parallel = mesh.tp.get();
    o.sequence_parallel = m.sp > 1 ? mesh.sp.get() : nullptr;
    o.sequence_length = Tl;
    Engine e = initialize(make_model(arch, {c.tp, m.tp, a.megatron_sp}, {c.sp, m.sp}), cfg, o);
    // This DP rank's micro-batch, this SP rank's share of each sequence.
    std::vector<std::int32_t> in, tg;
    for (long b = 0; b < micro; ++b) {
      std::vector<std::int32_t> si, st;
      sequence(c.dp * micro + b, a.seq, arch->vocab_size(), si, st);
      in.insert(in.end(), si.begin() + c.sp * Tl, si.begin() + (c.sp + 1) * Tl);
      tg.insert(tg.end(), st.begin() + c.sp * Tl, st.begin() + (c.sp + 1) * Tl);
    }
    const Shape bt{micro, Tl};
    const Batch batch{Tensor(in.data(), DType::int32, bt), Tensor(tg.data(), DType::int32, bt)};
    RankOut& out = res.ranks[static_cast<std::size_t>(comm.rank())];
    std::vector<double> mine;
    for (long k = 0; k < a.warmup + a.steps; ++k) {
      const CommStats tp0 = mesh.tp->stats(), sp0 = mesh.sp->stats(), d0 = mesh.data->stats();
      const auto t0 = Clock::now();
      e.forward(batch);
      e.backward();
      e.step();
      if (k >= a.warmup) mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      out.tp = mesh.tp->stats() - tp0;
      out.sp = mesh.sp->stats() - sp0;
      out.data = mesh.data->stats() - d0;
    }
    out.memory = e.report().memory;
    out.zero = e.report().zero;
    out.loss = e.state().last_step_loss;
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      ms = mine;
    }
  });
  std::sort(ms.begin(), ms.end());
  res.median_ms = ms.size() % 2 == 1 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  res.tokens_per_s = res.median_ms > 0 ? static_cast<double>(a.global_batch * a.seq) / (res.median_ms / 1000.0) : 0.0;
  return res;
}

// docs/parallelism.md's volumes for rank 0 of the mesh, one micro-batch of `micro` sequences of
// Tl tokens (fp32: s = 4).
struct Predicted {
  std::uint64_t tp = 0, sp = 0, data = 0;
};

Predicted predict(const Heads& h, const MeshSpec& m, long micro, long Tl, std::int64_t padded_params, bool megatron_sp) {
  Predicted p;
  const std::uint64_t B = static_cast<std::uint64_t>(micro), T = static_cast<std::uint64_t>(Tl), C = static_cast<std::uint64_t>(h.C),
                      L = static_cast<std::uint64_t>(h.L), s = 4;
  // TP (§2): 2(W−1)/W · [(4L + 2)·B·T·C·s + 3·B·T·4] (no q/k norm in these shapes), as ring all-reduces.
  // With the residual stream cut (§2, Megatron's sequence parallelism): (10L + 5) reduce-scatters /
  // all-gathers of B·T·C·s, the cross-entropy's 3·B·T·4, the norms' gradient sums (GPT-2: 4C per
  // block + 2C; Llama: 2C per block + C).
  if (m.tp > 1 && megatron_sp && (B * T) % static_cast<std::uint64_t>(m.tp) == 0) {
    const std::uint64_t block_norms = h.llama ? 2 * C : 4 * C, head_norm = h.llama ? C : 2 * C;
    p.tp = (10 * L + 5) * ring_bytes_sent(CollectiveKind::all_gather, B * T * C * s, m.tp) +
           L * ring_bytes_sent(CollectiveKind::all_reduce, block_norms * s, m.tp) + ring_bytes_sent(CollectiveKind::all_reduce, head_norm * s, m.tp) +
           ring_bytes_sent(CollectiveKind::all_reduce, B * T * 4, m.tp) + ring_bytes_sent(CollectiveKind::all_reduce, 2 * B * T * 4, m.tp);
  } else if (m.tp > 1) {
    p.tp = (4 * L + 2) * ring_bytes_sent(CollectiveKind::all_reduce, B * T * C * s, m.tp) +
           ring_bytes_sent(CollectiveKind::all_reduce, B * T * 4, m.tp) + ring_bytes_sent(CollectiveKind::all_reduce, 2 * B * T * 4, m.tp);
  }
  // SP (§3): per block, forward and backward, (SP−1)/SP · B·Tl·(W + Q)·s with this tensor-parallel
  // rank's heads, in two all-to-alls each way; plus two fp64 all-reduces (targets, loss).
  if (m.sp > 1) {
    const std::uint64_t nh = static_cast<std::uint64_t>(h.NH / m.tp), nkv = static_cast<std::uint64_t>(h.NKV / m.tp),
                        hs = static_cast<std::uint64_t>(h.HS);
    const std::uint64_t W = (nh + 2 * nkv) * hs, Q = nh * hs;
    p.sp = 2 * L *
               (ring_bytes_sent(CollectiveKind::all_to_all, B * T * W * s, m.sp) + ring_bytes_sent(CollectiveKind::all_to_all, B * T * Q * s, m.sp)) +
           2 * ring_bytes_sent(CollectiveKind::all_reduce, 8, m.sp);
  }
  // Data group (DP x SP ranks; ZeRO stage 0-2: 2Ψ of this rank's pieces, fp32 gradients) — the
  // stage-0/1/2 all-reduce / reduce-scatter + all-gather volume; stage 3 adds the gathers.
  const int wd = m.dp * m.sp;
  p.data = ring_bytes_sent(CollectiveKind::all_reduce, static_cast<std::uint64_t>(padded_params) * 4, wd);
  return p;
}

std::string mib(std::uint64_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1024.0 * 1024.0)); }
std::string diff(std::uint64_t a, std::uint64_t b) { return fmt::format("{:+}", static_cast<long long>(a) - static_cast<long long>(b)); }

void part1(const Args& a) {
  for (const std::string& spec : a.models) {
    const auto arch = model_architecture(with_positions(spec, a.seq));
    const Heads h = heads_of(spec, *arch);
    fmt::print(
        "\n== {} ({:.2f}M parameters; L {}, C {}, heads {} / kv {}, head size {}): global batch {} x T {} = {} tokens per step, fp32, ZeRO {}, "
        "{} warm-up + {} timed steps; Megatron sequence parallelism under TP {} ==\n",
        with_positions(spec, a.seq), arch->parameter_count() / 1e6, h.L, h.C, h.NH, h.NKV, h.HS, a.global_batch, a.seq, a.global_batch * a.seq,
        a.stage, a.warmup, a.steps, a.megatron_sp ? "on" : "off (--megatron-sp)");
    std::vector<MeshResult> rs;
    for (const MeshSpec& m : a.meshes) {
      try {
        rs.push_back(run_mesh(a, spec, m));
      } catch (const std::exception& e) {
        MeshResult r;
        r.mesh = m;
        r.error = e.what();
        rs.push_back(r);
      }
      std::fflush(stdout);
    }
    // One column per mesh.
    std::vector<std::string> head;
    for (const MeshResult& r : rs) head.push_back(fmt::format("{}dp{}sp{}tp", r.mesh.dp, r.mesh.sp, r.mesh.tp));
    const auto row = [&](const std::string& label, auto&& cell) {
      fmt::print("{:<34}", label);
      for (const MeshResult& r : rs) fmt::print(" {:>12}", r.error.empty() ? cell(r) : std::string("error"));
      fmt::print("\n");
    };
    fmt::print("{:<34}", "mesh (DP x SP x TP)");
    for (const std::string& s : head) fmt::print(" {:>12}", s);
    fmt::print("\n");
    row("micro-batch x tokens per rank", [&](const MeshResult& r) { return fmt::format("{}x{}", a.global_batch / r.mesh.dp, a.seq / r.mesh.sp); });
    row("step ms (median, rank 0)", [](const MeshResult& r) { return fmt::format("{:.0f}", r.median_ms); });
    row("tokens/s", [](const MeshResult& r) { return fmt::format("{:.0f}", r.tokens_per_s); });
    row("loss after the last step", [](const MeshResult& r) { return fmt::format("{:.5f}", r.ranks[0].loss); });
    fmt::print("-- bytes rank 0 sent in the last step (ring volume, zero/communicator.h): counted, and docs/parallelism.md's formula --\n");
    const auto pred = [&](const MeshResult& r) {
      return predict(h, r.mesh, a.global_batch / r.mesh.dp, a.seq / r.mesh.sp, r.ranks[0].zero.padded_param_elements, a.megatron_sp);
    };
    row("tp group: counted", [](const MeshResult& r) { return fmt::format("{}", r.ranks[0].tp.total_bytes_sent()); });
    row("tp group: formula (§2)", [&](const MeshResult& r) { return fmt::format("{}", pred(r).tp); });
    row("tp: counted - formula", [&](const MeshResult& r) { return diff(r.ranks[0].tp.total_bytes_sent(), pred(r).tp); });
    row("tp group: calls", [](const MeshResult& r) { return fmt::format("{}", r.ranks[0].tp.total_calls()); });
    row("sp group: counted, all-to-all", [](const MeshResult& r) { return fmt::format("{}", r.ranks[0].sp.bytes_sent(CollectiveKind::all_to_all)); });
    row("sp group: counted, all kinds", [](const MeshResult& r) { return fmt::format("{}", r.ranks[0].sp.total_bytes_sent()); });
    row("sp group: formula (§3)", [&](const MeshResult& r) { return fmt::format("{}", pred(r).sp); });
    row("sp: counted - formula", [&](const MeshResult& r) { return diff(r.ranks[0].sp.total_bytes_sent(), pred(r).sp); });
    row("data group: counted", [](const MeshResult& r) { return fmt::format("{}", r.ranks[0].data.total_bytes_sent()); });
    row("data group: 2(W-1)/W x 4 Psi_rank", [&](const MeshResult& r) { return fmt::format("{}", pred(r).data); });
    row("data: counted - formula", [&](const MeshResult& r) { return diff(r.ranks[0].data.total_bytes_sent(), pred(r).data); });
    row("Psi_rank (padded elements)", [](const MeshResult& r) { return fmt::format("{}", r.ranks[0].zero.padded_param_elements); });
    fmt::print(
        "   (the step's scalars, outside the per-micro-batch formulas: tp +16 B = one fp64 all-reduce of (norm², non-finite)\n"
        "    over 2 ranks, +24 over 4; data: one fp64 all-reduce of (norm², non-finite, loss) = +24 B over 2 ranks, +36 over 4)\n");
    fmt::print("-- rank 0's memory (MiB, allocator statistics) --\n");
    const auto cur = [](const MeshResult& r, MemoryPurpose p) { return r.ranks[0].memory[p].current; };
    const auto peak = [](const MeshResult& r, MemoryPurpose p) { return r.ranks[0].memory[p].peak; };
    row("params", [&](const MeshResult& r) { return mib(cur(r, MemoryPurpose::params)); });
    row("grads", [&](const MeshResult& r) { return mib(cur(r, MemoryPurpose::grads)); });
    row("optimizer", [&](const MeshResult& r) { return mib(cur(r, MemoryPurpose::optimizer)); });
    row("params+grads+optimizer",
        [&](const MeshResult& r) { return mib(cur(r, MemoryPurpose::params) + cur(r, MemoryPurpose::grads) + cur(r, MemoryPurpose::optimizer)); });
    row("activations (peak)", [&](const MeshResult& r) { return mib(peak(r, MemoryPurpose::activations)); });
    row("buffers (peak)", [&](const MeshResult& r) { return mib(peak(r, MemoryPurpose::buffers)); });
    row("total (peak)", [](const MeshResult& r) { return mib(r.ranks[0].memory.total.peak); });
    row("total (peak), max over ranks", [](const MeshResult& r) {
      std::uint64_t x = 0;
      for (const RankOut& o : r.ranks) x = std::max<std::uint64_t>(x, o.memory.total.peak);
      return mib(x);
    });
    for (const MeshResult& r : rs)
      if (!r.error.empty()) fmt::print("{}dp{}sp{}tp: error: {}\n", r.mesh.dp, r.mesh.sp, r.mesh.tp, r.error);
    std::fflush(stdout);
  }
}

// ---- part 2 ----

struct Probe {
  std::uint64_t peak = 0;                                  // max over ranks of the total peak
  std::uint64_t states = 0, activations = 0, buffers = 0;  // rank 0: held states, activation and buffer peaks
  MemoryStats rank0;
  double seconds = 0.0;
};

Probe probe(const Args& a, int sp, long T, bool step) {
  Probe p;
  const auto arch = model_architecture(with_positions(a.cap_model, T));
  config::ConfigOptions copts;
  copts.world_size = sp;
  const config::DsConfig cfg = config::parse_ds_config(config::Json::parse(ds_json(a.cap_batch, a.cap_stage, 1, sp)), copts);
  const long Tl = T / sp;
  std::mutex mu;
  const auto t0 = Clock::now();
  run_local_ranks(sp, [&](Communicator& comm) {
    MeshGroups mesh = make_mesh_groups(comm, make_mesh_shape(sp, 1, sp));
    EngineOptions o;
    o.seed = 1;
    o.comm = mesh.data.get();
    o.tensor_parallel = mesh.tp.get();
    o.sequence_parallel = sp > 1 ? mesh.sp.get() : nullptr;
    o.sequence_length = Tl;
    SequenceParallelRank sr{mesh.coord.sp, sp};
    if (sp > 1 && a.cap_alst) sr = with_alst_tiles(sr, *arch, 1, 4);
    Engine e = initialize(make_model(arch, {0, 1}, sr), cfg, o);
    std::vector<std::int32_t> in, tg;
    if (step) {
      for (long b = 0; b < a.cap_batch; ++b) {
        std::vector<std::int32_t> si, st;
        sequence(b, T, arch->vocab_size(), si, st);
        in.insert(in.end(), si.begin() + mesh.coord.sp * Tl, si.begin() + (mesh.coord.sp + 1) * Tl);
        tg.insert(tg.end(), st.begin() + mesh.coord.sp * Tl, st.begin() + (mesh.coord.sp + 1) * Tl);
      }
      const Shape bt{a.cap_batch, Tl};
      e.forward(Batch{Tensor(in.data(), DType::int32, bt), Tensor(tg.data(), DType::int32, bt)});
      e.backward();
      e.step();
    }
    const MemoryStats m = e.report().memory;
    std::lock_guard<std::mutex> lock(mu);
    p.peak = std::max<std::uint64_t>(p.peak, m.total.peak);
    if (comm.rank() == 0) {
      p.rank0 = m;
      p.states = m[MemoryPurpose::params].current + m[MemoryPurpose::grads].current + m[MemoryPurpose::optimizer].current;
      p.activations = m[MemoryPurpose::activations].peak;
      p.buffers = m[MemoryPurpose::buffers].peak;
    }
  });
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return p;
}

struct CapResult {
  int sp = 1;
  long t_max = 0;
  Probe at_max, above;  // construction-time figures
  Probe step_at_max;    // a real step's (when verified)
  bool verified = false;
  int probes = 0;
  double seconds = 0.0;
};

// The largest multiple of the quantum q whose per-rank peak is <= cap: from `guess`, strides of
// `stride` (doubling) up while it fits or down while it does not, then bisection. From
// --cap-start with stride --cap-start this doubles T; `fails` (> 0) is a T known not to fit.
long search(const Args& a, int sp, std::uint64_t cap, bool step, int* probes, long guess, long stride, long fails = 0) {
  const long q = a.cap_quantum;
  const auto fits = [&](long T) {
    ++*probes;
    return probe(a, sp, T, step).peak <= cap;
  };
  stride = std::max(q, (stride / q) * q);
  long lo = 0, hi = 0;  // lo fits (0: none known), hi does not (0: none known)
  long t = std::max(q, (guess / q) * q);
  if (fails > 0 && t >= fails) t = std::max(q, fails - q);
  if (fits(t)) {
    lo = t;
    while (hi == 0) {
      t = lo + stride;
      if (fails > 0 && t >= fails) {
        hi = fails;
      } else if (fits(t)) {
        lo = t;
      } else {
        hi = t;
      }
      stride *= 2;
    }
  } else {
    hi = t;
    while (true) {
      t = hi - stride;
      if (t <= 0) break;
      if (fits(t)) {
        lo = t;
        break;
      }
      hi = t;
      stride *= 2;
    }
  }
  while (hi - lo > q) {
    const long mid = ((lo + hi) / 2 / q) * q;
    ++*probes;
    if (probe(a, sp, mid, step).peak > cap)
      hi = mid;
    else
      lo = mid;
  }
  return lo;
}

void part2(const Args& a) {
  const std::uint64_t cap = static_cast<std::uint64_t>(a.cap_mib) << 20;
  const auto arch = model_architecture(with_positions(a.cap_model, 1024));
  fmt::print(
      "\n== the longest sequence within {} MiB per rank: {} ({:.2f}M parameters), micro-batch {}, fp32, ZeRO {}, world = SP (DP 1); "
      "T to a multiple of {} ==\n",
      a.cap_mib, a.cap_model, arch->parameter_count() / 1e6, a.cap_batch, a.cap_stage, a.cap_quantum);
  fmt::print("(ALST's tiled loss and MLP at SP > 1: {}; --cap-alst)\n", a.cap_alst ? "on, as train sets them" : "off");
  fmt::print("(probes: the engine's allocator peak over all purposes, max over ranks, {})\n",
             a.cap_step_each ? "after one real step at every probe"
                             : "after the engine is built (every activation is allocated then); one real step checks T_max");
  std::vector<CapResult> rs;
  for (int sp : a.cap_sps) {
    CapResult r;
    r.sp = sp;
    const auto t0 = Clock::now();
    try {
      r.t_max = search(a, sp, cap, a.cap_step_each, &r.probes, a.cap_start, a.cap_start);
      if (r.t_max > 0) r.at_max = probe(a, sp, r.t_max, false);
      r.above = probe(a, sp, r.t_max + a.cap_quantum, false);
      if (a.cap_verify && !a.cap_step_each && r.t_max > 0) {
        r.step_at_max = probe(a, sp, r.t_max, true);
        r.verified = true;
        if (r.step_at_max.peak != r.at_max.peak) {
          // A step allocates beyond what the engine holds when built (e.g. ZeRO-3's gathered
          // parameters): search again with a step at every probe, starting where the extra bytes
          // (at the construction-time slope, bytes per quantum) put T_max; the T one quantum above the
          // construction-time T_max cannot fit.
          std::string grew;
          for (MemoryPurpose pu : kAllMemoryPurposes) {
            const auto x = r.step_at_max.rank0[pu].peak, y = r.at_max.rank0[pu].peak;
            if (x != y)
              grew += fmt::format(" {} {:+.2f} MiB", memory_purpose_name(pu), (static_cast<double>(x) - static_cast<double>(y)) / (1 << 20));
          }
          fmt::print(
              "SP {}: one step peaks at {} B, the engine built at T {} at {} B (rank 0's peaks:{}): searching again with a step at every probe\n", sp,
              r.step_at_max.peak, r.t_max, r.at_max.peak, grew);
          const double slope = static_cast<double>(r.above.peak - r.at_max.peak);  // bytes per quantum
          const long back = slope > 0 ? static_cast<long>(static_cast<double>(r.step_at_max.peak - r.at_max.peak) / slope + 1.0) * a.cap_quantum : 0;
          r.t_max = search(a, sp, cap, true, &r.probes, r.t_max - back, a.cap_quantum, r.t_max + a.cap_quantum);
          r.at_max = r.step_at_max = probe(a, sp, r.t_max, true);
          r.above = probe(a, sp, r.t_max + a.cap_quantum, true);
        }
      }
    } catch (const std::exception& e) {
      fmt::print("SP {}: error: {}\n", sp, e.what());
      continue;
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    rs.push_back(r);
    std::fflush(stdout);
  }
  if (rs.empty()) return;
  const long t1 = rs.front().sp == 1 ? rs.front().t_max : 0;
  fmt::print("{:>3} {:>8} {:>9} {:>12} {:>12} {:>12} {:>12} {:>14} {:>14} {:>13} {:>7} {:>8}\n", "SP", "T_max", "x SP=1", "peak MiB", "states MiB",
             "activ. MiB", "buffers MiB", "step peak MiB", "T_max+q MiB", "act B/token", "probes", "seconds");
  for (const CapResult& r : rs) {
    const double per_token = r.t_max > 0 ? static_cast<double>(r.at_max.activations) / static_cast<double>(r.t_max / r.sp) : 0.0;
    fmt::print("{:>3} {:>8} {:>9} {:>12} {:>12} {:>12} {:>12} {:>14} {:>14} {:>13.0f} {:>7} {:>8.1f}\n", r.sp, r.t_max,
               t1 > 0 ? fmt::format("{:.2f}x", static_cast<double>(r.t_max) / static_cast<double>(t1)) : std::string("-"), mib(r.at_max.peak),
               mib(r.at_max.states), mib(r.at_max.activations), mib(r.at_max.buffers), r.verified ? mib(r.step_at_max.peak) : std::string("-"),
               mib(r.above.peak), per_token, r.probes, r.seconds);
  }
  fmt::print(
      "(peak: max over ranks at T_max; step peak: the same after one real step at T_max; T_max+q: the peak one quantum above T_max, > the cap;\n"
      " act B/token: rank 0's activation peak over its own T_max / SP tokens)\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    set_log_level(LogLevel::warning);
    const char* threads = std::getenv("OMP_NUM_THREADS");
    fmt::print("bench_parallel_cpu: {} local ranks (threads of this process), OMP_NUM_THREADS={}\n", a.ranks,
               threads != nullptr ? threads : "(unset)");
    const auto t0 = Clock::now();
    if (a.part == 0 || a.part == 1) part1(a);
    const auto t1 = Clock::now();
    if (a.part == 0 || a.part == 2) part2(a);
    fmt::print("\nwall time: part 1 {:.1f} s, part 2 {:.1f} s\n", std::chrono::duration<double>(t1 - t0).count(),
               std::chrono::duration<double>(Clock::now() - t1).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_parallel_cpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
