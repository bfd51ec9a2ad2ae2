// A DeepSpeed checkpoint folder read whole (issue 27): the fp32 masters, the module weights, the
// optimizer states, the counters, the loss scaler and the LR schedule of a run DeepSpeed saved,
// by the Hugging Face model's parameter names ("module." stripped).
//
// PLACEHOLDER: this header is the interface agreed with the reader's author; the reader's own
// commit replaces this file and deepspeed_checkpoint.cpp (take theirs on merge).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dstrain {
struct DeepSpeedLossScaler { double cur_scale = 1.0; std::int64_t cur_iter = 0; std::int64_t last_overflow_iter = -1; std::int64_t cur_hysteresis = 0; bool dynamic = false; };
struct DeepSpeedTrainingState {
  std::filesystem::path dir; std::string tag; int zero_stage = 0; int dp_world_size = 1; std::string dtype;
  std::vector<std::string> names;  // saved order, "module." stripped (Hugging Face names: transformer.h.0.attn.c_attn.weight, model.layers.0.self_attn.q_proj.weight ...)
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::map<std::string, std::vector<float>> master;  // fp32 masters per parameter
  std::map<std::string, std::vector<float>> module;  // module weights as saved, widened to fp32
  std::map<std::string, std::map<std::string, std::vector<float>>> optimizer_states;  // "exp_avg"/"exp_avg_sq" -> name -> values
  std::optional<std::int64_t> optimizer_step; std::string optimizer_type; std::map<std::string, double> param_group;
  std::int64_t global_steps = 0, global_samples = 0, skipped_steps = 0;
  std::optional<DeepSpeedLossScaler> loss_scaler; std::optional<std::string> lr_scheduler_json;
};
DeepSpeedTrainingState read_deepspeed_checkpoint(const std::filesystem::path& dir, const std::string& tag = "");
bool is_deepspeed_checkpoint(const std::filesystem::path& dir);
}
