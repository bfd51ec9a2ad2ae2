#include "models/llama/llama_config.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string>

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
    "config.json of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM";

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
};

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

}  // namespace

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
    return j.is_object() && family_of(j) != nullptr;
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
  const Family* fam = family_of(j);
  if (fam == nullptr) {
    fail(
        "model config '{}': model_type {} / architectures {} is not a Llama-family model dstrain builds; it builds llama "
        "(LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM) and qwen3 (Qwen3ForCausalLM)",
        source, j.contains("model_type") ? j["model_type"].dump() : "(none)", j.contains("architectures") ? j["architectures"].dump() : "(none)");
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
  const bool qwen = mt == "qwen2" || mt == "qwen3";

  LlamaConfig c;
  c.model_type = mt;
  // transformers' defaults for each family where a key is absent.
  c.max_position_embeddings = mt == "llama" ? 2048 : (mt == "mistral" ? 4096 * 32 : 32768);
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0;
  r.get_int("num_hidden_layers", c.n_layer, true);
  r.get_int("num_attention_heads", c.n_head, true);
  r.get_int("hidden_size", c.n_embd, true);
  r.get_int("intermediate_size", c.intermediate_size, true);
  r.get_int("vocab_size", c.vocab_size, true);
  c.n_kv_head = c.n_head;
  r.get_int("num_key_value_heads", c.n_kv_head, false);
  if (c.n_head <= 0) fail("model config '{}': num_attention_heads = {} must be positive", source, c.n_head);
  c.head_dim = mt == "qwen3" ? 128 : c.n_embd / c.n_head;
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
  if (mt == "llama" || mt == "qwen3") {
    r.get_bool("attention_bias", attention_bias);
    c.qkv_bias = c.o_bias = attention_bias;
  }
  if (mt == "llama") r.get_bool("mlp_bias", c.mlp_bias);
  if (mt == "qwen2") c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
  if (mt == "qwen3") c.qk_norm = true;
  // Sliding windows: Mistral applies `sliding_window` (default 4096) unless it is null; Qwen only
  // with use_sliding_window (then from layer max_window_layers on; refused when it would act).
  if (mt == "mistral") {
    r.use("sliding_window");
    if (!j.contains("sliding_window"))
      c.sliding_window = 4096;
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
  if (mt == "qwen3" || mt == "qwen2") {
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

std::int64_t parameter_count(const LlamaConfig& c) {
  const std::int64_t C = c.n_embd, I = c.intermediate_size, HD = c.head_dim;
  std::int64_t per_layer = 2 * C;                                 // the two RMSNorm weights
  per_layer += c.qkv_dim() * C + (c.qkv_bias ? c.qkv_dim() : 0);  // q, k, v
  per_layer += C * c.q_dim() + (c.o_bias ? C : 0);                // o
  per_layer += 3 * C * I + (c.mlp_bias ? 2 * I + C : 0);          // gate, up, down
  per_layer += c.qk_norm ? 2 * HD : 0;
  const std::int64_t embed = c.vocab_size * C;
  return embed + (c.tie_word_embeddings ? 0 : embed) + c.n_layer * per_layer + C;
}

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
  if (fam == nullptr) fail("Llama config: model_type \"{}\" is not llama, mistral, qwen2 or qwen3", c.model_type);
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
  } else if (c.model_type == "qwen3") {
    j["attention_bias"] = c.qkv_bias;
  }
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json(nullptr);
  } else if (c.model_type == "qwen2" || c.model_type == "qwen3") {
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
  if (c.qk_norm) extras += ", q/k RMSNorm";
  if (c.rope_scaling.kind == RopeScaling::Kind::linear) extras += fmt::format(", rope scaling linear x{}", c.rope_scaling.factor);
  if (c.rope_scaling.kind == RopeScaling::Kind::llama3) extras += fmt::format(", rope scaling llama3 x{}", c.rope_scaling.factor);
  if (c.sliding_window > 0) extras += fmt::format(", sliding window {}", c.sliding_window);
  return fmt::format(
      "{}: {} layers, {} heads ({} KV heads, head size {}), hidden {}, MLP {}, T <= {}, vocab {} (padded to {}), rope_theta {}, "
      "{} embeddings{}; {:.2f}M parameters",
      c.model_type, c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.n_embd, c.intermediate_size, c.max_position_embeddings, c.vocab_size,
      c.padded_vocab_size, c.rope_theta, c.tie_word_embeddings ? "tied" : "untied", extras, static_cast<double>(parameter_count(c)) / 1e6);
}

}  // namespace dstrain
