#include "models/llama/llama_config.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/error.h"
#include "ops/kernels/attention.h"
#include "models/vocab.h"
#include "formats/hf_config_json.h"

namespace dstrain {
namespace {

constexpr const char* kSpecForms =
    "llama:L<n>-C<c>-H<h>[-KV<k>][-I<i>][-D<d>][-V<v>][-T<t>][-tied] (e.g. llama:L4-C256-H4-KV2-I688), or the path of a Hugging Face "
    "config.json of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, "
    "Qwen3MoeForCausalLM or OlmoeForCausalLM";

constexpr const char* kMoeSpecForms =
    "moe:L<n>-C<c>-H<h>-E<experts>-K<top_k>[-KV<k>][-I<expert width>][-D<d>][-V<v>][-T<t>][-S<shared width>][-tied][-sigmoid]"
    "[-G<n_group>-TG<topk_group>][-RS<routed_scaling_factor>][-norm|-nonorm][-aux<coef>][-CF<capacity_factor>][-nodrop][-dense<first_k_dense>] "
    "(e.g. moe:L4-C256-H4-KV2-E8-K2-I512-norm)";

bool parse_int(std::string_view s, std::int64_t& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Meta's Llama MLP width: 2/3 of 4C, rounded up to a multiple of 256.
std::int64_t default_intermediate(std::int64_t C) {
  const std::int64_t w = (8 * C + 2) / 3;
  return (w + 255) / 256 * 256;
}

// The config.json key a descriptor letter sets, for "num_hidden_layers (L) must be at least 1".
const char* size_name(const std::string& key) {
  if (key == "L") return "num_hidden_layers";
  if (key == "C") return "hidden_size";
  if (key == "H") return "num_attention_heads";
  if (key == "KV") return "num_key_value_heads";
  if (key == "I") return "intermediate_size";
  if (key == "D") return "head_dim";
  if (key == "V") return "vocab_size";
  return "max_position_embeddings";
}

LlamaConfig parse_descriptor(std::string_view spec, std::string_view body) {
  std::int64_t L = -1, C = -1, H = -1, KV = -1, I = -1, D = -1, V = 32000, T = 2048;
  bool tied = false;
  std::set<std::string> seen;
  std::size_t pos = 0;
  while (pos <= body.size()) {
    const std::size_t dash = body.find('-', pos);
    const std::string_view part = body.substr(pos, dash == std::string_view::npos ? std::string_view::npos : dash - pos);
    std::string key;
    std::string_view num;
    if (part == "tied") {
      key = "tied";
    } else if (part.substr(0, 2) == "KV") {
      key = "KV";
      num = part.substr(2);
    } else if (!part.empty()) {
      key = std::string(1, part[0]);
      num = part.substr(1);
    }
    if (!seen.insert(key).second) fail("model spec '{}': {} is given twice; give each part at most once", spec, key);
    if (key != "tied") {
      std::int64_t v = 0;
      if (key.empty() || (key != "KV" && std::string_view("LCHIDVT").find(key) == std::string_view::npos)) {
        fail(
            "model spec '{}': part '{}' is not one of L (layers), C (hidden size), H (heads), KV (key/value heads), I (MLP width), D (head "
            "size), V (vocab), T (max positions) followed by a positive number, or 'tied'; accepted forms: {}",
            spec, part, kSpecForms);
      }
      if (parse_int(num, v) && v == 0) fail("{} ({}) must be at least 1 in {}", size_name(key), key, spec);
      if (!parse_int(num, v) || v <= 0) {
        const bool digits = !num.empty() && num.find_first_not_of("0123456789") == std::string_view::npos;
        if (digits && !parse_int(num, v)) fail("model spec '{}': part '{}' is too large a number", spec, part);
        fail("model spec '{}': part '{}' needs a positive number after {}; accepted forms: {}", spec, part, key, kSpecForms);
      }
      if (key == "L")
        L = v;
      else if (key == "C")
        C = v;
      else if (key == "H")
        H = v;
      else if (key == "KV")
        KV = v;
      else if (key == "I")
        I = v;
      else if (key == "D")
        D = v;
      else if (key == "V")
        V = v;
      else if (key == "T")
        T = v;
    } else {
      tied = true;
    }
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  if (L < 0 || C < 0 || H < 0) fail("model spec '{}': L<layers>, C<hidden size> and H<heads> are all required, e.g. llama:L4-C256-H4-KV2", spec);
  LlamaConfig c;
  c.model_type = "llama";
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = H;
  c.n_kv_head = KV > 0 ? KV : H;
  c.head_dim = D > 0 ? D : (C % H == 0 ? C / H : 0);
  if (c.head_dim == 0) fail("model spec '{}': C = {} is not divisible by H = {}; give the head size D explicitly or choose H dividing C", spec, C, H);
  c.intermediate_size = I > 0 ? I : default_intermediate(C);
  c.vocab_size = V;
  c.padded_vocab_size = padded_vocab(V);
  c.max_position_embeddings = T;
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = tied;
  return c;
}

// The families dstrain builds, by model_type and by architectures[0].
struct Family {
  const char* model_type;
  const char* architecture;
};
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM"},
    {"mistral", "MistralForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
    {"mixtral", "MixtralForCausalLM"},
    {"qwen2_moe", "Qwen2MoeForCausalLM"},
    {"qwen3_moe", "Qwen3MoeForCausalLM"},
    {"olmoe", "OlmoeForCausalLM"},
};

// DeepSeek-V2/V3: read only to say why they are refused (llama_config_from_hf_json).
bool is_deepseek(const nlohmann::json& j) {
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string mt = j["model_type"].get<std::string>();
    if (mt == "deepseek_v2" || mt == "deepseek_v3") return true;
  }
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() && j["architectures"][0].is_string()) {
    const std::string a = j["architectures"][0].get<std::string>();
    if (a == "DeepseekV2ForCausalLM" || a == "DeepseekV3ForCausalLM") return true;
  }
  return false;
}

const Family* family_of(const nlohmann::json& j) {
  if (j.contains("model_type") && j["model_type"].is_string()) {
    for (const Family& f : kFamilies)
      if (j["model_type"].get<std::string>() == f.model_type) return &f;
  }
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() && j["architectures"][0].is_string()) {
    for (const Family& f : kFamilies)
      if (j["architectures"][0].get<std::string>() == f.architecture) return &f;
  }
  return nullptr;
}

// Keys of transformers' PretrainedConfig and of these families that do not change the network
// dstrain trains (generation settings, token ids, labels, bookkeeping, storage dtype), or whose
// effect is the same model (pretraining_tp splits the same matmuls; max_window_layers only acts
// with use_sliding_window, which is checked).
const std::set<std::string>& neutral_keys() {
  static const std::set<std::string> k = {"_name_or_path",
                                          "transformers_version",
                                          "architectures",
                                          "model_type",
                                          "torch_dtype",
                                          "dtype",
                                          "use_cache",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "unk_token_id",
                                          "sep_token_id",
                                          "decoder_start_token_id",
                                          "id2label",
                                          "label2id",
                                          "num_labels",
                                          "problem_type",
                                          "finetuning_task",
                                          "tokenizer_class",
                                          "prefix",
                                          "task_specific_params",
                                          "return_dict",
                                          "output_hidden_states",
                                          "output_attentions",
                                          "torchscript",
                                          "use_bfloat16",
                                          "tf_legacy_loss",
                                          "pruned_heads",
                                          "chunk_size_feed_forward",
                                          "is_encoder_decoder",
                                          "is_decoder",
                                          "tie_encoder_decoder",
                                          "cross_attention_hidden_size",
                                          "max_length",
                                          "min_length",
                                          "do_sample",
                                          "early_stopping",
                                          "num_beams",
                                          "num_beam_groups",
                                          "diversity_penalty",
                                          "temperature",
                                          "top_k",
                                          "top_p",
                                          "typical_p",
                                          "repetition_penalty",
                                          "length_penalty",
                                          "no_repeat_ngram_size",
                                          "encoder_no_repeat_ngram_size",
                                          "bad_words_ids",
                                          "num_return_sequences",
                                          "output_scores",
                                          "return_dict_in_generate",
                                          "forced_bos_token_id",
                                          "forced_eos_token_id",
                                          "remove_invalid_values",
                                          "exponential_decay_length_penalty",
                                          "suppress_tokens",
                                          "begin_suppress_tokens",
                                          "pretraining_tp",
                                          "max_window_layers",
                                          "auto_map",
                                          "_attn_implementation",
                                          "attn_implementation"};
  return k;
}

class Reader {
 public:
  Reader(const nlohmann::json& j, std::string_view source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const nlohmann::json& at(const char* key) const { return j_[key]; }

  bool get_int(const char* key, std::int64_t& out, bool required) {
    used_.insert(key);
    if (!has(key)) {
      if (required) fail("model config '{}': key '{}' is missing; a {} config.json needs it", source_, key, family_name());
      return false;
    }
    const auto& v = j_[key];
    if (!v.is_number_integer()) fail("model config '{}': '{}' must be an integer, got {}", source_, key, v.dump());
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail("model config '{}': '{}' is {}, too large a number", source_, key, v.dump());
    }
    out = v.get<std::int64_t>();
    return true;
  }
  template <typename F>
  bool get_number(const char* key, F& out) {
    used_.insert(key);
    if (!has(key)) return false;
    const auto& v = j_[key];
    if (!v.is_number()) fail("model config '{}': '{}' must be a number, got {}", source_, key, v.dump());
    out = v.get<F>();
    return true;
  }
  bool get_bool(const char* key, bool& out) {
    used_.insert(key);
    if (!has(key)) return false;
    const auto& v = j_[key];
    if (!v.is_boolean()) fail("model config '{}': '{}' must be true or false, got {}", source_, key, v.dump());
    out = v.get<bool>();
    return true;
  }
  void use(const char* key) { used_.insert(key); }
  bool used(const std::string& key) const { return used_.count(key) != 0; }
  std::string_view source() const { return source_; }
  std::string family_name() const { return family_; }
  void set_family(std::string f) { family_ = std::move(f); }

