#include "config_schema/elasticity_config.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {

// The 38 smallest highly composite numbers, as in DeepSpeed (enough for a 720K batch).
const std::vector<std::int64_t> kHcn = {1,     2,     4,     6,      12,     24,     36,     48,     60,     120,    180,    240,   360,
                                        720,   840,   1260,  1680,   2520,   5040,   7560,   10080,  15120,  20160,  25200,  27720, 45360,
                                        50400, 55440, 83160, 110880, 166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

// Each base scaled by the largest HCN that keeps it <= max (bases above max are dropped).
std::set<std::int64_t> candidate_batch_sizes(const std::vector<std::int64_t>& bases, std::int64_t max_batch) {
  std::set<std::int64_t> out;
  for (std::int64_t base : bases) {
    if (base > max_batch) continue;
    if (base == max_batch) {
      out.insert(base);
      continue;
    }
    const std::int64_t value = max_batch / base;
    // np.argmax(HCN > value): first index where true, 0 when none; then HCN[index - 1] with
    // Python's wrap-around for index 0.
    std::size_t index = 0;
    for (std::size_t i = 0; i < kHcn.size(); ++i)
      if (kHcn[i] > value) {
        index = i;
        break;
      }
    const std::int64_t hcn = index == 0 ? kHcn.back() : kHcn[index - 1];
    out.insert(hcn * base);
  }
  return out;
}

std::vector<std::int64_t> valid_gpus(std::int64_t batch, const std::vector<std::int64_t>& micros, std::int64_t min_gpus, std::int64_t max_gpus) {
  std::set<std::int64_t> valid;
  for (std::int64_t micro : micros) {
    if (batch % micro != 0) continue;
    const std::int64_t most = batch / micro;
    if (min_gpus <= most && most <= max_gpus) valid.insert(most);
    for (std::int64_t i = 1; i <= most / 2; ++i) {
      if (i > max_gpus) break;
      if (i < min_gpus) continue;
      if (most % i == 0) valid.insert(i);
    }
  }
  return {valid.begin(), valid.end()};
}

struct Compatible {
  std::int64_t batch;
  std::vector<std::int64_t> gpus;
};

Compatible compatible_gpus_v01(const std::vector<std::int64_t>& micros, std::int64_t max_batch, std::int64_t min_gpus, std::int64_t max_gpus,
                               bool prefer_larger) {
  const std::int64_t smallest = *std::min_element(micros.begin(), micros.end());
  if (min_gpus == 0) min_gpus = 1;                     // "min_gpus or 1"
  if (max_gpus == 0) max_gpus = max_batch / smallest;  // "max_gpus or max // min(micro)"
  for (std::int64_t m : micros)
    if (m > max_batch)
      fail(
          "elasticity.micro_batch_sizes: All micro batches must be less than or equal to max_acceptable_batch_size: "
          "{} (micro batch {} is larger); lower it or raise elasticity.max_train_batch_size",
          max_batch, m);
  std::int64_t lcm = 1;
  for (std::int64_t m : micros) lcm = std::lcm(lcm, m);
  std::vector<std::int64_t> bases = micros;
  bases.push_back(lcm);
  Compatible best{smallest, {}};
  std::size_t best_count = 0;
  for (std::int64_t batch : candidate_batch_sizes(bases, max_batch)) {
    auto gpus = valid_gpus(batch, micros, min_gpus, max_gpus);
    const bool better =
        gpus.size() > best_count || (gpus.size() == best_count && ((prefer_larger && batch > best.batch) || (!prefer_larger && batch < best.batch)));
    if (better) {
      best_count = gpus.size();
      best = {batch, std::move(gpus)};
    }
  }
  return best;
}

Compatible compatible_gpus_v02(const ElasticityConfig& c, std::int64_t current_gpus) {
  const std::int64_t gpn = c.num_gpus_per_node, mp = c.model_parallel_size;
  if (gpn % mp != 0) fail("elasticity: In Elasticity v0.2, number of GPUs per node:{} should be divisible by model parallel size {}", gpn, mp);
  const std::int64_t dp_per_node = gpn / mp;
  // Version 0.2 works per node: batch and GPU bounds are divided by the node size.
  Compatible nodes = compatible_gpus_v01(c.micro_batch_sizes,
                                         static_cast<std::int64_t>(static_cast<double>(c.max_train_batch_size) / static_cast<double>(dp_per_node)),
                                         c.min_gpus / gpn, c.max_gpus / gpn, c.prefer_larger_batch);
  Compatible out{nodes.batch * dp_per_node, {}};
  for (std::int64_t n : nodes.gpus) out.gpus.push_back(n * dp_per_node);
  if (std::find(out.gpus.begin(), out.gpus.end(), current_gpus / mp) != out.gpus.end()) return out;
  // The current size is not one of the elastic sizes: pick the batch that fits it.
  const double current_dp = static_cast<double>(current_gpus) / static_cast<double>(gpn) * static_cast<double>(dp_per_node);
  std::vector<double> candidates;
  for (std::int64_t micro : c.micro_batch_sizes) {
    const double min_batch = static_cast<double>(micro) * current_dp;
    candidates.push_back(std::floor(static_cast<double>(c.max_train_batch_size) / min_batch) * min_batch);
  }
  const double chosen =
      c.prefer_larger_batch ? *std::max_element(candidates.begin(), candidates.end()) : *std::min_element(candidates.begin(), candidates.end());
  return {static_cast<std::int64_t>(chosen), {static_cast<std::int64_t>(current_dp)}};
}

}  // namespace

