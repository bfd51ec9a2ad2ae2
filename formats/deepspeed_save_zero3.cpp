// ZeRO stage 3's files (runtime/engine.py _save_checkpoint / _save_zero_checkpoint,
// zero/stage3.py _rigid_state_dict): every data-parallel rank writes its own model states file —
// the module holding empty placeholders of the parameters (their data lives in the partitions) —
// and its optimizer file. Each parameter is partitioned on its own (partition_parameters.py
// _partition_param): ceil(numel / W) values per rank, the last ranks' pieces padded; rank r's
// fp32_flat_groups[g] is its pieces of group g's parameters back to back, and FusedAdam's state of
// that flat its moments' pieces.
#include <algorithm>

#include "formats/deepspeed_save_parts.h"
#include "ops/error.h"

namespace dstrain::ds_save {
namespace {
using W = TorchSaveWriter;

// Rank r's pieces of the named parameters' `what`, back to back, the padding zero (DeepSpeed
// leaves it uninitialised: torch.empty; zero is what a fresh allocation shows and what the
// optimizer keeps there, the padding's gradients being zero).
std::vector<float> pieces(const Plan& p, const std::vector<std::string>& names, const std::map<std::string, std::vector<float>>& what, std::int64_t r) {
  const std::int64_t dp = p.layout.dp_world_size;
  std::vector<float> out;
  for (const std::string& n : names) {
    const std::vector<float>& v = what.at(n);
    const auto numel = static_cast<std::int64_t>(v.size());
    const std::int64_t size = (numel + dp - 1) / dp;
    const std::int64_t lo = std::min(numel, r * size), hi = std::min(numel, (r + 1) * size);
    out.insert(out.end(), v.begin() + lo, v.begin() + hi);
    out.resize(out.size() + static_cast<std::size_t>(size - (hi - lo)), 0.0F);
  }
  return out;
}

}  // namespace

TorchValue zero3_optimizer_state(TorchSaveWriter& w, const Plan& p, std::int64_t r) {
  const DeepSpeedTrainingState& st = *p.st;
  const auto& m = st.optimizer_states.at("exp_avg");
  const auto& v = st.optimizer_states.at("exp_avg_sq");
  std::vector<TorchValuePair> state;
  std::vector<TorchValue> pgs, flats;
  for (std::size_t g = 0; g < p.groups.size(); ++g) {
    const std::vector<std::string>& names = p.groups[g].names;
    std::vector<float> fp32 = pieces(p, names, st.master, r);
    const std::vector<std::int64_t> shape{static_cast<std::int64_t>(fp32.size())};
    state.emplace_back(W::integer(static_cast<std::int64_t>(g)), adam_state(w, p, shape, pieces(p, names, m, r), pieces(p, names, v, r)));
    pgs.push_back(adam_param_group(p, g, {static_cast<std::int64_t>(g)}));
    flats.push_back(w.tensor_from_fp32("F32", shape, fp32));
  }
  std::vector<TorchValuePair> d;
  d.push_back(kv("zero_stage", W::object("deepspeed.runtime.zero.config.ZeroStageEnum", {W::integer(3)}, std::nullopt)));
  d.push_back(kv("loss_scaler", loss_scaler(p)));
  d.push_back(kv("dynamic_loss_scale", W::boolean(dynamic_loss_scale(p))));
  d.push_back(kv("overflow", W::boolean(false)));
  d.push_back(kv("partition_count", W::integer(p.layout.dp_world_size)));
  d.push_back(kv("optimizer_state_dict", W::dict({kv("state", W::dict(std::move(state))), kv("param_groups", W::list(std::move(pgs)))})));
  d.push_back(kv("fp32_flat_groups", W::list(std::move(flats))));
  return W::dict(std::move(d));
}

void check_zero3(const Plan& p) {
  const DeepSpeedTrainingState& st = *p.st;
  const std::int64_t dp = p.layout.dp_world_size;
  // stage3._create_fp16_sub_groups: a group whose partition reaches sub_group_size (1e9 unless the
  // config says) is cut into several flat sub-groups, which this writer does not lay out.
  double sub_group_size = 1e9;
  if (const auto z = p.config.find("zero_optimization"); z != p.config.end() && z->contains("sub_group_size") && (*z)["sub_group_size"].is_number()) {
    sub_group_size = (*z)["sub_group_size"].get<double>();
  }
  for (std::size_t g = 0; g < p.groups.size(); ++g) {
    std::int64_t per_rank = 0;
    for (const std::string& n : p.groups[g].names) per_rank += (numel_of(st.shapes.at(n)) + dp - 1) / dp;
    if (static_cast<double>(per_rank) > sub_group_size) {
      fail("DeepSpeed checkpoint writer: param group {} holds {} values per rank, more than zero_optimization.sub_group_size {}; DeepSpeed splits it "
           "into sub-groups, which this writer does not lay out",
           g, per_rank, sub_group_size);
    }
  }
}

void write_zero3(const Plan& p) {
  const std::int64_t dp = p.layout.dp_world_size;
  const std::string prefix = p.layout.dtype == "bf16" ? "bf16_" : "";  // engine._get_zero_ckpt_prefix
  for (std::int64_t r = 0; r < dp; ++r) {
    const std::string rank = "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_";
    {
      W w;
      w.save(p.tag_dir / (rank + "model_states.pt"), model_states(p, module_state(w, p, true), W::none()));
    }
    W w;
    const TorchValue root = W::dict({kv("optimizer_state_dict", zero3_optimizer_state(w, p, r)), kv("ds_config", json_value(p.config)), kv("ds_version", str(kDeepSpeedVersion))});
    w.save(p.tag_dir / (prefix + rank + "optim_states.pt"), root);
  }
}

}  // namespace dstrain::ds_save
