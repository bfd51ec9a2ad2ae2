// CheckpointManager: an engine's training checkpoints — save / load and their collective agreement
// (docs/checkpoints.md; what is saved is parameter space, docs/training_state.md §5). The step
// loop is engine/engine.cpp; the file formats are engine/checkpoint/checkpoint_files.h.
#include "engine/checkpoint/checkpoint_manager.h"

#include "engine/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_pieces.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/loss_scaler.h"
#include "engine/optim/onebit_optimizer.h"
#include "engine/optim/optimizer.h"
#include "models/model_family.h"
#include "models/param_split.h"
#include "ops/buffer.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/tensor_ops.h"
#include "zero/model_states.h"
#include "zero/state_store.h"
#include "formats/json_text.h"

namespace dstrain {

// A checkpoint save between its phases (docs/checkpoints.md "Atomicity"); with
// checkpoint.writer.decoupled the background thread writing this rank's files from a snapshot.
struct CheckpointManager::SaveJob {
  std::filesystem::path save_dir, partial, data_file, index_file;
  std::string tag;
  int rank_files = 1;
  std::vector<CheckpointPiece> pieces;
  RankFileWriterOptions writer;
  std::uint64_t bytes = 0;              // this rank's data, for checkpoint.writer.show_statistics
  const std::byte* snapshot = nullptr;  // CheckpointManager::snapshot_memory_, copied in before the thread starts
  config::Json manifest;                // rank 0
  std::thread thread;
  std::string error;
  ~SaveJob() {
    if (thread.joinable()) thread.join();
  }
};

CheckpointManager::CheckpointManager(Engine& engine) : engine_(engine) {
  const config::DsConfig& config = engine_.impl_->config;
  const int world = position().mesh_size();  // every rank of the mesh
  // The checkpoint section's keys that change nothing here, with the reason (docs/checkpoints.md).
  if (config.checkpoint.load_universal) {
    log_info(
        "checkpoint.load_universal: every dstrain checkpoint is universal (parameter space, loadable at any world size and ZeRO "
        "stage), so it is read as any other; a DeepSpeed universal checkpoint (ds_to_universal's folder, its latest_universal) is "
        "read by --resume-deepspeed");
  }
  if (config.checkpoint.use_node_local_storage && world > 1) {
    log_warning(
        "checkpoint.use_node_local_storage: dstrain's save has rank 0 read every rank's index before it commits the checkpoint, "
        "so the save folder must be one every rank can read (a shared file system); the key is ignored");
  }
  if (config.checkpoint.writer_options.decoupled) prepare_snapshot(rank_bytes());
}

CheckpointManager::~CheckpointManager() = default;  // a pending save's thread is joined by ~SaveJob

namespace {

// The buffers a rank saves besides the optimizer states: the fp32 masters, and under fp16 / bf16
// the 16-bit params (so that stochastic rounding resumes bit for bit).
constexpr const char* kMasterBuffer = "master";
constexpr const char* kParamBuffer = "param";

// crc32c(tag) cut to 20 bits: W·h and W·h² stay exact in an fp64 sum for any world size.
double tag_hash(const std::string& tag) { return static_cast<double>(crc32c(tag.data(), tag.size()) & 0xFFFFFu); }

// Every scalar a load restores, read and checked before anything of the engine changes (a JSON
// type error becomes the caller's malformed-manifest Error).
// checkpoint.writer.show_statistics: what DeepSpeed's FastFileWriter reports, per rank.
void log_write_statistics(int rank, std::uint64_t bytes, std::chrono::steady_clock::time_point since, const RankFileWriter& w) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  log_info("checkpoint writer statistics, rank {}: {} bytes in {:.3f} s = {:.2f} GB/s ({}, staged, checksummed, written and fsync'd)", rank, bytes, s,
           static_cast<double>(bytes) / 1e9 / std::max(s, 1e-9),
           !w.direct()    ? "buffered"
           : w.io_uring() ? "O_DIRECT, io_uring"
                          : "O_DIRECT, pwrite");
}

// The parameters this rank holds but does not save: on a pipeline stage, the copies of parameters
// another stage owns (Model::shared_params, GPT-2's tied embedding on the last stage). The copy is
// equal to its owner (the same initial value, the same summed gradient, the same update), so the
// owner's stage saves it once, and a load fills the copy from the owner's pieces by name.
std::set<std::string> unsaved_copies(const Model& model) {
  std::set<std::string> out;
  for (const SharedParam& sp : model.shared_params)
    if (sp.copy) out.insert(sp.name);
  return out;
}

// Whether this rank saves owned piece p: a replicated parameter is the same on every rank of the
// tensor-parallel group, and tensor-parallel rank 0 alone saves it; a cut one, every rank its piece;
// a shared parameter's copy, no rank (its owner's stage saves it). Expert parallelism at ZeRO stage
// 0 (every rank holds its parameters whole): the experts from the first rank of each expert-data
// group, the rest from data rank 0.
bool saves_piece(const ModelStates& st, const OwnedPiece& p, int tp_rank, const std::set<std::string>& copies) {
  const ParamSpec& spec = st.spec(p.layer, *p.slot);
  if (copies.contains(spec.name) || !(tp_rank == 0 || is_tensor_piece(spec))) return false;
  if (st.stage() >= 1 || st.expert_communicator() == nullptr) return true;
  return (is_expert_piece(spec) ? st.expert_communicator()->rank() : st.rank()) == 0;
}

}  // namespace

