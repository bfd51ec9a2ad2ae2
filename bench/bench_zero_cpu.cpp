// bench_zero_cpu: ZeRO stages 0-3 on W local ranks (threads of one process, the local
// communicator) through the Engine API: per stage the mean step time after warm-up, tokens/s, the
// bytes each rank holds between steps (params / grads / optimizer states, from the allocator's
// statistics), the peak, and the bytes communicated per optimizer step by kind of collective (ring
// volume, zero/communicator.h) — then stage 3 against stage 0. Never asserts.
//
//   build/bench/bench_zero_cpu --model gpt2:L2-C64-H2-V256-T64 --micro-batch 4 --seq 64 --steps 5 --ranks 2
//
// The ranks are threads sharing this machine's cores, so step times measure the engine's own work
// and its synchronisation, not a network: stage 3's extra gathers cost copies here, not link time.
// Each rank trains on its own fixed random batch (the step's cost does not depend on the tokens).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "train/progress.h"
#include "zero/local_communicator.h"
#include "models/gpt2/gpt2_family.h"

namespace {

struct Args {
  std::string model = "gpt2:L2-C64-H2-V256-T64";
  long micro_batch = 4, seq = 64, gas = 1, steps = 5, warmup = 1, ranks = 2;
  std::string dtype = "fp32";      // fp32 | fp16 | bf16
  bool overlap = true;             // zero_optimization.overlap_comm
  long persistence_threshold = 0;  // stage3_param_persistence_threshold (0: partition every parameter)
  // stage3_max_reuse_distance / stage3_prefetch_bucket_size / stage3_max_live_parameters; -1: the
  // config's default (DeepSpeed's). With the defaults a small model stays gathered from forward to
  // backward (one all-gather a step); --max-reuse-distance 0 re-gathers it for backward (ZeRO's 3Ψ).
  long max_reuse_distance = -1, prefetch_bucket_size = -1, max_live_parameters = -1;
  std::vector<int> stages{0, 1, 2, 3};
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_zero_cpu: %s\n"
               "options: --model SPEC (gpt2:L<n>-C<c>-H<h>[-V<v>][-T<t>]) --micro-batch B --seq T --gas N --steps N --warmup N\n"
               "         --ranks W --dtype fp32|fp16|bf16 --overlap on|off --stages 0,1,2,3 --persistence-threshold N\n"
               "         --max-reuse-distance N --prefetch-bucket-size N --max-live-parameters N (stage 3; default: DeepSpeed's)\n",
               why.c_str());
  std::exit(2);
}

long positive(const std::string& k, const char* v, long min) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < min) usage(fmt::format("{} {}: must be an integer >= {}", k, v, min));
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--micro-batch")
      a.micro_batch = positive(k, v, 1);
    else if (k == "--seq")
      a.seq = positive(k, v, 1);
    else if (k == "--gas")
      a.gas = positive(k, v, 1);
    else if (k == "--steps")
      a.steps = positive(k, v, 1);
    else if (k == "--warmup")
      a.warmup = positive(k, v, 0);
    else if (k == "--ranks")
      a.ranks = positive(k, v, 1);
    else if (k == "--persistence-threshold")
      a.persistence_threshold = positive(k, v, 0);
    else if (k == "--max-reuse-distance")
      a.max_reuse_distance = positive(k, v, 0);
    else if (k == "--prefetch-bucket-size")
      a.prefetch_bucket_size = positive(k, v, 0);
    else if (k == "--max-live-parameters")
      a.max_live_parameters = positive(k, v, 1);
    else if (k == "--dtype") {
      a.dtype = v;
      if (a.dtype != "fp32" && a.dtype != "fp16" && a.dtype != "bf16") usage("--dtype " + a.dtype + ": fp32, fp16 or bf16");
    } else if (k == "--overlap") {
      const std::string s = v;
      if (s != "on" && s != "off") usage("--overlap " + s + ": on or off");
      a.overlap = s == "on";
    } else if (k == "--stages") {
      a.stages.clear();
      for (const char* p = v; *p != '\0'; ++p) {
        if (*p == ',') continue;
        if (*p < '0' || *p > '3') usage(fmt::format("--stages {}: a comma-separated list of 0..3", v));
        a.stages.push_back(*p - '0');
      }
    } else {
      usage("unknown option " + k);
    }
  }
  return a;
}

using Clock = std::chrono::steady_clock;

