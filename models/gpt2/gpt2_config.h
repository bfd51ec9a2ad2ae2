// Gpt2Config: the shape of a GPT-2 model, from a preset name or a Hugging Face config.json.
//
// Specs accepted by model_config_from_spec:
//   gpt2:d6 gpt2:d12 gpt2:d24 gpt2:d36 gpt2:d48   llm.c's descriptors (d12 = GPT-2 124M, d24 = 350M,
//                                                 d36 = 774M, d48 = 1558M; d6 an unofficial 30M):
//                                                 vocab 50257 padded to 50304, n_positions 1024,
//                                                 dropout 0 (llm.c trains without dropout)
//   gpt2:tiny                                     = gpt2:L2-C16-H2-V61-T8, for tests and quick runs
//   gpt2:L<n>-C<c>-H<h>[-V<v>][-T<t>]             any size: n_layer, n_embd, n_head, vocab (default
//                                                 50257), n_positions (default 1024); e.g.
//                                                 gpt2:L4-C128-H4-V512-T64
//   <path>/config.json (any path that names a file) a Hugging Face GPT-2 config
// padded_vocab_size is vocab_size rounded up to a multiple of 128 in every case.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "models/vocab.h"

namespace dstrain {

struct Gpt2Config {
  std::int64_t n_layer = 12;
  std::int64_t n_head = 12;
  std::int64_t n_embd = 768;
  std::int64_t n_positions = 1024;         // max T
  std::int64_t vocab_size = 50257;         // V: real tokens
  std::int64_t padded_vocab_size = 50304;  // Vp: V rounded up to a multiple of 128 (zero rows in wte)
  float layer_norm_epsilon = 1e-5f;
  float resid_pdrop = 0.0f;
  float embd_pdrop = 0.0f;
  float attn_pdrop = 0.0f;
};

// Throws Error naming the field when the config is inconsistent (n_embd % n_head, sizes <= 0,
// Vp < V, dropout outside [0, 1)).
void validate(const Gpt2Config& cfg);

// A preset, a descriptor or a config.json path (see the top of this file). Throws Error naming the
// spec and the accepted forms.
Gpt2Config model_config_from_spec(std::string_view spec);

// Parses the text of a Hugging Face GPT-2 config.json; `source` names it in errors.
Gpt2Config gpt2_config_from_hf_json(std::string_view json_text, std::string_view source);

// The Hugging Face config.json of this model (GPT2LMHeadModel; every key that shapes it), which
// gpt2_config_from_hf_json reads back into an equal config.
std::string gpt2_hf_config_json(const Gpt2Config& cfg);

// Parameters as GPT-2 counts them (real vocabulary): d12 = 124,439,808.
std::int64_t parameter_count(const Gpt2Config& cfg);
// Parameters as stored, with the padded vocabulary rows of wte (llm.c: d12 = 124,475,904).
std::int64_t parameter_count_padded(const Gpt2Config& cfg);

// One line for the top of a run, e.g.
// "GPT-2: 12 layers, 12 heads, 768 channels, T <= 1024, vocab 50257 (padded to 50304); 124.44M
//  parameters (124,439,808; 124,475,904 stored with the 47 padding rows of wte)"
std::string describe(const Gpt2Config& cfg);

}  // namespace dstrain
