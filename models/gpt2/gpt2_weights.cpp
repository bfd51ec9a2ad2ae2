#include "models/gpt2/gpt2_weights.h"

#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_model.h"
#include "formats/hf_weights_file.h"
#include "formats/safetensors.h"
#include "formats/torch_state_dict.h"

namespace dstrain {
namespace {

// One tensor of the HF file: its name, our shape, and the HF shape.
struct HfTensor {
  std::string name;
  Shape ours;
  std::vector<std::int64_t> hf;
  bool transpose = false;       // Conv1D weight: HF (in, out) = ours (out, in) transposed
  std::int64_t file_rows = -1;  // wte: the file holds only the first V rows
};

std::vector<HfTensor> hf_tensors(const Gpt2Config& cfg) {
  std::vector<HfTensor> out;
  for (const auto& layer : make_gpt2_layers(cfg)) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      HfTensor t{ps.name, ps.shape, {}, ps.hf_transposed, -1};
      for (int i = 0; i < ps.shape.rank; ++i) t.hf.push_back(ps.shape[i]);
      if (t.transpose) std::swap(t.hf[0], t.hf[1]);
      if (ps.name == "wte.weight") {
        t.file_rows = cfg.vocab_size;
        t.hf[0] = cfg.vocab_size;
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::string shape_str(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// "h.N.attn.bias" / "h.N.attn.masked_bias" (causal-mask buffers of old transformers versions).
bool is_mask_buffer(std::string_view n) { return n.starts_with("h.") && (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")); }

Tensor checked_param(const Gpt2ParamLookup& param, const HfTensor& t) {
  Tensor p = param(t.name);
  if (!(p.shape == t.ours) || !is_floating(p.dtype) || !p.device.is_cpu()) {
    fail("GPT-2 weights: parameter '{}' is {} but a cpu fp32/fp16/bf16 tensor of shape {} is expected", t.name, p.str(), t.ours.str());
  }
  return p;
}

}  // namespace

namespace {

// A weights file as the importer reads it: its tensors' names and shapes, and their fp32 values.
struct WeightSource {
  std::string file;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::function<std::vector<float>(const std::string& name)> read;
};

void import_gpt2(const WeightSource& f, const Gpt2Config& cfg, const Gpt2ParamLookup& param) {
  const std::string& fname = f.file;
  const auto expected = hf_tensors(cfg);
  std::set<std::string> known;
  for (const auto& t : expected) known.insert(t.name);

  // Every tensor in the file must be one we know or one we may ignore.
  for (const auto& [name, shape] : f.shapes) {
    std::string_view n = name;
    if (n.starts_with("transformer.")) n.remove_prefix(std::string_view("transformer.").size());
    if (known.count(std::string(n)) != 0 || is_mask_buffer(n) || n == "lm_head.weight") continue;
    fail(
        "GPT-2 weights '{}': tensor '{}' is not part of a GPT-2 with {} layers (n_layer = {}, n_embd = {}); check that the model config matches "
        "the weights",
        fname, name, cfg.n_layer, cfg.n_layer, cfg.n_embd);
  }

  for (const auto& t : expected) {
    auto e = f.shapes.find(t.name);
    if (e == f.shapes.end()) e = f.shapes.find("transformer." + t.name);
    if (e == f.shapes.end())
      fail("GPT-2 weights '{}': tensor '{}' is missing (expected shape {}); the file is not a complete GPT-2 checkpoint", fname, t.name,
           shape_str(t.hf));
    if (e->second != t.hf) {
      fail(
          "GPT-2 weights '{}': tensor '{}' has shape {} but {} is expected for this config (n_embd = {}, vocab_size = {}, n_positions = {}); "
          "check that the model config matches the weights",
          fname, e->first, shape_str(e->second), shape_str(t.hf), cfg.n_embd, cfg.vocab_size, cfg.n_positions);
    }
    const Tensor p = checked_param(param, t);
    std::vector<float> v = f.read(e->first);  // HF layout
    std::vector<float> ours(static_cast<std::size_t>(t.ours.numel()), 0.0f);
    if (t.transpose) {
      const std::int64_t in = t.hf[0], out = t.hf[1];  // file (in, out) -> ours (out, in)
      for (std::int64_t i = 0; i < in; ++i)
        for (std::int64_t o = 0; o < out; ++o) ours[static_cast<std::size_t>(o * in + i)] = v[static_cast<std::size_t>(i * out + o)];
    } else {
      std::copy(v.begin(), v.end(), ours.begin());  // wte: rows [V, Vp) stay zero
    }
    convert(ours.data(), DType::fp32, p.data, p.dtype, ours.size());
  }
}

}  // namespace

void import_gpt2_safetensors(const std::filesystem::path& file, const Gpt2Config& cfg, const Gpt2ParamLookup& param) {
  const SafetensorsFile f(file);
  WeightSource src;
  src.file = file.string();
  for (const auto& e : f.entries()) src.shapes[e.name] = e.shape;
  src.read = [&f](const std::string& name) { return f.read_fp32(*f.find(name)); };
  import_gpt2(src, cfg, param);
}

void import_gpt2_torch(const std::filesystem::path& file, const Gpt2Config& cfg, const Gpt2ParamLookup& param) {
  const TorchStateDict f(file);
  // DeepSpeed's mp_rank_00_model_states.pt holds the state dict under "module" (beside its own
  // scalars and config); a model wrapped in DistributedDataParallel names its tensors "module.*".
  std::string prefix;
  for (const auto& [name, t] : f.tensors())
    if (name.starts_with("module.")) prefix = "module.";
  WeightSource src;
  src.file = file.string();
  std::map<std::string, std::string> full;  // the importer's name -> the file's
  for (const auto& [name, t] : f.tensors()) {
    if (!prefix.empty() && !name.starts_with(prefix)) continue;  // DeepSpeed's other tensors (none in a model-states file)
    const std::string n = name.substr(prefix.size());
    src.shapes[n] = t.shape;
    full[n] = name;
  }
  src.read = [&f, &full](const std::string& name) { return f.read_fp32(full.at(name)); };
  import_gpt2(src, cfg, param);
}

void import_gpt2_weights(const std::filesystem::path& path, const Gpt2Config& cfg, const Gpt2ParamLookup& param) {
  const std::filesystem::path file = hf_weights_file(path, "GPT-2 weights:");
  if (TorchStateDict::looks_like(file)) {
    import_gpt2_torch(file, cfg, param);
  } else {
    import_gpt2_safetensors(file, cfg, param);
  }
}

void export_gpt2_safetensors(const std::filesystem::path& file, const Gpt2Config& cfg, const Gpt2ParamLookup& param, DType file_dtype) {
  (void)safetensors_dtype_name(file_dtype);  // Error for non-floating dtypes before any work
  const auto tensors = hf_tensors(cfg);
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsWriteItem> items;
  storage.reserve(tensors.size());
  for (const auto& t : tensors) {
    const Tensor p = checked_param(param, t);
    std::vector<float> ours(static_cast<std::size_t>(p.numel()));
    convert(p.data, p.dtype, ours.data(), DType::fp32, ours.size());
    std::int64_t n = 1;
    for (std::int64_t d : t.hf) n *= d;
    std::vector<float> hf(static_cast<std::size_t>(n));
    if (t.transpose) {
      const std::int64_t in = t.hf[0], out = t.hf[1];
      for (std::int64_t i = 0; i < in; ++i)
        for (std::int64_t o = 0; o < out; ++o) hf[static_cast<std::size_t>(i * out + o)] = ours[static_cast<std::size_t>(o * in + i)];
    } else {
      std::copy(ours.begin(), ours.begin() + n, hf.begin());  // wte: the first V rows
    }
    storage.emplace_back(static_cast<std::size_t>(n) * dtype_size(file_dtype));
    convert(hf.data(), DType::fp32, storage.back().data(), file_dtype, hf.size());
    items.push_back({t.name, Tensor(storage.back().data(), file_dtype, Shape{n}), t.hf});
  }
  write_safetensors(file, items, {{"format", "pt"}});
}

void load_gpt2_weights(Gpt2Model& model, const std::filesystem::path& file) {
  import_gpt2_safetensors(file, model.config(), [&](const std::string& n) { return model.param(n); });
}

void save_gpt2_weights(const Gpt2Model& model, const std::filesystem::path& file, DType file_dtype) {
  export_gpt2_safetensors(
      file, model.config(), [&](const std::string& n) { return model.param(n); }, file_dtype);
}

}  // namespace dstrain
