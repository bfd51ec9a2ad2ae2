// write_deepspeed_checkpoint: the plan is checked first (formats/deepspeed_save_parts.cpp), then
// the files are written as DeepSpeed's engine.save_checkpoint writes them — stage 0 and ZeRO stages
// 1 and 2 here, stage 3 in deepspeed_save_zero3.cpp — and `latest` last.
#include "formats/deepspeed_checkpoint_writer.h"

#include <system_error>

#include "formats/deepspeed_save_parts.h"
#include "ops/atomic_file.h"
#include "ops/error.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;
using W = TorchSaveWriter;
using namespace ds_save;

// Stage 0: the model states file holds the optimizer. fp32: FusedAdam itself (engine: no wrapper),
// per-parameter states shaped as the parameters; fp16 / bf16: FP16_Optimizer (fused_optimizer.py
// state_dict) over one unpadded fp32 flat copy per param group.
void write_stage0(const Plan& p) {
  const DeepSpeedTrainingState& st = *p.st;
  W w;
  const auto& m = st.optimizer_states.at("exp_avg");
  const auto& v = st.optimizer_states.at("exp_avg_sq");
  std::vector<TorchValuePair> state;
  std::vector<TorchValue> groups;
  TorchValue optimizer;
  if (p.layout.dtype == "fp32") {
    std::int64_t id = 0;
    for (std::size_t g = 0; g < p.groups.size(); ++g) {
      std::vector<std::int64_t> ids;
      for (const std::string& n : p.groups[g].names) {
        state.emplace_back(W::integer(id), adam_state(w, p, st.shapes.at(n), m.at(n), v.at(n)));
        ids.push_back(id++);
      }
      groups.push_back(adam_param_group(p, g, ids));
    }
    optimizer = W::dict({kv("state", W::dict(std::move(state))), kv("param_groups", W::list(std::move(groups)))});
  } else {
    std::vector<TorchValue> flats;
    for (std::size_t g = 0; g < p.groups.size(); ++g) {
      const std::vector<std::string>& names = p.groups[g].names;
      const std::vector<float> flat = flat_of(p, names, st.master);
      const std::vector<std::int64_t> shape{static_cast<std::int64_t>(flat.size())};
      state.emplace_back(W::integer(static_cast<std::int64_t>(g)), adam_state(w, p, shape, flat_of(p, names, m), flat_of(p, names, v)));
      groups.push_back(adam_param_group(p, g, {static_cast<std::int64_t>(g)}));
      flats.push_back(w.tensor_from_fp32("F32", shape, flat));
    }
    std::vector<TorchValuePair> d;
    // LossScaleConfig: the scale is saved only where it scales (use_grad_scaling: fp16).
    if (p.layout.dtype == "fp16") {
      const bool dynamic = dynamic_loss_scale(p);
      const TorchValue scaler = loss_scaler(p);
      const TorchValue& s = *scaler.state;
      d.push_back(kv("dynamic_loss_scale", W::boolean(dynamic)));
      d.push_back(kv("cur_scale", s.at("cur_scale")));
      d.push_back(kv("cur_iter", dynamic ? s.at("cur_iter") : W::integer(st.loss_scaler ? st.loss_scaler->cur_iter : 0)));
      if (dynamic) {
        d.push_back(kv("last_overflow_iter", s.at("last_overflow_iter")));
        d.push_back(kv("scale_factor", s.at("scale_factor")));
        d.push_back(kv("scale_window", s.at("scale_window")));
      }
    }
    d.push_back(kv("optimizer_state_dict", W::dict({kv("state", W::dict(std::move(state))), kv("param_groups", W::list(std::move(groups)))})));
    d.push_back(kv("fp32_groups_flat", W::list(std::move(flats))));
    d.push_back(kv("clip_grad", W::real(p.clip_grad)));
    optimizer = W::dict(std::move(d));
  }
  w.save(p.tag_dir / "mp_rank_00_model_states.pt", model_states(p, module_state(w, p, false), std::move(optimizer)));
}

