#include "train/rank_trainer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <csignal>
#include <cmath>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "data/gpt2_tokenizer.h"
#include "engine/checkpoint/deepspeed_export.h"
#include "train/flops_report.h"
#include "models/model.h"
#include "models/pipeline_stage.h"
#include "train/monitor/flops.h"
#include "train/monitor/memory_breakdown.h"
#include "train/monitor/train_events.h"
#include "train/progress.h"
#include "train/trainer_checkpoints.h"
#include "zero/comms_logger.h"
#include "ops/error.h"
#include "ops/stop_request.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/matmul.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

RankTrainer::RankTrainer(const TrainingPlan& plan, const TrainerOptions& options, Communicator* comm)
    : plan_(plan),
      options_(options),
      comm_(comm),
      rank_(comm != nullptr ? comm->rank() : 0),
      stragglers_(options.straggler_factor, static_cast<int>(std::min<std::int64_t>(options.straggler_steps, 1 << 20))) {
  if (options.inject_slow_rank && options.inject_slow_rank->rank >= (comm != nullptr ? comm->world_size() : 1)) {
    fail("--inject-slow-rank {}:{}: there is no rank {} in a world of {}", options.inject_slow_rank->rank, options.inject_slow_rank->ms,
         options.inject_slow_rank->rank, comm != nullptr ? comm->world_size() : 1);
  }
  const config::DsConfig& cfg = plan.config;
  // The mesh: the engine's ZeRO group is the data-parallel one, its layers split across the
  // tensor-parallel one; the data loaders read for the data-parallel ranks, the tensor-parallel
  // ranks of one group the same micro-batches.
  Communicator* data_comm = comm;
  Communicator* tp_comm = nullptr;
  Communicator* sp_comm = nullptr;
  TensorParallelRank tp;
  SequenceParallelRank sp;
  Communicator* ep_comm = nullptr;
  Communicator* expert_data_comm = nullptr;
  ExpertParallelRank ep;
  if (comm != nullptr && plan.mesh.world() == comm->world_size() && (plan.mesh.tp > 1 || plan.mesh.sp > 1 || plan.mesh.pp > 1 || plan.mesh.ep > 1)) {
    mesh_.emplace(make_mesh_groups(*comm, plan.mesh));
    data_comm = mesh_->data.get();
    tp_comm = mesh_->tp.get();
    sp_comm = plan.mesh.sp > 1 ? mesh_->sp.get() : nullptr;
    tp = {mesh_->coord.tp, plan.mesh.tp, options.megatron_sequence_parallel};
    sp = {mesh_->coord.sp, plan.mesh.sp};
    // ALST's tiled loss and MLP for long sequences (models/model.h).
    if (sp.active()) sp = with_alst_tiles(sp, *plan.model, plan.mesh.tp, cfg.fp16.enabled || cfg.bf16.enabled ? 2 : 4);
    sp_layers_ = sp;
    tp_layers_ = tp;
    if (plan.mesh.ep > 1) {
      // Expert parallelism: this rank's experts, the ranks it sends tokens to, and the ranks that
      // hold the same experts (ZeRO's group for them).
      ep = {mesh_->coord.ep, plan.mesh.ep};
      ep_comm = mesh_->ep.get();
      expert_data_comm = mesh_->expert_data.get();
    }
  }
  // The loaders read for the data-parallel ranks (the sequence-parallel ranks of one group read
  // the same sequences and each keeps its share of their tokens).
  const int world = plan.mesh.dp;
  const int data_rank = mesh_ ? mesh_->coord.dp : (comm != nullptr ? comm->rank() : 0);
  sp_rank_ = sp.rank;
  sp_ranks_ = sp.ranks;
  T_ = plan.sequence_length;
  // A resumed run continues with its own seed: the same data order and dropout streams.
  seed_ = plan.resume ? plan.resume->seed : options.seed;

  // ---- engine ----
  Model model = make_model(plan.model, tp, sp, ep);
  Communicator* pp_comm = nullptr;
  std::vector<int> in_flight;
  PipelineScheduleKind schedule = PipelineScheduleKind::one_f_one_b;
  if (plan.mesh.pp > 1) {
    // Pipeline parallelism: this rank's stage of the model, the group its shared parameters'
    // gradients are summed over, and the activation sets its schedule keeps in flight.
    model = make_pipeline_stage_model(std::move(model), plan.stage_parts, plan.mesh.pp, mesh_->coord.pp);
    pipeline_ties_ = make_pipeline_ties_group(*comm, *mesh_, model);
    pp_comm = mesh_->pp.get();
    schedule = parse_schedule_kind(plan.pipeline_schedule);
    in_flight = PipelineEngine::in_flight(schedule, plan.mesh.pp, mesh_->coord.pp, static_cast<int>(cfg.gradient_accumulation_steps),
                                          plan.pipeline_virtual_stages);
  }
  engine_.emplace(initialize(std::move(model), cfg,
                             {.seed = seed_,
                              .comm = data_comm,
                              .tensor_parallel = tp_comm,
                              .sequence_parallel = sp_comm,
                              .pipeline = pp_comm,
                              .pipeline_ties = pipeline_ties_.get(),
                              .expert_parallel = ep_comm,
                              .expert_data = expert_data_comm,
                              .pipeline_in_flight = in_flight,
                              .pipeline_checkpoint_interval = plan.pipeline_checkpoint_interval,
                              .sequence_length = T_ / sp_ranks_,
                              .init_params = options.init_from.empty() || plan.resume.has_value(),
                              .device = plan.device,
                              .checkpoint_activations = options.checkpoint_activations,
                              .bf16_stochastic_rounding = options.bf16_stochastic_rounding,
                              .inject_overflow_steps = options.inject_overflow}));
  Engine& engine = *engine_;
  if (pp_comm != nullptr) pipe_.emplace(engine, *pp_comm, schedule, plan.pipeline_virtual_stages);
  checkpoints_.emplace(engine);
  if (!options.init_from.empty() && !plan.resume) engine.load_weights(options.init_from);
  B_ = cfg.train_micro_batch_size_per_gpu;
  GAS_ = cfg.gradient_accumulation_steps;
  TBS_ = cfg.train_batch_size;
  stage_ = cfg.zero_optimization.stage;
  inputs_.assign(static_cast<std::size_t>(B_ * T_), 0);
  targets_.assign(inputs_.size(), 0);
  if (sp_ranks_ > 1) {
    shard_inputs_.assign(inputs_.size() / static_cast<std::size_t>(sp_ranks_), 0);
    shard_targets_.assign(shard_inputs_.size(), 0);
  }

  // ---- data: rank r of W reads its slots of every global batch (data/data_loader.h) ----
  DataLoaderOptions dlo;
  dlo.micro_batch_size = static_cast<std::size_t>(B_);
  dlo.sequence_length = static_cast<std::size_t>(T_);
  dlo.gradient_accumulation_steps = static_cast<int>(GAS_);
  dlo.world_size = world;
  dlo.rank = data_rank;
  dlo.seed = seed_;
  dlo.vocab_size = static_cast<std::int32_t>(plan.model->vocab_size());
  loader_.emplace(DataLoader::open(options.data, dlo));  // the pre-flight has scanned the whole file (plan_training)
  if (!options.log_samples.empty() && (!mesh_ || (mesh_->coord.tp == 0 && mesh_->coord.sp == 0 && mesh_->coord.pp == 0))) {
    // Opened once, before step 1 (a path that cannot be written fails here, not after training);
    // O_APPEND keeps the lines of ranks as threads or processes, and of a resumed run, whole.
    sample_log_.fd = ::open(options.log_samples.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (sample_log_.fd < 0) fail("--log-samples {}: cannot open it for appending: {}", options.log_samples.string(), std::strerror(errno));
  }
  if (plan.resume && plan.resume->deepspeed) {
    // A DeepSpeed checkpoint, mapped and checked by plan_resume: every rank writes its pieces.
    const auto load_start = Clock::now();
    checkpoints_->load_whole_state(plan.resume->deepspeed->state);
    startup_.load_seconds = seconds_since(load_start);
    // A folder dstrain wrote carries its run's data position (plan_deepspeed_resume); DeepSpeed's own: 0, 0.
    loader_->set_state(DataLoaderState{plan.resume->data_epoch, plan.resume->data_position});
    skipped_before_ = engine.state().skipped_steps;
    resumed_steps_ = engine.state().global_steps;
  } else if (plan.resume) {
    // The engine's state, then the data loader's position (the client state of save_checkpoint).
    const auto load_start = Clock::now();
    const LoadedCheckpoint l = checkpoints_->load(plan.resume->dir, plan.resume->tag);
    startup_.load_seconds = seconds_since(load_start);
    const config::Json data = l.client_state.value("data", config::Json::object());
    if (data.contains("epoch") && data.contains("position")) {
      loader_->set_state(DataLoaderState{data.at("epoch").get<std::uint64_t>(), data.at("position").get<std::uint64_t>()});
    } else {
      fail(
          "--resume: checkpoint {} has no data loader position in its client state (it was not saved by `dstrain train`); "
          "load it with CheckpointManager::load from the program that saved it",
          l.path.string());
    }
    skipped_before_ = engine.state().skipped_steps;
    resumed_steps_ = engine.state().global_steps;
  }
  if (!options.val_data.empty()) {
    EvalLoaderOptions elo;
    elo.batch_size = static_cast<std::size_t>(B_);
    elo.sequence_length = static_cast<std::size_t>(T_);
    // --val-batches counts batches of B sequences over all ranks, so W ranks evaluate exactly the
    // windows one rank would (data/eval_loader.h), each rank a disjoint share of them.
    elo.world_size = world;
    elo.rank = data_rank;
    elo.max_batches = static_cast<std::size_t>(options.val_batches);
    elo.vocab_size = static_cast<std::int32_t>(plan.model->vocab_size());
    val_.emplace(EvalLoader::open(options.val_data, elo));
  }
}

RankTrainer::~RankTrainer() = default;

RankTrainer::AppendFd::~AppendFd() {
  if (fd >= 0) ::close(fd);
}

void RankTrainer::say(const std::string& line) const {
  if (lead()) trainer_print(options_, line);
}

void RankTrainer::announce() {
  summary_.flops_per_token = plan_.model->flops_per_token(T_);  // the start line's MFU, the progress lines', the summary's
  const config::DsConfig& cfg = plan_.config;
  Engine& engine = *engine_;
  const int world = plan_.mesh.dp;  // the batch arithmetic's data-parallel size (the engine's group also spans SP)
  say(fmt::format("model {}: {}", plan_.model_spec, plan_.model->describe()));
  say(fmt::format(
      "batch: train_batch_size {} = micro-batch {} x gradient_accumulation_steps {} x {} {}; sequence length {} -> {} tokens per step", TBS_,
      B_, GAS_, mesh_ ? "data-parallel size" : "world size", world, T_, format_count(static_cast<double>(TBS_ * T_))));
  if (!plan_.device.is_cpu()) say(fmt::format("device: {}", plan_.device.str()));
  if (!plan_.comm_note.empty()) say(plan_.comm_note);
  if (mesh_) say("mesh: " + describe_mesh(plan_.mesh));
  if (sp_ranks_ > 1) {
    const std::int64_t tokens = B_ * (T_ / sp_ranks_);
    const std::int64_t mlp_tile = sp_layers_.mlp_tile_rows;
    say(fmt::format("sequence parallelism: ALST's tiled loss{}", sp_layers_.tiles_mlp(tokens) ? fmt::format(" and tiled MLP ({} of a rank's {} positions per tile: "
                                                                                              "the MLP's hidden features are recomputed in backward, "
                                                                                              "not kept)",
                                                                                              mlp_tile, tokens)
                                                                                : ""));
  }
  if (plan_.mesh.tp > 1) {
    const std::int64_t tokens = B_ * (T_ / sp_ranks_);  // a micro-batch's tokens on a tensor-parallel group
    if (!options_.megatron_sequence_parallel) {
      say("tensor parallelism: the residual stream stays whole on every tensor-parallel rank (--no-megatron-sp)");
    } else if (tp_layers_.shards_residual(tokens)) {
      say(fmt::format("tensor parallelism: Megatron sequence parallelism — each tensor-parallel rank keeps {} of a micro-batch's {} tokens of the "
                      "residual stream and its norms",
                      tokens / plan_.mesh.tp, tokens));
    } else {
      say(fmt::format("tensor parallelism: the residual stream stays whole: a micro-batch's {} tokens do not divide by {} tensor-parallel ranks "
                      "(Megatron sequence parallelism needs B·T{} divisible by tensor_parallel.autotp_size)",
                      tokens, plan_.mesh.tp, sp_ranks_ > 1 ? "/sequence_parallel_size" : ""));
    }
  }
  const int zero_world = engine.world_size();  // ZeRO's group: the data-parallel (x sequence-parallel) ranks
  if (zero_world > 1 || stage_ > 0 || (comm_ != nullptr && comm_->backend() != "local")) {
    const bool local = comm_ == nullptr || comm_->backend() == "local";
    say(fmt::format("zero: stage {} on {} rank{}{}", stage_, zero_world, zero_world == 1 ? "" : "s",
                    !local      ? fmt::format(" ({}: one process per rank)", comm_->backend())
                    : zero_world > 1 ? std::string(" (--num-ranks: threads of this process, local communicator)")
                                : std::string()));
  }
  say(fmt::format("data: {} ({} windows of {} tokens; one epoch = {} steps){}", options_.data.string(),
                  format_count(static_cast<double>(loader_->window_count())), T_ + 1, plan_.epoch_steps,
                  val_ ? fmt::format("; val {} ({} batches per evaluation)", options_.val_data.string(), val_->total_batches())
                       : std::string("; no val data")));
  say(fmt::format("optimizer {} lr {} | gradient_clipping {} | seed {} | {} steps{}", cfg.optimizer.type, cfg.optimizer.params.lr,
                  cfg.gradient_clipping, options_.seed, plan_.steps, plan_.steps_from_epoch ? " (one epoch; set --steps)" : ""));
  if (cfg.fp16.enabled) {
    say(fmt::format("precision fp16: {} loss scale {:g}{}", cfg.fp16.dynamic() ? "dynamic" : "static", engine.state().loss_scale,
                    cfg.fp16.dynamic() ? fmt::format(" (window {}, min {})", cfg.fp16.loss_scale_window, cfg.fp16.min_loss_scale) : std::string()));
  } else if (cfg.bf16.enabled) {
    say(fmt::format("precision bf16 (fp32 master params and optimizer state){}",
                    engine.device().is_cpu() ? fmt::format("; on this CPU: GEMMs {}, attention {}", cpu_gemm_path(DType::bf16),
                                                           cpu_attention_path(DType::bf16))
                                             : std::string()));
  }
  if (cfg.scheduler.present()) {
    say(fmt::format("scheduler {}: lr of step 1 = {:.3e} (stepped after every optimizer step)", cfg.scheduler.type, engine.state().lr));
  }
  if (plan_.print_every_defaulted) say("steps_per_print is not set in the config: printing progress every 10 steps");
  if (plan_.peak_flops > 0.0) {
    say(fmt::format("MFU against a peak of {:.1f} GFLOP/s ({}; {} FLOP per token)", plan_.peak_flops / 1e9, plan_.peak_source,
                    format_count(summary_.flops_per_token)));
  }
  if (plan_.resume && plan_.resume->deepspeed) {
    const DeepSpeedResume& d = *plan_.resume->deepspeed;
    say(fmt::format("resumed from {}: {}", d.summary, d.carried));
    if (lead())  // every rank planned the same resume: its notes once
      for (const std::string& note : d.notes) trainer_warn(options_, note);
    if (lead() && !options_.init_from.empty())
      trainer_warn(options_, fmt::format("--init-from {} is not read: the run resumes from a checkpoint", options_.init_from.string()));
  } else if (plan_.resume) {
    say(fmt::format("resumed from checkpoint {} at step {} (seed {}; data epoch {}, window {})", (plan_.resume->dir / plan_.resume->tag).string(),
                    engine.state().global_steps, seed_, loader_->state().epoch, loader_->state().position));
    if (!options_.init_from.empty())
      trainer_warn(options_, fmt::format("--init-from {} is not read: the run resumes from a checkpoint", options_.init_from.string()));
  }
  if (!options_.save_dir.empty()) {
    say(fmt::format("checkpoints: {} ({}{})", options_.save_dir.string(),
                    options_.save_interval > 0 ? fmt::format("every {} steps and at the end", options_.save_interval) : std::string("at the end"),
                    options_.keep_last > 0 ? fmt::format("; keeping the newest {}", options_.keep_last) : std::string()));
    if (options_.save_interval_minutes > 0.0)
      say(fmt::format("checkpoints: also every {:g} minutes (--save-interval-minutes; rank 0's clock)", options_.save_interval_minutes));
  }

  // ---- monitoring (rank 0 writes): csv_monitor / tensorboard files, wall_clock_breakdown timers,
  // memory_breakdown lines, the flops profile ----
  monitors_ = MonitorMaster(cfg, rank_);
  // DeepSpeed times with wall_clock_breakdown or the flops profiler on (the config layer turns the
  // former on with the latter). step_timers: this optimizer step (events, profile), reset every
  // step; print_timers: since the last progress line (the log line, per step).
  timing_ = cfg.wall_clock_breakdown || cfg.flops_profiler.enabled;

  // ---- samples (rank 0 generates; at ZeRO stage 3 every rank takes part in generation_model(),
  // which gathers the partitioned parameters, and its views last only until the next forward, so
  // the generator is rebuilt at every sample) ----
  // Its own allocator, so the run's peak memory stays the engine's; on the engine's device.
  sample_allocator_ = make_device_allocator(engine.device());
  samples_ = options_.sample_tokens > 0 && plan_.mesh.tp <= 1 && plan_.mesh.sp <= 1 && plan_.mesh.pp <= 1 && plan_.mesh.ep <= 1;
  if (options_.sample_tokens > 0 && !samples_ && lead()) {
    trainer_warn(options_, plan_.mesh.ep > 1 && plan_.mesh.pp <= 1 && plan_.mesh.tp <= 1 && plan_.mesh.sp <= 1
                               ? fmt::format("no samples (--sample-tokens {}): each expert-parallel rank holds only its experts, and the sampler "
                                             "runs the whole model on one rank; give --sample-tokens 0 to silence this",
                                             options_.sample_tokens)
                           : plan_.mesh.pp > 1 && plan_.mesh.tp <= 1 && plan_.mesh.sp <= 1
                               ? fmt::format("no samples (--sample-tokens {}): each pipeline stage holds only its layers, and the sampler runs the "
                                             "whole model on one rank; give --sample-tokens 0 to silence this",
                                             options_.sample_tokens)
                               : fmt::format("no samples (--sample-tokens {}): the {} ranks each hold a slice of the logits, and the sampler reads "
                                             "them whole; give --sample-tokens 0 to silence this",
                                             options_.sample_tokens, plan_.mesh.tp > 1 ? "tensor-parallel" : "sequence-parallel"));
  }
  if (samples_ && lead()) {
    std::string warning;
    tokenizer_ = sample_tokenizer(options_.tokenizer, plan_.model->vocab_size(), &warning);
    if (!warning.empty()) trainer_warn(options_, warning);
    if (stage_ < 3) generator_.emplace(engine.generation_model(), T_, *sample_allocator_);
    sampling_.max_new_tokens = options_.sample_tokens;
    sampling_.top_k = options_.sample_top_k;
    sampling_.temperature = static_cast<float>(options_.sample_temperature);  // finite and <= FLT_MAX (plan_training)
    sampling_.seed = options_.seed;
    sampling_.eot_token = sample_start_token(tokenizer_.get(), plan_.model->vocab_size());
  }

  summary_.model = plan_.model->describe();
  summary_.parameters = static_cast<std::int64_t>(plan_.model->parameter_count());
  summary_.parameters_stored = static_cast<std::int64_t>(plan_.model->stored_parameter_count());
  summary_.train_batch_size = TBS_;
  summary_.sequence_length = T_;
  summary_.peak_flops = plan_.peak_flops;
  summary_.peak_source = plan_.peak_source;
  start_ = Clock::now();
  last_save_time_ = start_;
  started_ = true;
  exchange_hosts();
}

void RankTrainer::exchange_hosts() {
  const int world = comm_ != nullptr ? comm_->world_size() : 1;
  if (world <= 1 || !stragglers_.enabled()) return;
  // Rank r's slot: its local rank, then its host name, one byte per fp64 (a sum all-reduce of
  // zeros elsewhere is every rank's slot everywhere).
  constexpr std::size_t kChars = 64;
  const std::size_t slot = kChars + 1;
  std::vector<double> v(slot * static_cast<std::size_t>(world), 0.0);
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) name[0] = '\0';
  const std::string host = name[0] != '\0' ? std::string(name.data()) : std::string("?");
  // Local ranks (--num-ranks threads) share this process's host; a launcher's processes have theirs.
  const int local_rank = comm_->backend() == "local" ? rank_ : plan_.launch.local_rank;
  const std::size_t me = slot * static_cast<std::size_t>(rank_);
  v[me] = local_rank;
  for (std::size_t i = 0; i < std::min(kChars, host.size()); ++i) v[me + 1 + i] = static_cast<unsigned char>(host[i]);
  engine_->all_reduce_host_sum(*comm_, v);
  hosts_.assign(static_cast<std::size_t>(world), std::string());
  local_ranks_.assign(static_cast<std::size_t>(world), 0);
  for (int r = 0; r < world; ++r) {
    const std::size_t at = slot * static_cast<std::size_t>(r);
    local_ranks_[static_cast<std::size_t>(r)] = static_cast<int>(v[at]);
    for (std::size_t i = 0; i < kChars && v[at + 1 + i] != 0.0; ++i)
      hosts_[static_cast<std::size_t>(r)].push_back(static_cast<char>(static_cast<unsigned char>(v[at + 1 + i])));
  }
}