// The runs of the owned pieces a save writes (`saving`: those saves_piece keeps) or a load fills
// (every one), in owned-piece order.
std::vector<PieceRun> piece_runs_of(const ModelStates& st, int tp_rank, bool saving, const std::set<std::string>& copies) {
  std::vector<PieceRun> out;
  const std::vector<OwnedPiece>& owned = st.owned_pieces();
  for (std::size_t i = 0; i < owned.size(); ++i) {
    const OwnedPiece& p = owned[i];
    if (saving && !saves_piece(st, p, tp_rank, copies)) continue;
    const ParamSpec& spec = st.spec(p.layer, *p.slot);
    if (!spec.is_piece()) {
      out.push_back({i, 0, p.tensor_offset, p.numel});
      continue;
    }
    for (const ElementRun& r : piece_runs(spec.split, spec.whole_shape(), spec.piece.ranks, spec.piece.rank, p.tensor_offset, p.numel, spec.name))
      out.push_back({i, r.local_offset - p.tensor_offset, r.whole_offset, r.numel});
  }
  return out;
}

CheckpointMeshPosition CheckpointManager::position() const {
  const Engine::Impl& im = *engine_.impl_;
  CheckpointMeshPosition p;
  p.pp_size = im.pp != nullptr ? im.pp->world_size() : 1;
  p.pp_rank = im.pp != nullptr ? im.pp->rank() : 0;
  p.data_size = im.world;
  p.data_rank = engine_.rank();
  p.tp_size = im.tp_size();
  p.tp_rank = im.tp_rank();
  p.every_rank_writes = im.ep != nullptr;
  return p;
}

void write_piece_values(ModelStates& st, const OwnedPiece& p, std::int64_t first, WholeBuffer which, std::size_t state, const Tensor& values,
                        bool have_lowp) {
  switch (which) {
    case WholeBuffer::master:
      if (st.masters_apart()) st.write_shard(0, p.shard_offset + first, values);
      // fp32: the params are the masters; 16-bit saved as another dtype (or not at all): rounded to nearest.
      if (!have_lowp) st.write_owned_param(p, values, first);
      break;
    case WholeBuffer::state:
      st.write_shard(st.first_state_buffer() + state, p.shard_offset + first, values);
      break;
    case WholeBuffer::param:
      st.write_owned_param(p, values, first);
      break;
  }
}

namespace {

std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> out;
  for (int d = 0; d < s.rank; ++d) out.push_back(s[d]);
  return out;
}

}  // namespace

std::vector<CheckpointParam> CheckpointManager::whole_params() const {
  const Engine::Impl& im = *engine_.impl_;
  const Model& model = engine_.model_;
  std::vector<CheckpointParam> out;
  if (!model.pipelined()) {
    for (const Engine::Impl::Owned& o : im.owned) out.push_back({o.spec.name, dims_of(o.spec.whole_shape())});
    return out;
  }
  // A stage holds its own layers only; the architecture builds every layer (unsplit: whole shapes),
  // so the list needs no exchange between the stages and is the one a run without a pipeline writes.
  if (!model.architecture) {
    fail(
        "checkpoint: a pipeline stage's model has no architecture, from which a checkpoint lists the whole model's parameters; build the "
        "stages with make_pipeline_stage_model from make_model(architecture)");
  }
  std::map<std::string, std::size_t> at;
  for (const std::unique_ptr<Layer>& layer : model.architecture->make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      at.emplace(ps.name, out.size());
      out.push_back({ps.name, dims_of(ps.whole_shape())});
    }
  }
  for (const Engine::Impl::Owned& o : im.owned) {
    const auto it = at.find(o.spec.name);
    if (it == at.end() || out[it->second].shape != dims_of(o.spec.whole_shape())) {
      fail("checkpoint: pipeline stage {} holds parameter '{}' of shape {}, which the model's architecture {}", position().pp_rank, o.spec.name,
           fmt::join(dims_of(o.spec.whole_shape()), "x"),
           it == at.end() ? std::string("does not have") : fmt::format("gives the shape {}", fmt::join(out[it->second].shape, "x")));
    }
  }
  return out;
}

