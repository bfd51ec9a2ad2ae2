// bench_activation_memory: peak activation memory with and without activation checkpointing, as
// the allocator counts it, and the extra forward cost of the recompute. Never asserts.
//
//   build/bench/bench_activation_memory                    # d12 shapes: B=4, T=1024 (allocation only)
//   build/bench/bench_activation_memory --model gpt2:d12 --batch 4 --seq 1024 --time-batch 1 --time-seq 128 --reps 2
//
// Part 1 builds an engine per variant at (--batch, --seq) and reads the allocator's statistics:
// the engine allocates every activation up front and nothing during a step (tests/unit/engine
// checks that), so the statistics after construction are the step's peak; no step runs, so the
// untouched pages cost no RAM. It also prints the figure computed from the layers' specs (the
// formula of engine/activation_checkpointing.h, 64-byte alignment ignored) next to the measured one.
// Part 2 times forward and backward (recompute included) at (--time-batch, --time-seq), where a
// step runs in seconds on a CPU: the extra cost is the blocks' forward run a second time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/activation_checkpointing.h"
#include "engine/engine.h"
#include "ops/log.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_family.h"

namespace {

using namespace dstrain;

struct Args {
  std::string model = "gpt2:d12";
  long batch = 4, seq = 1024, time_batch = 1, time_seq = 128, reps = 2;
};

struct Variant {
  std::string label;
  bool on = false;
  std::optional<int> k;
  bool cpu = false, contiguous = false;
  std::string section() const {
    if (!on) return "";
    std::string s = R"(, "activation_checkpointing": {)";
    if (k) s += fmt::format(R"("number_checkpoints": {}, )", *k);
    return s + fmt::format(R"("cpu_checkpointing": {}, "contiguous_memory_optimization": {}}})", cpu, contiguous);
  }
};

config::DsConfig ds(long micro, const std::string& section) {
  return config::parse_ds_config(
      config::Json::parse(
          fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4}}}}{}}})", micro, section)),
      {});
}

