#include "models/llama/llama_family.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/llama/llama_layers.h"
#include "models/llama/llama_weights.h"

namespace dstrain {
namespace {

class LlamaFamily final : public ModelFamily {
 public:
  std::string name() const override { return "llama"; }
  std::string spec_forms() const override {
    return "llama:L<n>-C<c>-H<h>[-KV<k>][-I<i>][-D<d>][-V<v>][-T<t>][-tied], or a config.json of LlamaForCausalLM, MistralForCausalLM, "
           "Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM or OlmoeForCausalLM";
  }
  std::shared_ptr<const Architecture> from_spec(std::string_view spec) const override {
    return std::make_shared<LlamaArchitecture>(llama_config_from_spec(spec));
  }
  bool reads_hf_config(std::string_view json_text) const override { return is_llama_family_json(json_text); }
  std::string hf_config_forms() const override { return llama_family_hf_forms(); }
  std::shared_ptr<const Architecture> from_config_json(std::string_view json_text, std::string_view source) const override {
    return std::make_shared<LlamaArchitecture>(llama_config_from_hf_json(json_text, source));
  }
};

// "moe:" descriptors: LlamaArchitectures with experts (llama_config.h). Their architectures belong to
// the llama family (family() is llama_family()), which reads the mixtral / qwen3_moe config.json
// they write: a checkpoint names the family "llama" and rebuilds through it. This family reads no
// config.json of its own.
class MoeFamily final : public ModelFamily {
 public:
  std::string name() const override { return "moe"; }
  std::string spec_forms() const override { return moe_spec_forms(); }
  std::shared_ptr<const Architecture> from_spec(std::string_view spec) const override {
    return std::make_shared<LlamaArchitecture>(moe_config_from_spec(spec));
  }
  bool reads_hf_config(std::string_view) const override { return false; }
  std::shared_ptr<const Architecture> from_config_json(std::string_view json_text, std::string_view source) const override {
    return std::make_shared<LlamaArchitecture>(llama_config_from_hf_json(json_text, source));
  }
};

// The stored rows beyond the real vocabulary (embedding, and the LM head when untied).
double padded_rows_params(const LlamaConfig& c) {
  const double pad_rows = static_cast<double>(c.padded_vocab_size - c.vocab_size);
  return pad_rows * static_cast<double>(c.n_embd) * (c.tie_word_embeddings ? 1.0 : 2.0);
}

}  // namespace

LlamaArchitecture::LlamaArchitecture(const LlamaConfig& cfg) : cfg_(cfg) { validate(cfg_); }

const ModelFamily& LlamaArchitecture::family() const { return llama_family(); }

// Every expert counted (llama_parameter_count).
double LlamaArchitecture::parameter_count() const { return llama_parameter_count(cfg_, false); }

double LlamaArchitecture::stored_parameter_count() const { return parameter_count() + padded_rows_params(cfg_); }

std::string LlamaArchitecture::describe() const { return dstrain::describe(cfg_); }

std::vector<std::unique_ptr<Layer>> LlamaArchitecture::make_layers() const { return make_llama_layers(cfg_); }

void LlamaArchitecture::check_tensor_parallel(int ranks) const {
  if (ranks < 1) fail("tensor_parallel: {} ranks; give 1 or more", ranks);
  if (ranks > cfg_.intermediate_size) {
    fail("tensor_parallel.autotp_size {} is more than intermediate_size {}: every rank must hold some MLP features; use at most {} ranks", ranks,
         cfg_.intermediate_size, cfg_.intermediate_size);
  }
  // AutoTP's rule: the key/value heads stay whole; with more ranks than them the surplus ranks hold
  // no attention weights and add zeros (their o_proj bias gradient is formed as every rank's).
  // A mixture of experts is allowed: its layer keeps the router and the experts replicated across
  // the tensor-parallel ranks (expert parallelism cuts them), the attention is cut as usual.
  // OLMoE's q/k norms over the whole projections are cut with their heads, the rows' statistics
  // summed over the group (llama_block.cpp).
}

void LlamaArchitecture::check_sequence_parallel(int sp_ranks, int tp_ranks) const {
  check_tensor_parallel(tp_ranks);
  if (sp_ranks < 1) fail("sequence_parallel_size {}: give 1 or more", sp_ranks);
  // Ulysses: every tensor-parallel rank's query and key/value heads split evenly across the
  // sequence-parallel ranks (DeepSpeed asserts the head counts divide by it).
  for (int r = 0; r < tp_ranks; ++r) {
    const std::int64_t kv = units_of_rank(cfg_.n_kv_head, tp_ranks, r);
    const std::int64_t q = kv * (cfg_.n_head / cfg_.n_kv_head);
    if (kv % sp_ranks != 0 || q % sp_ranks != 0) {
      fail("sequence_parallel_size {}: {} key/value heads and {} query heads{} do not divide by it (DeepSpeed-Ulysses splits the heads across "
           "the sequence-parallel ranks); use a sequence_parallel_size that divides num_key_value_heads",
           sp_ranks, kv, q, tp_ranks > 1 ? fmt::format(" on tensor-parallel rank {} of {}", r, tp_ranks) : std::string());
    }
  }
}

std::vector<std::unique_ptr<Layer>> LlamaArchitecture::make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp) const {
  check_sequence_parallel(sp.ranks, tp.ranks);
  return make_llama_layers(cfg_, tp, sp);
}

