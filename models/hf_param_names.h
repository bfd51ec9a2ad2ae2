// A model's parameters as its Hugging Face model names them — what DeepSpeed's AutoTP matches the
// patterns of tensor_parallel.partition_config and preset_model against (re.match over a module's
// name + ".weight") — each with the kind of module that holds it there and how dstrain cuts it
// across tensor-parallel ranks. The pre-flight (train/tensor_parallel_plan.h) checks the config's
// partition rules against them (docs/parallelism.md "partition_config").
//
// A family whose parameters are Hugging Face's one for one needs nothing of its own
// (hf_param_names_of derives the table from its layers); a family whose layers fuse what Hugging
// Face keeps apart (Llama's qkv_proj = q_proj | k_proj | v_proj) lists each Hugging Face tensor
// as a block of dstrain's parameter (Architecture::hf_param_names).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/layer.h"
#include "models/param_split.h"
#include "ops/tensor.h"

namespace dstrain {

// What holds the tensor in the Hugging Face model, as AutoTP routes it: a linear layer's 2-D weight
// (nn.Linear, GPT-2's Conv1D: the subject of a layer spec), an nn.Embedding's table (cut along its
// hidden dimension when a spec names it), a norm's 1-D weight and a bias (never cut by a spec: a
// bias goes with its module's weight).
enum class HfModuleKind { linear, embedding, norm, bias };

// "linear weight", "embedding", "norm weight", "bias".
const char* hf_module_kind_name(HfModuleKind kind);

struct HfParamName {
  // The name in the Hugging Face *ForCausalLM model: "model.layers.0.self_attn.q_proj.weight",
  // "transformer.h.0.attn.c_attn.weight", "lm_head.weight" (kept when tied: the module exists).
  std::string name;
  // Other spellings of the same tensor a model may carry (GPT2Model's "h.0.attn.c_attn.weight").
  std::vector<std::string> aliases;
  HfModuleKind module = HfModuleKind::linear;
  // The tensor's shape as an nn.Linear / nn.Embedding holds it: (out, in), (vocabulary, hidden) with
  // the real vocabulary; (n) for a bias or a norm. GPT-2's Conv1D weights are read as nn.Linear's.
  Shape shape;
  // dstrain's cut of this tensor (for a block of a fused parameter, that block's part alone).
  ParamSplit split;
  // dstrain's parameter (a ParamSpec name) this tensor is, or a block of.
  std::string param;
  // Replicated, but its gradient is formed from a rank's own heads and summed over the
  // tensor-parallel group by the layer (Qwen3's q/k norm weights): what AutoTP's grad_allreduce does.
  bool grad_summed = false;

  // The module's name: `name` without ".weight" / ".bias".
  std::string module_name() const;
};

// The table of a model whose parameter names are its Hugging Face names (the layers of one rank,
// whole: make_layers()): the first layer's matrices are embeddings, every other matrix a linear
// weight (a tied one too), a 1-D parameter named "*.bias" a bias and any other a norm weight.
// `vocab_size` replaces the padded rows of vocabulary-split tensors (the Hugging Face table has the
// real vocabulary).
std::vector<HfParamName> hf_param_names_of(const std::vector<std::unique_ptr<Layer>>& layers, std::int64_t vocab_size);

}  // namespace dstrain