SectionSpec elasticity_section_spec() {
  return make_section("elasticity", Regime::dict_lookup, "Elastic batch sizes: DeepSpeed derives the batch triple from these.",
                      {
                          bool_field("enabled", false, "Derive train_batch_size, micro batch and GAS from this section."),
                          int_field("max_train_batch_size", 2000, "Largest acceptable train_batch_size (required when enabled)."),
                          array_field("micro_batch_sizes", Json::array({2, 4, 6}), "Acceptable micro batch sizes (required when enabled)."),
                          int_field("min_gpus", 1, "Smallest GPU count to support."),
                          int_field("max_gpus", 10000, "Largest GPU count to support."),
                          number_field("min_time", 0, "Minutes before a scheduler may rescale the job (>= 0)."),
                          bool_field("prefer_larger_batch", true, "Prefer the larger of equally elastic batch sizes."),
                          bool_field("ignore_non_elastic_batch_info", false, "Ignore (instead of rejecting) batch keys outside elasticity."),
                          number_field("version", 0.2, "Elasticity algorithm version: 0.1 or 0.2."),
                          int_field("num_gpus_per_node", 1, "GPUs per node (version 0.2)."),
                          int_field("model_parallel_size", 1, "Model-parallel size (version 0.2)."),
                      });
}