void LlamaArchitecture::check_expert_parallel(int ranks) const {
  if (ranks < 1) fail("expert_parallel.autoep_size {}: give 1 or more", ranks);
  if (ranks == 1) return;
  if (!cfg_.moe.active() || cfg_.moe.sparse_layers(cfg_.n_layer) == 0) {
    fail("expert_parallel.autoep_size {}: the model ({}) has no experts to spread across expert-parallel ranks (no sparse mixture-of-experts "
         "layer); set expert_parallel.autoep_size to 1 (or remove the section)",
         ranks, cfg_.model_type);
  }
  // Each rank holds the same number of whole experts (DeepSpeed: num_experts % ep_size == 0).
  check_expert_split(cfg_.moe.num_experts, ranks, cfg_.model_type == "mixtral" ? "num_local_experts" : "num_experts");
}

std::vector<std::unique_ptr<Layer>> LlamaArchitecture::make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep) const {
  check_sequence_parallel(sp.ranks, tp.ranks);
  check_expert_parallel(ep.ranks);
  if (ep.rank < 0 || ep.rank >= ep.ranks) fail("expert-parallel rank {} of {} does not exist", ep.rank, ep.ranks);
  return make_llama_layers(cfg_, tp, sp, ep);
}

std::vector<std::unique_ptr<Layer>> LlamaArchitecture::make_tensor_parallel_layers(TensorParallelRank tp) const {
  check_tensor_parallel(tp.ranks);
  return make_llama_layers(cfg_, tp);
}

std::shared_ptr<const Architecture> LlamaArchitecture::with_moe_config(const MoeConfig& moe) const {
  if (!cfg_.moe.active()) return Architecture::with_moe_config(moe);
  LlamaConfig c = cfg_;
  c.moe = moe;
  return std::make_shared<LlamaArchitecture>(c);  // validates
}

std::shared_ptr<const Architecture> LlamaArchitecture::with_n_layer(std::int64_t n_layer) const {
  // Every block has the same parameters and cut; the sliding window's per-layer choice
  // (layer_types, max_window_layers) changes no parameter. A mixture of experts keeps its settings
  // when its layers are all sparse (the copy's are too: one sparse-layer pattern, every layer); one
  // that mixes dense and sparse layers (first_k_dense_replace, mlp_only_layers,
  // decoder_sparse_step) has no copy of alike blocks, and the estimate builds every layer.
  LlamaConfig c = cfg_;
  if (c.moe.active()) {
    const std::int64_t sparse = c.moe.sparse_layers(c.n_layer);
    if (sparse != c.n_layer) return nullptr;
    c.moe.first_k_dense = 0;
    c.moe.decoder_sparse_step = 1;
    c.moe.mlp_only_layers.clear();
  }
  c.n_layer = n_layer;
  if (n_layer > 0 && c.layer_types.size() > static_cast<std::size_t>(n_layer)) c.layer_types.resize(static_cast<std::size_t>(n_layer));
  return std::make_shared<LlamaArchitecture>(c);
}

