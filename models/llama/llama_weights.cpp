#include "models/llama/llama_weights.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ops/atomic_file.h"
#include "ops/error.h"
#include "formats/hf_config_json.h"
#include "formats/hf_weights_file.h"
#include "models/llama/llama_layers.h"
#include "formats/safetensors.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

using HfTensor = LlamaHfTensor;

// The Hugging Face tensors of sparse layer `layer`'s feed-forward, from dstrain's fixed names
// (llama_weights.h): the router, each expert as the e-th block of the stacked expert weights, the
// shared experts (Qwen2-MoE's gated "shared_expert", DeepSeek's ungated "shared_experts").
void add_sparse_mlp(std::vector<HfTensor>& out, const LlamaConfig& cfg, std::int64_t layer) {
  const MoeConfig& m = cfg.moe;
  const std::string p = fmt::format("model.layers.{}.", layer);
  const std::int64_t C = cfg.n_embd, E = m.num_experts, I = m.expert_intermediate_size, S = m.shared_expert_intermediate_size;
  const bool mixtral = cfg.model_type == "mixtral";
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  out.push_back({moe + "gate.weight", p + "mlp.gate.weight", Shape{E, C}, 0, {E, C}});
  struct Proj {
    const char* ours;
    const char* mixtral;
    bool down;
  };
  constexpr Proj kProjs[] = {{"gate_proj", "w1", false}, {"up_proj", "w3", false}, {"down_proj", "w2", true}};
  for (std::int64_t e = 0; e < E; ++e) {
    for (const Proj& pr : kProjs) {
      const std::vector<std::int64_t> hf = pr.down ? std::vector<std::int64_t>{C, I} : std::vector<std::int64_t>{I, C};
      const std::string name = mixtral ? fmt::format("{}experts.{}.{}.weight", moe, e, pr.mixtral) : fmt::format("{}experts.{}.{}.weight", moe, e, pr.ours);
      out.push_back({name, fmt::format("{}mlp.experts.{}.weight", p, pr.ours), pr.down ? Shape{E, C, I} : Shape{E, I, C}, e * I * C, hf});
    }
  }
  if (S > 0) {
    const std::string shared = p + (m.shared_expert_gate ? "mlp.shared_expert." : "mlp.shared_experts.");
    for (const Proj& pr : kProjs) {
      const std::vector<std::int64_t> hf = pr.down ? std::vector<std::int64_t>{C, S} : std::vector<std::int64_t>{S, C};
      out.push_back({fmt::format("{}{}.weight", shared, pr.ours), fmt::format("{}mlp.shared_expert.{}.weight", p, pr.ours),
                     pr.down ? Shape{C, S} : Shape{S, C}, 0, hf});
    }
    if (m.shared_expert_gate) out.push_back({p + "mlp.shared_expert_gate.weight", p + "mlp.shared_expert_gate.weight", Shape{1, C}, 0, {1, C}});
  }
}

// "model.layers.N." -> N; -1 for a name outside the blocks.
std::int64_t layer_of(const std::string& name) {
  constexpr std::string_view prefix = "model.layers.";
  if (!name.starts_with(prefix)) return -1;
  const std::size_t dot = name.find('.', prefix.size());
  return dot == std::string::npos ? -1 : std::stoll(name.substr(prefix.size(), dot - prefix.size()));
}

}  // namespace

std::int64_t LlamaHfTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : hf) n *= d;
  return n;
}

bool llama_param_from_config(const LlamaConfig& cfg, const std::string& param) {
  const std::int64_t layer = layer_of(param);
  if (layer < 0) return false;
  const std::string p = fmt::format("model.layers.{}.", layer);
  if (cfg.moe.is_sparse_layer(layer) && param.starts_with(p + "mlp.")) return true;
  return cfg.qk_norm_whole && (param == p + "self_attn.q_norm.weight" || param == p + "self_attn.k_norm.weight");
}