 private:
  const nlohmann::json& j_;
  std::string_view source_;
  std::set<std::string> used_;
  std::string family_ = "Llama-family";
};

RopeScaling parse_rope_scaling(const nlohmann::json& v, std::string_view source) {
  RopeScaling r;
  if (v.is_null()) return r;
  if (!v.is_object()) fail("model config '{}': 'rope_scaling' must be an object or null, got {}", source, v.dump());
  std::string type;
  for (const char* k : {"rope_type", "type"}) {
    if (v.contains(k) && v[k].is_string()) {
      const std::string t = v[k].get<std::string>();
      if (!type.empty() && t != type) fail("model config '{}': rope_scaling gives 'rope_type' \"{}\" and 'type' \"{}\"; keep one", source, type, t);
      type = t;
    }
  }
  if (type.empty()) fail("model config '{}': rope_scaling {} names no 'rope_type'; use \"default\", \"linear\" or \"llama3\"", source, v.dump());
  std::set<std::string> allowed = {"rope_type", "type"};
  auto num = [&](const char* key, double& out, bool required) {
    allowed.insert(key);
    if (!v.contains(key) || v[key].is_null()) {
      if (required) fail("model config '{}': rope_scaling of type \"{}\" needs '{}'", source, type, key);
      return;
    }
    if (!v[key].is_number()) fail("model config '{}': rope_scaling.{} must be a number, got {}", source, key, v[key].dump());
    out = v[key].get<double>();
  };
  if (type == "default") {
    r.kind = RopeScaling::Kind::none;
  } else if (type == "linear") {
    r.kind = RopeScaling::Kind::linear;
    num("factor", r.factor, true);
  } else if (type == "llama3") {
    r.kind = RopeScaling::Kind::llama3;
    num("factor", r.factor, true);
    num("low_freq_factor", r.low_freq_factor, true);
    num("high_freq_factor", r.high_freq_factor, true);
    num("original_max_position_embeddings", r.original_max_position_embeddings, true);
  } else {
    fail(
        "model config '{}': rope_scaling type \"{}\" is not provided; dstrain computes \"default\", \"linear\" and \"llama3\" (Hugging Face's "
        "modeling_rope_utils); use one of them or remove rope_scaling",
        source, type);
  }
  for (const auto& [k, val] : v.items()) {
    if (allowed.count(k) == 0) {
      fail(
          "model config '{}': rope_scaling.{} is not used by the \"{}\" rope type dstrain computes; remove it (or use a rope type that "
          "dstrain provides)",
          source, k, type);
    }
  }
  return r;
}


// The mixture-of-experts keys of Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (transformers' configs,
// their defaults where a key is absent), DeepSeek's routing keys (for any of them: dstrain writes
// them so) and DeepSpeed MoE's capacity (dstrain's own keys). docs/models.md §MoE.
void read_moe(Reader& r, const nlohmann::json& j, const std::string& mt, LlamaConfig& c) {
  const std::string_view source = r.source();
  MoeConfig& m = c.moe;
  m = MoeConfig{};
  if (mt == "mixtral") {
    // MixtralConfig: 8 experts, top-2, always renormalised; intermediate_size is each expert's width.
    m.num_experts = 8;
    m.top_k = 2;
    m.norm_topk_prob = true;
    m.router_aux_loss_coef = 0.001;
    r.get_int("num_local_experts", m.num_experts, false);
    m.expert_intermediate_size = c.intermediate_size;
    r.use("router_jitter_noise");
    if (r.has("router_jitter_noise") && (!j["router_jitter_noise"].is_number() || j["router_jitter_noise"].get<double>() != 0.0)) {
      fail(
          "model config '{}': router_jitter_noise is {}, but dstrain's router adds no jitter to its inputs (Mixtral's training-time "
          "multiplicative noise); set it to 0 or remove it",
          source, j["router_jitter_noise"].dump());
    }
  } else if (mt == "olmoe") {
    // OlmoeConfig: 64 experts, top-8, not renormalised, aux loss 0.01; intermediate_size is each expert's width.
    m.num_experts = 64;
    m.top_k = 8;
    m.norm_topk_prob = false;
    m.router_aux_loss_coef = 0.01;
    r.get_int("num_experts", m.num_experts, false);
    m.expert_intermediate_size = c.intermediate_size;
  } else {
    // Qwen2MoeConfig (60 experts of 1408, top-4, a gated shared expert of 5632) and Qwen3MoeConfig
    // (128 experts of 768, top-8, none): intermediate_size is the dense layers' width.
    const bool q2 = mt == "qwen2_moe";
    m.num_experts = q2 ? 60 : 128;
    m.top_k = q2 ? 4 : 8;
    m.expert_intermediate_size = q2 ? 1408 : 768;
    m.norm_topk_prob = false;
    m.router_aux_loss_coef = 0.001;
    r.get_int("num_experts", m.num_experts, false);
    r.get_int("moe_intermediate_size", m.expert_intermediate_size, false);
    r.get_int("decoder_sparse_step", m.decoder_sparse_step, false);
    r.use("mlp_only_layers");
    if (r.has("mlp_only_layers")) {
      const auto& v = j["mlp_only_layers"];
      if (!v.is_array()) fail("model config '{}': 'mlp_only_layers' must be a list of layer indices, got {}", source, v.dump());
      for (const auto& i : v) {
        if (!i.is_number_integer() || i.get<std::int64_t>() < 0)
          fail("model config '{}': mlp_only_layers holds {}; it lists layer indices (integers >= 0)", source, i.dump());
        m.mlp_only_layers.push_back(i.get<std::int64_t>());
      }
    }
    if (q2) {
      std::int64_t shared = 5632;
      r.get_int("shared_expert_intermediate_size", shared, false);
      m.shared_expert_intermediate_size = shared;
      m.shared_expert_gate = shared > 0;  // Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(h)) · shared_expert(h)
    }
  }
  r.get_int("num_experts_per_tok", m.top_k, false);
  r.get_bool("norm_topk_prob", m.norm_topk_prob);
  r.get_number("router_aux_loss_coef", m.router_aux_loss_coef);
  r.get_bool("output_router_logits", m.output_router_logits);
  // DeepSeek-V2/V3's routing (DeepseekV3Config's names).
  r.use("scoring_func");
  if (r.has("scoring_func")) {
    const auto& v = j["scoring_func"];
    if (v == "softmax")
      m.score = MoeConfig::Score::softmax;
    else if (v == "sigmoid")
      m.score = MoeConfig::Score::sigmoid;
    else
      fail("model config '{}': scoring_func is {}; dstrain's router scores with \"softmax\" or \"sigmoid\"", source, v.dump());
  }
  r.get_int("n_group", m.n_group, false);
  r.get_int("topk_group", m.topk_group, false);
  r.get_number("routed_scaling_factor", m.routed_scaling_factor);
  std::int64_t n_shared = 0;
  r.get_int("n_shared_experts", n_shared, false);
  if (n_shared < 0) fail("model config '{}': n_shared_experts = {} must not be negative", source, n_shared);
  if (n_shared > 0) {
    if (m.shared_expert_intermediate_size > 0) {
      fail(
          "model config '{}': n_shared_experts = {} (DeepSeek's ungated shared experts) and shared_expert_intermediate_size = {} (Qwen2-MoE's "
          "gated shared expert) both give shared experts; keep one (shared_expert_intermediate_size 0 for DeepSeek's)",
          source, n_shared, m.shared_expert_intermediate_size);
    }
    if (m.expert_intermediate_size > 0 && n_shared > std::numeric_limits<std::int64_t>::max() / m.expert_intermediate_size)
      fail("model config '{}': n_shared_experts = {} experts of width {} is too large a width", source, n_shared, m.expert_intermediate_size);
    m.shared_expert_intermediate_size = n_shared * m.expert_intermediate_size;
    m.shared_expert_gate = false;
  }
  r.get_int("first_k_dense_replace", m.first_k_dense, false);
  // DeepSpeed MoE's capacity (dstrain keeps it in config.json).
  r.get_number("capacity_factor", m.capacity_factor);
  r.get_int("min_capacity", m.min_capacity, false);
  r.get_bool("drop_tokens", m.drop_tokens);
  validate(m, std::string(source));
}

// Writes the MoE keys of `c` as read_moe reads them back.
void write_moe(nlohmann::ordered_json& j, const LlamaConfig& c) {
  const MoeConfig& m = c.moe;
  const std::string& mt = c.model_type;
  const bool ungated_shared = m.shared_expert_intermediate_size > 0 && !m.shared_expert_gate;
  if (mt == "mixtral") {
    j["num_local_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.top_k;
    j["router_jitter_noise"] = 0.0;
    if (!m.norm_topk_prob) j["norm_topk_prob"] = false;  // dstrain's: Hugging Face's Mixtral always renormalises
  } else {
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.top_k;
    if (mt != "olmoe") {
      j["moe_intermediate_size"] = m.expert_intermediate_size;
      if (mt == "qwen2_moe") j["shared_expert_intermediate_size"] = m.shared_expert_gate ? m.shared_expert_intermediate_size : 0;
      j["decoder_sparse_step"] = m.decoder_sparse_step;
      j["mlp_only_layers"] = m.mlp_only_layers;
    }
    j["norm_topk_prob"] = m.norm_topk_prob;
  }
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.output_router_logits;
  // DeepSeek's routing keys and DeepSpeed's capacity, where they differ from the defaults.
  if (m.score != MoeConfig::Score::softmax) j["scoring_func"] = "sigmoid";
  if (m.n_group != 1 || m.topk_group != 1) {
    j["n_group"] = m.n_group;
    j["topk_group"] = m.topk_group;
  }
  if (m.routed_scaling_factor != 1.0) j["routed_scaling_factor"] = m.routed_scaling_factor;
  if (ungated_shared) j["n_shared_experts"] = m.shared_expert_intermediate_size / m.expert_intermediate_size;
  if (m.first_k_dense != 0) j["first_k_dense_replace"] = m.first_k_dense;
  if (m.capacity_factor != 0.0 || m.min_capacity != MoeConfig{}.min_capacity) {
    j["capacity_factor"] = m.capacity_factor;
    j["min_capacity"] = m.min_capacity;
  }
  if (!m.drop_tokens) j["drop_tokens"] = false;
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(out);
}

// A moe: descriptor's body (after "moe:"); see llama_config.h.
LlamaConfig parse_moe_descriptor(std::string_view spec, std::string_view body) {
  // Integer parts, longest prefix first; then the number parts and the flags.
  static const std::vector<std::pair<std::string, const char*>> kInt = {
      {"dense", "first_k_dense_replace"}, {"KV", "num_key_value_heads"}, {"TG", "topk_group"}, {"L", "num_hidden_layers"},
      {"C", "hidden_size"},                {"H", "num_attention_heads"}, {"E", "num_experts"}, {"K", "num_experts_per_tok"},
      {"I", "moe_intermediate_size"},      {"D", "head_dim"},            {"V", "vocab_size"},  {"T", "max_position_embeddings"},
      {"S", "the shared experts' width"},  {"G", "n_group"}};
  static const std::vector<std::pair<std::string, const char*>> kNum = {
      {"aux", "router_aux_loss_coef"}, {"RS", "routed_scaling_factor"}, {"CF", "capacity_factor"}};
  static const std::set<std::string> kFlags = {"tied", "sigmoid", "norm", "nonorm", "nodrop"};
  std::map<std::string, std::int64_t> ints;
  std::map<std::string, double> nums;
  std::set<std::string> flags, seen;
  std::size_t pos = 0;
  while (pos <= body.size()) {
    const std::size_t dash = body.find('-', pos);
    const std::string_view part = body.substr(pos, dash == std::string_view::npos ? std::string_view::npos : dash - pos);
    std::string key;
    bool done = false;
    if (kFlags.count(std::string(part)) != 0) {
      key = std::string(part);
      flags.insert(key);
      done = true;
    }
    for (const auto& [k, name] : kNum) {
      if (done || part.substr(0, k.size()) != k) continue;
      key = k;
      double v = 0;
      // (C / CF: "CF" is tried before the single letters.)
      if (!parse_double(part.substr(k.size()), v) || v < 0.0)
        fail("model spec '{}': part '{}' needs a number >= 0 after {} ({}); accepted forms: {}", spec, part, k, name, kMoeSpecForms);
      nums[k] = v;
      done = true;
    }
    for (const auto& [k, name] : kInt) {
      if (done || part.substr(0, k.size()) != k) continue;
      const std::string_view num = part.substr(k.size());
      if (num.empty() || num.find_first_not_of("0123456789") != std::string_view::npos) continue;  // "Dx": not D; reported below
      key = k;
      std::int64_t v = 0;
      if (!parse_int(num, v)) fail("model spec '{}': part '{}' is too large a number", spec, part);
      if (v == 0 && k != "dense" && k != "S") fail("{} ({}) must be at least 1 in {}", name, k, spec);
      ints[k] = v;
      done = true;
    }
    if (!done) {
      fail(
          "model spec '{}': part '{}' is not one of L, C, H, E (experts), K (experts per token), KV, I (expert width), D, V, T, S (shared "
          "width), G (n_group), TG (topk_group), dense (first dense layers) followed by a whole number, RS (routed scaling), aux (aux loss "
          "coefficient), CF (capacity factor) followed by a number, or the flags tied, sigmoid, norm, nonorm, nodrop; accepted forms: {}",
          spec, part, kMoeSpecForms);
    }
    if (!seen.insert(key).second) fail("model spec '{}': {} is given twice; give each part at most once", spec, key);
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  for (const char* k : {"L", "C", "H", "E", "K"}) {
    if (ints.count(k) == 0) {
      fail("model spec '{}': L<layers>, C<hidden size>, H<heads>, E<experts> and K<experts per token> are all required, e.g. "
           "moe:L4-C256-H4-E8-K2; {} is missing",
           spec, k);
    }
  }
  if ((ints.count("G") != 0) != (ints.count("TG") != 0))
    fail("model spec '{}': G<n_group> and TG<topk_group> go together (DeepSeek's group-limited routing); give both or neither", spec);
  auto get = [&](const char* k, std::int64_t def) { return ints.count(k) != 0 ? ints[k] : def; };
  const std::int64_t L = ints["L"], C = ints["C"], H = ints["H"];
  LlamaConfig c;
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = H;
  c.n_kv_head = get("KV", H);
  c.head_dim = get("D", C % H == 0 ? C / H : 0);
  if (c.head_dim == 0) fail("model spec '{}': C = {} is not divisible by H = {}; give the head size D explicitly or choose H dividing C", spec, C, H);
  c.vocab_size = get("V", 32000);
  c.padded_vocab_size = padded_vocab(c.vocab_size);
  c.max_position_embeddings = get("T", 2048);
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = flags.count("tied") != 0;
  MoeConfig& m = c.moe;
  m.num_experts = ints["E"];
  m.top_k = ints["K"];
  m.expert_intermediate_size = get("I", default_intermediate(C));
  m.score = flags.count("sigmoid") != 0 ? MoeConfig::Score::sigmoid : MoeConfig::Score::softmax;
  // Renormalised by default (Mixtral's rule, and what a bare descriptor then writes: a mixtral
  // config); -nonorm for Qwen-MoE's / OLMoE's default.
  if (flags.count("norm") != 0 && flags.count("nonorm") != 0)
    fail("model spec '{}': -norm and -nonorm contradict each other; give at most one (renormalising is the default)", spec);
  m.norm_topk_prob = flags.count("nonorm") == 0;
  m.n_group = get("G", 1);
  m.topk_group = get("TG", 1);
  m.routed_scaling_factor = nums.count("RS") != 0 ? nums["RS"] : 1.0;
  m.router_aux_loss_coef = nums.count("aux") != 0 ? nums["aux"] : 0.001;
  m.output_router_logits = nums.count("aux") != 0;
  m.capacity_factor = nums.count("CF") != 0 ? nums["CF"] : 0.0;
  m.drop_tokens = flags.count("nodrop") == 0;  // DeepSpeed's drop_tokens=False
  m.first_k_dense = get("dense", 0);
  const std::int64_t S = get("S", 0);
  if (S % m.expert_intermediate_size != 0) {
    fail(
        "model spec '{}': S = {} is not a multiple of the expert width I = {}; the shared experts are written as DeepSeek's n_shared_experts "
        "experts of width I (S = n_shared_experts x I)",
        spec, S, m.expert_intermediate_size);
  }
  m.shared_expert_intermediate_size = S;
  m.shared_expert_gate = false;
  // Dense layers keep the llama: MLP width; with none, intermediate_size is unused and set to I.
  c.intermediate_size = m.first_k_dense > 0 ? default_intermediate(C) : m.expert_intermediate_size;
  const bool mixtral = S == 0 && m.score == MoeConfig::Score::softmax && m.n_group == 1 && m.topk_group == 1 && m.norm_topk_prob &&
                       m.routed_scaling_factor == 1.0 && m.first_k_dense == 0 && !m.drops();
  c.model_type = mixtral ? "mixtral" : "qwen3_moe";
  c.qk_norm = !mixtral;  // Qwen3-MoE's attention
  return c;
}

}  // namespace

bool is_moe_model_type(std::string_view mt) { return mt == "mixtral" || mt == "qwen2_moe" || mt == "qwen3_moe" || mt == "olmoe"; }

void validate(const LlamaConfig& c) {
  auto positive = [](std::int64_t v, const char* name) {
    if (v <= 0) fail("Llama config: {} = {} must be positive", name, v);
  };
  positive(c.n_layer, "num_hidden_layers");
  positive(c.n_head, "num_attention_heads");
  positive(c.n_kv_head, "num_key_value_heads");
  positive(c.n_embd, "hidden_size");
  positive(c.head_dim, "head_dim");
  positive(c.intermediate_size, "intermediate_size");
  positive(c.vocab_size, "vocab_size");
  positive(c.max_position_embeddings, "max_position_embeddings");
  if (c.n_head % c.n_kv_head != 0) {
    fail("Llama config: num_key_value_heads = {} does not divide num_attention_heads = {}; grouped-query attention needs whole groups", c.n_kv_head,
         c.n_head);
  }
  if (c.head_dim % 2 != 0) fail("Llama config: head_dim = {} is odd; rotary embeddings rotate pairs of channels", c.head_dim);
  if (c.head_dim > kAttentionMaxHeadSize) {
    fail("Llama config: head_dim = {} exceeds the attention kernels' maximum {}", c.head_dim, kAttentionMaxHeadSize);
  }
  if (c.padded_vocab_size < c.vocab_size)
    fail("Llama config: padded_vocab_size = {} is smaller than vocab_size = {}", c.padded_vocab_size, c.vocab_size);
  if (!(c.rms_norm_eps > 0.0f)) fail("Llama config: rms_norm_eps = {} must be positive", c.rms_norm_eps);
  if (!(c.attention_dropout >= 0.0f && c.attention_dropout < 1.0f))
    fail("Llama config: attention_dropout = {} must be in [0, 1)", c.attention_dropout);
  if (!(c.initializer_range > 0.0f)) fail("Llama config: initializer_range = {} must be positive", c.initializer_range);
  if (c.sliding_window < 0) fail("Llama config: sliding_window = {} must be positive (or null for none)", c.sliding_window);
  if (c.qk_norm_whole && !c.qk_norm) fail("Llama config: qk_norm_whole (OLMoE's q/k norm over the whole projections) needs qk_norm");
  const bool moe_type = is_moe_model_type(c.model_type);
  if (moe_type && !c.moe.active())
    fail("Llama config: model_type \"{}\" is a mixture of experts but its expert count is {}; give num_experts (num_local_experts) >= 1", c.model_type,
         c.moe.num_experts);
  if (!moe_type && c.moe.active()) {
    fail("Llama config: {} experts on model_type \"{}\", whose config.json has no experts; use mixtral, qwen2_moe, qwen3_moe or olmoe",
         c.moe.num_experts, c.model_type);
  }
  if (c.moe.active()) {
    const MoeConfig& m = c.moe;
    validate(m, c.model_type);
    const bool expert_width_is_intermediate = c.model_type == "mixtral" || c.model_type == "olmoe";
    if (expert_width_is_intermediate && c.intermediate_size != m.expert_intermediate_size) {
      fail("Llama config: a {} config.json's intermediate_size is the experts' width, so intermediate_size = {} must equal the experts' {}",
           c.model_type, c.intermediate_size, m.expert_intermediate_size);
    }
    if (expert_width_is_intermediate && (m.decoder_sparse_step != 1 || !m.mlp_only_layers.empty())) {
      fail("Llama config: decoder_sparse_step = {} / mlp_only_layers (Qwen-MoE's sparse-layer pattern) cannot be written in a {} config.json",
           m.decoder_sparse_step, c.model_type);
    }
    if (m.shared_expert_gate && (c.model_type != "qwen2_moe" || m.shared_expert_intermediate_size == 0)) {
      fail("Llama config: a gated shared expert (shared_expert_gate) is Qwen2-MoE's: model_type qwen2_moe with shared_expert_intermediate_size > 0");
    }
    if (m.shared_expert_intermediate_size > 0 && !m.shared_expert_gate && m.shared_expert_intermediate_size % m.expert_intermediate_size != 0) {
      fail("Llama config: the ungated shared experts' width {} is not a multiple of the experts' width {} (DeepSeek's n_shared_experts experts)",
           m.shared_expert_intermediate_size, m.expert_intermediate_size);
    }
    if (c.mlp_bias) fail("Llama config: mlp_bias on a mixture of experts; the experts and the router have no bias");
  }
  (void)rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling);  // throws, naming the rope key
}

void llama_check_sequence(const LlamaConfig& c, std::int64_t T, bool cuda) {
  if (c.sliding_window > 0 && T > c.sliding_window) {
    if (c.attention_window() == 0) {
      fail(
          "model: sliding_window = {} is smaller than the sequence length T = {}, and this {} config applies it to some layers only "
          "(use_sliding_window with max_window_layers, or layer_types), which dstrain does not build; its full causal attention equals "
          "sliding-window attention while T <= sliding_window: train with T <= {} (or set use_sliding_window to false)",
          c.sliding_window, T, c.model_type, c.sliding_window);
    }
    if (cuda) {
      fail(
          "model: sliding_window = {} is smaller than the sequence length T = {}; the windowed attention mask is computed on the CPU "
          "only (the CUDA attention kernels are full causal, which equals it while T <= sliding_window): train with T <= {} or "
          "--device cpu",
          c.sliding_window, T, c.sliding_window);
    }
  }
  if (T > c.max_position_embeddings) {
    fail("model: sequence length T = {} exceeds max_position_embeddings = {}; use T <= {}", T, c.max_position_embeddings, c.max_position_embeddings);
  }
}

bool is_llama_family_json(std::string_view json_text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
    return j.is_object() && (family_of(j) != nullptr || is_deepseek(j));
  } catch (const std::exception&) {
    return false;
  }
}