void RankTrainer::inject_slowness() const {
  if (options_.inject_slow_rank && options_.inject_slow_rank->rank == rank_)
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.inject_slow_rank->ms));
}

void RankTrainer::agree_after_step(double dt) {
  Engine& engine = *engine_;
  const int world = comm_ != nullptr ? comm_->world_size() : 1;
  const int mine = stop_signal();
  // Rank 0's clock decides a time-based save; the others learn it from the sum.
  const bool save_due = options_.save_interval_minutes > 0.0 && lead() && seconds_since(last_save_time_) >= options_.save_interval_minutes * 60.0;
  slowest_rank_ = -1;
  if (world <= 1) {
    agreed_signal_ = mine;
    agreed_save_ = save_due;
    return;
  }
  // Slots 0..W-1: the ranks' step seconds; W: ranks that saw a stop signal; W+1: rank 0's save.
  std::vector<double> v(static_cast<std::size_t>(world) + 2, 0.0);
  v[static_cast<std::size_t>(rank_)] = dt;
  v[static_cast<std::size_t>(world)] = mine != 0 ? 1.0 : 0.0;
  v[static_cast<std::size_t>(world) + 1] = save_due ? 1.0 : 0.0;
  engine.all_reduce_host_sum(*comm_, v);
  // This rank's own signal as it was read above (a signal arriving later waits for the next step,
  // which every rank then agrees on); SIGTERM for a rank that saw none while another did.
  agreed_signal_ = mine != 0 ? mine : v[static_cast<std::size_t>(world)] > 0.0 ? SIGTERM : 0;
  agreed_save_ = v[static_cast<std::size_t>(world) + 1] > 0.0;
  const std::span<const double> times(v.data(), static_cast<std::size_t>(world));
  slowest_rank_ = static_cast<int>(std::max_element(times.begin(), times.end()) - times.begin());
  slowest_s_ = times[static_cast<std::size_t>(slowest_rank_)];
  for (const Straggler& s : stragglers_.observe(times)) {
    if (!lead()) continue;
    const auto r = static_cast<std::size_t>(s.rank);
    trainer_warn(options_, fmt::format("straggler: rank {} (host {}, local rank {}) took {:.2f} s per step for the last {} steps, {:.1f}x the "
                                       "median {:.2f} s (step {}/{}; --straggler-factor {:g})",
                                       s.rank, r < hosts_.size() ? hosts_[r] : std::string("?"), r < local_ranks_.size() ? local_ranks_[r] : s.rank,
                                       s.seconds, options_.straggler_steps, s.ratio, s.median, engine.state().global_steps, plan_.steps,
                                       options_.straggler_factor));
    if (monitors_.enabled()) {
      const std::vector<MonitorEvent> events = straggler_events(s.rank, s.seconds, s.ratio, engine.state().global_samples);
      monitors_.write_events(events);
    }
  }
}

