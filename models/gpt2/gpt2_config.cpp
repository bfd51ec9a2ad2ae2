#include "models/gpt2/gpt2_config.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/error.h"
#include "formats/hf_config_json.h"

namespace dstrain {
namespace {

constexpr const char* kSpecForms =
    "gpt2:d6, gpt2:d12, gpt2:d24, gpt2:d36, gpt2:d48, gpt2:tiny, gpt2:L<n>-C<c>-H<h>[-V<v>][-T<t>] (e.g. gpt2:L4-C128-H4-V512-T64), "
    "or the path of a Hugging Face config.json";

Gpt2Config make(std::int64_t L, std::int64_t C, std::int64_t NH, std::int64_t V = 50257, std::int64_t maxT = 1024) {
  Gpt2Config c;
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = NH;
  c.vocab_size = V;
  c.n_positions = maxT;
  c.padded_vocab_size = padded_vocab(V);
  return c;
}

bool parse_int(std::string_view s, std::int64_t& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// "gpt2:L0-C8-H2": zero is a number, but no model has zero layers (or channels, heads, tokens,
// positions); the message names the size the letter stands for.
[[noreturn]] void fail_zero_size(std::string_view spec, char letter) {
  const char* name = letter == 'L' ? "n_layer" : letter == 'C' ? "n_embd" : letter == 'H' ? "n_head" : letter == 'V' ? "vocab_size" : "n_positions";
  fail("{} ({}) must be at least 1 in {}", name, letter, spec);
}

// "L4-C128-H4-V512-T64" (V and T optional, any order after L, C, H are all given).
Gpt2Config parse_descriptor(std::string_view spec, std::string_view body) {
  std::int64_t L = -1, C = -1, H = -1, V = 50257, T = 1024;
  bool seen[5] = {false, false, false, false, false};  // L, C, H, V, T
  std::size_t pos = 0;
  while (pos <= body.size()) {
    const std::size_t dash = body.find('-', pos);
    const std::string_view part = body.substr(pos, dash == std::string_view::npos ? std::string_view::npos : dash - pos);
    std::int64_t v = 0;
    const bool parsed = part.size() >= 2 && parse_int(part.substr(1), v);
    const bool known_letter = !part.empty() && std::string_view("LCHVT").find(part[0]) != std::string_view::npos;
    if (parsed && v == 0 && known_letter) fail_zero_size(spec, part[0]);
    if (!parsed || v <= 0) {
      const bool digits = part.size() >= 2 && part.substr(1).find_first_not_of("0123456789") == std::string_view::npos;
      if (digits && !parsed) fail("model spec '{}': part '{}' is too large a number (at most 2^63 - 1, and far less fits in memory)", spec, part);
      fail("model spec '{}': part '{}' is not a letter L, C, H, V or T followed by a positive number; accepted forms: {}", spec, part, kSpecForms);
    }
    if (const std::size_t at = std::string_view("LCHVT").find(part[0]); at != std::string_view::npos) {
      if (seen[at]) fail("model spec '{}': {} is given twice; give each of L, C, H, V and T at most once", spec, part[0]);
      seen[at] = true;
    }
    switch (part[0]) {
      case 'L':
        L = v;
        break;
      case 'C':
        C = v;
        break;
      case 'H':
        H = v;
        break;
      case 'V':
        V = v;
        break;
      case 'T':
        T = v;
        break;
      default:
        fail(
            "model spec '{}': part '{}' starts with '{}', but only L (layers), C (channels), H (heads), V (vocab) and T (max sequence) "
            "are known; accepted forms: {}",
            spec, part, part[0], kSpecForms);
    }
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  if (L < 0 || C < 0 || H < 0) fail("model spec '{}': L<layers>, C<channels> and H<heads> are all required, e.g. gpt2:L4-C128-H4", spec);
  return make(L, C, H, V, T);
}

}  // namespace

void validate(const Gpt2Config& c) {
  auto positive = [](std::int64_t v, const char* name) {
    if (v <= 0) fail("GPT-2 config: {} = {} must be positive", name, v);
  };
  positive(c.n_layer, "n_layer");
  positive(c.n_head, "n_head");
  positive(c.n_embd, "n_embd");
  positive(c.n_positions, "n_positions");
  positive(c.vocab_size, "vocab_size");
  if (c.n_embd % c.n_head != 0) {
    fail("GPT-2 config: n_embd = {} is not divisible by n_head = {}; choose n_head dividing n_embd (head size = n_embd / n_head)", c.n_embd,
         c.n_head);
  }
  if (c.padded_vocab_size < c.vocab_size) {
    fail("GPT-2 config: padded_vocab_size = {} is smaller than vocab_size = {}; use padded_vocab(vocab_size) = {}", c.padded_vocab_size, c.vocab_size,
         padded_vocab(c.vocab_size));
  }
  auto prob = [](float p, const char* name) {
    if (!(p >= 0.0f && p < 1.0f)) fail("GPT-2 config: {} = {} must be in [0, 1)", name, p);
  };
  prob(c.resid_pdrop, "resid_pdrop");
  prob(c.embd_pdrop, "embd_pdrop");
  prob(c.attn_pdrop, "attn_pdrop");
  if (!(c.layer_norm_epsilon > 0.0f)) fail("GPT-2 config: layer_norm_epsilon = {} must be positive", c.layer_norm_epsilon);
}

Gpt2Config gpt2_config_from_hf_json(std::string_view json_text, std::string_view source) {
  nlohmann::json j = parse_hf_config_json(json_text, source, "a Hugging Face GPT-2 config.json");

  auto get_int = [&](const char* key, std::int64_t& out, bool required) {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) fail("model config '{}': key '{}' is missing; a GPT-2 config.json needs it", source, key);
      return false;
    }
    const auto& v = j[key];
    if (!v.is_number_integer()) fail("model config '{}': '{}' must be an integer, got {}", source, key, v.dump());
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail("model config '{}': '{}' is {}, too large a number (at most 2^63 - 1, and far less fits in memory)", source, key, v.dump());
    }
    out = v.get<std::int64_t>();
    return true;
  };
  auto get_float = [&](const char* key, float& out) {
    if (!j.contains(key) || j[key].is_null()) return;  // HF GPT2Config default stays
    const auto& v = j[key];
    if (!v.is_number()) fail("model config '{}': '{}' must be a number, got {}", source, key, v.dump());
    out = v.get<float>();
  };