std::string llama_family_hf_forms() {
  std::string s;
  for (const Family& f : kFamilies) s += fmt::format("{}\"{}\" ({})", s.empty() ? "" : ", ", f.model_type, f.architecture);
  return s;
}

LlamaConfig llama_config_from_hf_json(std::string_view json_text, std::string_view source) {
  const nlohmann::json j = parse_hf_config_json(json_text, source, "a Hugging Face config.json of the Llama family");
  if (is_deepseek(j)) {
    fail(
        "model config '{}': model_type {} / architectures {} is DeepSeek-V2/V3, whose multi-head latent attention (MLA: q_lora_rank, "
        "kv_lora_rank, qk_rope_head_dim, v_head_dim) is not built in dstrain. Its routing (scoring_func, n_group, topk_group, "
        "routed_scaling_factor, n_shared_experts, first_k_dense_replace) is: give those keys on a qwen3_moe-shaped config.json "
        "(model_type \"qwen3_moe\", moe_intermediate_size, num_experts, num_experts_per_tok), or use a moe: descriptor ({})",
        source, j.contains("model_type") ? j["model_type"].dump() : "(none)", j.contains("architectures") ? j["architectures"].dump() : "(none)",
        kMoeSpecForms);
  }
  const Family* fam = family_of(j);
  if (fam == nullptr) {
    fail("model config '{}': model_type {} / architectures {} is not a Llama-family model dstrain builds; it builds {}", source,
         j.contains("model_type") ? j["model_type"].dump() : "(none)", j.contains("architectures") ? j["architectures"].dump() : "(none)",
         llama_family_hf_forms());
  }
  const std::string mt = fam->model_type;
  if (j.contains("architectures") && j["architectures"].is_array()) {
    for (const auto& a : j["architectures"]) {
      if (!a.is_string() || a.get<std::string>() != fam->architecture) {
        fail("model config '{}': architectures {} does not match model_type \"{}\" ({}); dstrain trains the causal language model only", source,
             j["architectures"].dump(), mt, fam->architecture);
      }
    }
  }
  if (j.contains("model_type") && (!j["model_type"].is_string() || j["model_type"].get<std::string>() != mt)) {
    fail("model config '{}': model_type {} does not match architectures {}", source, j["model_type"].dump(), j["architectures"].dump());
  }
  Reader r(j, source);
  r.set_family(fam->architecture);
  const bool qwen = mt == "qwen2" || mt == "qwen3" || mt == "qwen2_moe" || mt == "qwen3_moe";
  const bool moe = is_moe_model_type(mt);

  LlamaConfig c;
  c.model_type = mt;
  // transformers' defaults for each family where a key is absent.
  c.max_position_embeddings = mt == "llama" ? 2048 : (mt == "mistral" || mt == "mixtral" ? 4096 * 32 : (mt == "olmoe" ? 4096 : 32768));
  c.rms_norm_eps = mt == "mixtral" || mt == "olmoe" ? 1e-5f : 1e-6f;
  c.rope_theta = mt == "mixtral" ? 1e6 : 10000.0;
  r.get_int("num_hidden_layers", c.n_layer, true);
  r.get_int("num_attention_heads", c.n_head, true);
  r.get_int("hidden_size", c.n_embd, true);
  // MixtralConfig's, Qwen2MoeConfig's, Qwen3MoeConfig's, OlmoeConfig's default intermediate_size.
  if (moe) c.intermediate_size = mt == "mixtral" ? 14336 : (mt == "qwen2_moe" ? 5632 : (mt == "qwen3_moe" ? 6144 : 2048));
  r.get_int("intermediate_size", c.intermediate_size, !moe);
  r.get_int("vocab_size", c.vocab_size, true);
  c.n_kv_head = c.n_head;
  r.get_int("num_key_value_heads", c.n_kv_head, false);
  if (c.n_head <= 0) fail("model config '{}': num_attention_heads = {} must be positive", source, c.n_head);
  c.head_dim = mt == "qwen3" ? 128 : c.n_embd / c.n_head;  // Qwen3MoeAttention: getattr(config, "head_dim", hidden / heads)
  if (!r.get_int("head_dim", c.head_dim, false) && mt != "qwen3" && c.n_embd % c.n_head != 0) {
    fail("model config '{}': hidden_size = {} is not divisible by num_attention_heads = {} and no head_dim is given", source, c.n_embd, c.n_head);
  }
  r.get_int("max_position_embeddings", c.max_position_embeddings, false);
  r.get_number("rms_norm_eps", c.rms_norm_eps);
  r.get_number("rope_theta", c.rope_theta);
  r.get_bool("tie_word_embeddings", c.tie_word_embeddings);
  r.get_number("attention_dropout", c.attention_dropout);
  r.get_number("initializer_range", c.initializer_range);
  r.use("rope_scaling");
  if (j.contains("rope_scaling")) c.rope_scaling = parse_rope_scaling(j["rope_scaling"], source);

  r.use("hidden_act");
  if (r.has("hidden_act")) {
    const auto& v = j["hidden_act"];
    if (!v.is_string() || v.get<std::string>() != "silu") {
      fail("model config '{}': hidden_act is {} but dstrain's SwiGLU MLP computes silu(gate) * up; set \"silu\" or use another model", source,
           v.dump());
    }
  }
  // Biases and norms of each family (transformers' modeling files).
  bool attention_bias = false;
  if (mt == "llama" || mt == "qwen3" || mt == "qwen3_moe" || mt == "olmoe") {
    r.get_bool("attention_bias", attention_bias);
    c.qkv_bias = c.o_bias = attention_bias;
  }
  if (mt == "llama") r.get_bool("mlp_bias", c.mlp_bias);
  if (mt == "qwen2") c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
  if (mt == "qwen2_moe") {
    c.qkv_bias = true;  // Qwen2MoeAttention: as Qwen2's (newer configs may say so with "qkv_bias")
    r.get_bool("qkv_bias", c.qkv_bias);
  }
  if (mt == "qwen3" || mt == "qwen3_moe") c.qk_norm = true;
  if (mt == "olmoe") {
    // OlmoeAttention: RMSNorm over the whole q (hidden_size) and k (kv heads x head size) projections.
    c.qk_norm = c.qk_norm_whole = true;
    r.use("clip_qkv");
    if (r.has("clip_qkv") && !j["clip_qkv"].is_null()) {
      fail("model config '{}': clip_qkv is {}, but dstrain does not clip q, k and v (OLMoE's clip_qkv); set it to null or use another model",
           source, j["clip_qkv"].dump());
    }
    if (r.has("head_dim") && c.n_embd % c.n_head == 0 && c.head_dim != c.n_embd / c.n_head) {
      fail("model config '{}': head_dim = {} but OlmoeAttention uses hidden_size / num_attention_heads = {}; remove head_dim", source, c.head_dim,
           c.n_embd / c.n_head);
    }
  }
  if (moe) read_moe(r, j, mt, c);
  // Sliding windows: Mistral applies `sliding_window` (default 4096) unless it is null; Qwen only
  // with use_sliding_window (then from layer max_window_layers on; refused when it would act).
  if (mt == "mistral" || mt == "mixtral") {
    r.use("sliding_window");
    if (!j.contains("sliding_window"))
      c.sliding_window = mt == "mistral" ? 4096 : 0;  // MixtralConfig's default: None
    else if (!j["sliding_window"].is_null())
      r.get_int("sliding_window", c.sliding_window, false);
  } else if (qwen) {
    bool use_sw = false;
    r.get_bool("use_sliding_window", use_sw);
    r.use("sliding_window");
    c.use_sliding_window = use_sw;
    if (use_sw) {
      std::int64_t w = 4096, first = 28;  // Qwen2Config's / Qwen3Config's defaults
      if (r.has("sliding_window")) r.get_int("sliding_window", w, false);
      r.get_int("max_window_layers", first, false);
      c.max_window_layers = first;
      if (first < c.n_layer) c.sliding_window = w;
    }
  }
  if (qwen) {
    r.use("layer_types");
    if (r.has("layer_types")) {
      const auto& lt = j["layer_types"];
      if (!lt.is_array()) fail("model config '{}': 'layer_types' must be a list, got {}", source, lt.dump());
      for (const auto& t : lt) {
        if (!t.is_string() || (t.get<std::string>() != "full_attention" && t.get<std::string>() != "sliding_attention")) {
          fail("model config '{}': layer_types holds {}; dstrain knows \"full_attention\" and \"sliding_attention\"", source, t.dump());
        }
        c.layer_types.push_back(t.get<std::string>());
        // Qwen2Config / Qwen3Config drop sliding_window unless use_sliding_window: a
        // "sliding_attention" layer then attends in full.
        if (t.get<std::string>() == "sliding_attention" && c.use_sliding_window && c.sliding_window == 0) {
          std::int64_t w = 4096;
          if (r.has("sliding_window")) r.get_int("sliding_window", w, false);
          c.sliding_window = w;
        }
      }
    }
  }
  // Keys that would change the model in ways dstrain does not build.
  r.use("partial_rotary_factor");
  if (r.has("partial_rotary_factor") && (!j["partial_rotary_factor"].is_number() || j["partial_rotary_factor"].get<double>() != 1.0)) {
    fail("model config '{}': partial_rotary_factor is {} but dstrain rotates the whole head (1.0); remove it or set 1.0", source,
         j["partial_rotary_factor"].dump());
  }
  for (const auto& [key, value] : j.items()) {
    if (r.used(key) || neutral_keys().count(key) != 0) continue;
    if (key == "attention_bias" || key == "mlp_bias") {
      fail("model config '{}': '{}' is not a key of {} configs (transformers' {} has no such option); remove it", source, key, fam->architecture,
           fam->architecture);
    }
    fail(
        "model config '{}': key '{}' ({}) is not one dstrain knows for {}; it may change the model, so it is refused rather than ignored. "
        "docs/models.md lists the keys dstrain honours and those it knows to be neutral; remove it if it does not change the network",
        source, key, value.dump(), fam->architecture);
  }
  c.padded_vocab_size = padded_vocab(c.vocab_size);
  try {
    validate(c);
  } catch (const Error& e) {
    fail("model config '{}': {}", source, e.what());
  }
  return c;
}

