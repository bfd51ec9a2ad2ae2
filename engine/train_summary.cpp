#include "engine/train_summary.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/progress.h"

namespace dstrain {

std::optional<double> TrainSummary::final_train_loss() const {
  if (train_losses.empty()) return std::nullopt;
  return train_losses.back();
}

std::optional<double> TrainSummary::final_val_loss() const {
  if (val_losses.empty()) return std::nullopt;
  return val_losses.back().second;
}

double TrainSummary::steady_tokens_per_s() const {
  std::vector<double> t(step_seconds.size() > 1 ? step_seconds.begin() + 1 : step_seconds.begin(), step_seconds.end());
  if (t.empty()) return 0.0;
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  const double median = t[t.size() / 2];
  return median > 0.0 ? static_cast<double>(train_batch_size * sequence_length) / median : 0.0;
}

nlohmann::json to_json(const TrainSummary& s) {
  nlohmann::json j;
  j["model"] = s.model;
  j["parameters"] = s.parameters;
  j["parameters_stored"] = s.parameters_stored;
  j["steps"] = s.steps;
  j["train_batch_size"] = s.train_batch_size;
  j["sequence_length"] = s.sequence_length;
  j["tokens"] = s.tokens;
  const auto opt = [](std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  j["final_train_loss"] = opt(s.final_train_loss());
  j["final_val_loss"] = opt(s.final_val_loss());
  j["tokens_per_s"] = s.tokens_per_s();
  j["steady_tokens_per_s"] = s.steady_tokens_per_s();
  j["train_seconds"] = s.train_seconds;
  j["step_seconds"] = s.step_seconds;
  j["elapsed_seconds"] = s.elapsed_seconds;
  j["train_losses"] = s.train_losses;
  j["lrs"] = s.lrs;
  j["skipped_steps"] = s.skipped_steps;
  j["loss_scale"] = opt(s.loss_scale);
  nlohmann::json val = nlohmann::json::array();
  for (const auto& [step, loss] : s.val_losses) val.push_back(nlohmann::json::array({step, loss}));
  j["val_losses"] = val;
  nlohmann::json peak;
  for (MemoryPurpose p : kAllMemoryPurposes) peak[std::string(memory_purpose_name(p))] = s.memory[p].peak;
  peak["total"] = s.memory.total.peak;
  j["peak_memory_bytes"] = peak;
  return j;
}

std::string format_summary(const TrainSummary& s) {
  const auto loss = [](std::optional<double> v) { return v ? fmt::format("{:.4f}", *v) : std::string("-"); };
  std::string out = fmt::format("done: {} steps, {} tokens in {} ({} of them training): {} tokens/s\n", s.steps, format_count(static_cast<double>(s.tokens)),
                                format_duration(s.elapsed_seconds), format_duration(s.train_seconds), format_count(s.tokens_per_s()));
  out += fmt::format("final train loss {} | final val loss {}\n", loss(s.final_train_loss()), loss(s.final_val_loss()));
  if (s.loss_scale || s.skipped_steps > 0) {
    out += fmt::format("skipped steps {}{}\n", s.skipped_steps, s.loss_scale ? fmt::format(" | final loss scale {:g}", *s.loss_scale) : std::string());
  }
  out += "peak memory:";
  for (MemoryPurpose p : kAllMemoryPurposes) out += fmt::format(" {} {} |", memory_purpose_name(p), format_bytes(s.memory[p].peak));
  out += fmt::format(" total {}\n", format_bytes(s.memory.total.peak));
  return out;
}

}  // namespace dstrain
