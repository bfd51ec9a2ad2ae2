// CheckpointManager::load_whole_state: a whole training state in memory into the engine
// (engine/checkpoint/whole_state_load.h). The same two phases as CheckpointManager::load —
// everything checked on every rank and agreed before anything of the engine changes, then each
// rank's owned pieces' runs written through write_piece_values and the scalars through
// restore_scalars (engine/checkpoint/checkpoint_pieces.h).
#include "engine/checkpoint/whole_state_load.h"

#include <cmath>
#include <set>

#include <fmt/ranges.h>

#include "engine/checkpoint/checkpoint_manager.h"
#include "engine/checkpoint/checkpoint_pieces.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

std::int64_t whole_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

namespace {

// The first non-finite element of `v`, or -1.
std::int64_t first_non_finite(const std::vector<float>& v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return static_cast<std::int64_t>(i);
  return -1;
}

// Every name of `given` is one of `whole`'s, and every one of `whole`'s is given at its whole size
// with finite values; `what`: "master" or the state's name.
void check_tensors(const std::string& source, const char* what, const std::map<std::string, std::vector<float>>& given,
                   const std::vector<CheckpointParam>& whole) {
  std::set<std::string> known;
  for (const CheckpointParam& p : whole) {
    known.insert(p.name);
    const auto it = given.find(p.name);
    if (it == given.end()) fail("{}: it has no {} for parameter '{}' (of shape {})", source, what, p.name, fmt::join(p.shape, "x"));
    const std::int64_t n = whole_numel(p.shape);
    if (static_cast<std::int64_t>(it->second.size()) != n) {
      fail("{}: its {} of parameter '{}' has {} elements, but the parameter is {} ({} elements)", source, what, p.name, it->second.size(),
           fmt::join(p.shape, "x"), n);
    }
    if (const std::int64_t bad = first_non_finite(it->second); bad >= 0)
      fail("{}: its {} of parameter '{}' is not finite at element {} ({})", source, what, p.name, bad, it->second[static_cast<std::size_t>(bad)]);
  }
  for (const auto& [name, v] : given)
    if (!known.contains(name)) fail("{}: it has a {} for '{}', which this model does not have", source, what, name);
}

}  // namespace