// The formula from the layers' specs (bytes, alignment ignored).
std::size_t formula(const Gpt2Config& cfg, long B, long T, const Variant& v, std::size_t* host) {
  const LayerDims d{B, T, DType::fp32};
  const auto layers = make_gpt2_layers(cfg);
  const std::size_t btc = static_cast<std::size_t>(B * T * cfg.n_embd) * 4;
  std::vector<std::size_t> block;
  std::size_t all = 0, head = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::size_t b = layers[i]->output(d).nbytes();
    for (const auto& s : layers[i]->saved_activations(d)) b += s.nbytes();
    all += b;
    if (i + 1 == layers.size())
      head = b;
    else if (i > 0)
      block.push_back(b);
  }
  *host = 0;
  if (!v.on) return all + btc;
  const std::size_t n = block.size(), K = v.k ? static_cast<std::size_t>(*v.k) : n;
  std::size_t seg = 0;
  for (std::size_t s = 0, b = 0; s < K; ++s) {
    std::size_t bytes = 0;
    for (std::size_t j = 0; j < n / K + (s < n % K ? 1 : 0); ++j) bytes += block[b++];
    seg = std::max(seg, bytes);
  }
  const std::size_t area = std::max(seg, head);
  if (v.cpu) {
    *host = (K - 1) * btc;
    return 2 * btc + area + btc;
  }
  return K * btc + btc + area + btc;
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--batch")
      a.batch = std::atol(v);
    else if (k == "--seq")
      a.seq = std::atol(v);
    else if (k == "--time-batch")
      a.time_batch = std::atol(v);
    else if (k == "--time-seq")
      a.time_seq = std::atol(v);
    else if (k == "--reps")
      a.reps = std::atol(v);
    else {
      std::fprintf(stderr, "bench_activation_memory: unknown option %s (--model --batch --seq --time-batch --time-seq --reps)\n", k.c_str());
      return 2;
    }
  }
  try {
    set_log_level(LogLevel::warning);  // no per-engine description lines
    const Gpt2Config cfg = model_config_from_spec(a.model);
    const int L = static_cast<int>(cfg.n_layer);
    std::vector<Variant> variants{{"off (every activation kept)", false, {}, false, false}};
    for (int k : {L, L / 2, L / 3, L / 4, 2, 1}) {
      if (k < 1 || k > L) continue;
      bool dup = false;
      for (const auto& v : variants) dup = dup || (v.on && v.k && *v.k == k);
      if (!dup) variants.push_back({fmt::format("number_checkpoints {}{}", k, k == L ? " (default: one per block)" : ""), true, k, false, false});
    }
    variants.push_back({fmt::format("number_checkpoints {} + contiguous", L), true, L, false, true});
    variants.push_back({fmt::format("number_checkpoints {} + cpu_checkpointing", L), true, L, true, false});
    variants.push_back({"number_checkpoints 4 + cpu_checkpointing", true, 4, true, false});

    fmt::print("{} (n_layer {}, n_embd {}, Vp {}), B={}, T={}, fp32: activation memory (allocator statistics, purpose activations)\n", a.model,
               cfg.n_layer, cfg.n_embd, cfg.padded_vocab_size, a.batch, a.seq);
    fmt::print("{:<48} {:>14} {:>14} {:>14} {:>8}\n", "variant", "device peak", "formula", "host", "vs off");
    std::size_t off_bytes = 0;
    for (const Variant& v : variants) {
      CpuAllocator dev, host;
      Engine e = initialize(make_gpt2_model(cfg), ds(a.batch, v.section()),
                            {.seed = 1,
                             .sequence_length = a.seq,
                             .init_params = false,
                             .allocator = &dev,
                             .checkpoint_activations = v.on,
                             .host_allocator = &host});
      const std::size_t peak = dev.stats()[MemoryPurpose::activations].peak;
      std::size_t host_formula = 0;
      const std::size_t f = formula(cfg, a.batch, a.seq, v, &host_formula);
      if (!v.on) off_bytes = peak;
      fmt::print("{:<48} {:>14} {:>14} {:>14} {:>7.1f}%\n", v.label, format_bytes(peak), format_bytes(f),
                 format_bytes(host.stats()[MemoryPurpose::activations].peak), 100.0 * static_cast<double>(peak) / static_cast<double>(off_bytes));
    }

    // ---- the recompute's cost: the variants' steps interleaved rep by rep (a busy machine slows
    // them alike), best of --reps; and, within one checkpointed run, the segments' recompute time
    // against their own forward time (the same work, measured side by side) ----
    if (a.reps > 0) {
      fmt::print("\ntime per micro-batch at B={}, T={} (forward; backward incl. recompute), best of {} interleaved:\n", a.time_batch, a.time_seq,
                 a.reps);
      std::vector<std::int32_t> tok(static_cast<std::size_t>(a.time_batch * a.time_seq)), tgt(tok.size());
      for (std::size_t i = 0; i < tok.size(); ++i) {
        tok[i] = static_cast<std::int32_t>((i * 2654435761u) % static_cast<std::size_t>(cfg.vocab_size));
        tgt[i] = static_cast<std::int32_t>((i * 40503u + 7) % static_cast<std::size_t>(cfg.vocab_size));
      }
      const Batch batch{Tensor(tok.data(), DType::int32, Shape{a.time_batch, a.time_seq}),
                        Tensor(tgt.data(), DType::int32, Shape{a.time_batch, a.time_seq})};
      const std::vector<Variant> timed{variants[0], variants[1], variants[variants.size() - 2]};
      std::vector<Engine> engines;
      for (const Variant& v : timed) {
        engines.push_back(initialize(make_gpt2_model(cfg), ds(a.time_batch, v.section()),
                                     {.seed = 1, .sequence_length = a.time_seq, .checkpoint_activations = v.on}));
      }
      std::vector<double> f(timed.size(), 1e30), b(timed.size(), 1e30), seg_f(timed.size(), 1e30), seg_r(timed.size(), 1e30);
      for (long r = 0; r < a.reps; ++r) {
        for (std::size_t k = 0; k < timed.size(); ++k) {
          auto t = Clock::now();
          engines[k].forward(batch);
          f[k] = std::min(f[k], ms_since(t));
          t = Clock::now();
          engines[k].backward();
          b[k] = std::min(b[k], ms_since(t));
          if (const ActivationCheckpointing* ck = engines[k].report().checkpointing) {
            double sf = 0, sr = 0;
            for (const SegmentProfile& p : ck->profile()) {
              sf += p.forward_s * 1e3;
              sr += p.recompute_s * 1e3;
            }
            seg_f[k] = std::min(seg_f[k], sf);
            seg_r[k] = std::min(seg_r[k], sr);
          }
        }
      }
      for (std::size_t k = 0; k < timed.size(); ++k) {
        fmt::print("{:<48} forward {:8.1f} ms  backward {:8.1f} ms  total {:8.1f} ms ({:+.1f}% vs off)", timed[k].label, f[k], b[k], f[k] + b[k],
                   100.0 * ((f[k] + b[k]) / (f[0] + b[0]) - 1.0));
        if (timed[k].on) fmt::print("; blocks: forward {:.1f} ms, recompute {:.1f} ms", seg_f[k], seg_r[k]);
        fmt::print("\n");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_activation_memory: %s\n", e.what());
    return 1;
  }
  return 0;
}