  if (j.contains("model_type")) {
    const auto& mt = j["model_type"];
    if (!mt.is_string() || mt.get<std::string>() != "gpt2") {
      fail("model config '{}': model_type is {} but a GPT-2 config.json has \"gpt2\" (docs/models.md lists the families dstrain builds)", source,
           mt.dump());
    }
  }
  if (j.contains("activation_function")) {
    const auto& af = j["activation_function"];
    const std::string a = af.is_string() ? af.get<std::string>() : af.dump();
    if (a != "gelu_new" && a != "gelu_pytorch_tanh") {
      fail("model config '{}': activation_function is \"{}\" but only \"gelu_new\" (GELU, tanh approximation, as GPT-2) is supported", source, a);
    }
  }

  // Keys of HF's GPT2Config that change the model dstrain would build: each is honoured (the shape,
  // dropouts, layer_norm_epsilon, activation_function, n_inner above and below) or refused here
  // when it asks for something else than GPT-2's own architecture — never silently ignored.
  // (Keys of the other heads, summary_*, and of generation, use_cache / bos / eos, do not change
  // the language model.)
  const auto require_flag = [&](const char* key, bool gpt2_value, const char* why) {
    if (!j.contains(key) || j[key].is_null()) return;
    const auto& v = j[key];
    if (!v.is_boolean()) fail("model config '{}': '{}' must be true or false, got {}", source, key, v.dump());
    if (v.get<bool>() != gpt2_value) {
      fail("model config '{}': {} is {} but dstrain's GPT-2 {}; set it to {} or remove it", source, key, v.dump(), why,
           gpt2_value ? "true" : "false");
    }
  };
  require_flag("tie_word_embeddings", true, "ties the LM head to the token embedding (wte), as GPT-2 does");
  require_flag("scale_attn_weights", true, "scales attention scores by 1/sqrt(head size), as GPT-2 does");
  require_flag("scale_attn_by_inverse_layer_idx", false, "does not scale attention by 1/(layer index + 1) (Stanford Mistral's GPT-2 variant)");
  require_flag("reorder_and_upcast_attn", false, "does not reorder the attention's scaling and upcast (Stanford Mistral's GPT-2 variant)");
  require_flag("add_cross_attention", false, "is a decoder-only model without cross-attention");
  if (j.contains("initializer_range") && !j["initializer_range"].is_null()) {
    const auto& v = j["initializer_range"];
    if (!v.is_number() || v.get<double>() != 0.02) {
      fail(
          "model config '{}': initializer_range is {} but dstrain initialises GPT-2's weights with a standard deviation of 0.02 (its "
          "residual projections scaled by 1/sqrt(2 n_layer), as GPT-2 and llm.c do); set it to 0.02 or remove it",
          source, v.dump());
    }
  }

