#include "train/progress.h"

#include <cmath>

#include <fmt/format.h>

namespace dstrain {

std::string format_duration(double s) {
  if (!(s >= 0.0) || !std::isfinite(s)) return "?";
  if (s < 60.0) return fmt::format("{:.1f}s", s);
  const auto total = static_cast<std::int64_t>(std::llround(s));
  if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

std::string format_count(double value) {
  std::string digits = fmt::format("{}", static_cast<std::int64_t>(std::llround(value)));
  std::string out;
  const std::size_t lead = digits[0] == '-' ? 1 : 0;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    out += digits[i];
    const std::size_t left = digits.size() - 1 - i;
    if (i >= lead && left > 0 && left % 3 == 0) out += ',';
  }
  return out;
}

std::string format_progress(const ProgressLine& p) {
  std::string scaling;
  if (p.loss_scale > 0.0) scaling += fmt::format(" | loss scale {:g}", p.loss_scale);
  if (p.skipped > 0) scaling += fmt::format(" | skipped {}", p.skipped);
  if (p.moe) {
    scaling += fmt::format(" | aux {:.4f} | experts {}-{} (x{:.2f})", p.aux_loss, format_count(p.expert_min), format_count(p.expert_max), p.expert_imbalance);
    if (p.expert_dropped > 0) scaling += fmt::format(" | dropped {}", format_count(static_cast<double>(p.expert_dropped)));
  }
  std::string throughput = p.show_throughput ? fmt::format(" | {} tokens/s", format_count(p.tokens_per_s)) : std::string();
  if (p.show_throughput && p.mfu >= 0.0) throughput += fmt::format(" | MFU {:.1f}%", 100.0 * p.mfu);
  if (p.slowest_rank >= 0) throughput += fmt::format(" | slowest rank {}: {:.2f} s", p.slowest_rank, p.slowest_s);
  return fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.4f}{}{} | elapsed {} | ETA {}", p.step, p.total_steps, p.loss, p.lr,
                     p.grad_norm, scaling, throughput, format_duration(p.elapsed_s), format_duration(p.eta_s));
}

}  // namespace dstrain