template <typename Fn>
void RankTrainer::timed(std::string_view name, Fn&& fn) {
  if (!timing_) {
    fn();
    return;
  }
  step_timers_(name).start();
  print_timers_(name).start();
  fn();
  step_timers_(name).stop();
  print_timers_(name).stop();
}

bool RankTrainer::done() const { return engine_->state().global_steps >= plan_.steps; }

Batch RankTrainer::rank_batch() {
  if (sp_ranks_ <= 1) {
    const Shape shape{B_, T_};
    return Batch{Tensor(inputs_.data(), DType::int32, shape), Tensor(targets_.data(), DType::int32, shape)};
  }
  // Sequence parallelism: this rank's tokens [s·Tl, (s+1)·Tl) of every sequence of the micro-batch.
  const std::int64_t Tl = T_ / sp_ranks_;
  for (std::int64_t b = 0; b < B_; ++b) {
    const auto from = static_cast<std::ptrdiff_t>(b * T_ + sp_rank_ * Tl);
    std::copy_n(inputs_.begin() + from, Tl, shard_inputs_.begin() + static_cast<std::ptrdiff_t>(b * Tl));
    std::copy_n(targets_.begin() + from, Tl, shard_targets_.begin() + static_cast<std::ptrdiff_t>(b * Tl));
  }
  const Shape shape{B_, Tl};
  return Batch{Tensor(shard_inputs_.data(), DType::int32, shape), Tensor(shard_targets_.data(), DType::int32, shape)};
}