struct StageResult {
  int stage = 0;
  std::string error;
  double step_ms = 0.0;    // rank 0's mean over the timed steps (the ranks move in lockstep)
  double median_ms = 0.0;  // and the median: a shared machine's stray slow step moves the mean
  double tokens_per_s = 0.0;
  float loss = 0.0f;
  std::vector<dstrain::ZeroReport> reports;  // per rank
};

std::string ds_config_json(const Args& a, int stage) {
  std::string precision;
  if (a.dtype == "fp16") precision = R"("fp16": {"enabled": true, "initial_scale_power": 12},)";
  if (a.dtype == "bf16") precision = R"("bf16": {"enabled": true},)";
  std::string stage3;
  if (a.max_reuse_distance >= 0) stage3 += fmt::format(R"(, "stage3_max_reuse_distance": {})", a.max_reuse_distance);
  if (a.prefetch_bucket_size >= 0) stage3 += fmt::format(R"(, "stage3_prefetch_bucket_size": {})", a.prefetch_bucket_size);
  if (a.max_live_parameters >= 0) stage3 += fmt::format(R"(, "stage3_max_live_parameters": {})", a.max_live_parameters);
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0, {}
      "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}}}},
      "zero_optimization": {{"stage": {}, "overlap_comm": {}, "stage3_param_persistence_threshold": {}{}}}}})",
                     a.micro_batch, a.gas, precision, stage, a.overlap ? "true" : "false", a.persistence_threshold, stage3);
}

StageResult run_stage(const Args& a, int stage) {
  StageResult res;
  res.stage = stage;
  res.reports.resize(static_cast<std::size_t>(a.ranks));
  dstrain::config::ConfigOptions opts;
  opts.world_size = a.ranks;
  const auto cfg = dstrain::config::parse_ds_config(dstrain::config::Json::parse(ds_config_json(a, stage)), opts);
  const long timed = a.steps, total = a.warmup + a.steps;
  dstrain::run_local_ranks(static_cast<int>(a.ranks), [&](dstrain::Communicator& comm) {
    dstrain::Model model = dstrain::make_gpt2_model(a.model);
    const std::int64_t vocab = model.vocab_size;
    dstrain::Engine engine = dstrain::initialize(std::move(model), cfg, {.seed = 0, .comm = &comm, .sequence_length = a.seq});
    std::vector<std::int32_t> tok(static_cast<std::size_t>(a.micro_batch * a.seq + 1));
    std::uint32_t s = 1u + static_cast<std::uint32_t>(comm.rank());
    for (auto& t : tok) {
      s = s * 1664525u + 1013904223u;
      t = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
    }
    std::vector<std::int32_t> in(tok.begin(), tok.end() - 1), tg(tok.begin() + 1, tok.end());
    const dstrain::Shape bt{a.micro_batch, a.seq};
    const dstrain::Batch batch{dstrain::Tensor(in.data(), dstrain::DType::int32, bt), dstrain::Tensor(tg.data(), dstrain::DType::int32, bt)};
    std::vector<double> ms;
    for (long k = 0; k < total; ++k) {
      const auto t0 = Clock::now();
      for (long m = 0; m < a.gas; ++m) {
        engine.forward(batch);
        engine.backward();
        engine.step();
      }
      if (k >= a.warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    res.reports[static_cast<std::size_t>(comm.rank())] = engine.report().zero;
    if (comm.rank() == 0) {
      double sum = 0.0;
      for (double x : ms) sum += x;
      res.step_ms = sum / static_cast<double>(timed);
      std::sort(ms.begin(), ms.end());
      res.median_ms = ms.size() % 2 == 1 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
      res.loss = engine.state().last_step_loss;
      const double tokens = static_cast<double>(a.micro_batch * a.gas * a.ranks * a.seq);
      res.tokens_per_s = res.step_ms > 0.0 ? tokens / (res.step_ms / 1000.0) : 0.0;
    }
  });
  return res;
}

std::string mib(std::uint64_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1024.0 * 1024.0)); }

std::uint64_t max_over(const std::vector<dstrain::ZeroReport>& rs, std::uint64_t dstrain::ZeroReport::*field) {
  std::uint64_t m = 0;
  for (const auto& r : rs) m = std::max(m, r.*field);
  return m;
}

