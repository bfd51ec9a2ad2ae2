#include "models/stage_partition.h"

#include <algorithm>
#include <limits>
#include <regex>
#include <string>

#include "ops/error.h"

namespace dstrain {

StageParts partition_uniform(std::size_t items, std::size_t stages) {
  StageParts parts(stages + 1, 0);
  if (items <= stages) {
    for (std::size_t p = 0; p <= stages; ++p) parts[p] = std::min(p, items);
    return parts;
  }
  const std::size_t chunk = items / stages, residual = items - chunk * stages;
  // DeepSpeed: arange(0, (stages + 1) · chunk, chunk), then parts[i + 1:] += 1 for i < residual.
  for (std::size_t p = 0; p <= stages; ++p) parts[p] = p * chunk + std::min(p, residual);
  return parts;
}

StageParts partition_balanced(std::span<const double> weights, std::size_t stages) {
  const std::size_t n = weights.size(), m = stages;
  if (n <= m) return partition_uniform(n, m);
  constexpr double inf = std::numeric_limits<double>::infinity();
  const std::size_t cols = m + 1;
  std::vector<double> dp_max((n + 1) * cols, inf), dp_min((n + 1) * cols, inf), dp_cost((n + 1) * cols, inf);
  std::vector<std::size_t> position((n + 1) * cols, 0);
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  const auto at = [cols](std::size_t i, std::size_t j) { return i * cols + j; };
  dp_max[at(0, 0)] = 0.0;
  dp_cost[at(0, 0)] = 0.0;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= std::min(i, m); ++j) {
      for (std::size_t k = 0; k < i; ++k) {
        const double part = prefix[i] - prefix[k];
        const double max_sum = std::max(dp_max[at(k, j - 1)], part);
        const double min_sum = std::min(dp_min[at(k, j - 1)], part);
        const double cost = max_sum - min_sum;
        // >=: of equal costs the last k wins, as in DeepSpeed (an inf - inf = NaN cost never does).
        if (dp_cost[at(i, j)] >= cost) {
          dp_cost[at(i, j)] = cost;
          dp_max[at(i, j)] = max_sum;
          dp_min[at(i, j)] = min_sum;
          position[at(i, j)] = k;
        }
      }
    }
  }
  StageParts parts{n};
  for (std::size_t j = m; j >= 1; --j) parts.push_back(position[at(parts.back(), j)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

StageParts partition_layers(std::span<const std::unique_ptr<Layer>> layers, std::size_t stages, std::string_view method_in) {
  std::string method(method_in);
  std::transform(method.begin(), method.end(), method.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (stages < 1) fail("pipeline stages: {} — a pipeline has at least one stage", stages);
  if (method == "uniform") return partition_uniform(layers.size(), stages);
  std::vector<double> weights(layers.size(), 0.0);
  if (method == "parameters" || method == "best") {
    for (std::size_t i = 0; i < layers.size(); ++i)
      for (const ParamSpec& p : layers[i]->params()) weights[i] += static_cast<double>(p.shape.numel());
    return partition_balanced(weights, stages);
  }
  if (method.rfind("type:", 0) == 0) {
    const std::string pattern(method_in.substr(5));
    std::regex rx;
    try {
      rx = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      fail("pipeline partition method '{}': '{}' is not a valid regular expression ({})", method_in, pattern, e.what());
    }
    bool any = false;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      if (std::regex_search(layers[i]->type_name(), rx)) {
        weights[i] = 1.0;
        any = true;
      }
    }
    if (!any) {
      std::string types;
      for (const auto& l : layers)
        if (types.find(l->type_name()) == std::string::npos) types += (types.empty() ? "" : ", ") + l->type_name();
      fail("pipeline partition method '{}' found no layers to partition: the model's layer types are {}", method_in, types);
    }
    return partition_balanced(weights, stages);
  }
  fail("pipeline partition method '{}': use \"parameters\" (or \"best\"), \"uniform\" or \"type:<regex>\", as DeepSpeed's PipelineModule takes",
       method_in);
}

}  // namespace dstrain
