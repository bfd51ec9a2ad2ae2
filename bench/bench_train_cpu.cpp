// bench_train_cpu: dstrain's training step on the CPU (forward + backward + AdamW, fp32 or bf16, ZeRO 0)
// through the Engine, at the shape given, in tokens/s and ms per step, with the time split into
// forward / backward / optimizer step. Prints one JSON line, like bench/pytorch_gpt2_cpu.py, so
// bench/compare_pytorch_cpu.sh can put the two side by side. Never asserts.
//
//   build/bench/bench_train_cpu --layers 12 --channels 768 --heads 12 --vocab 50257 --batch 4 --seq 256 --steps 3
//   build/bench/bench_train_cpu --model llama:L30-C576-H9-KV3-I1536-V49152-tied --batch 4 --seq 256 --steps 3
// (--model: any spec `dstrain train --model` takes; it replaces --layers/--channels/--heads/--vocab.)
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "models/model.h"
#include "models/model_registry.h"
#include "ops/kernels/matmul.h"

namespace {

struct Args {
  long layers = 2, channels = 64, heads = 4, vocab = 256, batch = 4, seq = 64, steps = 5, warmup = 1;
  double lr = 3e-4;
  std::string model;  // a model spec; empty: the GPT-2 descriptor of the shape options
  std::string precision = "fp32";  // or bf16: the config's bf16.enabled (fp32 masters and AdamW)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_train_cpu: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (k == "--layers")
      a.layers = std::atol(v);
    else if (k == "--channels")
      a.channels = std::atol(v);
    else if (k == "--heads")
      a.heads = std::atol(v);
    else if (k == "--vocab")
      a.vocab = std::atol(v);
    else if (k == "--batch")
      a.batch = std::atol(v);
    else if (k == "--seq")
      a.seq = std::atol(v);
    else if (k == "--steps")
      a.steps = std::atol(v);
    else if (k == "--warmup")
      a.warmup = std::atol(v);
    else if (k == "--lr")
      a.lr = std::atof(v);
    else if (k == "--model")
      a.model = v;
    else if (k == "--precision")
      a.precision = v;
    else {
      std::fprintf(stderr, "bench_train_cpu: unknown option %s (--model --layers --channels --heads --vocab --batch --seq --steps --warmup --lr --precision)\n",
                   k.c_str());
      std::exit(2);
    }
  }
  return a;
}

using Clock = std::chrono::steady_clock;
double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// CPU seconds this process has used, all threads (user + system): on a machine shared with other
// work the wall time of a step grows with the load while its CPU time hardly does, so the two
// peers are also compared by CPU seconds per step.
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    const std::string spec = !a.model.empty() ? a.model : fmt::format("gpt2:L{}-C{}-H{}-V{}-T{}", a.layers, a.channels, a.heads, a.vocab, a.seq);
    const std::shared_ptr<const dstrain::Architecture> model = dstrain::model_architecture(spec);
    const long vocab = static_cast<long>(model->vocab_size());
    // The PyTorch peer's optimizer: AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, no weight decay.
    const auto cfg =
        dstrain::config::parse_ds_config(dstrain::config::Json::parse(fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_clipping": 1.0,
          "bf16": {{"enabled": {}}},
          "optimizer": {{"type": "AdamW", "params": {{"lr": {}, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}}}}}})",
                                                                                  a.batch, a.precision == "bf16" ? "true" : "false", a.lr)),
                                         {});
    dstrain::Engine engine = dstrain::initialize(dstrain::make_model(model), cfg, {.seed = 0, .sequence_length = a.seq});
    // One fixed batch (the step's cost does not depend on the tokens), as the peer.
    std::vector<std::int32_t> tok(static_cast<std::size_t>(a.batch * a.seq + 1));
    std::uint32_t s = 1;
    for (auto& t : tok) {
      s = s * 1664525u + 1013904223u;
      t = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
    }
    std::vector<std::int32_t> in(tok.begin(), tok.end() - 1), tg(tok.begin() + 1, tok.end());
    const dstrain::Shape bt{a.batch, a.seq};
    const dstrain::Batch batch{dstrain::Tensor(in.data(), dstrain::DType::int32, bt), dstrain::Tensor(tg.data(), dstrain::DType::int32, bt)};
    double fwd = 0, bwd = 0, opt = 0, cpu0 = 0;
    float first_loss = 0, loss = 0;
    for (long i = 0; i < a.warmup + a.steps; ++i) {
      if (i == a.warmup) cpu0 = process_cpu_s();
      const auto t0 = Clock::now();
      loss = engine.forward(batch);
      const auto t1 = Clock::now();
      engine.backward();
      const auto t2 = Clock::now();
      engine.step();
      const auto t3 = Clock::now();
      if (i == 0) first_loss = loss;
      if (i >= a.warmup) {
        fwd += ms(t0, t1);
        bwd += ms(t1, t2);
        opt += ms(t2, t3);
      }
    }
    const double cpu_s = process_cpu_s() - cpu0;
    const double total = fwd + bwd + opt, n = static_cast<double>(a.steps);
    nlohmann::json j;
    j["peer"] = "dstrain-cpu";
    j["precision"] = a.precision;
    j["gemm_path"] = dstrain::cpu_gemm_path(a.precision == "bf16" ? dstrain::DType::bf16 : dstrain::DType::fp32);
    j["flops_per_token"] = model->flops_per_token(a.seq);
    j["tokens_per_s"] = static_cast<double>(a.batch * a.seq) * n / (total / 1000.0);
    j["ms_per_step"] = total / n;
    j["ms_forward"] = fwd / n;
    j["ms_backward"] = bwd / n;
    j["ms_optimizer"] = opt / n;
    j["cpu_s_per_step"] = cpu_s / n;
    const char* threads = std::getenv("OMP_NUM_THREADS");
    j["omp_num_threads"] = threads != nullptr ? threads : "unset";
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    j["omp_wait_policy"] = wait != nullptr ? wait : "unset";
    if (a.model.empty())
      j["shape"] = {{"L", a.layers}, {"C", a.channels}, {"NH", a.heads}, {"V", a.vocab}, {"B", a.batch}, {"T", a.seq}};
    else
      j["shape"] = {{"model", model->describe()}, {"B", a.batch}, {"T", a.seq}};
    j["parameters"] = engine.report().parameter_count;
    j["steps"] = a.steps;
    j["warmup_steps"] = a.warmup;
    j["loss_first"] = first_loss;
    j["loss_last"] = loss;
    std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_cpu: %s\n", e.what());
    return 2;
  }
  return 0;
}