std::string moe_spec_forms() { return kMoeSpecForms; }

LlamaConfig moe_config_from_spec(std::string_view spec) {
  constexpr std::string_view prefix = "moe:";
  if (spec.substr(0, prefix.size()) != prefix || spec.size() == prefix.size()) fail("unknown model spec '{}'; accepted forms: {}", spec, kMoeSpecForms);
  LlamaConfig c = parse_moe_descriptor(spec, spec.substr(prefix.size()));
  try {
    validate(c);
  } catch (const Error& e) {
    fail("model spec '{}': {}", spec, e.what());
  }
  return c;
}

LlamaConfig llama_config_from_spec(std::string_view spec) {
  constexpr std::string_view prefix = "llama:";
  if (spec.substr(0, prefix.size()) == prefix) {
    const std::string_view body = spec.substr(prefix.size());
    if (body.empty() || body[0] != 'L') fail("unknown model spec '{}'; accepted forms: {}", spec, kSpecForms);
    LlamaConfig c = parse_descriptor(spec, body);
    try {
      validate(c);
    } catch (const Error& e) {
      fail("model spec '{}': {}", spec, e.what());
    }
    return c;
  }
  const std::filesystem::path p = model_config_path(spec, "a llama: descriptor", kSpecForms);
  return llama_config_from_hf_json(read_model_config_file(p), p.string());
}