config::Json CheckpointManager::manifest(const std::string& tag, const config::Json& client_state) const {
  const Engine::Impl& im = *engine_.impl_;
  const CheckpointMeshPosition pos = position();
  // The whole parameters (under tensor parallelism a rank holds pieces of them, on a pipeline stage
  // its stage's): a checkpoint is of the model, whatever mesh saved it.
  config::Json params = config::Json::array();
  std::int64_t parameter_count = 0;
  for (const CheckpointParam& p : whole_params()) {
    params.push_back({{"name", p.name}, {"shape", p.shape}});
    std::int64_t n = 1;
    for (std::int64_t d : p.shape) n *= d;
    parameter_count += n;
  }
  // The mesh it was saved on: world_size counts every rank (pipeline x data-parallel x
  // tensor-parallel); "tensor_parallel" and "pipeline_stages" are written only when more than 1
  // (checkpoints without them are as before).
  config::Json layout{{"world_size", pos.mesh_size()},
                      {"zero_stage", im.config.zero_optimization.stage},
                      {"dtype", std::string(dtype_name(engine_.dims_.dtype))}};
  if (pos.tp_size > 1) layout["tensor_parallel"] = pos.tp_size;
  if (pos.pp_size > 1) layout["pipeline_stages"] = pos.pp_size;
  if (im.ep != nullptr) layout["expert_parallel"] = im.ep_size();
  const LossScalerState ss = im.scaler.state();
  return config::Json{
      {"format", kCheckpointFormat},
      {"version", kCheckpointVersion},
      {"tag", tag},
      {"layout", layout},
      {"model", {{"parameter_count", parameter_count}, {"params", params}}},
      // The 1-bit family's scalars (phase, counters, frozen ratios; docs/optimizers_onebit.md §5).
      {"optimizer", im.onebit
                        ? config::Json{{"type", im.config.optimizer.type}, {"states", im.optimizer.state_names()}, {"onebit", im.onebit->state()}}
                        : config::Json{{"type", im.config.optimizer.type}, {"states", im.optimizer.state_names()}}},
      {"engine",
       {{"global_steps", engine_.global_steps_},
        {"global_samples", engine_.global_samples_},
        {"skipped_steps", engine_.skipped_steps_},
        {"micro_steps", engine_.micro_steps_},
        {"gradient_accumulation_steps", engine_.gas_},
        {"train_batch_size", engine_.train_batch_size_},
        {"last_step_lr", engine_.last_step_lr_},
        {"last_step_loss", engine_.last_step_loss_},
        // T of the run, so that a resume at another --sequence-length can say what it does to the data position.
        {"sequence_length", engine_.sequence_length()}}},
      {"loss_scaler",
       {{"kind", std::string(loss_scaler_kind_name(im.scaler.kind()))},
        {"cur_scale", ss.cur_scale},
        {"cur_iter", ss.cur_iter},
        {"last_overflow_iter", ss.last_overflow_iter},
        {"cur_hysteresis", ss.cur_hysteresis}}},
      {"lr_scheduler", {{"last_batch_iteration", im.schedule.last_batch_iteration()}}},
      // The model's family and config (docs/checkpoints.md "Manifest"), which consolidate rebuilds it from.
      {"architecture", engine_.model_.architecture ? config::Json{{"family", engine_.model_.architecture->family().name()},
                                                                  {"config", config::Json::parse(engine_.model_.architecture->config_json())}}
                                                   : config::Json(nullptr)},
      {"seed", im.options.seed},
      {"bf16_stochastic_rounding", im.rounding.enabled},
      {"ds_config", im.config.to_json()},
      {"client_state", client_state},
  };
}