// A pipeline's step: the step's micro-batches read first (every stage reads the same ones), then
// the schedule runs them through the stages and steps (PipelineEngine::train_batch).
void RankTrainer::train_pipeline_step() {
  const auto t0 = Clock::now();
  step_tokens_.resize(static_cast<std::size_t>(GAS_));
  step_targets_.resize(static_cast<std::size_t>(GAS_));
  std::vector<Batch> batches;
  for (std::int64_t m = 0; m < GAS_; ++m) {
    if (sample_log_.fd >= 0) log_micro_batch_samples();
    loader_->next_micro_batch(inputs_, targets_);
    const Batch b = rank_batch();
    auto& tok = step_tokens_[static_cast<std::size_t>(m)];
    auto& tgt = step_targets_[static_cast<std::size_t>(m)];
    const auto* tp = static_cast<const std::int32_t*>(b.tokens.data);
    const auto* gp = static_cast<const std::int32_t*>(b.targets.data);
    tok.assign(tp, tp + b.tokens.numel());
    tgt.assign(gp, gp + b.targets.numel());
    batches.push_back(Batch{Tensor(tok.data(), DType::int32, b.tokens.shape), Tensor(tgt.data(), DType::int32, b.targets.shape)});
  }
  timed(kStepGlobalTimer, [&] { pipe_->train_batch(batches); });
  inject_slowness();
  after_step(seconds_since(t0));
}

