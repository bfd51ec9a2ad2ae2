#include "train_command.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/monitor/flops.h"
#include "engine/monitor/memory_breakdown.h"
#include "engine/monitor/monitor_master.h"
#include "engine/monitor/timers.h"
#include "engine/monitor/train_events.h"
#include "ops/kernels/matmul.h"
#include "zero/launch_env.h"
#include "zero/local_communicator.h"

namespace dstrain::cli {
namespace {

struct TrainArgs {
  std::string config, model, data, val_data, tokenizer, init_from, save_weights, summary_json;
  std::optional<std::int64_t> steps, sequence_length, warmup_steps;
  std::uint64_t seed = 42;
  std::int64_t val_interval = 100, val_batches = 20;
  bool checkpoint_activations = false;
  bool bf16_stochastic_rounding = false;
  std::vector<std::int64_t> inject_overflow;  // optimizer steps (1-based) given an inf gradient
  std::int64_t sample_tokens = 64, sample_top_k = 40;
  float sample_temperature = 1.0f;
  double peak_flops = 0.0;  // 0: measure this machine's sgemm once (flops_profiler only)
  std::int64_t num_ranks = 1;  // data-parallel ranks, as threads of this process (local communicator)
  std::string device = "cpu";  // where the engine trains: cpu, cuda, cuda:N
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Micro-batch token storage the engine's Batch views.
struct TokenBatch {
  std::vector<std::int32_t> inputs, targets;
  Shape shape;
  TokenBatch(std::int64_t B, std::int64_t T) : inputs(static_cast<std::size_t>(B * T)), targets(inputs.size()), shape{B, T} {}
  Batch batch() { return Batch{Tensor(inputs.data(), DType::int32, shape), Tensor(targets.data(), DType::int32, shape)}; }
};

// Sum and count of the losses over the eval loader's batches (the same ones every time).
std::pair<double, std::size_t> evaluate_sum(Engine& engine, EvalLoader& loader, TokenBatch& tb) {
  loader.reset();
  double sum = 0.0;
  std::size_t n = 0;
  while (loader.next(tb.inputs, tb.targets)) {
    sum += engine.evaluate(tb.batch());
    ++n;
  }
  return {sum, n};
}

// Mean loss over the eval loader's batches.
double evaluate(Engine& engine, EvalLoader& loader, TokenBatch& tb) {
  const auto [sum, n] = evaluate_sum(engine, loader, tb);
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

// ---- samples at the val interval (llm.c / nanoGPT) ----

// The run's tokenizer for printing samples: --tokenizer, else GPT-2's when the model's vocabulary
// holds its 50257 tokens, else bytes. nullptr (samples print as token ids) when GPT-2's encoder
// files are not in the cache: a sample is never worth failing a run.
std::unique_ptr<Tokenizer> sample_tokenizer(const std::string& option, std::int64_t vocab) {
  const std::string name = !option.empty() ? option : vocab >= Gpt2Tokenizer::kVocabSize ? "gpt2" : "bytes";
  try {
    return make_tokenizer(name, resolve_cache_dir());
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: samples print token ids: the %s tokenizer did not load (%s)\n", name.c_str(), e.what());
    return nullptr;
  }
}

// `bytes` with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD, as
// nanoGPT's decode(errors="replace") prints: a barely trained byte-level model emits lone high
// bytes, which would otherwise reach the terminal or log as invalid UTF-8.
std::string printable_utf8(std::string_view bytes) {
  std::string out;
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = u[i];
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    }
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = k == 1 ? (u[i + k] >= lo && u[i + k] <= hi) : (u[i + k] >= 0x80 && u[i + k] <= 0xBF);
    if (ok) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

void print_sample(Generator& gen, const Tokenizer* tok, const SamplingOptions& so, std::int64_t step, std::int64_t steps) {
  const std::vector<std::int32_t> out = gen.generate({}, so);
  std::string text;
  if (tok != nullptr) {
    text = printable_utf8(decode_for_print(*tok, out));
  } else {
    for (const std::int32_t id : out) text += fmt::format("{}{}", text.empty() ? "" : " ", id);
  }
  say(fmt::format("step {}/{} | sample ({} tokens, top-k {}, temperature {}, seed {}):\n---\n{}\n---", step, steps, so.max_new_tokens, so.top_k,
                  so.temperature, so.seed, text));
}

// ---- flops profiler ----

// FLOP/s of one n x n x n GEMM through dstrain's matmul kernel on the training device, best of 3:
// the practical peak for MFU when --peak-flops is not given. The CPU: a 1024^3 fp32 sgemm (the
// BLAS the layers use). A GPU: a 4096^3 GEMM in the training dtype (the tensor cores for fp16 /
// bf16) on device memory, each run synchronised; a CPU sgemm would make a GPU's MFU meaningless.
double measure_gemm_flops(Device device, DType dtype) {
  const bool gpu = !device.is_cpu();
  const std::int64_t n = gpu ? 4096 : 1024;
  const Shape sq{n, n};
  std::vector<float> a, b, c;
  std::unique_ptr<Allocator> alloc;
  Buffer buf;
  Tensor ta, tb, tc, scratch;  // scratch: the fp32 one matmul's contract asks of 16-bit storage (unused on a GPU)
  if (gpu) {
    alloc = make_device_allocator(device);
    const std::size_t bytes = static_cast<std::size_t>(n * n) * dtype_size(dtype);
    const auto scratch_elems = static_cast<std::int64_t>(matmul_scratch_elems(dtype, n));
    buf = Buffer(*alloc, 3 * bytes + static_cast<std::size_t>(scratch_elems) * sizeof(float), MemoryPurpose::buffers);
    ta = buf.tensor(dtype, sq, 0);
    tb = buf.tensor(dtype, sq, bytes);
    tc = buf.tensor(dtype, sq, 2 * bytes);
    if (scratch_elems > 0) scratch = buf.tensor(DType::fp32, Shape{scratch_elems}, 3 * bytes);
    zero_tensor(ta);
    zero_tensor(tb);
    matmul_forward(tc, ta, tb, Tensor{}, scratch);  // warm-up: cuBLASLt's handle and algorithm choice
    synchronize_device(device);
  } else {
    a.assign(static_cast<std::size_t>(n * n), 0.5f);
    b.assign(a.size(), 0.25f);
    c.resize(a.size());
    ta = Tensor(a.data(), DType::fp32, sq);
    tb = Tensor(b.data(), DType::fp32, sq);
    tc = Tensor(c.data(), DType::fp32, sq);
  }
  double best = 0.0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    matmul_forward(tc, ta, tb, Tensor{}, scratch);
    if (gpu) synchronize_device(device);
    const double s = seconds_since(t0);
    if (s > 0.0) best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
  }
  return best;
}

// DeepSpeed's print_model_profile at profile_step, with the step's measured fwd / bwd / step times,
// plus MFU (llm.c's 6N + 6LCT per token) against the peak.
void emit_profile(const config::DsConfig& cfg, const Gpt2Config& g, std::int64_t B, std::int64_t T, std::int64_t TBS, double fwd_ms, double bwd_ms,
                  double step_ms, double peak_flops, bool peak_measured) {
  Gpt2FlopsShape shape{.batch = B, .seq_len = T, .channels = g.n_embd, .heads = g.n_head, .vocab = g.padded_vocab_size, .layers = g.n_layer,
                       .max_seq_len = g.n_positions};
  const ModuleFlops tree = gpt2_forward_flops(shape);
  FlopsProfileInput in;
  in.model = &tree;
  in.profile_step = cfg.flops_profiler.profile_step;
  in.micro_batch_per_gpu = B;
  in.fwd_ms = fwd_ms;
  in.bwd_ms = bwd_ms;
  in.step_ms = step_ms;
  std::string text = format_flops_profile(in, cfg.flops_profiler);
  const double step_s = (fwd_ms + bwd_ms + step_ms) / 1000.0;
  const double tokens_per_s = step_s > 0.0 ? static_cast<double>(TBS * T) / step_s : 0.0;
  const double per_token = model_flops_per_token(parameter_count_padded(g), g.n_layer, g.n_embd, T);
  text += fmt::format("\nMFU (6N + 6LCT = {} per token, {} tokens/s, against a peak of {}{}): {:.2f}%\n", flops_number_to_string(per_token),
                      format_count(tokens_per_s), flops_flops_to_string(peak_flops),
                      peak_measured ? " measured by one GEMM on the training device; set --peak-flops" : " from --peak-flops",
                      100.0 * mfu(per_token, tokens_per_s, peak_flops));
  emit_flops_profile(text, cfg.flops_profiler);
  if (cfg.flops_profiler.output_file) say(fmt::format("flops profile of step {} written to {}", in.profile_step, *cfg.flops_profiler.output_file));
}

void require_file(const std::string& path, const char* option) {
  if (!std::filesystem::is_regular_file(path)) {
    fail("{} {}: no such file; {}", option, path,
         std::string(option) == "--data" || std::string(option) == "--val-data"
             ? "make token files with `dstrain prepare-data` (scripts/setup.sh makes data/brown_train.bin and data/brown_val.bin)"
             : "give the path of an existing file");
  }
}

// What the rank threads hand back to the main thread (threads of one process: each rank writes
// its own slot; the main thread reads them after run_local_ranks has joined every thread).
struct RunResult {
  std::optional<TrainSummary> summary;  // rank 0's
  // One per rank of this process, indexed by rank - report_offset: every rank with --num-ranks;
  // with a launcher, this process's rank alone (the others' stay in their processes).
  std::vector<ZeroReport> reports;
  int report_offset = 0;
};

// The val loss over every rank's share of the val batches (EvalLoader gives rank r of W the
// batches j·W + r): each rank sums its own, and one all-reduce of [sum, count] combines them.
// One rank: the mean of its batches, as before ZeRO.
double evaluate_all_ranks(Engine& engine, EvalLoader& loader, TokenBatch& tb) {
  if (engine.world_size() == 1) return evaluate(engine, loader, tb);
  const auto [sum, n] = evaluate_sum(engine, loader, tb);
  std::array<float, 2> buf{static_cast<float>(sum), static_cast<float>(n)};
  engine.all_reduce_sum(buf);
  return buf[1] > 0.0f ? static_cast<double>(buf[0]) / static_cast<double>(buf[1]) : 0.0;
}

nlohmann::json comm_json(const CommStats& c) {
  nlohmann::json j;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    j[std::string(collective_name(kind))] = {{"bytes", c.bytes_sent(kind)}, {"calls", c.call_count(kind)}};
  }
  j["total"] = {{"bytes", c.total_bytes_sent()}, {"calls", c.total_calls()}};
  return j;
}

// --summary-json's "zero" object: the stage, the world size and every rank's ZeroReport.
nlohmann::json zero_json(const std::vector<ZeroReport>& reports) {
  nlohmann::json z;
  z["stage"] = reports.empty() ? 0 : reports.front().stage;
  z["world_size"] = reports.size();
  nlohmann::json ranks = nlohmann::json::array();
  for (const ZeroReport& r : reports) {
    ranks.push_back({{"rank", r.rank},
                     {"param_bytes", r.param_bytes},
                     {"grad_bytes", r.grad_bytes},
                     {"optimizer_bytes", r.optimizer_bytes},
                     {"peak_bytes", r.peak_bytes},
                     {"padded_param_elements", r.padded_param_elements},
                     {"peak_gathered_param_elements", r.peak_gathered_param_elements},
                     {"step_comm", comm_json(r.step_comm)}});
  }
  z["ranks"] = ranks;
  return z;
}

// One rank's run: its own Engine (options.comm = comm; nullptr: the single rank), its own
// DataLoader for rank r of W, the same Engine calls in the same order as every other rank. Only
// rank 0 prints, writes monitors and samples.
void train_rank(const TrainArgs& args, const config::DsConfig& cfg, Device device, Communicator* comm, double peak_flops, bool peak_measured,
                RunResult& result) {
  const int rank = comm != nullptr ? comm->rank() : 0;
  const int world = comm != nullptr ? comm->world_size() : 1;
  const bool lead = rank == 0;
  const auto say0 = [lead](const std::string& line) {
    if (lead) say(line);
  };

  // ---- model and sequence length ----
  Model model = make_gpt2_model(args.model);
  const Gpt2Config gcfg = *model.gpt2;
  const std::int64_t T = args.sequence_length ? *args.sequence_length : std::min<std::int64_t>(gcfg.n_positions, 1024);
  if (T < 1 || T > gcfg.n_positions) {
    fail("--sequence-length {}: must be between 1 and the model's n_positions = {} (give a model with more positions, e.g. a -T<n> descriptor)", T,
         gcfg.n_positions);
  }
  if (!args.tokenizer.empty()) {
    const std::int64_t tv = args.tokenizer == "gpt2" ? Gpt2Tokenizer::kVocabSize : ByteTokenizer().vocab_size();
    if (gcfg.vocab_size < tv) {
      fail("--tokenizer {} has {} tokens but the model {} has a vocabulary of {}; give a model with -V{} (or more)", args.tokenizer, tv, args.model,
           gcfg.vocab_size, tv);
    }
  }

  // ---- engine ----
  Engine engine = initialize(std::move(model), cfg,
                             {.seed = args.seed,
                              .comm = comm,
                              .sequence_length = T,
                              .init_params = args.init_from.empty(),
                              .device = device,
                              .checkpoint_activations = args.checkpoint_activations,
                              .bf16_stochastic_rounding = args.bf16_stochastic_rounding,
                              .inject_overflow_steps = args.inject_overflow});
  if (!args.init_from.empty()) engine.load_weights(args.init_from);
  const std::int64_t B = engine.micro_batch_size(), GAS = engine.gradient_accumulation_steps(), TBS = engine.train_batch_size();
  const int stage = engine.zero_stage();

  // ---- data: rank r of W reads its slots of every global batch (engine/data/data_loader.h) ----
  DataLoaderOptions dlo;
  dlo.micro_batch_size = static_cast<std::size_t>(B);
  dlo.sequence_length = static_cast<std::size_t>(T);
  dlo.gradient_accumulation_steps = static_cast<int>(GAS);
  dlo.world_size = world;
  dlo.rank = rank;
  dlo.seed = args.seed;
  dlo.vocab_size = static_cast<std::int32_t>(gcfg.vocab_size);
  DataLoader loader = DataLoader::open(args.data, dlo);
  if (lead) loader.validate(static_cast<std::int32_t>(gcfg.vocab_size));  // one scan is enough: the ranks read the same file
  std::optional<EvalLoader> val;
  if (!args.val_data.empty()) {
    EvalLoaderOptions elo;
    elo.batch_size = static_cast<std::size_t>(B);
    elo.sequence_length = static_cast<std::size_t>(T);
    // --val-batches counts batches of B sequences over all ranks, so W ranks evaluate the windows
    // one rank would (the first val-batches·B of the file), each rank a disjoint 1/W of them.
    elo.world_size = world;
    elo.rank = rank;
    elo.max_batches = static_cast<std::size_t>((args.val_batches + world - 1) / world);
    elo.vocab_size = static_cast<std::int32_t>(gcfg.vocab_size);
    val.emplace(EvalLoader::open(args.val_data, elo));
  }
  const std::int64_t epoch_steps = std::max<std::int64_t>(1, static_cast<std::int64_t>(loader.window_count()) / TBS);
  const std::int64_t steps = args.steps ? *args.steps : epoch_steps;

  // ---- what is about to run ----
  say0(fmt::format("model {}: {}", args.model, gcfg.n_layer > 0 ? describe(gcfg) : ""));
  say0(fmt::format("batch: train_batch_size {} = micro-batch {} x gradient_accumulation_steps {} x world size {}; sequence length {} -> {} tokens per step",
                   TBS, B, GAS, world, T, format_count(static_cast<double>(TBS * T))));
  if (!device.is_cpu()) say0(fmt::format("device: {}", device.str()));
  if (world > 1 || stage > 0 || (comm != nullptr && comm->backend() != "local")) {
    const bool local = comm == nullptr || comm->backend() == "local";
    say0(fmt::format("zero: stage {} on {} rank{}{}", stage, world, world == 1 ? "" : "s",
                     !local ? fmt::format(" ({}: one process per rank)", comm->backend())
                     : world > 1 ? std::string(" (--num-ranks: threads of this process, local communicator)") : std::string()));
  }
  say0(fmt::format("data: {} ({} windows of {} tokens; one epoch = {} steps){}", args.data, format_count(static_cast<double>(loader.window_count())), T + 1,
                   epoch_steps,
                   val ? fmt::format("; val {} ({} batches per evaluation)", args.val_data, val->batch_count() * static_cast<std::size_t>(world))
                       : std::string("; no val data")));
  say0(fmt::format("optimizer {} lr {} | gradient_clipping {} | seed {} | {} steps{}", cfg.optimizer.type, cfg.optimizer.params.lr, cfg.gradient_clipping,
                   args.seed, steps, args.steps ? "" : " (one epoch; set --steps)"));
  if (cfg.fp16.enabled) {
    say0(fmt::format("precision fp16: {} loss scale {:g}{}", cfg.fp16.dynamic() ? "dynamic" : "static", engine.loss_scale(),
                     cfg.fp16.dynamic() ? fmt::format(" (window {}, min {})", cfg.fp16.loss_scale_window, cfg.fp16.min_loss_scale) : std::string()));
  } else if (cfg.bf16.enabled) {
    say0("precision bf16 (fp32 master params and optimizer state)");
  }
  if (cfg.scheduler.present()) {
    say0(fmt::format("scheduler {}: lr of step 1 = {:.3e} (stepped after every optimizer step)", cfg.scheduler.type, engine.lr()));
  }
  std::int64_t print_every = 10;
  if (cfg.steps_per_print && *cfg.steps_per_print > 0) {
    print_every = *cfg.steps_per_print;
  } else {
    say0("steps_per_print is not set in the config: printing progress every 10 steps");
  }

  // ---- monitoring (rank 0 writes): csv_monitor / tensorboard files, wall_clock_breakdown timers,
  // memory_breakdown lines, the flops profile ----
  MonitorMaster monitors(cfg, rank);
  // DeepSpeed times with wall_clock_breakdown or the flops profiler on (the config layer turns the
  // former on with the latter). step_timers: this optimizer step (events, profile), reset every
  // step; print_timers: since the last progress line (the log line, per step).
  const bool timing = cfg.wall_clock_breakdown || cfg.flops_profiler.enabled;
  Timers step_timers, print_timers;
  const auto timed = [&](std::string_view name, auto&& fn) {
    if (!timing) return fn();
    step_timers(name).start();
    print_timers(name).start();
    fn();
    step_timers(name).stop();
    print_timers(name).stop();
  };

  // ---- samples (rank 0 generates; at ZeRO stage 3 every rank takes part in generation_model(),
  // which gathers the partitioned parameters, and its views last only until the next forward, so
  // the generator is rebuilt at every sample) ----
  // Its own, so the run's peak memory stays the engine's; on the engine's device; outlives the generator.
  const std::unique_ptr<Allocator> sample_allocator_owner = make_device_allocator(engine.device());
  Allocator& sample_allocator = *sample_allocator_owner;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<Generator> generator;
  SamplingOptions sampling;
  const bool sampling_on = args.sample_tokens > 0;
  if (sampling_on && lead) {
    tokenizer = sample_tokenizer(args.tokenizer, gcfg.vocab_size);
    if (stage < 3) generator.emplace(engine.generation_model(), T, sample_allocator);
    sampling.max_new_tokens = args.sample_tokens;
    sampling.top_k = args.sample_top_k;
    sampling.temperature = args.sample_temperature;
    sampling.seed = args.seed;
    sampling.eot_token = tokenizer ? tokenizer->eot_token() : Gpt2Tokenizer::kEotToken;
    if (sampling.eot_token >= gcfg.vocab_size) sampling.eot_token = 0;
  }
  const auto sample = [&](std::int64_t step) {
    if (!sampling_on) return;
    if (stage >= 3) {
      GenerationModel gm = engine.generation_model();  // collective: every rank
      if (!lead) return;
      Generator gen(std::move(gm), T, sample_allocator);
      print_sample(gen, tokenizer.get(), sampling, step, steps);
    } else if (lead) {
      print_sample(*generator, tokenizer.get(), sampling, step, steps);
    }
  };

  // ---- the loop ----
  TrainSummary summary;
  summary.model = describe(gcfg);
  summary.parameters = parameter_count(gcfg);
  summary.parameters_stored = parameter_count_padded(gcfg);
  summary.train_batch_size = TBS;
  summary.sequence_length = T;
  TokenBatch tb(B, T);
  const auto start = Clock::now();
  double train_s = 0.0, interval_train_s = 0.0;
  std::int64_t interval_steps = 0;
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    for (std::int64_t m = 0; m < GAS; ++m) {
      loader.next_micro_batch(tb.inputs, tb.targets);
      timed(kForwardGlobalTimer, [&] { engine.forward(tb.batch()); });
      timed(kBackwardGlobalTimer, [&] { engine.backward(); });
      timed(kStepGlobalTimer, [&] { engine.step(); });
    }
    engine.synchronize();  // a GPU may still run the step's last kernels: time them
    const double dt = seconds_since(t0);
    summary.step_seconds.push_back(dt);
    train_s += dt;
    interval_train_s += dt;
    ++interval_steps;
    summary.train_losses.push_back(engine.last_step_loss());
    summary.lrs.push_back(engine.last_step_lr());
    const std::int64_t done = engine.global_steps();
    if (monitors.enabled()) {
      // DeepSpeed's names at global_samples after the step: the step's mean loss (as the pipeline
      // engine writes it), the lr the next step uses (get_lr() after the scheduler stepped), and
      // the step's timers (backward_inner and backward_allreduce read 0: the reduction runs
      // inside backward, not as a separate phase).
      std::vector<MonitorEvent> events{train_loss_event(engine.last_step_loss(), engine.global_samples())};
      for (MonitorEvent& e : step_events(engine.lr(), cfg.fp16.enabled ? std::optional<double>(engine.loss_scale()) : std::nullopt, engine.global_samples())) events.push_back(std::move(e));
      if (cfg.wall_clock_breakdown) {
        for (MonitorEvent& e : elapsed_time_events(step_timers, engine.global_samples())) events.push_back(std::move(e));
      }
      monitors.write_events(events);
    }
    if (lead && cfg.flops_profiler.enabled && done == cfg.flops_profiler.profile_step) {
      emit_profile(cfg, gcfg, B, T, TBS, step_timers(kForwardGlobalTimer).elapsed_ms(false), step_timers(kBackwardGlobalTimer).elapsed_ms(false),
                   step_timers(kStepGlobalTimer).elapsed_ms(false), peak_flops, peak_measured);
    }
    if (timing) {
      for (std::string_view name : {kForwardGlobalTimer, kBackwardGlobalTimer, kStepGlobalTimer}) step_timers(name).reset();
    }
    if (done % print_every == 0 || done == 1 || done == steps) {  // step 1: the starting loss
      if (lead) {
        ProgressLine p;
        p.step = done;
        p.total_steps = steps;
        p.loss = engine.last_step_loss();
        p.lr = engine.lr();
        p.grad_norm = engine.grad_norm();
        p.loss_scale = cfg.fp16.enabled ? engine.loss_scale() : 0.0;
        p.skipped = engine.skipped_steps();
        p.tokens_per_s = static_cast<double>(interval_steps * TBS * T) / interval_train_s;
        p.elapsed_s = seconds_since(start);
        p.eta_s = train_s / static_cast<double>(done) * static_cast<double>(steps - done);
        say(format_progress(p));
        if (cfg.wall_clock_breakdown) {
          // DeepSpeed's global timer line, here the mean per optimizer step since the last line.
          // No bwd_inner / bwd_allreduce: the reduction is not timed apart from backward.
          const std::array<std::string_view, 3> names{kForwardGlobalTimer, kBackwardGlobalTimer, kStepGlobalTimer};
          say(print_timers.log_line(names, static_cast<double>(interval_steps)));
        }
        if (cfg.memory_breakdown) say(format_memory_breakdown(fmt::format("after step {}", done), engine.memory_stats(), read_host_memory()));
      }
      interval_train_s = 0.0;
      interval_steps = 0;
    }
    if (args.val_interval > 0 && done % args.val_interval == 0 && done != steps) {
      if (val) {
        const double vl = evaluate_all_ranks(engine, *val, tb);
        summary.val_losses.emplace_back(done, vl);
        say0(fmt::format("step {}/{} | val loss {:.4f}", done, steps, vl));
      }
      sample(done);
    }
  }
  // This rank's ZeRO figures after training (before the final evaluation and save).
  result.reports[static_cast<std::size_t>(rank - result.report_offset)] = engine.zero_report();
  if (val) {
    const double vl = evaluate_all_ranks(engine, *val, tb);
    summary.val_losses.emplace_back(engine.global_steps(), vl);
    say0(fmt::format("step {}/{} | val loss {:.4f}", engine.global_steps(), steps, vl));
  }
  sample(engine.global_steps());
  summary.steps = engine.global_steps();
  summary.tokens = summary.steps * TBS * T;
  summary.train_seconds = train_s;
  summary.elapsed_seconds = seconds_since(start);
  summary.memory = engine.memory_stats();
  summary.skipped_steps = engine.skipped_steps();
  if (cfg.fp16.enabled) summary.loss_scale = engine.loss_scale();
  if (!args.save_weights.empty()) {
    engine.save_weights(args.save_weights);  // collective with several ranks: rank 0 writes
    say0(fmt::format("weights saved to {}", args.save_weights));
  }
  if (lead) {
    const std::string text_summary = format_summary(summary);
    std::fwrite(text_summary.data(), 1, text_summary.size(), stdout);
    std::fflush(stdout);
    result.summary = std::move(summary);
  }
}

// The launcher's environment: world size 1 (and launcher "none") when there is none. A process
// started as one of several ranks trains over NCCL, which needs --device cuda.
LaunchEnv launcher_env(Device device) {
  LaunchEnv env;
  try {
    env = detect_launch_env();
  } catch (const Error& e) {
    fail("the launcher's environment does not describe a rank ({}); start dstrain train without a launcher (--num-ranks N runs N ranks as "
         "threads of one process), or fix the launcher's variables",
         e.what());
  }
  if (env.world_size > 1 && device.is_cpu()) {
    fail("this process was started by a launcher as one of {} ranks ({}): on the cpu dstrain's ranks are threads of one process and cannot "
         "join other processes; give --device cuda (NCCL, one GPU per rank), or start one process without the launcher and give --num-ranks {}",
         env.world_size, env.str(), env.world_size);
  }
  return env;
}

void run_train(const TrainArgs& args) {
  if (args.num_ranks < 1) {
    fail("--num-ranks {}: must be >= 1 (the number of data-parallel ranks, run as threads of this process)", args.num_ranks);
  }
  // --device: "cuda" alone means the launcher's local rank (cuda:0 without a launcher, and when
  // the launcher shows each process only its own GPU).
  Device device = parse_device(args.device);
  const bool explicit_ordinal = args.device.find(':') != std::string::npos;
  const LaunchEnv env = launcher_env(device);
  if (device.is_cuda() && !explicit_ordinal) device = launcher_device(env);
  // A launcher with a GPU per process: NCCL over its ranks (also at world size 1).
  const bool launcher_group = device.is_cuda() && env.launcher != "none";
  if (launcher_group && args.num_ranks > 1) {
    fail("--num-ranks {} with a launcher ({}): the launcher's processes are the ranks; drop --num-ranks", args.num_ranks, env.str());
  }
  const int world = launcher_group ? env.world_size : static_cast<int>(args.num_ranks);
  if (args.steps && *args.steps < 0) fail("--steps {}: must be >= 0", *args.steps);
  require_file(args.data, "--data");
  if (!args.val_data.empty()) require_file(args.val_data, "--val-data");
  if (!args.init_from.empty()) require_file(args.init_from, "--init-from");

  // ---- config: resolved for the world size (train_batch_size = micro x GAS x --num-ranks);
  // --steps fills "auto" total_num_steps of a scheduler ----
  const ConfigText text = load_config_argument(args.config);
  config::ConfigOptions options;
  options.world_size = world;
  options.autos.total_num_steps = args.steps;
  options.autos.warmup_num_steps = args.warmup_steps;
  const config::DsConfig cfg = config::parse_ds_config(text.tree, options);
  for (const config::Warning& w : cfg.warnings) {
    std::fprintf(stderr, "warning: %s%s%s\n", w.path.c_str(), w.path.empty() ? "" : ": ", w.message.c_str());
  }

  // The flops profiler's peak, measured once here rather than on rank 0 while the others wait.
  double peak_flops = args.peak_flops;
  const bool peak_measured = cfg.flops_profiler.enabled && peak_flops <= 0.0;
  if (peak_measured) {
    peak_flops = measure_gemm_flops(device, cfg.fp16.enabled ? DType::fp16 : cfg.bf16.enabled ? DType::bf16 : DType::fp32);
  }

  RunResult result;
  result.reports.resize(static_cast<std::size_t>(world));
  if (launcher_group) {
    // This process is one rank; reports of the others stay on their processes.
    const std::unique_ptr<Communicator> comm = join_launcher_group(env, device);
    result.reports.assign(1, ZeroReport{});
    result.report_offset = comm->rank();
    train_rank(args, cfg, device, comm.get(), peak_flops, peak_measured, result);
  } else if (args.num_ranks == 1) {
    train_rank(args, cfg, device, nullptr, peak_flops, peak_measured, result);
  } else {
    run_local_ranks(static_cast<int>(args.num_ranks),
                    [&](Communicator& comm) { train_rank(args, cfg, device, &comm, peak_flops, peak_measured, result); });
  }
  if (!args.summary_json.empty() && result.summary) {
    const std::filesystem::path p(args.summary_json);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p);
    if (!out) fail("--summary-json {}: cannot write the file (check the folder exists and is writable)", args.summary_json);
    nlohmann::json j = to_json(*result.summary);
    j["device"] = device.str();
    j["zero"] = zero_json(result.reports);
    out << j.dump(2) << '\n';
    if (!out) fail("--summary-json {}: writing failed (disk full?)", args.summary_json);
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT-2 from a DeepSpeed config on a token file (CPU; ZeRO stages 0-3 on --num-ranks local ranks)");
  cmd->add_option("--deepspeed_config,--deepspeed,--deepspeed-config", args->config, "ds_config file, JSON string or base64 of one")->required();
  cmd->add_option("--model", args->model,
                  "gpt2:d6|d12|d24|d36|d48, gpt2:tiny, gpt2:L<n>-C<c>-H<h>[-V<v>][-T<t>], or a Hugging Face config.json")
      ->required();
  cmd->add_option("--data", args->data, "Training token file (dstrain prepare-data)")->required();
  cmd->add_option("--val-data", args->val_data, "Validation token file");
  cmd->add_option("--steps", args->steps, "Optimizer steps (default: one pass over --data; 0: only evaluate); fills \"auto\" total_num_steps");
  cmd->add_option("--warmup-steps", args->warmup_steps, "Fills a scheduler's \"auto\" warmup_num_steps")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", args->seed, "Seed of the parameter init, the data order and dropout")->capture_default_str();
  cmd->add_option("--sequence-length", args->sequence_length, "T: tokens per sequence (default: the model's n_positions, at most 1024)");
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer of the data files: checks the model's vocabulary covers it")
      ->check(CLI::IsMember({"gpt2", "bytes"}));
  cmd->add_option("--val-interval", args->val_interval, "Evaluate every N steps (and always at the end; 0: only at the end)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--val-batches", args->val_batches, "Batches (of the micro-batch size) per evaluation, shared out over the --num-ranks ranks, each taking ceil(N / ranks) "
                  "(0: the whole val file)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--init-from", args->init_from, "Start from these weights (Hugging Face GPT-2 safetensors) instead of the init");
  cmd->add_option("--save-weights", args->save_weights, "Write the final weights (Hugging Face GPT-2 safetensors)");
  cmd->add_option("--inject-overflow", args->inject_overflow,
                  "Put an inf into one gradient at these optimizer steps (1-based, comma-separated), to watch fp16 / bf16 skip them")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--summary-json", args->summary_json, "Write the run's figures as JSON (with a \"zero\" object: every rank's ZeRO memory and traffic)");
  cmd->add_option("--num-ranks", args->num_ranks,
                  "Data-parallel ranks, run as threads of this process over the local communicator; the config is resolved for this "
                  "world size (train_batch_size = micro-batch x gradient_accumulation_steps x N)")
      ->capture_default_str();
  cmd->add_option("--device", args->device,
                  "Where the engine trains: cpu, or cuda / cuda:N (the CUDA build; started by a launcher, \"cuda\" is cuda:LOCAL_RANK, or "
                  "cuda:0 when each process sees one GPU, and the launcher's processes train over NCCL)")
      ->capture_default_str();
  cmd->add_flag("--bf16-stochastic-rounding", args->bf16_stochastic_rounding,
                "bf16 training: round the bf16 weights stochastically from the fp32 masters after each Adam/AdamW step (llm.c's choice) "
                "instead of to nearest (DeepSpeed's)");
  cmd->add_flag("--checkpoint-activations", args->checkpoint_activations,
                "Activation checkpointing: keep only the inputs of checkpoint segments and recompute in backward; the config's "
                "\"activation_checkpointing\" section configures it");
  cmd->add_option("--sample-tokens", args->sample_tokens, "Tokens of the sample printed every --val-interval steps and at the end (0: no samples)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--sample-top-k", args->sample_top_k, "Sample among the k most likely tokens (0: the whole vocabulary)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--sample-temperature", args->sample_temperature, "Sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--peak-flops", args->peak_flops,
                  "Peak FLOP/s for the flops profiler's MFU (default 0: measure one GEMM once on the training device: a 1024^3 fp32 "
                  "sgemm on the cpu, a 4096^3 GEMM in the training dtype on a GPU)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([args] { run_train(*args); });
}

}  // namespace dstrain::cli