  // HF GPT2Config's defaults for the optional keys (dropouts 0.1, eps 1e-5).
  Gpt2Config c;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.1f;
  get_int("n_layer", c.n_layer, true);
  get_int("n_head", c.n_head, true);
  get_int("n_embd", c.n_embd, true);
  get_int("vocab_size", c.vocab_size, true);
  if (!get_int("n_positions", c.n_positions, false) && !get_int("n_ctx", c.n_positions, false)) {
    fail("model config '{}': neither 'n_positions' nor 'n_ctx' is given; one of them sets the maximum sequence length", source);
  }
  std::int64_t n_inner = 0;
  if (get_int("n_inner", n_inner, false) && n_inner != 4 * c.n_embd) {
    fail("model config '{}': n_inner = {} but only the GPT-2 MLP width 4 * n_embd = {} is supported; remove n_inner or set it to null", source,
         n_inner, 4 * c.n_embd);
  }
  get_float("layer_norm_epsilon", c.layer_norm_epsilon);
  get_float("resid_pdrop", c.resid_pdrop);
  get_float("embd_pdrop", c.embd_pdrop);
  get_float("attn_pdrop", c.attn_pdrop);
  c.padded_vocab_size = padded_vocab(c.vocab_size);
  try {
    validate(c);
  } catch (const Error& e) {
    fail("model config '{}': {}", source, e.what());
  }
  return c;
}

Gpt2Config model_config_from_spec(std::string_view spec) {
  constexpr std::string_view prefix = "gpt2:";
  Gpt2Config c;
  if (spec.substr(0, prefix.size()) == prefix) {
    const std::string_view name = spec.substr(prefix.size());
    if (name == "d6")
      c = make(6, 384, 6);
    else if (name == "d12")
      c = make(12, 768, 12);
    else if (name == "d24")
      c = make(24, 1024, 16);
    else if (name == "d36")
      c = make(36, 1280, 20);
    else if (name == "d48")
      c = make(48, 1600, 25);
    else if (name == "tiny")
      c = make(2, 16, 2, 61, 8);
    else if (!name.empty() && name[0] == 'L')
      c = parse_descriptor(spec, name);
    else
      fail("unknown model spec '{}'; accepted forms: {}", spec, kSpecForms);
    try {
      validate(c);
    } catch (const Error& e) {
      fail("model spec '{}': {}", spec, e.what());
    }
    return c;
  }
  const std::filesystem::path p = model_config_path(spec, "a known preset", kSpecForms);
  return gpt2_config_from_hf_json(read_model_config_file(p), p.string());
}

std::string gpt2_hf_config_json(const Gpt2Config& c) {
  const nlohmann::json j = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_embd", c.n_embd},
      {"n_positions", c.n_positions},
      {"vocab_size", c.vocab_size},
      {"layer_norm_epsilon", c.layer_norm_epsilon},
      {"resid_pdrop", c.resid_pdrop},
      {"embd_pdrop", c.embd_pdrop},
      {"attn_pdrop", c.attn_pdrop},
      {"activation_function", "gelu_new"},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", true},
  };
  return j.dump(2);
}

std::int64_t parameter_count(const Gpt2Config& c) {
  const std::int64_t C = c.n_embd;
  const std::int64_t per_layer = 12 * C * C + 13 * C;  // ln_1 2C, c_attn 3C²+3C, c_proj C²+C, ln_2 2C, c_fc 4C²+4C, c_proj 4C²+C
  return c.vocab_size * C + c.n_positions * C + c.n_layer * per_layer + 2 * C;
}

std::int64_t parameter_count_padded(const Gpt2Config& c) { return parameter_count(c) + (c.padded_vocab_size - c.vocab_size) * c.n_embd; }

std::string describe(const Gpt2Config& c) {
  const std::int64_t n = parameter_count(c), np = parameter_count_padded(c);
  auto grouped = [](std::int64_t v) {
    std::string s = std::to_string(v), out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
      out += s[i];
    }
    return out;
  };
  return fmt::format(
      "GPT-2: {} layers, {} heads, {} channels, T <= {}, vocab {} (padded to {}); {:.2f}M parameters ({}; {} stored with the {} padding rows "
      "of wte); dropout embd {} resid {} attn {}",
      c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size, c.padded_vocab_size, static_cast<double>(n) / 1e6, grouped(n), grouped(np),
      c.padded_vocab_size - c.vocab_size, c.embd_pdrop, c.resid_pdrop, c.attn_pdrop);
}

}  // namespace dstrain