double llama_parameter_count(const LlamaConfig& c, bool active_only) {
  const double C = static_cast<double>(c.n_embd), I = static_cast<double>(c.intermediate_size);
  const double qkv = static_cast<double>(c.qkv_dim()), q = static_cast<double>(c.q_dim());
  double attn = 2.0 * C;                         // the two RMSNorm weights
  attn += qkv * C + (c.qkv_bias ? qkv : 0.0);    // q, k, v
  attn += C * q + (c.o_bias ? C : 0.0);          // o
  if (c.qk_norm_whole)
    attn += static_cast<double>(c.q_dim() + c.kv_dim());  // OLMoE: q_norm (NH·D), k_norm (NKV·D)
  else if (c.qk_norm)
    attn += 2.0 * static_cast<double>(c.head_dim);  // Qwen3: q_norm (D), k_norm (D)
  const double dense_mlp = 3.0 * C * I + (c.mlp_bias ? 2.0 * I + C : 0.0);  // gate, up, down
  double sparse_mlp = 0.0;
  const MoeConfig& m = c.moe;
  if (m.active()) {
    const double E = static_cast<double>(m.num_experts), Ie = static_cast<double>(m.expert_intermediate_size);
    const double S = static_cast<double>(m.shared_expert_intermediate_size);
    sparse_mlp = E * C;                                                         // the router
    sparse_mlp += (active_only ? static_cast<double>(m.top_k) : E) * 3.0 * C * Ie;  // the experts a token goes through, or all
    sparse_mlp += 3.0 * C * S + (m.shared_expert_gate ? C : 0.0);              // the shared experts (and their gate)
  }
  const double sparse = static_cast<double>(m.sparse_layers(c.n_layer)), dense = static_cast<double>(c.n_layer) - sparse;
  const double embed = static_cast<double>(c.vocab_size) * C;
  return embed + (c.tie_word_embeddings ? 0.0 : embed) + static_cast<double>(c.n_layer) * attn + dense * dense_mlp + sparse * sparse_mlp + C;
}