std::vector<LlamaHfTensor> llama_hf_tensors(const LlamaConfig& cfg) {
  std::vector<HfTensor> out;
  const std::int64_t C = cfg.n_embd;
  const auto layers = make_llama_layers(cfg);
  for (std::size_t li = 0; li < layers.size(); ++li) {
    // The parameters a sparse layer's feed-forward and OLMoE's q/k norms have by their fixed names
    // (llama_weights.h) come from the config, whatever the block declares for them.
    std::vector<HfTensor> from_config;
    const std::int64_t layer = static_cast<std::int64_t>(li) - 1;  // layers[0] is the embedding
    if (layer >= 0 && layer < cfg.n_layer) {
      const std::string p = fmt::format("model.layers.{}.", layer);
      if (cfg.qk_norm_whole) {
        from_config.push_back({p + "self_attn.q_norm.weight", p + "self_attn.q_norm.weight", Shape{cfg.q_dim()}, 0, {cfg.q_dim()}});
        from_config.push_back({p + "self_attn.k_norm.weight", p + "self_attn.k_norm.weight", Shape{cfg.kv_dim()}, 0, {cfg.kv_dim()}});
      }
      if (cfg.moe.is_sparse_layer(layer)) add_sparse_mlp(from_config, cfg, layer);
    }
    for (const ParamSpec& ps : layers[li]->params()) {
      if (ps.tied() || llama_param_from_config(cfg, ps.name)) continue;
      std::vector<std::int64_t> shape;
      for (int i = 0; i < ps.shape.rank; ++i) shape.push_back(ps.shape[i]);
      const std::string& n = ps.name;
      if (n.ends_with("self_attn.qkv_proj.weight") || n.ends_with("self_attn.qkv_proj.bias")) {
        const bool weight = n.ends_with(".weight");
        const std::string base = n.substr(0, n.find("qkv_proj"));
        const std::string suffix = weight ? ".weight" : ".bias";
        const std::int64_t row = weight ? C : 1;
        std::int64_t r0 = 0;
        for (const auto& [part, rows] :
             {std::pair<const char*, std::int64_t>{"q_proj", cfg.q_dim()}, {"k_proj", cfg.kv_dim()}, {"v_proj", cfg.kv_dim()}}) {
          std::vector<std::int64_t> hf = weight ? std::vector<std::int64_t>{rows, C} : std::vector<std::int64_t>{rows};
          out.push_back({base + part + suffix, n, ps.shape, r0 * row, hf});
          r0 += rows;
        }
      } else if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
        out.push_back({n, n, ps.shape, 0, {cfg.vocab_size, C}});
      } else {
        out.push_back({n, n, ps.shape, 0, shape});
      }
    }
    out.insert(out.end(), from_config.begin(), from_config.end());
  }
  return out;
}

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

Tensor checked_param(const LlamaParamLookup& param, const HfTensor& t) {
  Tensor p = param(t.ours);
  if (!(p.shape == t.ours_shape) || !is_floating(p.dtype) || !p.device.is_cpu()) {
    fail("Llama weights: parameter '{}' is {} but a cpu fp32/fp16/bf16 tensor of shape {} is expected", t.ours, p.str(), t.ours_shape.str());
  }
  return p;
}

// Elements [offset, offset + n) of p, as a flat tensor.
Tensor range_of(const Tensor& p, std::int64_t offset, std::int64_t n) {
  return Tensor(static_cast<std::byte*>(p.data) + static_cast<std::size_t>(offset) * dtype_size(p.dtype), p.dtype, Shape{n}, p.device);
}

// The safetensors files of a checkpoint and which holds each tensor.
struct Checkpoint {
  std::string where;  // for messages
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsEntry*>> tensors;
};

Checkpoint open_checkpoint(const fs::path& path) {
  Checkpoint ck;
  const fs::path p = hf_weights_file(path, "Llama weights:");
  ck.where = p.string();
  auto add_file = [&](const fs::path& f, const std::set<std::string>* only) {
    ck.files.push_back(std::make_unique<SafetensorsFile>(f));
    const SafetensorsFile* sf = ck.files.back().get();
    for (const auto& e : sf->entries()) {
      if (only != nullptr && only->count(e.name) == 0) continue;
      if (!ck.tensors.emplace(e.name, std::make_pair(sf, &e)).second) {
        fail("Llama weights '{}': tensor '{}' is stored twice (again in '{}'); a checkpoint holds each tensor once", ck.where, e.name, f.string());
      }
    }
  };
  if (p.string().ends_with(".json")) {
    const nlohmann::json j = parse_hf_config_json(read_model_config_file(p), p.string(), "a Hugging Face model.safetensors.index.json");
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail("Llama weights '{}': no \"weight_map\" object; a sharded checkpoint's index maps each tensor to its shard file", p.string());
    }
    std::map<std::string, std::set<std::string>> by_file;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail("Llama weights '{}': weight_map[\"{}\"] must be a file name, got {}", p.string(), name, file.dump());
      const std::string fname = file.get<std::string>();
      if (fname.find('/') != std::string::npos || fname == "..") {
        fail("Llama weights '{}': weight_map[\"{}\"] = \"{}\" must name a file in the index's folder", p.string(), name, fname);
      }
      by_file[fname].insert(name);
    }
    for (const auto& [fname, names] : by_file) {
      add_file(p.parent_path() / fname, &names);
      for (const std::string& n : names) {
        if (ck.tensors.count(n) == 0) fail("Llama weights '{}': the index puts '{}' in '{}', which does not hold it", p.string(), n, fname);
      }
    }
  } else {
    add_file(p, nullptr);
  }
  return ck;
}

// DeepSeek-V3's router bias (noaux_tc routing): dstrain's router has none, and dropping it would
// route differently, so it is refused by name rather than ignored.
void refuse_score_correction_bias(const Checkpoint& ck) {
  for (const auto& [name, where] : ck.tensors) {
    if (name.ends_with("mlp.gate.e_score_correction_bias")) {
      fail(
          "Llama weights '{}': tensor '{}' (in '{}') is DeepSeek-V3's score-correction bias of the router (topk_method \"noaux_tc\"); dstrain's "
          "router has no such bias and would route these experts differently; convert the model without it only if it was trained without",
          ck.where, name, where.first->path().string());
    }
  }
}