std::uint64_t states(const dstrain::ZeroReport& r) { return r.param_bytes + r.grad_bytes + r.optimizer_bytes; }

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::printf(
      "bench_zero_cpu: %s, micro-batch %ld x GAS %ld x %ld ranks, T %ld, %s, overlap_comm %s, stage3_param_persistence_threshold %ld; "
      "%ld warm-up + %ld timed steps\n",
      a.model.c_str(), a.micro_batch, a.gas, a.ranks, a.seq, a.dtype.c_str(), a.overlap ? "on" : "off", a.persistence_threshold, a.warmup, a.steps);
  std::vector<StageResult> results;
  for (int stage : a.stages) {
    try {
      results.push_back(run_stage(a, stage));
    } catch (const std::exception& e) {
      StageResult r;
      r.stage = stage;
      r.error = e.what();
      results.push_back(r);
    }
  }

  // Memory: rank 0's bytes held between steps (the ranks' shares are equal: the layout pads every
  // layer to split evenly), the peak the largest over ranks. Traffic: rank 0's bytes sent in the
  // last optimizer step, by kind (ring volume), and its calls.
  std::printf("\n%-5s %9s %9s %11s | %10s %10s %10s %10s %10s | %11s %11s %11s %11s | %7s %9s %9s\n", "stage", "step ms", "median", "tokens/s",
              "params MiB", "grads MiB", "optim MiB", "states MiB", "peak MiB", "allred MiB", "redsct MiB", "allgth MiB", "bcast MiB", "calls",
              "gathered", "loss");
  for (const StageResult& r : results) {
    if (!r.error.empty()) {
      std::printf("%-5d error: %s\n", r.stage, r.error.c_str());
      continue;
    }
    const dstrain::ZeroReport& z = r.reports.front();
    const auto& c = z.step_comm;
    using K = dstrain::CollectiveKind;
    std::printf("%-5d %9.2f %9.2f %11.0f | %10s %10s %10s %10s %10s | %11s %11s %11s %11s | %7llu %9lld %9.4f\n", r.stage, r.step_ms, r.median_ms,
                r.tokens_per_s, mib(z.param_bytes).c_str(), mib(z.grad_bytes).c_str(), mib(z.optimizer_bytes).c_str(), mib(states(z)).c_str(),
                mib(max_over(r.reports, &dstrain::ZeroReport::peak_bytes)).c_str(), mib(c.bytes_sent(K::all_reduce)).c_str(),
                mib(c.bytes_sent(K::reduce_scatter)).c_str(), mib(c.bytes_sent(K::all_gather)).c_str(), mib(c.bytes_sent(K::broadcast)).c_str(),
                static_cast<unsigned long long>(c.total_calls()), static_cast<long long>(z.peak_gathered_param_elements),
                static_cast<double>(r.loss));
  }
  if (!results.empty() && results.front().error.empty()) {
    const auto& z = results.front().reports.front();
    std::printf("\npadded parameters (Psi): %lld elements; comm per step in units of Psi x %s bytes:",
                static_cast<long long>(z.padded_param_elements), a.dtype == "fp32" ? "4" : "2");
    const double unit = static_cast<double>(z.padded_param_elements) * (a.dtype == "fp32" ? 4.0 : 2.0);
    for (const StageResult& r : results) {
      if (r.error.empty() && unit > 0)
        std::printf(" stage %d %.2f", r.stage, static_cast<double>(r.reports.front().step_comm.total_bytes_sent()) / unit);
    }
    std::printf("\n");
  }
  const StageResult* s0 = nullptr;
  const StageResult* s3 = nullptr;
  for (const StageResult& r : results) {
    if (!r.error.empty()) continue;
    if (r.stage == 0) s0 = &r;
    if (r.stage == 3) s3 = &r;
  }
  if (s0 != nullptr && s3 != nullptr) {
    const auto ratio = [](double x, double y) { return y > 0.0 ? x / y : 0.0; };
    const auto& z0 = s0->reports.front();
    const auto& z3 = s3->reports.front();
    std::printf("stage 3 / stage 0: step time %.2fx | model states per rank %.3fx | peak %.3fx | bytes sent per step %.2fx\n",
                ratio(s3->step_ms, s0->step_ms), ratio(static_cast<double>(states(z3)), static_cast<double>(states(z0))),
                ratio(static_cast<double>(max_over(s3->reports, &dstrain::ZeroReport::peak_bytes)),
                      static_cast<double>(max_over(s0->reports, &dstrain::ZeroReport::peak_bytes))),
                ratio(static_cast<double>(z3.step_comm.total_bytes_sent()), static_cast<double>(z0.step_comm.total_bytes_sent())));
  }
  bool failed = false;
  for (const StageResult& r : results) failed = failed || !r.error.empty();
  return failed ? 1 : 0;
}