std::int64_t parameter_count(const LlamaConfig& c) { return static_cast<std::int64_t>(llama_parameter_count(c, false)); }

std::string llama_class_prefix(const LlamaConfig& c) {
  for (const Family& f : kFamilies) {
    if (c.model_type == f.model_type) {
      const std::string arch = f.architecture;  // "Qwen2ForCausalLM"
      return arch.substr(0, arch.size() - std::string_view("ForCausalLM").size());
    }
  }
  return "Llama";
}

std::string llama_hf_config_json(const LlamaConfig& c) {
  const Family* fam = nullptr;
  for (const Family& f : kFamilies)
    if (c.model_type == f.model_type) fam = &f;
  if (fam == nullptr) fail("Llama config: model_type \"{}\" is not one of {}", c.model_type, llama_family_hf_forms());
  nlohmann::ordered_json j;
  j["architectures"] = {fam->architecture};
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.n_embd;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_kv_head;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["vocab_size"] = c.vocab_size;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.kind == RopeScaling::Kind::none) {
    j["rope_scaling"] = nullptr;
  } else if (c.rope_scaling.kind == RopeScaling::Kind::linear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
  } else {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_dropout"] = c.attention_dropout;
  j["initializer_range"] = c.initializer_range;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    j["attention_bias"] = c.qkv_bias;
  } else if (c.model_type == "olmoe") {
    j["attention_bias"] = c.qkv_bias;
    j["clip_qkv"] = nullptr;
  } else if (c.model_type == "qwen2_moe" && !c.qkv_bias) {
    j["qkv_bias"] = false;
  }
  if (c.moe.active()) write_moe(j, c);
  if (c.model_type == "mistral" || c.model_type == "mixtral") {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json(nullptr);
  } else if (c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe") {
    // The layers the imported config windowed, in its own keys (docs/models.md §3.4): Hugging Face
    // windows layer i when use_sliding_window and i >= max_window_layers, or where layer_types says
    // so. A window with neither (a config not read from JSON) acts on every layer: from layer 0.
    const bool every_layer = c.sliding_window > 0 && !c.use_sliding_window && c.layer_types.empty();
    j["use_sliding_window"] = c.use_sliding_window || every_layer;
    if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
    if (c.use_sliding_window || every_layer) j["max_window_layers"] = every_layer ? 0 : c.max_window_layers;
    if (!c.layer_types.empty()) j["layer_types"] = c.layer_types;
  }
  return j.dump(2) + "\n";
}

