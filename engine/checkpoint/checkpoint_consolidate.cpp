#include "engine/checkpoint/checkpoint_consolidate.h"

#include <map>
#include <optional>
#include <vector>

#include "engine/checkpoint/checkpoint_files.h"
#include "models/model.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_weights.h"
#include "models/llama/llama_weights.h"

namespace dstrain {

std::string consolidate_checkpoint(const std::filesystem::path& save_dir, std::string tag, const std::filesystem::path& output, DType dtype) {
  if (tag.empty()) {
    const std::optional<std::string> latest = read_latest_tag(save_dir);
    if (!latest) fail("consolidate: no '{}' file in '{}'; give the checkpoint with --tag", kLatestFile, save_dir.string());
    tag = *latest;
  }
  check_checkpoint_tag(tag);
  CheckpointReader rd(save_dir, tag);
  const config::Json& m = rd.manifest();
  // The architecture: GPT-2's shape, or the Llama family's Hugging Face config.json.
  ModelConfig mc;
  if (m.contains("llama") && !m.at("llama").is_null()) {
    mc.llama = llama_config_from_hf_json(m.at("llama").dump(), rd.dir().string() + " (manifest \"llama\")");
  } else if (m.contains("gpt2") && !m.at("gpt2").is_null()) {
    const config::Json& g = m.at("gpt2");
    Gpt2Config cfg;
    cfg.n_layer = g.at("n_layer").get<std::int64_t>();
    cfg.n_head = g.at("n_head").get<std::int64_t>();
    cfg.n_embd = g.at("n_embd").get<std::int64_t>();
    cfg.n_positions = g.at("n_positions").get<std::int64_t>();
    cfg.vocab_size = g.at("vocab_size").get<std::int64_t>();
    cfg.padded_vocab_size = g.at("padded_vocab_size").get<std::int64_t>();
    cfg.layer_norm_epsilon = g.at("layer_norm_epsilon").get<float>();
    validate(cfg);
    mc.gpt2 = cfg;
  } else {
    fail("consolidate: checkpoint '{}' is of neither a GPT-2 nor a Llama-family model (its manifest has no \"gpt2\" or \"llama\" config)",
         rd.dir().string());
  }
  // The owned parameters (their names and shapes from the model; the manifest must agree), and
  // where a tied name points.
  const Model model = make_model(mc);
  std::map<std::string, std::string> owner;
  std::map<std::string, Shape> shapes;
  for (const auto& layer : model.layers) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) {
        owner[ps.name] = ps.tied_to;
      } else {
        owner[ps.name] = ps.name;
        shapes[ps.name] = ps.shape;
      }
    }
  }
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape] : shapes) {
    std::vector<float> v(static_cast<std::size_t>(shape.numel()));
    rd.read("master", name, 0, shape.numel(), v.data());
    values[name] = std::move(v);
  }
  const auto lookup = [&](const std::string& n) {
    const auto it = owner.find(n);
    if (it == owner.end()) fail("consolidate: the Hugging Face layout asks for '{}', which the model does not have", n);
    return Tensor(values.at(it->second).data(), DType::fp32, shapes.at(it->second));
  };
  if (mc.llama) {
    export_llama_weights(output, *mc.llama, lookup, dtype);
  } else {
    export_gpt2_safetensors(output, *mc.gpt2, lookup, dtype);
  }
  return tag;
}

}  // namespace dstrain
