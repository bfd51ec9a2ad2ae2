#include "train/train_summary.h"

#include <algorithm>

#include <fmt/format.h>

#include "train/progress.h"

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

double OffloadSummary::bytes_read_per_step(std::int64_t steps) const {
  return steps > 0 ? static_cast<double>(bytes_read) / static_cast<double>(steps) : 0.0;
}

double OffloadSummary::bytes_written_per_step(std::int64_t steps) const {
  return steps > 0 ? static_cast<double>(bytes_written) / static_cast<double>(steps) : 0.0;
}

double OffloadSummary::gb_per_s(double train_seconds) const {
  return train_seconds > 0.0 ? static_cast<double>(bytes_read + bytes_written) / train_seconds / 1e9 : 0.0;
}

nlohmann::json memory_purposes_json(const std::array<std::uint64_t, kNumMemoryPurposes>& bytes) {
  nlohmann::json j;
  std::uint64_t total = 0;
  for (MemoryPurpose p : kAllMemoryPurposes) {
    j[std::string(memory_purpose_name(p))] = bytes[static_cast<std::size_t>(p)];
    total += bytes[static_cast<std::size_t>(p)];
  }
  j["total"] = total;
  return j;
}

double OffloadSummary::io_wait_share(double train_seconds) const { return train_seconds > 0.0 ? wait_seconds / train_seconds : 0.0; }

namespace {

std::uint64_t total(const std::array<std::uint64_t, kNumMemoryPurposes>& bytes) {
  std::uint64_t t = 0;
  for (std::uint64_t b : bytes) t += b;
  return t;
}

}  // namespace

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
  if (s.peak_flops > 0.0) {
    j["mfu"] = s.steady_mfu();
    j["peak_flops"] = s.peak_flops;
    j["peak_source"] = s.peak_source;
    j["flops_per_token"] = s.flops_per_token;
  }
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
  if (s.offload) {
    const OffloadSummary& o = *s.offload;
    j["offload"] = {{"optimizer_home", o.optimizer_home},
                    {"bytes_held",
                     {{"device", memory_purposes_json(o.device)}, {"host", memory_purposes_json(o.host)}, {"nvme", memory_purposes_json(o.nvme)}}},
                    {"nvme_bytes_read", o.bytes_read},
                    {"nvme_bytes_written", o.bytes_written},
                    {"nvme_bytes_read_per_step", o.bytes_read_per_step(s.steps)},
                    {"nvme_bytes_written_per_step", o.bytes_written_per_step(s.steps)},
                    {"nvme_last_step_bytes_read", o.last_step_bytes_read},
                    {"nvme_last_step_bytes_written", o.last_step_bytes_written},
                    {"nvme_gb_per_s", o.gb_per_s(s.train_seconds)},
                    {"io_wait_seconds", o.wait_seconds},
                    {"io_wait_share", o.io_wait_share(s.train_seconds)}};
  }
  if (s.comms) {
    // DeepSpeed's log_all(return_dict=True) "summary": op -> message size -> figures (JSON keys
    // are strings, so the size is written as one, as json.dumps writes DeepSpeed's int keys).
    nlohmann::json summary = nlohmann::json::object();
    for (const CommsLogRow& r : s.comms->rows) {
      summary[r.op][std::to_string(r.msg_bytes)] = {{"count", r.count},
                                                    {"total_latency_ms", r.total_latency_ms},
                                                    {"avg_latency_ms", r.avg_latency_ms},
                                                    {"tput_avg_gbps", r.algbw_avg_gbps},
                                                    {"busbw_avg_gbps", r.busbw_avg_gbps},
                                                    {"msg_size_bytes", r.msg_bytes},
                                                    {"msg_size_str", convert_comm_size(r.msg_bytes)}};
    }
    j["comms"] = {{"world_size", s.comms->world_size}, {"rank", s.comms->rank}, {"summary", summary}};
  }
  return j;
}

double TrainSummary::steady_mfu() const {
  return peak_flops > 0.0 ? steady_tokens_per_s() * flops_per_token / peak_flops : 0.0;
}

std::string format_summary(const TrainSummary& s) {
  const auto loss = [](std::optional<double> v) { return v ? fmt::format("{:.4f}", *v) : std::string("-"); };
  std::string out =
      fmt::format("done: {} steps, {} tokens in {} ({} of them training): {} tokens/s\n", s.steps, format_count(static_cast<double>(s.tokens)),
                  format_duration(s.elapsed_seconds), format_duration(s.train_seconds), format_count(s.tokens_per_s()));
  if (s.peak_flops > 0.0) {
    out += fmt::format("MFU {:.1f}% at the steady {} tokens/s: {} FLOP per token (6N + 6LCT) against a peak of {:.1f} GFLOP/s ({})\n",
                       100.0 * s.steady_mfu(), format_count(s.steady_tokens_per_s()), format_count(s.flops_per_token), s.peak_flops / 1e9,
                       s.peak_source);
  }
  out += fmt::format("final train loss {} | final val loss {}\n", loss(s.final_train_loss()), loss(s.final_val_loss()));
  if (s.loss_scale || s.skipped_steps > 0) {
    out +=
        fmt::format("skipped steps {}{}\n", s.skipped_steps, s.loss_scale ? fmt::format(" | final loss scale {:g}", *s.loss_scale) : std::string());
  }
  out += "peak memory:";
  for (MemoryPurpose p : kAllMemoryPurposes) out += fmt::format(" {} {} |", memory_purpose_name(p), format_bytes(s.memory[p].peak));
  out += fmt::format(" total {}\n", format_bytes(s.memory.total.peak));
  if (s.offload) {
    const OffloadSummary& o = *s.offload;
    const auto held = [](const char* where, const std::array<std::uint64_t, kNumMemoryPurposes>& bytes) {
      std::string line = fmt::format("  {:<6}", where);
      for (MemoryPurpose p : kAllMemoryPurposes)
        line += fmt::format(" {} {} |", memory_purpose_name(p), format_bytes(bytes[static_cast<std::size_t>(p)]));
      return line + fmt::format(" total {}\n", format_bytes(total(bytes)));
    };
    out += fmt::format("offload (optimizer on {}), bytes held:\n", o.optimizer_home);
    out += held("device", o.device) + held("host", o.host) + held("nvme", o.nvme);
    if (o.bytes_read + o.bytes_written > 0 || total(o.nvme) > 0) {
      out += fmt::format("nvme per step: read {} written {} | {:.2f} GB/s over the steps | waiting on I/O {:.1f}% of step time\n",
                         format_bytes(static_cast<std::size_t>(o.bytes_read_per_step(s.steps))),
                         format_bytes(static_cast<std::size_t>(o.bytes_written_per_step(s.steps))), o.gb_per_s(s.train_seconds),
                         100.0 * o.io_wait_share(s.train_seconds));
    }
  }
  return out;
}

}  // namespace dstrain
