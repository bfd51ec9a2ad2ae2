// write_universal_checkpoint: what DeepSpeed's checkpoint/ds_to_universal.py (main, with
// --inject_missing_state, pipeline and tensor-parallel degree 1) writes when it converts the
// save_checkpoint folder write_deepspeed_checkpoint would write for `source`. The conversion's
// result depends on the source only through what ds_to_universal reads, so it is built from the
// same trees (formats/deepspeed_save_parts.h) instead of writing the source and reading it back.
//   ZeRO 1/2 (extract_zero_shards, merge_tp_slices): zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt
//   = {'cat_dim': 0, 'param': the whole tensor in param_shapes' shape}, zero/<name>/step.pt = the
//   base optimizer's step; zero/optimizer_state.pt = rank 0's optimizer state without its
//   partitioned entries (_save_optimizer_state) plus the base optimizer's param_groups; the model
//   states file copied.
//   ZeRO 3 (extract_zero_shards_stage3, merge_zero3_slices): zero/<name>/<state>.pt = the padding-free
//   pieces concatenated, flat, no dict and no step.pt; zero/optimizer_state.pt = rank 0's whole
//   optimizer state plus param_groups (_save_optimizer_state_stage3); every rank's model states
//   file copied.
// Then save_dir/latest_universal names the tag (the converted folder's name).
#include <system_error>

#include "formats/deepspeed_checkpoint_writer.h"
#include "formats/deepspeed_save_parts.h"
#include "ops/atomic_file.h"
#include "ops/error.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;
using W = TorchSaveWriter;
using namespace ds_save;

// The layout converted: the one given, else the state's own when it names a ZeRO layout (a state
// read from a DeepSpeed folder), else ZeRO stage 2 on one rank in fp32.
DeepSpeedSaveLayout source_of(const DeepSpeedTrainingState& st, const std::optional<DeepSpeedSaveLayout>& source) {
  if (source) return *source;
  if (st.zero_stage >= 1 && st.zero_stage <= 3 && st.dp_world_size >= 1 && (st.dtype == "fp32" || st.dtype == "fp16" || st.dtype == "bf16")) {
    return DeepSpeedSaveLayout{st.zero_stage, st.dp_world_size, st.dtype};
  }
  return DeepSpeedSaveLayout{2, 1, "fp32"};
}

}  // namespace

void write_universal_checkpoint(const fs::path& save_dir, const DeepSpeedTrainingState& state, const std::optional<DeepSpeedSaveLayout>& source) {
  const DeepSpeedSaveLayout layout = source_of(state, source);
  const Plan p = make_plan(save_dir, state, layout);
  if (layout.zero_stage == 0) {
    fail("DeepSpeed checkpoint writer: ds_to_universal converts ZeRO checkpoints (stages 1 to 3); a stage-0 folder has no universal form");
  }
  const fs::path zero = p.tag_dir / "zero";
  std::error_code ec;
  fs::create_directories(zero, ec);
  if (ec) fail("DeepSpeed checkpoint writer: cannot create '{}': {}", zero.string(), ec.message());
  const bool stage3 = layout.zero_stage == 3;
  const std::map<std::string, const std::map<std::string, std::vector<float>>*> states = {
      {"fp32", &state.master}, {"exp_avg", &state.optimizer_states.at("exp_avg")}, {"exp_avg_sq", &state.optimizer_states.at("exp_avg_sq")}};
  for (const std::string& n : state.names) {
    const std::vector<std::int64_t>& shape = state.shapes.at(n);
    if (numel_of(shape) == 0) continue;  // no fragment on any rank: ds_to_universal writes nothing for it
    const fs::path dir = zero / n;
    fs::create_directories(dir, ec);
    if (ec) fail("DeepSpeed checkpoint writer: cannot create '{}': {}", dir.string(), ec.message());
    for (const auto& [key, values] : states) {
      W w;
      if (stage3) {
        w.save(dir / (key + ".pt"), w.tensor_from_fp32("F32", {numel_of(shape)}, values->at(n)));
      } else {
        w.save(dir / (key + ".pt"), W::dict({kv("cat_dim", W::integer(0)), kv("param", w.tensor_from_fp32("F32", shape, values->at(n)))}));
      }
    }
    if (!stage3) W().save(dir / "step.pt", W::integer(p.optimizer_step));
  }
  {
    W w;
    TorchValue osd = stage3 ? zero3_optimizer_state(w, p, 0) : zero12_optimizer_state(w, p, 0);
    // The base optimizer's param_groups beside what is kept.
    TorchValue groups = stage3 ? osd.at("optimizer_state_dict").at("param_groups") : osd.at("base_optimizer_state").at("param_groups");
    std::vector<TorchValuePair> kept;
    for (TorchValuePair& e : osd.pairs) {
      const std::string& k = e.first.s;
      if (!stage3 && (k == "base_optimizer_state" || k == "param_slice_mappings" || k == "single_partition_of_fp32_groups")) continue;
      kept.push_back(std::move(e));
    }
    kept.push_back(kv("param_groups", std::move(groups)));
    w.save(zero / "optimizer_state.pt", W::dict(std::move(kept)));
  }
  // The model states, copied as the save_checkpoint folder has them.
  for (std::int64_t r = 0; r < (stage3 ? layout.dp_world_size : 1); ++r) {
    W w;
    const std::string name = stage3 ? "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt";
    w.save(p.tag_dir / name, model_states(p, module_state(w, p, stage3), W::none()));
  }
  write_file_atomically(save_dir / "latest_universal", state.tag);
}

}  // namespace dstrain