// --log-samples FILE: "step S epoch E window W rank R" for each window of the micro-batch the
// loader reads next (stream position p: epoch p / N, window order_E[p mod N], data/data_loader.h),
// appended with one write(2) per micro-batch to the file opened O_APPEND in the constructor, so that
// ranks as threads or processes, and a resumed run after the saving one, add to one file without
// tearing lines.
void RankTrainer::log_micro_batch_samples() {
  const DataLoaderOptions& o = loader_->options();
  const DataLoaderState st = loader_->state();
  const std::uint64_t n = loader_->window_count();
  const std::uint64_t slot = static_cast<std::uint64_t>(loader_->micro_step()) * static_cast<std::uint64_t>(o.world_size) + static_cast<std::uint64_t>(o.rank);
  const std::uint64_t first = st.epoch * n + st.position + slot * o.micro_batch_size;
  const std::int64_t step = engine_->state().global_steps + 1;
  std::string lines;
  for (std::uint64_t b = 0; b < o.micro_batch_size; ++b)
    lines += fmt::format("step {} epoch {} window {} rank {}\n", step, (first + b) / n, loader_->window_at(first + b), o.rank);
  const ssize_t wrote = ::write(sample_log_.fd, lines.data(), lines.size());
  if (wrote != static_cast<ssize_t>(lines.size()))
    fail("--log-samples {}: cannot append to it: {}", options_.log_samples.string(), wrote < 0 ? std::strerror(errno) : "short write");
}

