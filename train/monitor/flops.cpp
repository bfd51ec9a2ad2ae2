#include "train/monitor/flops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "train/monitor/python_format.h"
#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

std::string percent(double part, double total) { return python_format_g(total != 0 ? python_round(100.0 * part / total, 2) : 0.0); }

// DeepSpeed's number_to_string with the unit picked by magnitude.
std::string number_with_units(double num) {
  double magnitude = 1;
  const char* units = "";
  if (num >= 1e12) {
    magnitude = 1e12, units = "T";
  } else if (num >= 1e9) {
    magnitude = 1e9, units = "G";
  } else if (num >= 1e6) {
    magnitude = 1e6, units = "M";
  } else if (num >= 1e3) {
    magnitude = 1e3, units = "K";
  } else if (num >= 1 || num == 0) {
    magnitude = 1, units = "";
  } else if (num >= 1e-3) {
    magnitude = 1e-3, units = "m";
  } else {
    magnitude = 1e-6, units = "u";
  }
  return fmt::format("{} {}", python_format_g(python_round(num / magnitude, 2)), units);
}

std::string line(std::string_view label, std::string_view value) { return fmt::format("{:<70}  {:<8}\n", label, value); }

// Python's repr of a {str: str} dict.
std::string py_dict(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += fmt::format("'{}': '{}'", items[i].first, items[i].second);
  }
  return out + "}";
}

struct TypeTotals {
  std::int64_t macs = 0, params = 0;
  std::size_t first_seen = 0;  // Python dicts keep insertion order; sorted() is stable
};

void walk(const ModuleFlops& m, std::size_t depth, std::vector<std::map<std::string, TypeTotals>>& info, std::size_t& order) {
  if (info.size() <= depth) info.resize(depth + 1);
  auto [it, inserted] = info[depth].try_emplace(m.type);
  if (inserted) it->second.first_seen = order++;
  it->second.macs += m.macs;
  it->second.params += m.params;
  for (const auto& c : m.children) walk(c, depth + 1, info, order);
}

void print_tree(const ModuleFlops& m, const ModuleFlops& total, const std::string& indent, const std::string& label, std::string& out) {
  std::string repr =
      fmt::format("{} = {}% Params, {} = {}% MACs, {}flops = {}% flops", flops_params_to_string(m.params),
                  percent(static_cast<double>(m.params), static_cast<double>(total.params)), flops_macs_to_string(static_cast<double>(m.macs)),
                  percent(static_cast<double>(m.macs), static_cast<double>(total.macs)), flops_number_to_string(static_cast<double>(m.flops)),
                  percent(static_cast<double>(m.flops), static_cast<double>(total.flops)));
  if (!m.note.empty()) repr += ", " + m.note;
  const std::string head = label.empty() ? m.type : fmt::format("({}): {}", label, m.type);
  if (m.children.empty()) {
    out += fmt::format("{}{}({})\n", indent, head, repr);
    return;
  }
  out += fmt::format("{}{}(\n{}  {}\n", indent, head, indent, repr);
  for (const auto& c : m.children) print_tree(c, total, indent + "  ", c.name, out);
  out += indent + ")\n";
}

}  // namespace

double model_flops_per_token(std::int64_t num_parameters, std::int64_t layers, std::int64_t channels, std::int64_t seq_len) {
  return 6.0 * static_cast<double>(num_parameters) + 6.0 * static_cast<double>(layers) * static_cast<double>(channels) * static_cast<double>(seq_len);
}

double mfu(double flops_per_token, double tokens_per_second, double peak_flops_per_second) {
  DSTRAIN_CHECK(peak_flops_per_second > 0,
                "mfu: the peak FLOP/s must be > 0, got {}; pass the device's dense peak "
                "for the training dtype",
                peak_flops_per_second);
  return flops_per_token * tokens_per_second / peak_flops_per_second;
}

std::string flops_number_to_string(double num) { return number_with_units(num); }

