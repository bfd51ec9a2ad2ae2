#include "config_schema/unsupported_sections.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {

struct Feature {
  const char* key;
  const char* what;  // "dstrain does not provide <what>"
};

const std::vector<Feature>& features() {
  static const std::vector<Feature> f = {
      {"compression_training", "compression training (quantization, pruning, layer reduction)"},
      {"sparse_attention", "sparse attention"},
      {"data_efficiency", "data efficiency (curriculum data sampling, random-LTD)"},
      {"curriculum_learning", "legacy curriculum learning"},
      {"progressive_layer_drop", "progressive layer drop"},
      {"hybrid_engine", "the hybrid (RLHF) engine"},
      {"compile", "DeepCompile / torch.compile"},
      {"weight_quantization", "quantized weight initialisation"},
      {"nebula", "the Nebula checkpoint engine"},
      {"datastates_ckpt", "DataStates asynchronous checkpointing"},
      {"autotuning", "the autotuner"},
      {"eigenvalue", "eigenvalue computation"},
      {"quantize_training", "MoQ quantize-training"},
  };
  return f;
}

bool enabled_flag(const Json& v) { return v.is_object() && v.contains("enabled") && truthy(v["enabled"]); }

// Whether the section asks for the feature. Sections with an "enabled" switch are active only when
// it is truthy (DeepSpeed's own test); the rest are active by presence.
bool is_active(const std::string& key, const Json& v) {
  if (v.is_null()) return false;
  if (key == "datastates_ckpt") return !(v.is_boolean() && !v.get<bool>());  // anything but false enables it
  if (key == "compression_training" || key == "sparse_attention" || key == "weight_quantization")
    return true;
  if (key == "compile") return v.is_object() && v.contains("deepcompile") && truthy(v["deepcompile"]);
  return enabled_flag(v);
}

void validate(const std::string& key, const Json& v) {
  if (key == "eigenvalue" && enabled_flag(v))
    fail(
        "eigenvalue.enabled is true: DeepSpeed asserts that eigenvalue computation is temporarily disabled; set "
        "eigenvalue.enabled to false");
  if (key == "sparse_attention" && v.is_object() && v.contains("mode")) {
    const Json& m = v["mode"];
    static const std::vector<std::string> modes = {"dense", "fixed", "variable", "bigbird", "bslongformer"};
    if (!m.is_string() || std::find(modes.begin(), modes.end(), m.get<std::string>()) == modes.end())
      fail(
          "sparse_attention.mode is {}: DeepSpeed raises NotImplementedError; valid modes: dense, fixed, variable, "
          "bigbird, bslongformer",
          show(m));
  }
  if (key != "datastates_ckpt" && !v.is_null() && !v.is_object()) fail("{} must be an object, got {}", key, show(v));
}

}  // namespace

SectionSpec hybrid_engine_section_spec() {
  return make_section("hybrid_engine", Regime::validated, "DeepSpeed-Chat hybrid engine; not provided by dstrain.",
                      {
                          bool_field("enabled", false, "Switch between training and inference kernels (RLHF)."),
                          int_field("max_out_tokens", 512, "Generation length."),
                          int_field("inference_tp_size", 1, "Tensor-parallel size for generation."),
                          bool_field("release_inference_cache", false, "Free the inference cache after generation."),
                          bool_field("pin_parameters", true, "Pin parameters in memory."),
                          int_field("tp_gather_partition_size", 8, "Partitions gathered at once."),
                          bool_field("enable_cuda_graph", false, "Capture generation in CUDA graphs."),
                      });
}

const std::vector<std::string>& unsupported_section_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : features()) k.emplace_back(f.key);
    return k;
  }();
  return keys;
}

std::vector<IgnoredSection> check_unsupported_sections(const Json& root, ParseContext& ctx) {
  std::vector<IgnoredSection> out;
  for (const auto& f : features()) {
    if (!root.contains(f.key)) continue;
    const Json& v = root[f.key];
    validate(f.key, v);
    if (std::string(f.key) == "hybrid_engine" && v.is_object()) {
      // Unknown keys and bad types are errors in DeepSpeed's pydantic model; the values are unused.
      Json ignored = read_section(v, hybrid_engine_section_spec(), ctx);
      (void)ignored;
    }
    const bool active = is_active(f.key, v);
    if (active) ctx.warn(f.key, fmt::format("dstrain does not provide {}; the `{}` section is ignored", f.what, f.key));
    out.push_back({f.key, v, active});
  }
  return out;
}

}  // namespace dstrain::config