void CheckpointManager::load_whole_state(const WholeTrainingState& ws, const LoadCheckpointOptions& options) {
  Engine::Impl& im = *engine_.impl_;
  wait();
  if (engine_.have_backward_ || engine_.micro_steps_ % engine_.gas_ != 0) {
    fail(
        "CheckpointManager::load_whole_state: the engine is inside a gradient-accumulation window (micro-step {} of {}); load before the first "
        "forward or after the step() that completes a window",
        engine_.micro_steps_ % engine_.gas_, engine_.gas_);
  }
  ModelStates& st = *im.states;
  const std::vector<std::string> state_names = im.optimizer.state_names();
  const bool want_states = options.load_optimizer_states && !options.load_module_only && !ws.states.empty();
  // Phase 1, every rank: everything checked (each rank is given the whole state, and checks all of
  // it, so that an Error names the same tensor everywhere).
  std::string error;
  CheckpointScalars scalars;
  try {
    const std::vector<CheckpointParam> whole = whole_params();
    check_tensors(ws.source, "fp32 master", ws.masters, whole);
    if (want_states) {
      std::vector<std::string> given;
      for (const auto& [name, v] : ws.states) given.push_back(name);
      if (std::set<std::string>(given.begin(), given.end()) != std::set<std::string>(state_names.begin(), state_names.end())) {
        fail("{}: it holds the optimizer states [{}], but this engine's optimizer \"{}\" keeps [{}]", ws.source, fmt::join(given, ", "),
             im.config.optimizer.type, fmt::join(state_names, ", "));
      }
      for (const std::string& s : state_names) check_tensors(ws.source, s.c_str(), ws.states.at(s), whole);
    }
    if (ws.global_steps < 0 || ws.skipped_steps < 0 || ws.skipped_steps > ws.global_steps || ws.global_samples < 0)
      fail("{}: its counters global_steps {} / skipped_steps {} / global_samples {} are inconsistent", ws.source, ws.global_steps, ws.skipped_steps,
           ws.global_samples);
    if (want_states && ws.optimizer_step && *ws.optimizer_step != ws.global_steps - ws.skipped_steps) {
      fail(
          "{}: its optimizer has taken {} steps, but global_steps {} - skipped_steps {} = {}: dstrain counts the optimizer's steps (its bias "
          "corrections) as global_steps - skipped_steps, so the run cannot continue the same",
          ws.source, *ws.optimizer_step, ws.global_steps, ws.skipped_steps, ws.global_steps - ws.skipped_steps);
    }
    scalars.global_steps = ws.global_steps;
    scalars.global_samples = ws.global_samples;
    scalars.skipped_steps = ws.skipped_steps;
    scalars.last_step_lr = engine_.last_step_lr_;
    scalars.last_step_loss = engine_.last_step_loss_;
    scalars.lr_last_batch_iteration = ws.lr_last_batch_iteration.value_or(im.schedule.last_batch_iteration());
    scalars.seed = im.options.seed;
    // No scaler given: the engine's own state again (restore_scalars then changes nothing).
    scalars.scaler = im.scaler.state();
    scalars.scaler_kind = std::string(loss_scaler_kind_name(im.scaler.kind()));
    if (ws.loss_scaler && options.load_optimizer_states) {
      const LossScalerState& s = *ws.loss_scaler;
      if (!(std::isfinite(s.cur_scale) && s.cur_scale > 0) || s.cur_iter < 0 || s.last_overflow_iter < -1 || s.last_overflow_iter >= s.cur_iter ||
          s.cur_hysteresis < 0) {
        fail("{}: its loss scaler state (scale {}, iteration {}, last overflow {}, hysteresis {}) is not valid", ws.source, s.cur_scale, s.cur_iter,
             s.last_overflow_iter, s.cur_hysteresis);
      }
      if (!im.scaler.dynamic()) fail("{}: it has a dynamic loss scale, but this engine has none (fp16 with dynamic loss scaling)", ws.source);
      scalars.scaler = s;
    }
    scalars.saved_layout = ws.source;
  } catch (const Error& e) {
    error = e.what();
  }
  engine_.agree_on_errors(error);
  // Phase 2: each rank's runs of the whole tensors into its owned pieces.
  im.initial_state = false;
  const std::vector<PieceRun> runs = piece_runs_of(st, im.tp_rank(), /*saving=*/false);
  const std::vector<OwnedPiece>& owned = st.owned_pieces();
  const auto write = [&](WholeBuffer which, std::size_t state, const std::map<std::string, std::vector<float>>& values) {
    for (const PieceRun& run : runs) {
      const OwnedPiece& p = owned[run.piece];
      const std::vector<float>& v = values.at(st.spec(p.layer, *p.slot).name);
      // write_piece_values reads the values only: the const_cast is for Tensor's pointer.
      const Tensor t(const_cast<float*>(v.data()) + run.whole_offset, DType::fp32, Shape{run.numel});
      write_piece_values(st, p, run.first, which, state, t, /*have_lowp=*/false);
    }
  };
  write(WholeBuffer::master, 0, ws.masters);
  for (std::size_t j = 0; want_states && j < state_names.size(); ++j) write(WholeBuffer::state, j, ws.states.at(state_names[j]));
  if (!want_states && options.load_optimizer_states && !options.load_module_only) {
    // No states given: they start at zero, whatever the engine held before.
    std::vector<float> zeros;
    for (std::size_t j = 0; j < state_names.size(); ++j) {
      for (const OwnedPiece& p : owned) {
        if (zeros.size() < static_cast<std::size_t>(p.numel)) zeros.assign(static_cast<std::size_t>(p.numel), 0.0f);
        st.write_shard(st.first_state_buffer() + j, p.shard_offset, Tensor(zeros.data(), DType::fp32, Shape{p.numel}));
      }
    }
  }
  st.after_update();  // the layers kept whole get every rank's pieces (collective)
  if (!options.load_module_only) {
    LoadCheckpointOptions o = options;
    o.load_lr_scheduler_states = options.load_lr_scheduler_states && ws.lr_last_batch_iteration.has_value();
    restore_scalars(scalars, o);
  }
  const CheckpointMeshPosition pos = position();
  log_info("loaded {} (global_step {}) at stage {} on {}{}{} in {}", ws.source, ws.global_steps, im.config.zero_optimization.stage, pos.mesh_size(),
           pos.tp_size > 1 ? fmt::format(" (tensor-parallel {})", pos.tp_size) : "",
           pos.pp_size > 1 ? fmt::format(" (pipeline stages {})", pos.pp_size) : "", dtype_name(engine_.dims_.dtype));
  engine_.exclude_from_step_comm();
}

}  // namespace dstrain