std::string flops_params_to_string(double params) {
  std::string s = number_with_units(params);
  std::replace(s.begin(), s.end(), 'G', 'B');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string flops_macs_to_string(double macs) { return number_with_units(macs) + "MACs"; }
std::string flops_flops_to_string(double flops_per_second) { return number_with_units(flops_per_second) + "FLOPS"; }
std::string flops_duration_to_string(double seconds) { return number_with_units(seconds) + "s"; }

std::string format_flops_profile(const FlopsProfileInput& in, const config::FlopsProfilerConfig& cfg) {
  DSTRAIN_CHECK(in.model != nullptr, "format_flops_profile: no model tree given; pass the architecture's forward_flops(B, T)");
  const ModuleFlops& m = *in.model;
  const auto flops = static_cast<double>(m.flops);
  const auto mp = static_cast<double>(in.model_parallel_size);
  std::string out;
  out += "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  out += fmt::format("Profile Summary at step {}:\n", in.profile_step);
  out +=
      "Notations:\n"
      "data parallel size (dp_size), model parallel size(mp_size),\n"
      "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
      "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
      "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
      "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  out += line("world size: ", std::to_string(in.world_size));
  out += line("data parallel size: ", std::to_string(in.data_parallel_size));
  out += line("model parallel size: ", std::to_string(in.model_parallel_size));
  out += line("batch size per GPU: ", std::to_string(in.micro_batch_per_gpu));
  out += line("params per GPU: ", flops_params_to_string(static_cast<double>(m.params)));
  out += line("params of model = params per GPU * mp_size: ", flops_params_to_string(static_cast<double>(m.params) * mp));
  out += line("fwd MACs per GPU: ", flops_macs_to_string(static_cast<double>(m.macs)));
  out += line("fwd flops per GPU: ", flops_number_to_string(flops));
  out += line("fwd flops of model = fwd flops per GPU * mp_size: ", flops_number_to_string(flops * mp));
  if (in.fwd_ms) {
    const double fwd = *in.fwd_ms / 1000.0;
    out += line("fwd latency: ", flops_duration_to_string(fwd));
    out += line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", flops_flops_to_string(flops / fwd));
    if (in.bwd_ms && in.step_ms) {
      const double bwd_factor = 2.0 + cfg.recompute_fwd_factor;
      const double bwd = *in.bwd_ms / 1000.0, step = *in.step_ms / 1000.0;
      out += line("bwd latency: ", flops_duration_to_string(bwd));
      out += line(fmt::format("bwd FLOPS per GPU = {} * fwd flops per GPU / bwd latency: ", python_format_g(bwd_factor)),
                  flops_flops_to_string(bwd_factor * flops / bwd));
      out += line(fmt::format("fwd+bwd FLOPS per GPU = {} * fwd flops per GPU / (fwd+bwd latency): ", python_format_g(bwd_factor + 1)),
                  flops_flops_to_string((bwd_factor + 1) * flops / (fwd + bwd)));
      out += line("step latency: ", flops_duration_to_string(step));
      const double iter = fwd + bwd + step;
      out += line("iter latency: ", flops_duration_to_string(iter));
      out += line(fmt::format("FLOPS per GPU = {} * fwd flops per GPU / iter latency: ", python_format_g(bwd_factor + 1)),
                  flops_flops_to_string((bwd_factor + 1) * flops / iter));
      const double samples_per_iter = static_cast<double>(in.micro_batch_per_gpu * in.world_size);
      out += line("samples/second: ", python_float_repr(python_round(samples_per_iter / iter, 2)));
    }
  }

  out += "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  std::vector<std::map<std::string, TypeTotals>> info;
  std::size_t order = 0;
  walk(m, 0, info, order);
  // DeepSpeed: depth = len(info) - 1 for -1, then `for d in range(depth)`.
  const std::int64_t depth = cfg.module_depth == -1 ? static_cast<std::int64_t>(info.size()) - 1 : cfg.module_depth;
  out += fmt::format("Top {} modules in terms of params, MACs or fwd latency at different model depths:\n", cfg.top_modules);
  for (std::int64_t d = 0; d < depth && d < static_cast<std::int64_t>(info.size()); ++d) {
    std::vector<std::pair<std::string, TypeTotals>> rows(info[static_cast<std::size_t>(d)].begin(), info[static_cast<std::size_t>(d)].end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first_seen < b.second.first_seen; });
    const auto n = static_cast<std::size_t>(std::clamp<std::int64_t>(cfg.top_modules, 0, static_cast<std::int64_t>(rows.size())));
    auto top_by = [&](auto key, auto to_string) {
      auto sorted = rows;
      std::stable_sort(sorted.begin(), sorted.end(), [&](const auto& a, const auto& b) { return key(a.second) > key(b.second); });
      std::vector<std::pair<std::string, std::string>> items;
      for (std::size_t i = 0; i < n; ++i) items.emplace_back(sorted[i].first, to_string(static_cast<double>(key(sorted[i].second))));
      return py_dict(items);
    };
    out += fmt::format("depth {}:\n", d);
    out += fmt::format("    params      - {}\n", top_by([](const TypeTotals& t) { return t.params; }, flops_params_to_string));
    out += fmt::format("    MACs        - {}\n", top_by([](const TypeTotals& t) { return t.macs; }, flops_macs_to_string));
  }

  if (cfg.detailed) {
    out += "\n------------------------------ Detailed Profile per GPU ------------------------------\n";
    out +=
        "Each module profile is listed after its name in the following order: \n"
        "params, percentage of total params, MACs, percentage of total MACs, fwd flops, percentage of total fwd "
        "flops\n\n";
    out +=
        "Note: 1. A module's figures include its submodules'; the difference between a parent's and the sum of its "
        "submodules' is the parent's own work (attention's QK^T and AV, residual adds).\n"
        "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could be "
        "larger than the maximum system throughput.\n\n";
    print_tree(m, m, "", "", out);
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

void emit_flops_profile(const std::string& text, const config::FlopsProfilerConfig& cfg) {
  if (!cfg.output_file || cfg.output_file->empty()) {
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) log_info("{}", l);
    return;
  }
  const std::filesystem::path path = *cfg.output_file;
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (ec || !out || !(out << text) || !out.flush()) {
    const int err = errno;
    fail(
        "flops_profiler: cannot write the profile to '{}': {}; set flops_profiler.output_file to a writable path "
        "or remove it to log the profile",
        path.string(), ec ? ec.message() : std::string(std::strerror(err)));
  }
}

}  // namespace dstrain
