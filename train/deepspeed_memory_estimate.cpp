#include "train/deepspeed_memory_estimate.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace dstrain {
namespace {

// Python's int() of a non-negative float.
double py_int(double x) { return std::floor(x); }

std::int64_t own_params(const ModuleFlops& m) {
  std::int64_t children = 0;
  for (const ModuleFlops& c : m.children) children += c.params;
  return m.params - children;
}

}  // namespace

std::string DeepSpeedStatesEstimate::options() const {
  const char* cpu = "cpu ";  // DeepSpeed pads the device to 4 characters: f'{OffloadDeviceEnum.cpu:4}'
  if (!zero3) return fmt::format("offload_optimizer={}", offload_optimizer ? cpu : "none");
  return fmt::format("offload_param={}, offload_optimizer={}, zero_init={}", offload_param ? cpu : "none", offload_optimizer ? cpu : "none",
                     zero_init ? 1 : 0);
}

std::vector<DeepSpeedStatesEstimate> deepspeed_zero2_estimates(double n, std::int64_t gpus_per_node, std::int64_t nodes, double f) {
  const double G = static_cast<double>(gpus_per_node * nodes);
  std::vector<DeepSpeedStatesEstimate> rows;
  for (const bool cpu_offload : {true, false}) {
    DeepSpeedStatesEstimate e;
    e.offload_optimizer = cpu_offload;
    if (cpu_offload) {
      e.gpu_bytes = 2.0 * n;
      e.cpu_bytes = n * std::max(4.0 * G, 16.0) * f;
    } else {
      e.gpu_bytes = 2.0 * n + py_int(18.0 * n / G);
      e.cpu_bytes = n * 4.0 * static_cast<double>(gpus_per_node) * f;
    }
    e.cpu_bytes = py_int(e.cpu_bytes);
    e.gpu_bytes = py_int(e.gpu_bytes);
    rows.push_back(e);
  }
  return rows;
}

std::vector<DeepSpeedStatesEstimate> deepspeed_zero3_estimates(double n, double largest, std::int64_t gpus_per_node, std::int64_t nodes, double f) {
  const double G = static_cast<double>(gpus_per_node * nodes), per_node = static_cast<double>(gpus_per_node);
  const double a = 1.0 / static_cast<double>(nodes);
  const double largest_memory = 4.0 * largest;
  std::vector<DeepSpeedStatesEstimate> rows;
  for (const bool cpu_offload : {true, false}) {
    for (const bool cpu_offload_params : {true, false}) {
      if (!cpu_offload && cpu_offload_params) continue;
      for (const bool zero_init : {true, false}) {
        DeepSpeedStatesEstimate e;
        e.zero3 = true;
        e.offload_optimizer = cpu_offload;
        e.offload_param = cpu_offload_params;
        e.zero_init = zero_init;
        if (cpu_offload && cpu_offload_params) {
          e.gpu_bytes = largest_memory;
          e.cpu_bytes = zero_init ? n * 18.0 * a * f : n * std::max(4.0 * per_node, 18.0 * a) * f;
        } else if (cpu_offload) {
          e.gpu_bytes = largest_memory + py_int(2.0 * n / G);
          e.cpu_bytes = zero_init ? n * 16.0 * a * f : n * std::max(4.0 * per_node, 16.0 * a) * f;
        } else {
          e.gpu_bytes = largest_memory + py_int(18.0 * n / G);
          e.cpu_bytes = zero_init ? largest * 4.0 * per_node * f : n * 4.0 * per_node * f;
        }
        e.cpu_bytes = py_int(e.cpu_bytes);
        e.gpu_bytes = py_int(e.gpu_bytes);
        rows.push_back(e);
      }
    }
  }
  return rows;
}

std::int64_t largest_module_params(const ModuleFlops& tree) {
  std::int64_t best = own_params(tree);
  for (const ModuleFlops& c : tree.children) best = std::max(best, largest_module_params(c));
  return best;
}

std::string format_deepspeed_estimates(const std::vector<DeepSpeedStatesEstimate>& rows, double total_params, double largest_layer_params,
                                       std::int64_t gpus_per_node, std::int64_t nodes, bool zero3, int marked) {
  std::string out = fmt::format("Estimated memory needed for params, optim states and gradients for a:\nHW: Setup with {} {}, {} {} per node.\n",
                                nodes, nodes > 1 ? "nodes" : "node", gpus_per_node, gpus_per_node > 1 ? "GPUs" : "GPU");
  if (zero3) {
    out += fmt::format("SW: Model with {}M total params, {}M largest layer params.\n", static_cast<long long>(total_params / 1e6),
                       static_cast<long long>(largest_layer_params / 1e6));
  } else {
    out += fmt::format("SW: Model with {}M total params.\n", static_cast<long long>(total_params / 1e6));
  }
  out += "  per CPU  |  per GPU |   Options\n";
  constexpr double GiB = 1073741824.0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const DeepSpeedStatesEstimate& e = rows[i];
    out += fmt::format(" {:7.2f}GB | {:6.2f}GB | {}{}\n", e.cpu_bytes / GiB, e.gpu_bytes / GiB, e.options(),
                       static_cast<int>(i) == marked ? "  <- this config" : "");
  }
  return out;
}

}  // namespace dstrain