// Stages 1 and 2 (zero/stage_1_and_2.py; bf16_optimizer.py for BF16_Optimizer): each param group
// flattened in order and padded with zeros to a multiple of nccl_start_alignment_factor (2) times
// the data-parallel world size (align_dense_tensors), cut into W equal partitions; rank r keeps
// partition r of the fp32 master and of Adam's moments. DeepSpeedZeroOptimizer saves its fp32
// partition with the rank's padding cut off (_get_groups_without_padding) and group_paddings the
// padding inside each rank's partition; BF16_Optimizer saves the partition whole and the group's
// whole padding as the last rank's.
void write_stage12(const Plan& p) {
  {
    W w;
    w.save(p.tag_dir / "mp_rank_00_model_states.pt", model_states(p, module_state(w, p, false), W::none()));
  }
  const std::string prefix = p.layout.dtype == "bf16" ? "bf16_" : "";  // engine._get_zero_ckpt_prefix: bfloat16_enabled()
  for (std::int64_t r = 0; r < p.layout.dp_world_size; ++r) {
    W w;
    const TorchValue root = W::dict({kv("optimizer_state_dict", zero12_optimizer_state(w, p, r)), kv("ds_config", json_value(p.config)),
                                     kv("ds_version", str(kDeepSpeedVersion))});
    w.save(p.tag_dir / (prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt"), root);
  }
}

}  // namespace

namespace ds_save {

TorchValue zero12_optimizer_state(TorchSaveWriter& w, const Plan& p, std::int64_t r) {
  const DeepSpeedTrainingState& st = *p.st;
  const std::int64_t dp = p.layout.dp_world_size;
  std::vector<TorchValuePair> state;
  std::vector<TorchValue> pgs, fp32, paddings, counts, mappings;
  for (std::size_t g = 0; g < p.groups.size(); ++g) {
    const std::vector<std::string>& names = p.groups[g].names;
    std::vector<float> master = flat_of(p, names, st.master), m = flat_of(p, names, st.optimizer_states.at("exp_avg")),
                       v = flat_of(p, names, st.optimizer_states.at("exp_avg_sq"));
    const auto numel = static_cast<std::int64_t>(master.size());
    const std::int64_t alignment = 2 * dp;  // nccl_start_alignment_factor * world size
    const std::int64_t aligned = (numel + alignment - 1) / alignment * alignment;
    const std::int64_t size = aligned / dp;
    for (auto* f : {&master, &m, &v}) f->resize(static_cast<std::size_t>(aligned), 0.0F);
    const std::int64_t left = r * size;
    const std::int64_t pad = numel <= left ? size : numel < left + size ? left + size - numel : 0;
    const auto part = [&](const std::vector<float>& f, std::int64_t len) { return std::vector<float>(f.begin() + left, f.begin() + left + len); };
    const std::vector<std::int64_t> shape{size};
    state.emplace_back(W::integer(static_cast<std::int64_t>(g)), adam_state(w, p, shape, part(m, size), part(v, size)));
    pgs.push_back(adam_param_group(p, g, {static_cast<std::int64_t>(g)}));
    const std::int64_t kept = p.bf16_optimizer ? size : size - pad;
    fp32.push_back(w.tensor_from_fp32("F32", {kept}, part(master, kept)));
    paddings.push_back(W::integer(p.bf16_optimizer ? (r == dp - 1 ? size * dp - numel : 0) : pad));
    counts.push_back(W::integer(dp));
    // _create_param_mapping: each parameter's fragment inside this rank's partition
    // (tensor_fragment.get_hp_fragment_mapping), for the parameters that have one.
    std::vector<TorchValuePair> frag;
    std::int64_t off = 0;
    for (const std::string& n : names) {
      const std::int64_t k = numel_of(st.shapes.at(n));
      const std::int64_t lo = std::max(off, left), hi = std::min(off + k, left + size);
      if (lo < hi) {
        frag.push_back(kv(n, W::object("deepspeed.utils.tensor_fragment.fragment_address", {},
                                       W::dict({kv("numel", W::integer(hi - lo)), kv("start", W::integer(lo - left))}))));
      }
      off += k;
    }
    mappings.push_back(ordered_dict(std::move(frag)));
  }
  TorchValue base = W::dict({kv("state", W::dict(std::move(state))), kv("param_groups", W::list(std::move(pgs)))});
  std::vector<TorchValuePair> d;
  if (p.bf16_optimizer) {
    d.push_back(kv("clip_grad", W::real(p.clip_grad)));
    d.push_back(kv("base_optimizer_state", std::move(base)));
    d.push_back(kv("single_partition_of_fp32_groups", W::list(std::move(fp32))));
  } else {
    d.push_back(kv("loss_scaler", loss_scaler(p)));
    d.push_back(kv("dynamic_loss_scale", W::boolean(dynamic_loss_scale(p))));
    d.push_back(kv("overflow", W::boolean(false)));
    d.push_back(kv("clip_grad", W::real(p.clip_grad)));
    d.push_back(kv("base_optimizer_state", std::move(base)));
    d.push_back(kv("single_partition_of_fp32_groups", W::list(std::move(fp32))));
    d.push_back(kv("zero_stage", W::object("deepspeed.runtime.zero.config.ZeroStageEnum", {W::integer(p.layout.zero_stage)}, std::nullopt)));
  }
  d.push_back(kv("group_paddings", W::list(std::move(paddings))));
  d.push_back(kv("partition_count", W::list(std::move(counts))));
  d.push_back(kv("ds_version", str(kDeepSpeedVersion)));
  d.push_back(kv("param_slice_mappings", W::list(std::move(mappings))));
  return W::dict(std::move(d));
}

}  // namespace ds_save

void write_deepspeed_checkpoint(const fs::path& save_dir, const DeepSpeedTrainingState& state, const DeepSpeedSaveLayout& layout) {
  const Plan p = make_plan(save_dir, state, layout);
  std::error_code ec;
  fs::create_directories(p.tag_dir, ec);
  if (ec) fail("DeepSpeed checkpoint writer: cannot create '{}': {}", p.tag_dir.string(), ec.message());
  if (layout.zero_stage == 0) {
    write_stage0(p);
  } else if (layout.zero_stage == 3) {
    write_zero3(p);
  } else {
    write_stage12(p);
  }
  // engine.save_checkpoint: `latest` names the tag once every file is written.
  write_file_atomically(save_dir / "latest", state.tag);
}

}  // namespace dstrain