void LlamaArchitecture::check_sequence(std::int64_t T, const Device& device) const { llama_check_sequence(cfg_, T, device.is_cuda()); }

double LlamaArchitecture::flops_per_token(std::int64_t T) const {
  // 6 per ACTIVE stored parameter: a token goes through the router, its top_k experts and the
  // shared experts of each sparse layer, not all E experts (equal to every parameter when dense).
  const double active = llama_parameter_count(cfg_, true) + padded_rows_params(cfg_);
  return 6.0 * active + 6.0 * static_cast<double>(cfg_.n_layer) * static_cast<double>(cfg_.q_dim()) * static_cast<double>(T);
}

ModuleFlops LlamaArchitecture::forward_flops(std::int64_t B, std::int64_t T) const { return llama_forward_flops(cfg_, B, T); }

std::vector<HfParamName> LlamaArchitecture::hf_param_names() const {
  std::vector<HfParamName> out;
  const std::vector<HfParamName> from_layers = hf_param_names_of(make_llama_layers(cfg_), cfg_.vocab_size);
  // The tensors of the sparse layers' feed-forward and OLMoE's q/k norms, from the config (the
  // layers' names for them are fixed, llama_weights.h), grouped by layer: an expert is a block of
  // the stacked expert weights (HfParamName::param names the stack; no field of HfParamName says
  // which block, as none says which row block q_proj is of qkv_proj). The router and the experts are
  // replicated across tensor-parallel ranks; a whole parameter keeps the cut its layer declares
  // (OLMoE's q/k norms: rows, with the heads; their gradients are the pieces', not summed).
  std::map<std::string, const HfParamName*> declared;
  for (const HfParamName& p : from_layers) declared[p.param] = &p;
  std::map<std::string, std::vector<HfParamName>> by_layer;  // "model.layers.N." -> its tensors
  if (cfg_.moe.active() || cfg_.qk_norm_whole) {
    for (const LlamaHfTensor& t : llama_hf_tensors(cfg_)) {
      if (!llama_param_from_config(cfg_, t.ours)) continue;
      HfParamName p;
      p.name = t.name;
      p.param = t.ours;
      p.shape = t.hf.size() == 2 ? Shape{t.hf[0], t.hf[1]} : Shape{t.hf[0]};
      p.module = t.hf.size() == 2 ? HfModuleKind::linear : HfModuleKind::norm;
      const auto it = declared.find(t.ours);
      const bool whole = t.numel() == t.ours_shape.numel();
      if (whole && it != declared.end() && it->second->shape == p.shape) p.split = it->second->split;
      p.grad_summed = p.split.is_replicated() && (p.name.ends_with("self_attn.q_norm.weight") || p.name.ends_with("self_attn.k_norm.weight"));
      by_layer[t.ours.substr(0, t.ours.find('.', std::string("model.layers.").size()) + 1)].push_back(std::move(p));
    }
  }
  auto layer_prefix = [](const std::string& name) -> std::string {
    if (!name.starts_with("model.layers.")) return "";
    return name.substr(0, name.find('.', std::string("model.layers.").size()) + 1);
  };
  for (std::size_t pi = 0; pi < from_layers.size(); ++pi) {
    HfParamName p = from_layers[pi];
    const std::string prefix = layer_prefix(p.param);
    const bool last_of_layer = !prefix.empty() && (pi + 1 == from_layers.size() || layer_prefix(from_layers[pi + 1].param) != prefix);
    auto flush = [&] {
      if (!last_of_layer) return;
      auto it = by_layer.find(prefix);
      if (it == by_layer.end()) return;
      for (HfParamName& q : it->second) out.push_back(std::move(q));
      by_layer.erase(it);
    };
    if (llama_param_from_config(cfg_, p.param)) {
      flush();
      continue;
    }
    const auto at = p.name.find("self_attn.qkv_proj.");
    if (at == std::string::npos) {
      p.grad_summed = p.name.ends_with("self_attn.q_norm.weight") || p.name.ends_with("self_attn.k_norm.weight");
      out.push_back(std::move(p));
      flush();
      continue;
    }
    // q_proj, k_proj, v_proj: the row blocks of qkv_proj (weight and bias), in order.
    const std::string base = p.name.substr(0, at + std::string("self_attn.").size());
    const std::string suffix = p.name.substr(p.name.rfind('.'));
    const char* parts[] = {"q_proj", "k_proj", "v_proj"};
    for (std::size_t i = 0; i < 3; ++i) {
      HfParamName block = p;
      block.name = base + parts[i] + suffix;
      const ParamSplit::Part part = p.split.parts.at(i);
      block.split = ParamSplit::rows({part});
      block.shape = p.shape.rank == 2 ? Shape{part.size, p.shape[1]} : Shape{part.size};
      out.push_back(std::move(block));
    }
    flush();
  }
  return out;
}