ElasticityConfig parse_elasticity_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(value == nullptr || value->is_null() ? Json::object() : *value, elasticity_section_spec(), ctx);
  ElasticityConfig c;
  c.enabled = resolved["enabled"].get<bool>();
  if (c.enabled) {
    for (const char* key : {"max_train_batch_size", "micro_batch_sizes"})
      if (!value->contains(key)) fail("elasticity.{}: Elasticity config missing {}; it is required when elasticity.enabled is true", key, key);
  }
  c.max_train_batch_size = resolved["max_train_batch_size"].get<std::int64_t>();
  c.micro_batch_sizes.clear();
  for (const auto& m : resolved["micro_batch_sizes"]) {
    if (!m.is_number_integer())
      fail(
          "elasticity.micro_batch_sizes is {}: Elasticity expected micro_batch_sizes to only contain a list of "
          "integers",
          show(resolved["micro_batch_sizes"]));
    if (m.get<std::int64_t>() <= 0)
      fail(
          "elasticity.micro_batch_sizes is {}: Elasticity expected micro_batch_sizes to only contain positive "
          "integers",
          show(resolved["micro_batch_sizes"]));
    c.micro_batch_sizes.push_back(m.get<std::int64_t>());
  }
  if (c.micro_batch_sizes.empty()) fail("elasticity.micro_batch_sizes is empty: give at least one micro batch size, e.g. [2, 4, 6]");
  c.min_gpus = resolved["min_gpus"].get<std::int64_t>();
  c.max_gpus = resolved["max_gpus"].get<std::int64_t>();
  if (c.min_gpus < 1 || c.max_gpus < 1)
    fail("elasticity: Elasticity min/max gpus must be > 0, given min_gpus: {}, max_gpus: {}", c.min_gpus, c.max_gpus);
  if (c.max_gpus < c.min_gpus)
    fail("elasticity: Elasticity min_gpus cannot be greater than max_gpus, given min_gpus: {}, max_gpus: {}", c.min_gpus, c.max_gpus);
  c.model_parallel_size = resolved["model_parallel_size"].get<std::int64_t>();
  if (c.model_parallel_size < 1) fail("elasticity.model_parallel_size is {}: Model-Parallel size cannot be less than 1", c.model_parallel_size);
  c.num_gpus_per_node = resolved["num_gpus_per_node"].get<std::int64_t>();
  if (c.num_gpus_per_node < 1) fail("elasticity.num_gpus_per_node is {}: Number of GPUs per node cannot be less than 1", c.num_gpus_per_node);
  c.min_time = resolved["min_time"].get<double>();
  if (c.min_time < 0) fail("elasticity.min_time is {}: Elasticity min time needs to be >= 0", c.min_time);
  c.prefer_larger_batch = resolved["prefer_larger_batch"].get<bool>();
  c.ignore_non_elastic_batch_info = resolved["ignore_non_elastic_batch_info"].get<bool>();
  c.version = resolved["version"].get<double>();
  if (c.enabled) {
    if (c.model_parallel_size > 1) fail("elasticity.model_parallel_size is {}: dstrain has no model parallelism; set it to 1", c.model_parallel_size);
    if (c.version != 0.1 && c.version != 0.2)
      fail("elasticity.version is {}: {}; use 0.1 or 0.2", c.version,
           c.version > 0.2 ? "Attempting to run elasticity version above the latest supported (0.2)"
                           : "Unable to find elastic logic for this version");
  }
  return c;
}

ElasticBatch compute_elastic_batch(const ElasticityConfig& c, std::int64_t w) {
  Compatible found = c.version == 0.1
                         ? compatible_gpus_v01(c.micro_batch_sizes, c.max_train_batch_size, c.min_gpus, c.max_gpus, c.prefer_larger_batch)
                         : compatible_gpus_v02(c, w);
  if (std::find(found.gpus.begin(), found.gpus.end(), w) == found.gpus.end())
    fail(
        "elasticity: World size ({}) is not valid with the current list of valid GPU counts: [{}] (elastic "
        "train_batch_size {}); run on one of these data-parallel sizes or change elasticity.max_train_batch_size / "
        "micro_batch_sizes",
        w, fmt::join(found.gpus, ", "), found.batch);
  std::vector<std::int64_t> micros = c.micro_batch_sizes;
  std::sort(micros.begin(), micros.end(), std::greater<>());
  micros.erase(std::unique(micros.begin(), micros.end()), micros.end());
  std::int64_t micro = 0;
  for (std::int64_t m : micros)
    if ((found.batch / w) % m == 0) {
      micro = m;
      break;
    }
  if (micro == 0)
    fail(
        "elasticity: Unable to find divisible micro batch size world_size={}, final_batch_size={}, and "
        "micro_batches=[{}]",
        w, found.batch, fmt::join(c.micro_batch_sizes, ", "));
  return {found.batch, found.gpus, micro, found.batch / (micro * w)};
}

}  // namespace dstrain::config