void RankTrainer::train_step() {
  if (!started_) announce();
  if (pipe_) {
    train_pipeline_step();
    return;
  }
  Engine& engine = *engine_;
  const auto t0 = Clock::now();
  for (std::int64_t m = 0; m < GAS_; ++m) {
    if (sample_log_.fd >= 0) log_micro_batch_samples();
    loader_->next_micro_batch(inputs_, targets_);
    const Batch batch = rank_batch();
    timed(kForwardGlobalTimer, [&] { engine.forward(batch); });
    timed(kBackwardGlobalTimer, [&] { engine.backward(); });
    if (timing_) {
      // The engine splits its backward itself (DeepSpeed's bwd_inner and bwd_allreduce timers run
      // inside engine.backward()); both lie within the bwd record just taken.
      const EngineState st = engine.state();
      for (Timers* t : {&step_timers_, &print_timers_}) {
        (*t)(kBackwardInnerGlobalTimer).add(st.last_backward_inner_ms);
        (*t)(kBackwardReduceGlobalTimer).add(st.last_backward_allreduce_ms);
      }
    }
    timed(kStepGlobalTimer, [&] { engine.step(); });
  }
  inject_slowness();
  engine.synchronize();  // a GPU may still run the step's last kernels: time them
  after_step(seconds_since(t0));
}

void RankTrainer::after_step(double dt) {
  const config::DsConfig& cfg = plan_.config;
  Engine& engine = *engine_;
  const std::int64_t steps = plan_.steps;
  agree_after_step(dt);  // collective: every rank, every step, before anything below may fail
  summary_.step_seconds.push_back(dt);
  note_step_seconds(dt);  // a stop request waits this long for a step boundary (ops/stop_request.h)
  train_s_ += dt;
  interval_train_s_ += dt;
  ++interval_steps_;
  summary_.train_losses.push_back(engine.state().last_step_loss);
  summary_.lrs.push_back(engine.state().last_step_lr);
  const std::int64_t done = engine.state().global_steps;
  // A non-finite loss of a step that was applied (fp16 / bf16 skip a step whose gradients
  // overflowed, and that step changes nothing) has put NaN into the weights: stop, on every rank
  // alike (the loss is the all-reduced mean), before anything is written from them.
  const bool skipped = engine.state().skipped_steps > skipped_before_;
  skipped_before_ = engine.state().skipped_steps;
  if (!skipped) check_finite(engine.state().last_step_loss, "training loss", done);
  const bool print_step = done % plan_.print_every == 0 || done == 1 || done == steps;  // step 1: the starting loss
  // comms_logger's table: read at progress lines only (a snapshot under its lock).
  const CommsLog* comms = print_step ? engine.report().comms : nullptr;
  if (monitors_.enabled()) {
    // DeepSpeed's names at global_samples after the step: the step's mean loss (as the pipeline
    // engine writes it), the lr the next step uses (get_lr() after the scheduler stepped), and
    // the step's timers; with comms_logger, at each progress line, its per-op figures.
    std::vector<MonitorEvent> events{train_loss_event(engine.state().last_step_loss, engine.state().global_samples)};
    for (MonitorEvent& e : step_events(engine.state().lr, cfg.fp16.enabled ? std::optional<double>(engine.state().loss_scale) : std::nullopt,
                                       engine.state().global_samples)) {
      events.push_back(std::move(e));
    }
    if (cfg.wall_clock_breakdown) {
      for (MonitorEvent& e : elapsed_time_events(step_timers_, engine.state().global_samples)) events.push_back(std::move(e));
    }
    if (comms != nullptr) {
      for (MonitorEvent& e : comms_events(comms->op_totals(), engine.state().global_samples)) events.push_back(std::move(e));
    }
    monitors_.write_events(events);
  }
  if (lead() && cfg.flops_profiler.enabled && done == cfg.flops_profiler.profile_step) {
    FlopsReportInput in;
    in.model = plan_.model.get();
    in.micro_batch = B_;
    in.sequence_length = T_;
    in.train_batch_size = TBS_;
    in.fwd_ms = step_timers_(kForwardGlobalTimer).elapsed_ms(false);
    in.bwd_ms = step_timers_(kBackwardGlobalTimer).elapsed_ms(false);
    in.step_ms = step_timers_(kStepGlobalTimer).elapsed_ms(false);
    in.peak_flops = plan_.peak_flops;
    in.peak_measured = plan_.peak_measured;
    emit_flops_profile(flops_report(cfg, in), cfg.flops_profiler);
    if (cfg.flops_profiler.output_file)
      say(fmt::format("flops profile of step {} written to {}", cfg.flops_profiler.profile_step, *cfg.flops_profiler.output_file));
  }
  if (timing_) {
    for (std::string_view name : kGlobalTimerNames) step_timers_(name).reset();
  }
  if (print_step) {
    // Every rank takes its per-expert counts at a progress line, summed over the data group (the
    // lead prints every rank's tokens, not only its own).
    const MoeStats::Report moe = engine.take_data_group_moe_report();
    if (lead()) {
      ProgressLine p;
      p.moe = moe.layers > 0;
      p.aux_loss = moe.last_aux;
      p.expert_min = moe.min;
      p.expert_max = moe.max;
      p.expert_imbalance = moe.imbalance();
      p.expert_dropped = moe.dropped;
      p.step = done;
      p.total_steps = steps;
      p.loss = engine.state().last_step_loss;
      p.lr = engine.state().lr;
      p.grad_norm = engine.state().grad_norm;
      p.loss_scale = cfg.fp16.enabled ? engine.state().loss_scale : 0.0;
      p.skipped = engine.state().skipped_steps;
      p.tokens_per_s = static_cast<double>(interval_steps_ * TBS_ * T_) / interval_train_s_;
      if (plan_.peak_flops > 0.0) p.mfu = p.tokens_per_s * summary_.flops_per_token / plan_.peak_flops;
      p.show_throughput = cfg.timers.throughput_enabled;
      p.slowest_rank = slowest_rank_;
      p.slowest_s = slowest_s_;
      p.elapsed_s = seconds_since(start_);
      p.eta_s = train_s_ / static_cast<double>(std::max<std::int64_t>(1, done - resumed_steps_)) * static_cast<double>(steps - done);
      say(format_progress(p));
      if (cfg.wall_clock_breakdown) {
        // DeepSpeed's global timer line, here the mean per optimizer step since the last line.
        say(print_timers_.log_line(kGlobalTimerNames, static_cast<double>(interval_steps_)));
      }
      if (comms != nullptr) {
        // DeepSpeed's comms.log_summary() table, this rank's collectives since the start.
        std::string table = format_comms_table(comms->rows(), comms->node_count() > 1);
        if (!table.empty() && table.back() == '\n') table.pop_back();
        say(table);
      }
      if (cfg.memory_breakdown) say(format_memory_breakdown(fmt::format("after step {}", done), engine.report().memory, read_host_memory()));
    }
    interval_train_s_ = 0.0;
    interval_steps_ = 0;
  }
  if (options_.val_interval > 0 && done % options_.val_interval == 0 && done != steps) {
    if (val_) {
      const double vl = evaluate();
      check_finite(vl, "val loss", done);
      summary_.val_losses.emplace_back(done, vl);
      say(fmt::format("step {}/{} | val loss {:.4f}", done, steps, vl));
    }
    sample(done);
    engine.exclude_from_step_comm();  // the evaluation's collectives are not the next step's
  }
}