std::string LlamaArchitecture::config_json() const { return llama_hf_config_json(cfg_); }

void LlamaArchitecture::import_weights(const std::filesystem::path& path, const ParamLookup& param) const { import_llama_weights(path, cfg_, param); }

void LlamaArchitecture::export_weights(const std::filesystem::path& path, const ParamLookup& param, DType file_dtype) const {
  export_llama_weights(path, cfg_, param, file_dtype);
}

namespace {

// A sparse layer's feed-forward over BT tokens (Hugging Face's *SparseMoeBlock): the router
// (gate), the experts as one ModuleList node holding all E experts' parameters but the work of the
// ACTIVE ones only — each token through top_k experts (BT·top_k expert-token pairs, however the
// router spreads them) — the shared experts (and Qwen2-MoE's shared_expert_gate), and the block's
// own work: the routing scores (1 per score), the top-k weights applied and summed (2 per element
// of each chosen expert's output), the shared gate's sigmoid and scaling.
ModuleFlops sparse_moe_flops(const LlamaConfig& c, std::int64_t BT) {
  const MoeConfig& m = c.moe;
  const std::string cls = llama_class_prefix(c);
  const std::int64_t C = c.n_embd, E = m.num_experts, I = m.expert_intermediate_size, S = m.shared_expert_intermediate_size, k = m.top_k;
  const std::int64_t pairs = BT * k;
  const std::int64_t expert_macs = pairs * 3 * C * I;
  ModuleFlops experts = flops_leaf("experts", "ModuleList", E * 3 * C * I, expert_macs, 2 * expert_macs + 2 * pairs * I);
  experts.note = fmt::format("{} experts; each token through {} of them", E, k);
  std::vector<ModuleFlops> children{flops_linear("gate", BT, C, E, false), std::move(experts)};
  std::int64_t own = BT * E + 2 * pairs * C;
  if (S > 0) {
    children.push_back(flops_parent(m.shared_expert_gate ? "shared_expert" : "shared_experts", cls + "MLP",
                                    {flops_linear("gate_proj", BT, C, S, false), flops_linear("up_proj", BT, C, S, false),
                                     flops_linear("down_proj", BT, S, C, false), flops_leaf("act_fn", "SiLU", 0, 0, BT * S)},
                                    0, BT * S));
    own += BT * C;  // adding the shared output
    if (m.shared_expert_gate) {
      children.push_back(flops_linear("shared_expert_gate", BT, C, 1, false));
      own += BT + BT * C;  // sigmoid, scaling
    }
  }
  return flops_parent(c.model_type == "mixtral" ? "block_sparse_moe" : "mlp", cls + "SparseMoeBlock", std::move(children), 0, own);
}

}  // namespace

