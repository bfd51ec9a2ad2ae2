// GPT-2 weights in the Hugging Face layout (model.safetensors of GPT2LMHeadModel / GPT2Model).
//
// Names: wte.weight, wpe.weight, h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.
// {weight, bias}, ln_f.{weight, bias}; read with or without a "transformer." prefix. HF's Conv1D
// stores c_attn / c_proj / c_fc weights as (in, out); dstrain keeps nn.Linear's (out, in), so they
// are transposed on the way in and out. wte is stored with the real vocabulary (V rows); dstrain's
// padded rows [V, Vp) are zero after import and are not written. Ignored on import: the attention
// mask buffers h.N.attn.bias / h.N.attn.masked_bias and lm_head.weight (tied to wte). Any other
// unexpected tensor, a missing one, or a wrong shape is an Error naming the tensor, the shape
// expected and the shape found.
#pragma once

#include <filesystem>
#include <functional>
#include <string_view>
#include <string>

#include "ops/dtype.h"
#include "ops/tensor.h"
#include "models/gpt2/gpt2_config.h"

namespace dstrain {

class Gpt2Model;

// Our parameter with this HF name (our layout, shape as in the layers' ParamSpecs, any floating
// dtype, on the cpu).
using Gpt2ParamLookup = std::function<Tensor(const std::string& name)>;

// Reads every GPT-2 tensor of `file` into the parameters (converted to their dtype).
void import_gpt2_safetensors(const std::filesystem::path& file, const Gpt2Config& cfg, const Gpt2ParamLookup& param);
// The same from a torch.save state dict (formats/torch_state_dict.h: Hugging Face's
// pytorch_model.bin, DeepSpeed's mp_rank_00_model_states.pt with its "module", zero_to_fp32's
// output), read without running any of its code; "module." prefixes are dropped.
void import_gpt2_torch(const std::filesystem::path& file, const Gpt2Config& cfg, const Gpt2ParamLookup& param);
// Either, by the file's first bytes (a zip: torch.save; otherwise safetensors); a folder is read as
// hf_weights_file() resolves it (its model.safetensors).
void import_gpt2_weights(const std::filesystem::path& path, const Gpt2Config& cfg, const Gpt2ParamLookup& param);

// Writes the parameters in the HF layout with dtype `file_dtype` (F32 by default), atomically.
// Metadata {"format": "pt"} as transformers' save_pretrained writes it.
void export_gpt2_safetensors(const std::filesystem::path& file, const Gpt2Config& cfg, const Gpt2ParamLookup& param, DType file_dtype = DType::fp32);

// The same for a Gpt2Model's own parameters.
void load_gpt2_weights(Gpt2Model& model, const std::filesystem::path& file);
void save_gpt2_weights(const Gpt2Model& model, const std::filesystem::path& file, DType file_dtype = DType::fp32);

}  // namespace dstrain