std::string describe(const LlamaConfig& c) {
  std::string extras;
  if (c.qkv_bias) extras += ", q/k/v bias";
  if (c.o_bias) extras += ", o bias";
  if (c.mlp_bias) extras += ", MLP bias";
  if (c.qk_norm) extras += c.qk_norm_whole ? ", q/k RMSNorm (whole projections)" : ", q/k RMSNorm";
  if (c.rope_scaling.kind == RopeScaling::Kind::linear) extras += fmt::format(", rope scaling linear x{}", c.rope_scaling.factor);
  if (c.rope_scaling.kind == RopeScaling::Kind::llama3) extras += fmt::format(", rope scaling llama3 x{}", c.rope_scaling.factor);
  if (c.sliding_window > 0) extras += fmt::format(", sliding window {}", c.sliding_window);
  if (c.moe.active()) {
    const std::int64_t sparse = c.moe.sparse_layers(c.n_layer);
    extras += fmt::format("; MoE in {} of {} layers: {}; {:.2f}M active parameters", sparse, c.n_layer, describe(c.moe),
                          llama_parameter_count(c, true) / 1e6);
  }
  return fmt::format(
      "{}: {} layers, {} heads ({} KV heads, head size {}), hidden {}, MLP {}, T <= {}, vocab {} (padded to {}), rope_theta {}, "
      "{} embeddings{}; {:.2f}M parameters",
      c.model_type, c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.n_embd, c.intermediate_size, c.max_position_embeddings, c.vocab_size,
      c.padded_vocab_size, c.rope_theta, c.tie_word_embeddings ? "tied" : "untied", extras, static_cast<double>(parameter_count(c)) / 1e6);
}

}  // namespace dstrain