std::string CheckpointManager::save(const std::filesystem::path& save_dir, std::string tag, const config::Json& client_state) {
  Engine::Impl& im = *engine_.impl_;
  if (engine_.have_backward_ || engine_.micro_steps_ % engine_.gas_ != 0) {
    fail(
        "CheckpointManager::save: the engine is inside a gradient-accumulation window (micro-step {} of {}); the accumulated gradients of a "
        "half-done step are not saved — call it after the step() that completes the window",
        engine_.micro_steps_ % engine_.gas_, engine_.gas_);
  }
  wait();  // a decoupled save still being written is committed first
  if (tag.empty()) tag = fmt::format("global_step{}", engine_.global_steps_);
  check_checkpoint_tag(tag);
  const CheckpointMeshPosition pos = position();
  const int r = pos.data_rank;
  // The rank in the whole mesh ((stage x data size + data rank) x TP + tensor-parallel rank;
  // docs/parallelism.md §1). Mesh rank 0 makes the folder and commits.
  const int tp_rank = pos.tp_rank, mesh = pos.mesh_size();
  const int mr = pos.mesh_rank();
  // checkpoint.tag_validation: every rank must save under the same tag (DeepSpeed compares a hash
  // of it across ranks). Sum h and h² over the ranks: both equal W·h, W·h² only when every h is h.
  if (mesh > 1 && im.config.checkpoint.tag_validation != config::TagValidation::ignore) {
    const double h = tag_hash(tag);
    double v[2] = {h, h * h};
    const Tensor t(v, DType::fp64, Shape{2});
    if (im.world > 1) im.states->all_reduce_sum(t);
    if (im.tp != nullptr) im.tp->all_reduce(t, ReduceOp::sum);
    if (im.pp != nullptr) im.pp->all_reduce(t, ReduceOp::sum);  // the other stages: the whole mesh agrees
    if (v[0] != mesh * h || v[1] != mesh * h * h) {
      const std::string msg =
          fmt::format("checkpoint tag '{}' of rank {} is not the same on every rank (checkpoint.tag_validation: {}); pass the same tag on every rank",
                      tag, mr, config::to_string(im.config.checkpoint.tag_validation));
      if (im.config.checkpoint.tag_validation == config::TagValidation::fail) throw Error(msg);
      log_warning("{}", msg);
    }
  }
  auto job = std::make_unique<SaveJob>();
  job->save_dir = save_dir;
  job->tag = tag;
  job->partial = partial_checkpoint_dir(save_dir, tag);
  // checkpoint.writer (docs/checkpoints.md "Writers"). Without a writer block the fast writer is
  // the engine's own choice (measured 1.7-1.9x the buffered writer's rate, docs/checkpoints.md), and a
  // file system that refuses O_DIRECT falls back without a warning.
  const config::CheckpointWriterConfig& wc = im.config.checkpoint.writer_options;
  const bool decoupled = wc.decoupled;
  job->writer.direct = wc.type == config::CheckpointWriterType::fast;
  job->writer.io_buffer_size = static_cast<std::size_t>(wc.io_buffer_size);
  job->writer.double_buffer = wc.io_buffer_double;
  job->writer.aio = IoOptions::from_config(im.config.aio);  // DeepSpeed's fast writer takes its aio_config too
  if (!wc.present) job->writer.direct_key.clear();
  if (!writer_announced_ && mr == 0) {
    const std::int64_t each = wc.io_buffer_size / (wc.io_buffer_double ? 2 : 1);
    log_info("checkpoint writer: {}{} {}, {} staging buffer(s) of {}{}; {}", wc.present ? "" : "(no checkpoint.writer block: the engine's choice) ",
             to_string(wc.type), job->writer.direct ? "(O_DIRECT)" : "(buffered, through the page cache)", wc.io_buffer_double ? 2 : 1,
             each % (1 << 20) == 0 ? fmt::format("{} MiB", each >> 20) : fmt::format("{} KiB", each / 1024.0),
             wc.io_buffer_double ? " (one written while the other is filled)" : "",
             decoupled ? "decoupled (a snapshot in host memory, written by a background thread while training goes on; the next save or the end "
                         "of the run waits for it and commits it)"
                       : "synchronous (each rank streams its pieces from the optimizer partition to its file, then fsync; "
                         "checkpoint.writer.decoupled: true writes in the background instead)");
  }
  writer_announced_ = true;
  // 1. mesh rank 0 makes a fresh partial folder.
  std::string error;
  if (mr == 0) {
    try {
      std::error_code ec;
      std::filesystem::create_directories(save_dir, ec);
      if (ec) fail("cannot create the checkpoint folder '{}': {}", save_dir.string(), ec.message());
      std::filesystem::remove_all(job->partial, ec);
      std::filesystem::create_directory(job->partial, ec);
      if (ec) fail("cannot create '{}': {}; check that the save folder is writable", job->partial.string(), ec.message());
    } catch (const std::exception& e) {  // std::filesystem, JSON: any failure is agreed on, never a hang
      error = e.what();
    }
  }
  finish_phase(*job, error);
  // 2. every rank that owns a distinct part writes its pieces (stage 0: every data-parallel rank
  // holds the same values, data-parallel rank 0 writes them), read through the store
  // (docs/training_state.md §3). The pieces: every buffer (masters, each optimizer state, the
  // 16-bit params) of every owned piece this rank saves, each as its runs in the whole parameter's
  // elements (tensor parallelism: a piece of a cut parameter is several runs of the whole; a
  // replicated parameter is saved by tensor-parallel rank 0 alone). The files are numbered by mesh
  // rank: at stage 0 the writers are data rank 0 of each stage and tensor-parallel index, files
  // stage x TP + tensor-parallel rank. A shared parameter's copy on a pipeline stage is not saved.
  const int stage = im.config.zero_optimization.stage;
  job->rank_files = pos.files(stage);
  const int file = pos.file(stage);
  const bool writes = stage >= 1 || r == 0 || pos.every_rank_writes;
  const std::set<std::string> copies = unsaved_copies(engine_.model_);
  ModelStates& st = *im.states;
  std::vector<std::string> buffers{kMasterBuffer};
  for (const std::string& n : im.optimizer.state_names()) buffers.push_back(n);
  if (im.mixed) buffers.emplace_back(kParamBuffer);
  const auto dtype_of = [this](const std::string& buffer) { return buffer == kParamBuffer ? engine_.dims_.dtype : DType::fp32; };
  // Buffer bi lies in the optimizer shard (the masters when apart from the params, each optimizer
  // state); else it is read through the owned params.
  const auto from_shard = [&st, &buffers](std::size_t bi) { return !(buffers[bi] == kParamBuffer || (bi == 0 && !st.masters_apart())); };
  // Copies elements [first, first + out.numel()) of owned piece p of buffer bi into `out` (host
  // memory of the buffer's dtype). A buffer in the shard may be read past the piece's end, into
  // the pieces that follow it there.
  const auto read_piece = [&](std::size_t bi, const OwnedPiece& p, std::int64_t first, const Tensor& out) {
    if (from_shard(bi)) {
      st.read_shard(bi == 0 ? 0 : st.first_state_buffer() + (bi - 1), p.shard_offset + first, out);
    } else {
      st.read_owned_param(p, out, first);  // the 16-bit params, or the fp32 params that are the masters
    }
  };
  if (writes) {
    try {
      const std::vector<PieceRun> runs = piece_runs_of(st, tp_rank, /*saving=*/true, copies);
      std::size_t total = 0;
      for (const std::string& b : buffers) {
        const DType dt = dtype_of(b);
        for (const PieceRun& run : runs) {
          const OwnedPiece& p = st.owned_pieces()[run.piece];
          job->pieces.push_back({b, st.spec(p.layer, *p.slot).name, run.whole_offset, run.numel, dt});
          total += static_cast<std::size_t>(run.numel) * dtype_size(dt);
        }
      }
      job->bytes = total;
      job->data_file = job->partial / rank_file_name(file, ".safetensors");
      job->index_file = job->partial / rank_file_name(file, ".json");
      if (decoupled) {
        // The snapshot: every piece copied into host memory now (the memory the engine faulted in
        // when it started); the files are written from it.
        if (!snapshot_memory_ || snapshot_bytes_ != total) prepare_snapshot(total);
        std::byte* const snapshot = snapshot_memory_.get();
        job->snapshot = snapshot;
        // Pieces that lie back to back in the shard are copied as one run: one large copy per
        // buffer instead of one per tensor (hundreds of small copies, each a fork of the copy's
        // threads, on local ranks oversubscribed cores) — the same bytes in the same places. A
        // piece's runs cover it in order, so the runs' bytes back to back are the piece's.
        std::vector<OwnedPiece> owned;
        for (const OwnedPiece& p : st.owned_pieces())
          if (saves_piece(st, p, tp_rank, copies)) owned.push_back(p);
        std::size_t at = 0;
        for (std::size_t bi = 0; bi < buffers.size(); ++bi) {
          const DType dt = dtype_of(buffers[bi]);
          for (std::size_t i = 0; i < owned.size();) {
            std::size_t j = i + 1;
            std::int64_t n = owned[i].numel;
            while (from_shard(bi) && j < owned.size() && owned[j].shard_offset == owned[i].shard_offset + n) n += owned[j++].numel;
            read_piece(bi, owned[i], 0, Tensor(snapshot + at, dt, Shape{n}));  // pieces i .. j - 1
            at += static_cast<std::size_t>(n) * dtype_size(dt);
            i = j;
          }
        }
      } else {
        // Straight from the optimizer partition into the writer's staging buffers.
        const auto t0 = std::chrono::steady_clock::now();
        RankFileWriter w(job->data_file, job->pieces, job->writer);
        std::size_t k = 0;
        for (std::size_t bi = 0; bi < buffers.size(); ++bi) {
          const DType dt = dtype_of(buffers[bi]);
          for (const PieceRun& run : runs) {
            const OwnedPiece& p = st.owned_pieces()[run.piece];
            w.write(k++, [&, bi, dt](std::int64_t first, std::int64_t count, void* dst) {
              read_piece(bi, p, run.first + first, Tensor(dst, dt, Shape{count}));
            });
          }
        }
        write_checkpoint_text(job->index_file, w.finish().dump(1));
        if (wc.show_statistics) log_write_statistics(file, job->bytes, t0, w);
      }
    } catch (const std::exception& e) {  // std::filesystem, JSON: any failure is agreed on, never a hang
      error = e.what();
    }
  }
  if (mr == 0) {
    // The state of this step, whenever it is committed; a failure (a pipeline stage's model the
    // architecture does not match) is agreed on below like a write's, never a hang.
    try {
      job->manifest = manifest(tag, client_state);
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
  }
  if (decoupled) {
    // Agree that every snapshot was taken, then write in the background.
    finish_phase(*job, error);
    if (writes) {
      SaveJob* jp = job.get();
      job->thread = std::thread([jp, r = file, stats = wc.show_statistics] {
        try {
          const auto t0 = std::chrono::steady_clock::now();
          RankFileWriter w(jp->data_file, jp->pieces, jp->writer);
          std::size_t at = 0;
          for (std::size_t k = 0; k < jp->pieces.size(); ++k) {
            w.write(k, jp->snapshot + at);
            at += static_cast<std::size_t>(jp->pieces[k].numel) * dtype_size(jp->pieces[k].dtype);
          }
          write_checkpoint_text(jp->index_file, w.finish().dump(1));
          if (stats) log_write_statistics(r, jp->bytes, t0, w);
        } catch (const std::exception& e) {
          jp->error = e.what();
        }
      });
    }
    pending_ = std::move(job);
    engine_.exclude_from_step_comm();
    return tag;
  }
  finish_phase(*job, error);
  commit(*job);
  engine_.exclude_from_step_comm();
  return tag;
}

std::size_t CheckpointManager::rank_bytes() const {
  const Engine::Impl& im = *engine_.impl_;
  if (im.config.zero_optimization.stage < 1 && engine_.rank() != 0) return 0;  // stage 0: data rank 0 writes the stage's file
  // Per element: the fp32 master, each fp32 optimizer state, and under fp16 / bf16 the 16-bit param.
  const std::size_t per_element = checkpoint_bytes_per_element(im.optimizer.state_names().size(), im.mixed ? engine_.dims_.dtype : DType::fp32);
  const std::set<std::string> copies = unsaved_copies(engine_.model_);
  std::size_t total = 0;
  for (const OwnedPiece& p : im.states->owned_pieces())
    if (saves_piece(*im.states, p, im.tp_rank(), copies)) total += static_cast<std::size_t>(p.numel) * per_element;
  return total;
}

void CheckpointManager::prepare_snapshot(std::size_t bytes) {
  prefault_.reset();  // stops faulting in the memory replaced below
  snapshot_bytes_ = bytes;
  snapshot_memory_.reset();
  if (bytes == 0) return;
  snapshot_memory_ = allocate_checkpoint_memory(snapshot_bytes_, HostPages::huge);
  prefault_ = std::make_unique<BackgroundPrefault>(snapshot_memory_.get(), snapshot_bytes_);
}

void CheckpointManager::finish_phase(const SaveJob& job, const std::string& error) {
  try {
    engine_.agree_on_errors(error);
  } catch (const Error&) {
    // Every rank learns of any rank's failure; the partial folder of a failed save goes.
    std::error_code ec;
    if (position().first()) std::filesystem::remove_all(job.partial, ec);
    throw;
  }
}

// 3. rank 0 writes the manifest (every rank's index is durable by now), renames the folder and
// rewrites `latest`.
void CheckpointManager::commit(SaveJob& job) {
  std::string error;
  if (position().first()) {
    try {
      config::Json manifest = std::move(job.manifest);
      config::Json ranks = config::Json::array();
      for (int k = 0; k < job.rank_files; ++k) {
        const std::filesystem::path ip = job.partial / rank_file_name(k, ".json");
        std::ifstream in(ip, std::ios::binary);
        if (!in) fail("cannot read back '{}'", ip.string());
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ranks.push_back({{"index", ip.filename().string()}, {"bytes", text.size()}, {"crc32c", crc32c(text.data(), text.size())}});
      }
      manifest["ranks"] = std::move(ranks);
      write_checkpoint_text(job.partial / kCheckpointManifest, manifest.dump(1));
      commit_checkpoint(job.save_dir, job.tag);
    } catch (const std::exception& e) {  // std::filesystem, JSON: any failure is agreed on, never a hang
      error = e.what();
    }
  }
  finish_phase(job, error);
}

void CheckpointManager::wait() {
  if (!pending_) return;
  std::unique_ptr<SaveJob> job = std::move(pending_);
  if (job->thread.joinable()) job->thread.join();
  finish_phase(*job, job->error);
  commit(*job);
  engine_.exclude_from_step_comm();
}

namespace {

// Everything is read whatever the load options, so a checkpoint is as valid loaded one way as another.
CheckpointScalars read_checkpoint_scalars(const config::Json& m, bool onebit) {
  CheckpointScalars c;
  const config::Json& e = m.at("engine");
  c.global_steps = e.at("global_steps").get<std::int64_t>();
  c.global_samples = e.at("global_samples").get<std::int64_t>();
  c.skipped_steps = e.at("skipped_steps").get<std::int64_t>();
  c.last_step_lr = e.at("last_step_lr").get<double>();
  // JSON has no NaN or infinity: a non-finite loss is written as null.
  const config::Json& loss = e.at("last_step_loss");
  c.last_step_loss = loss.is_null() ? std::numeric_limits<float>::quiet_NaN() : loss.get<float>();
  if (c.global_steps < 0 || c.skipped_steps < 0 || c.skipped_steps > c.global_steps) {
    fail("checkpoint counters global_steps {} / skipped_steps {} are inconsistent", c.global_steps, c.skipped_steps);
  }
  c.lr_last_batch_iteration = m.at("lr_scheduler").at("last_batch_iteration").get<std::int64_t>();
  c.seed = m.at("seed").get<std::uint64_t>();
  const config::Json& ls = m.at("loss_scaler");
  LossScalerState& s = c.scaler;
  s.cur_scale = ls.at("cur_scale").get<double>();
  s.cur_iter = ls.at("cur_iter").get<std::int64_t>();
  s.last_overflow_iter = ls.at("last_overflow_iter").get<std::int64_t>();
  s.cur_hysteresis = ls.at("cur_hysteresis").get<std::int64_t>();
  c.scaler_kind = ls.at("kind").get<std::string>();
  if (!(std::isfinite(s.cur_scale) && s.cur_scale > 0) || s.cur_iter < 0 || s.last_overflow_iter < -1 || s.last_overflow_iter >= s.cur_iter ||
      s.cur_hysteresis < 0) {
    fail("checkpoint loss scaler state (scale {}, iteration {}, last overflow {}, hysteresis {}) is not valid", s.cur_scale, s.cur_iter,
         s.last_overflow_iter, s.cur_hysteresis);
  }
  if (onebit && m.at("optimizer").contains("onebit")) c.onebit = OneBitOptimizer::parse_state(m.at("optimizer").at("onebit"));
  const config::Json& layout = m.at("layout");
  const std::int64_t saved_tp = layout.value("tensor_parallel", std::int64_t{1});
  const std::int64_t saved_pp = layout.value("pipeline_stages", std::int64_t{1});
  const std::int64_t saved_ep = layout.value("expert_parallel", std::int64_t{1});
  c.saved_layout =
      fmt::format("ZeRO stage {} on {} rank(s){}{}{} in {}", layout.value("zero_stage", -1), layout.value("world_size", -1),
                  saved_tp > 1 ? fmt::format(" (tensor-parallel {})", saved_tp) : std::string(),
                  saved_pp > 1 ? fmt::format(" (pipeline stages {})", saved_pp) : std::string(),
                  saved_ep > 1 ? fmt::format(" (expert-parallel {})", saved_ep) : std::string(), layout.value("dtype", std::string("?")));
  return c;
}

}  // namespace

void CheckpointManager::restore_scalars(const CheckpointScalars& c, const LoadCheckpointOptions& options) {
  Engine::Impl& im = *engine_.impl_;
  engine_.global_steps_ = c.global_steps;
  engine_.global_samples_ = c.global_samples;
  engine_.skipped_steps_ = c.skipped_steps;
  engine_.micro_steps_ = engine_.global_steps_ * engine_.gas_;  // saved at a boundary; GAS may differ at another world size
  engine_.last_step_lr_ = c.last_step_lr;
  engine_.last_step_loss_ = c.last_step_loss;
  if (options.load_lr_scheduler_states) im.schedule.set_last_batch_iteration(c.lr_last_batch_iteration);
  engine_.lr_ = im.hook ? im.hook(engine_.global_steps_ - engine_.skipped_steps_) : im.schedule.lr();
  // The dropout streams and stochastic rounding continue from the saved seed.
  const std::uint64_t seed = c.seed;
  if (seed != im.options.seed) log_info("checkpoint: continuing with the saved seed {} (the engine was built with {})", seed, im.options.seed);
  im.options.seed = seed;
  if (im.rounding.enabled) im.rounding.seed = seed;
  if (!options.load_optimizer_states) return;
  // The loss scaler (DeepSpeed keeps it with the optimizer states). Saved under another rule — the
  // non-ZeRO FP16 optimizer has no hysteresis, ZeRO's DynamicLossScaler does — the scale and the
  // overflow history carry over and the hysteresis starts full, as a fresh ZeRO scaler's.
  LossScalerState s = c.scaler;
  const std::string& saved_kind = c.scaler_kind;
  const bool saved_dynamic =
      saved_kind == loss_scaler_kind_name(LossScalerKind::dynamic_zero) || saved_kind == loss_scaler_kind_name(LossScalerKind::dynamic_non_zero);
  if (im.scaler.dynamic()) {
    if (!saved_dynamic) {
      log_info("checkpoint: saved with a {} loss scale; the dynamic fp16 loss scale starts fresh at {}", saved_kind, im.scaler.scale());
      return;
    }
    if (saved_kind != loss_scaler_kind_name(im.scaler.kind())) {
      log_info("checkpoint: loss scaler saved as {}, continued as {} (scale {}, hysteresis {})", saved_kind, loss_scaler_kind_name(im.scaler.kind()),
               s.cur_scale, im.scaler.hysteresis());
      s.cur_hysteresis = im.scaler.hysteresis();
    }
    s.cur_hysteresis = std::min(s.cur_hysteresis, im.scaler.hysteresis());
    im.scaler.set_state(s);
  } else if (saved_kind == loss_scaler_kind_name(im.scaler.kind())) {
    s.cur_scale = im.scaler.scale();  // a static or unit scale comes from the config
    im.scaler.set_state(s);
  }
  if (im.onebit && c.onebit) {
    // The phase decides who all-reduces the gradients next, as DeepSpeed's load_state_dict sets
    // enable_backward_allreduce; the compression errors start at zero, as DeepSpeed's do.
    im.onebit->load_state(*c.onebit);
    im.states->set_gradient_all_reduce(im.onebit->gradient_all_reduce());
  }
}

LoadedCheckpoint CheckpointManager::load(const std::filesystem::path& load_dir, std::string tag, const LoadCheckpointOptions& options) {
  Engine::Impl& im = *engine_.impl_;
  wait();
  if (engine_.have_backward_ || engine_.micro_steps_ % engine_.gas_ != 0) {
    fail(
        "CheckpointManager::load: the engine is inside a gradient-accumulation window (micro-step {} of {}); load before the first forward or "
        "after the step() that completes a window",
        engine_.micro_steps_ % engine_.gas_, engine_.gas_);
  }
  // Phase 1, every rank: read and verify everything this rank needs into host memory. Nothing of
  // the engine changes until every rank has succeeded.
  std::string error;
  std::optional<CheckpointReader> rd;
  ModelStates& st = *im.states;
  const std::vector<std::string> state_names = im.optimizer.state_names();
  const bool want_states = options.load_optimizer_states && !options.load_module_only;
  CheckpointReader::Loaded loaded;  // read_all's pieces, one block of host memory
  bool have_lowp = false;
  bool nothing = false;
  bool streamed = false;  // read straight into the state (CheckpointReader::stream)
  bool touched = false;   // ... and something of the state was overwritten
  std::vector<CheckpointReader::Want> want;
  // The owned pieces as runs of the whole parameters' elements (one run each without tensor
  // parallelism), which is how the checkpoint names its pieces whatever mesh saved it.
  const std::vector<PieceRun> runs = piece_runs_of(st, im.tp_rank(), /*saving=*/false);
  // Writes elements [first, first + count) of wanted piece i (in the order of `want`: masters,
  // each state, the 16-bit params; each over the runs of the owned pieces) through the store
  // (docs/training_state.md §3) and into the params.
  const auto write_range = [&](std::size_t i, std::int64_t first_in_run, std::int64_t count, void* data) {
    const std::size_t n = runs.size(), n_states = want_states ? state_names.size() : 0;
    const PieceRun& run = runs[i % n];
    const OwnedPiece& p = st.owned_pieces()[run.piece];
    const std::int64_t first = run.first + first_in_run;  // within the piece
    const std::size_t group = i / n;
    const WholeBuffer which = group == 0 ? WholeBuffer::master : group <= n_states ? WholeBuffer::state : WholeBuffer::param;
    write_piece_values(st, p, first, which, group - 1, Tensor(data, which == WholeBuffer::param ? engine_.dims_.dtype : DType::fp32, Shape{count}),
                       have_lowp);
  };
  CheckpointScalars scalars;
  try {
    if (tag.empty()) {
      const std::optional<std::string> latest = read_latest_tag(load_dir);
      if (!latest) {
        nothing = true;
      } else {
        tag = *latest;
      }
    }
    if (!nothing) {
      check_checkpoint_tag(tag);
      rd.emplace(load_dir, tag);
      const config::Json& m = rd->manifest();
      // The same model: every parameter of the whole model by name and whole shape (a checkpoint
      // holds whole parameters, whatever tensor-parallel size or pipeline saved it; a pipeline
      // stage compares every stage's), and nothing else.
      std::map<std::string, std::vector<std::int64_t>> saved;
      for (const config::Json& p : m.at("model").at("params"))
        saved[p.at("name").get<std::string>()] = p.at("shape").get<std::vector<std::int64_t>>();
      const std::vector<CheckpointParam> whole = whole_params();
      for (const CheckpointParam& p : whole) {
        const auto it = saved.find(p.name);
        if (it == saved.end() || it->second != p.shape) {
          fail(
              "checkpoint '{}' was saved from another model: its parameter '{}' is {} but this model's is {}; load it into the model it was "
              "saved from (its config is in {})",
              rd->dir().string(), p.name, it == saved.end() ? std::string("absent") : fmt::format("{}", fmt::join(it->second, "x")),
              fmt::format("{}", fmt::join(p.shape, "x")), kCheckpointManifest);
        }
      }
      if (saved.size() != whole.size()) {
        fail("checkpoint '{}' was saved from another model: it has {} parameters, this model {}", rd->dir().string(), saved.size(), whole.size());
      }
      if (want_states) {
        const auto saved_states = m.at("optimizer").at("states").get<std::vector<std::string>>();
        if (saved_states != state_names) {
          fail(
              "checkpoint '{}' holds the optimizer states [{}] of optimizer \"{}\", but this engine's optimizer keeps [{}]; load with "
              "load_optimizer_states = false to start the optimizer fresh from the saved weights",
              rd->dir().string(), fmt::join(saved_states, ", "), m.at("optimizer").value("type", std::string("?")), fmt::join(state_names, ", "));
        }
      }
      scalars = read_checkpoint_scalars(m, im.onebit != nullptr);
      have_lowp = im.mixed && rd->buffer_dtype(kParamBuffer) == std::optional<DType>(engine_.dims_.dtype);
      if (rd->buffer_dtype(kMasterBuffer) != std::optional<DType>(DType::fp32)) fail("checkpoint '{}' holds no fp32 masters", rd->dir().string());
      // Buffer by buffer, in the order a rank file holds them (masters, each state, the 16-bit
      // params), so that a load at the saving layout is one span of its rank file, read straight
      // into host memory (CheckpointReader::read_all).
      const std::vector<OwnedPiece>& owned = st.owned_pieces();
      const auto wants = [&](const char* buffer) {
        for (const PieceRun& run : runs) {
          const OwnedPiece& p = owned[run.piece];
          want.push_back({buffer, st.spec(p.layer, *p.slot).name, run.whole_offset, run.numel});
        }
      };
      wants(kMasterBuffer);
      for (std::size_t j = 0; want_states && j < state_names.size(); ++j) wants(state_names[j].c_str());
      if (have_lowp) wants(kParamBuffer);
      // An engine still in its initial state takes a checkpoint of its own layout straight into
      // the state, range by range as the file is read, without a copy of it in host memory (whose
      // first touch costs more than the disk: docs/checkpoints.md "Loading"); a failure after the
      // first range puts the initial state back below. Otherwise phase 2 copies from read_all's.
      if (im.initial_state) {
        streamed = rd->stream(want, [&](std::size_t i, std::int64_t first, std::int64_t count, const std::byte* data) {
          touched = true;
          write_range(i, first, count, const_cast<std::byte*>(data));
        });
      }
      if (!streamed) loaded = rd->read_all(want);
    }
  } catch (const Error& e) {
    error = e.what();
  } catch (const config::Json::exception& e) {
    error = fmt::format("checkpoint '{}' under '{}' has a malformed manifest ({}); load another tag", tag, load_dir.string(), json_error_text(e, ""));
  } catch (const std::exception& e) {
    error = fmt::format("checkpoint '{}' under '{}' has a malformed manifest ({}); load another tag", tag, load_dir.string(), e.what());
  }
  try {
    engine_.agree_on_errors(error);
  } catch (const Error&) {
    if (touched) restore_initial_state();  // a load streamed in part, here or (agreed) on another rank
    throw;
  }
  if (nothing) {
    log_warning("CheckpointManager::load: no '{}' file in '{}' and no tag given: nothing was loaded (training starts fresh)", kLatestFile,
                load_dir.string());
    return {};
  }
  im.initial_state = false;
  // Phase 2 (read_all's pieces, verified on every rank): into the state.
  for (std::size_t i = 0; !streamed && i < want.size(); ++i) write_range(i, 0, want[i].numel, loaded.at[i]);
  free_in_background(std::move(loaded.memory));  // copied into the store: the kernel takes it back off the critical path
  st.after_update();                             // the layers kept whole get every rank's pieces (collective)
  const config::Json& m = rd->manifest();
  if (!options.load_module_only) restore_scalars(scalars, options);
  const CheckpointMeshPosition pos = position();
  log_info("loaded checkpoint '{}' (saved at {}; loaded at stage {} on {}{}{} in {})", rd->dir().string(), scalars.saved_layout,
           im.config.zero_optimization.stage, pos.mesh_size(), pos.tp_size > 1 ? fmt::format(" (tensor-parallel {})", pos.tp_size) : "",
           pos.pp_size > 1 ? fmt::format(" (pipeline stages {})", pos.pp_size) : "", dtype_name(engine_.dims_.dtype));
  engine_.exclude_from_step_comm();
  LoadedCheckpoint out;
  out.path = rd->dir();
  out.tag = tag;
  out.client_state = m.value("client_state", config::Json::object());
  return out;
}

void CheckpointManager::restore_initial_state() {
  Engine::Impl& im = *engine_.impl_;
  ModelStates& st = *im.states;
  im.set_initial_masters();  // the parameters and masters as initialize set them
  // Every optimizer state starts at zero.
  constexpr std::int64_t kChunk = std::int64_t{1} << 20;
  std::vector<float> zeros;
  for (std::size_t j = 0; j < im.optimizer.state_names().size(); ++j) {
    for (const OwnedPiece& p : st.owned_pieces()) {
      for (std::int64_t at = 0; at < p.numel; at += kChunk) {
        const std::int64_t count = std::min(kChunk, p.numel - at);
        if (zeros.size() < static_cast<std::size_t>(count)) zeros.assign(static_cast<std::size_t>(count), 0.0f);
        st.write_shard(st.first_state_buffer() + j, p.shard_offset + at, Tensor(zeros.data(), DType::fp32, Shape{count}));
      }
    }
  }
}

}  // namespace dstrain
