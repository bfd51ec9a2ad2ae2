// bench_onebit: OneBitAdam against Adam on W local ranks (threads, the local communicator) through
// the Engine: per optimizer the bytes each rank sends per step (ring volume by kind of collective,
// zero/communicator.h) during and after 1-bit Adam's warm-up, and the mean step time after warm-up.
// docs/optimizers_onebit.md explains the figures. Never asserts.
//
//   build/bench/bench_onebit --model gpt2:L4-C256-H4 --micro-batch 2 --seq 64 --ranks 4 --freeze-step 3 --steps 6
//
// The ranks share this machine's cores and communicate through memory, so the step times show the
// compression's own cost (packing, the host arithmetic), not the bandwidth it saves on a network.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "zero/local_communicator.h"
#include "models/gpt2/gpt2_family.h"

namespace {

struct Args {
  std::string model = "gpt2:L4-C256-H4";
  long micro_batch = 2, seq = 64, ranks = 4, freeze_step = 3, steps = 6;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_onebit: %s\noptions: --model SPEC --micro-batch B --seq T --ranks W --freeze-step N --steps N (after the warm-up)\n",
               why.c_str());
  std::exit(2);
}

long integer(const std::string& k, const char* v, long min) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < min) usage(fmt::format("{} {}: must be an integer >= {}", k, v, min));
  return x;
}

struct Result {
  std::vector<dstrain::CommStats> comm;  // rank 0, per step
  std::vector<double> ms;                // rank 0, per step
  float loss = 0.0f;
};

Result run(const Args& a, const std::string& optimizer) {
  const std::string json =
      fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_clipping": 1.0, "optimizer": {}}})", a.micro_batch, optimizer);
  dstrain::config::ConfigOptions opts;
  opts.world_size = a.ranks;
  const auto cfg = dstrain::config::parse_ds_config(dstrain::config::Json::parse(json), opts);
  Result res;
  const long total = a.freeze_step + 1 + a.steps;
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
    for (long k = 0; k < total; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      engine.forward(batch);
      engine.backward();
      engine.step();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (comm.rank() == 0) {
        res.comm.push_back(engine.report().zero.step_comm);
        res.ms.push_back(ms);
      }
    }
    if (comm.rank() == 0) res.loss = engine.state().last_step_loss;
  });
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--micro-batch")
      a.micro_batch = integer(k, v, 1);
    else if (k == "--seq")
      a.seq = integer(k, v, 1);
    else if (k == "--ranks")
      a.ranks = integer(k, v, 1);
    else if (k == "--freeze-step")
      a.freeze_step = integer(k, v, 1);
    else if (k == "--steps")
      a.steps = integer(k, v, 1);
    else
      usage("unknown option " + k);
  }
  std::printf("bench_onebit: %s, micro-batch %ld, T %ld, %ld local ranks, fp32, ZeRO 0; OneBitAdam freeze_step %ld, %ld steps after it\n",
              a.model.c_str(), a.micro_batch, a.seq, a.ranks, a.freeze_step, a.steps);
  const Result adam = run(a, R"({"type": "Adam", "params": {"lr": 1e-3}})");
  const Result onebit = run(a, fmt::format(R"({{"type": "OneBitAdam", "params": {{"lr": 1e-3, "freeze_step": {}}}}})", a.freeze_step));
  std::printf("%-6s %-12s %14s %14s %14s %14s %10s\n", "step", "optimizer", "bytes sent", "all_reduce", "all_to_all", "all_gather", "ms");
  for (std::size_t k = 0; k < adam.comm.size(); ++k) {
    for (const auto* r : {&adam, &onebit}) {
      const dstrain::CommStats& c = r->comm[k];
      std::printf("%-6zu %-12s %14llu %14llu %14llu %14llu %10.1f\n", k + 1, r == &adam ? "Adam" : "OneBitAdam",
                  static_cast<unsigned long long>(c.total_bytes_sent()),
                  static_cast<unsigned long long>(c.bytes_sent(dstrain::CollectiveKind::all_reduce)),
                  static_cast<unsigned long long>(c.bytes_sent(dstrain::CollectiveKind::all_to_all)),
                  static_cast<unsigned long long>(c.bytes_sent(dstrain::CollectiveKind::all_gather)), r->ms[k]);
    }
  }
  // After the warm-up: the compressed steps (freeze_step + 1 on), against Adam's same steps.
  auto mean = [&](const Result& r, bool bytes) {
    double s = 0.0;
    for (std::size_t k = static_cast<std::size_t>(a.freeze_step) + 1; k < r.comm.size(); ++k)
      s += bytes ? static_cast<double>(r.comm[k].total_bytes_sent()) : r.ms[k];
    return s / static_cast<double>(r.comm.size() - static_cast<std::size_t>(a.freeze_step) - 1);
  };
  std::printf("after the warm-up, per step and rank: Adam %.0f bytes, %.1f ms; OneBitAdam %.0f bytes (1/%.1f), %.1f ms\n", mean(adam, true),
              mean(adam, false), mean(onebit, true), mean(adam, true) / mean(onebit, true), mean(onebit, false));
  std::printf("final loss: Adam %.4f, OneBitAdam %.4f\n", adam.loss, onebit.loss);
  return 0;
}