ModuleFlops llama_forward_flops(const LlamaConfig& c, std::int64_t B, std::int64_t T) {
  const std::int64_t BT = B * T, C = c.n_embd, I = c.intermediate_size, D = c.head_dim, Vp = c.padded_vocab_size;
  const std::string cls = llama_class_prefix(c);
  std::vector<ModuleFlops> layers;
  layers.reserve(static_cast<std::size_t>(c.n_layer));
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    std::vector<ModuleFlops> attn_children{flops_linear("q_proj", BT, C, c.q_dim(), c.qkv_bias),
                                           flops_linear("k_proj", BT, C, c.kv_dim(), c.qkv_bias),
                                           flops_linear("v_proj", BT, C, c.kv_dim(), c.qkv_bias), flops_linear("o_proj", BT, c.q_dim(), C, c.o_bias)};
    if (c.qk_norm_whole) {  // OLMoE: over the whole projections
      attn_children.push_back(flops_rmsnorm("q_norm", cls + "RMSNorm", BT, c.q_dim()));
      attn_children.push_back(flops_rmsnorm("k_norm", cls + "RMSNorm", BT, c.kv_dim()));
    } else if (c.qk_norm) {
      attn_children.push_back(flops_rmsnorm("q_norm", cls + "RMSNorm", BT * c.n_head, D));
      attn_children.push_back(flops_rmsnorm("k_norm", cls + "RMSNorm", BT * c.n_kv_head, D));
    }
    // QKᵀ and AV: B·H·T·T·D multiply-accumulates each; softmax one FLOP per score; RoPE on q and k.
    const std::int64_t attn_macs = 2 * B * c.n_head * T * T * D;
    ModuleFlops attn = flops_parent("self_attn", cls + "Attention", std::move(attn_children), attn_macs,
                                    2 * attn_macs + B * c.n_head * T * T + 3 * BT * (c.q_dim() + c.kv_dim()));
    ModuleFlops mlp = c.moe.is_sparse_layer(l) ? sparse_moe_flops(c, BT)
                                               : flops_parent("mlp", cls + "MLP",
                                                              {flops_linear("gate_proj", BT, C, I, c.mlp_bias), flops_linear("up_proj", BT, C, I, c.mlp_bias),
                                                               flops_linear("down_proj", BT, I, C, c.mlp_bias), flops_leaf("act_fn", "SiLU", 0, 0, BT * I)},
                                                              0, BT * I);  // the gate-times-up product
    layers.push_back(flops_parent(std::to_string(l), cls + "DecoderLayer",
                                  {std::move(attn), std::move(mlp), flops_rmsnorm("input_layernorm", cls + "RMSNorm", BT, C),
                                   flops_rmsnorm("post_attention_layernorm", cls + "RMSNorm", BT, C)},
                                  0, 2 * BT * C));  // the two residual adds
  }
  ModuleFlops model = flops_parent("model", cls + "Model",
                                   {flops_leaf("embed_tokens", "Embedding", Vp * C, 0, 0), flops_parent("layers", "ModuleList", std::move(layers)),
                                    flops_rmsnorm("norm", cls + "RMSNorm", BT, C)});
  ModuleFlops lm_head = flops_leaf("lm_head", "Linear", c.tie_word_embeddings ? 0 : Vp * C, BT * C * Vp, 2 * BT * C * Vp);
  if (c.tie_word_embeddings) lm_head.note = "weight tied to embed_tokens";
  return flops_parent("", cls + "ForCausalLM", {std::move(model), std::move(lm_head)});
}

std::shared_ptr<const ModelFamily> llama_family_ptr() {
  static const std::shared_ptr<const ModelFamily> family = std::make_shared<LlamaFamily>();
  return family;
}

const ModelFamily& llama_family() { return *llama_family_ptr(); }

std::shared_ptr<const ModelFamily> moe_family_ptr() {
  static const std::shared_ptr<const ModelFamily> family = std::make_shared<MoeFamily>();
  return family;
}

Model make_llama_model(const LlamaConfig& cfg) { return make_model(std::make_shared<LlamaArchitecture>(cfg)); }

Model make_llama_model(std::string_view spec) { return make_model(llama_family().from_spec(spec)); }

const LlamaConfig* llama_config_of(const Architecture& architecture) {
  const auto* a = dynamic_cast<const LlamaArchitecture*>(&architecture);
  return a != nullptr ? &a->config() : nullptr;
}

}  // namespace dstrain