double RankTrainer::evaluate() {
  Engine& engine = *engine_;
  EvalLoader& loader = *val_;
  loader.reset();
  double sum = 0.0;
  std::size_t n = 0;
  while (loader.next(inputs_, targets_)) {
    // Every rank evaluates every round (collective at ZeRO-3; through every stage of a pipeline).
    const float loss = pipe_ ? pipe_->evaluate(rank_batch()) : engine.evaluate(rank_batch());
    if (!loader.last_counts()) continue;        // a padding batch of the last round
    sum += loss;
    ++n;
  }
  if (engine.world_size() == 1) return n > 0 ? sum / static_cast<double>(n) : 0.0;
  // The val loss over every rank's share of the val batches: each rank sums its own, and one
  // all-reduce of [sum, count] combines them.
  std::array<float, 2> buf{static_cast<float>(sum), static_cast<float>(n)};
  engine.all_reduce_sum(buf);
  return buf[1] > 0.0f ? static_cast<double>(buf[0]) / static_cast<double>(buf[1]) : 0.0;
}

void RankTrainer::check_finite(double loss, const char* what, std::int64_t step) const {
  if (std::isfinite(loss)) return;
  fail(
      "step {}/{}: the {} is {}: the weights no longer hold numbers, so the run stops here{}. Fix: lower the learning rate "
      "(optimizer.params.lr, the scheduler's peak), keep gradient_clipping on, check --init-from; fp16 and bf16 runs skip a step "
      "whose gradients overflow instead",
      step, plan_.steps, what,
      std::isnan(loss) ? "nan"
      : loss > 0       ? "inf"
                       : "-inf",
      options_.save_weights.empty() ? std::string() : fmt::format(" and --save-weights {} is not written", options_.save_weights.string()));
}

void RankTrainer::sample(std::int64_t step) {
  if (!samples_) return;
  Engine& engine = *engine_;
  // A sample is never worth failing a run: a model whose logits overflowed (diverging, its loss
  // not yet NaN) gets a warning here, and the next step's loss check ends the run as it would
  // without samples. Only rank 0 generates, so catching here keeps the ranks' collectives matched.
  const auto block = [&](Generator& gen) {
    try {
      say(generate_sample_block(gen, tokenizer_.get(), sampling_, step, plan_.steps));
    } catch (const Error& e) {
      trainer_warn(options_, fmt::format("step {}/{}: no sample: {}", step, plan_.steps, e.what()));
    }
  };
  if (stage_ >= 3) {
    GenerationModel gm = engine.generation_model();  // collective: every rank
    if (!lead()) return;
    Generator gen(std::move(gm), T_, *sample_allocator_);
    block(gen);
  } else if (lead()) {
    block(*generator_);
  }
}