bool ignorable(std::string_view n, const LlamaConfig& cfg) {
  if (n.ends_with("rotary_emb.inv_freq")) return true;
  return cfg.tie_word_embeddings && n == "lm_head.weight";
}

}  // namespace

void import_llama_weights(const fs::path& path, const LlamaConfig& cfg, const LlamaParamLookup& param) {
  const Checkpoint ck = open_checkpoint(path);
  refuse_score_correction_bias(ck);
  const auto expected = llama_hf_tensors(cfg);
  std::set<std::string> known;
  for (const auto& t : expected) known.insert(t.name);
  for (const auto& [name, where] : ck.tensors) {
    if (known.count(name) != 0 || ignorable(name, cfg)) continue;
    fail(
        "Llama weights '{}': tensor '{}' (in '{}') is not part of this {} model ({} layers, hidden {}, q/k/v bias {}, q/k norm {}, tied "
        "embeddings {}{}); check that the model config matches the weights",
        ck.where, name, where.first->path().string(), cfg.model_type, cfg.n_layer, cfg.n_embd, cfg.qkv_bias, cfg.qk_norm, cfg.tie_word_embeddings,
        cfg.moe.active() ? ", " + describe(cfg.moe) : std::string());
  }
  std::set<std::string> zeroed;
  for (const auto& t : expected) {
    const auto it = ck.tensors.find(t.name);
    if (it == ck.tensors.end()) {
      fail("Llama weights '{}': tensor '{}' is missing (expected shape {}); the checkpoint does not match the config ({} layers{})", ck.where, t.name,
           shape_str(t.hf), cfg.n_layer, t.name == "lm_head.weight" ? ", untied embeddings: tie_word_embeddings is false" : "");
    }
    const auto& [file, entry] = it->second;
    if (entry->shape != t.hf) {
      fail(
          "Llama weights '{}': tensor '{}' has shape {} but {} is expected for this config (hidden {}, heads {}, KV heads {}, head_dim {}, MLP "
          "{}, vocab {}{}); check that the model config matches the weights",
          file->path().string(), t.name, shape_str(entry->shape), shape_str(t.hf), cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim,
          cfg.intermediate_size, cfg.vocab_size,
          cfg.moe.active() ? fmt::format(", {} experts of {}, shared width {}", cfg.moe.num_experts, cfg.moe.expert_intermediate_size,
                                         cfg.moe.shared_expert_intermediate_size)
                           : std::string());
    }
    const Tensor p = checked_param(param, t);
    if (zeroed.insert(t.ours).second) std::memset(p.data, 0, p.nbytes());  // padded vocabulary rows
    const std::vector<float> v = file->read_fp32(*entry);
    convert(v.data(), DType::fp32, range_of(p, t.offset, t.numel()).data, p.dtype, v.size());
  }
}

void export_llama_weights(const fs::path& file, const LlamaConfig& cfg, const LlamaParamLookup& param, DType file_dtype,
                          std::size_t max_shard_bytes) {
  (void)safetensors_dtype_name(file_dtype);  // Error for non-floating dtypes before any work
  if (max_shard_bytes == 0) fail("Llama weights: the shard size limit must be positive");
  const auto tensors = llama_hf_tensors(cfg);
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsWriteItem> items;
  storage.reserve(tensors.size());
  std::size_t total = 0;
  for (const auto& t : tensors) {
    const Tensor p = checked_param(param, t);
    const Tensor src = range_of(p, t.offset, t.numel());
    storage.emplace_back(static_cast<std::size_t>(t.numel()) * dtype_size(file_dtype));
    if (p.dtype == file_dtype) {
      std::memcpy(storage.back().data(), src.data, storage.back().size());
    } else {
      std::vector<float> f(static_cast<std::size_t>(t.numel()));
      convert(src.data, p.dtype, f.data(), DType::fp32, f.size());
      convert(f.data(), DType::fp32, storage.back().data(), file_dtype, f.size());
    }
    total += storage.back().size();
    items.push_back({t.name, Tensor(storage.back().data(), file_dtype, Shape{t.numel()}), t.hf});
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  if (total <= max_shard_bytes) {
    write_safetensors(file, items, meta);
    return;
  }
  // Shards in tensor order, a new one when the next tensor would overflow the limit.
  std::vector<std::vector<SafetensorsWriteItem>> shards(1);
  std::size_t in_shard = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::size_t bytes = storage[i].size();
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(items[i]);
    in_shard += bytes;
  }
  std::string stem = file.filename().string();
  if (stem.ends_with(".safetensors")) stem.resize(stem.size() - std::string_view(".safetensors").size());
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string name = fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, s + 1, shards.size());
    write_safetensors(file.parent_path() / name, shards[s], meta);
    for (const auto& it : shards[s]) map[it.name] = name;
  }
  index["weight_map"] = map;
  fs::path index_path = file;
  index_path += ".index.json";
  write_file_atomically(index_path, index.dump(2) + "\n");
}

}  // namespace dstrain
