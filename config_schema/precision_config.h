// Mixed precision: fp16 (+ loss scaling), bf16 / legacy bfloat16, amp, torch_autocast, data_types
// (docs/precision.md §1–§2, §9).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

// fp16: regime B since DeepSpeed v0.17.1.
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;                      // cast floating inputs of forward to fp16
  double loss_scale = 0.0;                     // 0 = dynamic scaling; > 0 = static scale
  std::int64_t initial_scale_power = 16;       // initial dynamic scale = 2^power
  std::int64_t loss_scale_window = 1000;       // clean steps before the scale doubles
  std::int64_t hysteresis = 2;                 // overflows tolerated before halving (ZeRO only)
  bool consecutive_hysteresis = false;         // refill hysteresis after every clean step
  std::int64_t min_loss_scale = 1;             // floor of the dynamic scale
  bool fp16_master_weights_and_grads = false;  // needs ZeRO 1-3

  bool dynamic() const { return loss_scale == 0.0; }
};

// bf16 (or the legacy key bfloat16, used only when bf16 is absent or null; never merged).
struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;             // default true since DeepSpeed v0.19.3
  bool bf16_master_weights_and_grads = false;  // needs ZeRO 1-3
  bool bf16_optimizer_states = false;          // needs ZeRO 1-3 and bf16_master_weights_and_grads
  std::string source_key = "bf16";             // which key the section came from: "bf16" or "bfloat16"
};

// amp: NVIDIA Apex AMP; dstrain does not provide it. Every key except enabled goes to apex.
struct AmpConfig {
  bool enabled = false;
  Json params = Json::object();  // the other keys, as given
};

// torch_autocast: torch.autocast around forward; dstrain does not provide it.
struct TorchAutocastConfig {
  bool enabled = false;
  std::optional<std::string> dtype;  // canonical "float16"/"bfloat16"/"float32"; nullopt = torch default
  std::vector<std::string> lower_precision_safe_modules;
};

// data_types: gradient-accumulation / parameter / buffer dtypes ("fp32", "fp16", "bf16").
struct DataTypesConfig {
  std::optional<std::string> grad_accum_dtype;  // nullopt = model dtype
  std::optional<std::string> param_dtype;
  std::optional<std::string> buffer_dtype;
};

SectionSpec fp16_section_spec();
SectionSpec bf16_section_spec(const std::string& key);  // "bf16" or "bfloat16"
SectionSpec amp_section_spec();
SectionSpec torch_autocast_section_spec();
SectionSpec data_types_section_spec();

Fp16Config parse_fp16_config(const Json* value, ParseContext& ctx, Json& resolved);
// Picks bf16 or bfloat16 from the top-level object as DeepSpeed does.
Bf16Config parse_bf16_config(const Json& root, ParseContext& ctx, Json& resolved);
AmpConfig parse_amp_config(const Json* value, ParseContext& ctx, Json& resolved);
TorchAutocastConfig parse_torch_autocast_config(const Json* value, ParseContext& ctx, Json& resolved);
DataTypesConfig parse_data_types_config(const Json* value, ParseContext& ctx, Json& resolved);

// Cross-section checks (fp16 xor bf16, amp vs ZeRO, master-weight options vs stage, data_types).
// bf16 master-weight options without ZeRO are switched off in `bf16` (with a warning).
void check_precision(const Fp16Config& fp16, Bf16Config& bf16, const AmpConfig& amp, const DataTypesConfig& data_types, int zero_stage,
                     ParseContext& ctx);

}  // namespace dstrain::config