void RankTrainer::finish() {
  if (!started_) announce();
  Engine& engine = *engine_;
  const config::DsConfig& cfg = plan_.config;
  // This rank's ZeRO figures after training (before the final evaluation and save).
  report_ = engine.report().zero;
  // Offloaded parameters alone (offload_param at stage 3, the optimizer on the device) are reported too.
  const auto params = static_cast<std::size_t>(MemoryPurpose::params);
  if (report_.optimizer_home != StateHome::device || report_.host_bytes[params] > 0 || report_.nvme_bytes[params] > 0) {
    OffloadSummary o;
    o.optimizer_home = std::string(state_home_name(report_.optimizer_home));
    o.device = report_.device_bytes;
    o.host = report_.host_bytes;
    o.nvme = report_.nvme_bytes;
    o.last_step_bytes_read = report_.step_io.bytes_read;
    o.last_step_bytes_written = report_.step_io.bytes_written;
    o.bytes_read = report_.train_io.bytes_read;
    o.bytes_written = report_.train_io.bytes_written;
    o.wait_seconds = report_.train_io.wait_seconds;
    summary_.offload = o;
  }
  if (val_) {
    const double vl = evaluate();
    check_finite(vl, "val loss", engine.state().global_steps);
    summary_.val_losses.emplace_back(engine.state().global_steps, vl);
    say(fmt::format("step {}/{} | val loss {:.4f}", engine.state().global_steps, plan_.steps, vl));
  }
  sample(engine.state().global_steps);
  summary_.steps = engine.state().global_steps;
  summary_.tokens = summary_.steps * TBS_ * T_;
  summary_.train_seconds = train_s_;
  summary_.elapsed_seconds = seconds_since(start_);
  summary_.memory = engine.report().memory;
  summary_.skipped_steps = engine.state().skipped_steps;
  if (cfg.fp16.enabled) summary_.loss_scale = engine.state().loss_scale;
  if (const CommsLog* comms = engine.report().comms) summary_.comms = CommsSummary{comms->world_size(), rank_, comms->rows()};
  if (!options_.save_dir.empty() && last_saved_tag_.empty()) save_checkpoint();
  checkpoints_->wait();  // a decoupled save is committed before the run ends
  if (!options_.save_weights.empty()) {
    engine.save_weights(options_.save_weights);  // collective with several ranks: rank 0 writes
    say(fmt::format("weights saved to {}", options_.save_weights.string()));
  }
  if (lead()) {
    std::string text = format_summary(summary_);
    // format_summary ends its lines with '\n'; print takes lines without the last one.
    if (!text.empty() && text.back() == '\n') text.pop_back();
    trainer_print(options_, text);
  }
}

std::string RankTrainer::save_checkpoint() {
  Engine& engine = *engine_;
  const DataLoaderState d = loader_->state();
  const config::Json client{{"data", {{"epoch", d.epoch}, {"position", d.position}}}, {"seed", seed_}, {"model", plan_.model_spec}};
  last_saved_tag_ = checkpoints_->save(options_.save_dir, "", client);  // commits a decoupled save still pending first
  last_save_time_ = Clock::now();  // --save-interval-minutes counts from here
  if (lead()) {
    for (const std::string& t : prune_checkpoints(options_.save_dir, options_.keep_last))
      say(fmt::format("checkpoint {} removed (--keep-last {})", t, options_.keep_last));
  }
  const bool decoupled = plan_.config.checkpoint.writer_options.decoupled;
  say(fmt::format("step {}/{} | checkpoint {} {}", engine.state().global_steps, plan_.steps, (options_.save_dir / last_saved_tag_).string(),
                  decoupled ? "snapshot taken (written in the background, committed at the next save or the end)" : "saved"));
  if (options_.save_format != TrainerOptions::SaveFormat::dstrain && lead()) {
    // DeepSpeed's files beside dstrain's, from the committed checkpoint (every rank's file is
    // there: the save above returned after the commit), in the same tag folder.
    const DeepSpeedTrainingState ds = deepspeed_state_of_checkpoint(options_.save_dir, last_saved_tag_);
    if (options_.save_format == TrainerOptions::SaveFormat::universal) {
      write_universal_checkpoint(options_.save_dir, ds);
      say(fmt::format("checkpoint {} also saved as a DeepSpeed universal checkpoint", last_saved_tag_));
    } else {
      const DeepSpeedSaveLayout layout{ds.zero_stage, ds.dp_world_size, ds.dtype};
      write_deepspeed_checkpoint(options_.save_dir, ds, layout);
      say(fmt::format("checkpoint {} also saved in DeepSpeed's layout (ZeRO stage {} on {} ranks, {})", last_saved_tag_, layout.zero_stage,
                      layout.dp_world_size, layout.dtype));
    }
  }
  return last_saved_tag_;
}

bool RankTrainer::stop_requested() {
  // Every rank stops after the same step: the step's agreement (agree_after_step) carried every
  // rank's signal.
  stopped_by_signal_ = agreed_signal_;
  return stopped_by_signal_ != 0;
}

void RankTrainer::run() {
  announce();
  bool first = true;
  while (!done()) {
    const auto step_start = Clock::now();
    train_step();
    if (first && plan_.resume) {
      // What a relaunch cost this process before training went on (docs/elastic.md "Recovery time").
      say(fmt::format("startup: step {} done {:.2f} s after this process started (joining the group {:.2f} s, loading the checkpoint {:.2f} s, "
                      "the step {:.2f} s)",
                      engine_->state().global_steps, seconds_since_process_start(), startup_.join_seconds, startup_.load_seconds,
                      seconds_since(step_start)));
    }
    first = false;
    last_saved_tag_.clear();
    if (options_.handle_signals && stop_requested()) {
      // A scheduler's preemption notice: this step is done; save it and end the run.
      if (!options_.save_dir.empty()) save_checkpoint();
      checkpoints_->wait();
      say(fmt::format("step {}/{} | stopped by signal {} ({}){}", engine_->state().global_steps, plan_.steps, stopped_by_signal_,
                      stopped_by_signal_ == SIGINT ? "SIGINT" : "SIGTERM",
                      options_.save_dir.empty() ? std::string("; no --save-dir: nothing was saved")
                                                : std::string("; rerun the same command with --resume auto to continue")));
      report_ = engine_->report().zero;
      summary_.steps = engine_->state().global_steps;
      return;
    }
    // Every --save-interval steps, and when rank 0 found --save-interval-minutes passed (the
    // step's agreement: every rank saves after the same step).
    const bool by_steps = options_.save_interval > 0 && engine_->state().global_steps % options_.save_interval == 0;
    if ((by_steps || agreed_save_) && !done() && !options_.save_dir.empty()) save_checkpoint();
  }
  finish();
}

}  // namespace dstrain
