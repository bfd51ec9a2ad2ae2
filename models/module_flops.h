// ModuleFlops: the forward pass of one micro-batch as a tree of modules with their parameters,
// multiply-accumulates and FLOPs — what DeepSpeed's flops profiler prints (train/monitor/flops.h
// formats it). Each model family builds its own tree in its Hugging Face module names
// (Architecture::forward_flops), with the conventions below so that families compare.
//
//   Linear(in, out)        2·tokens·in·out (2 FLOPs per multiply-accumulate) + tokens·out (bias)
//   attention QKᵀ and AV   the full T×T product per head, as a dense kernel computes it
//   softmax                one FLOP per score (DeepSpeed's convention)
//   LayerNorm              5 per element (DeepSpeed's estimate with affine); RMSNorm 4
//   activations            1 per element; residual adds 1 per element
//   embedding lookups, dropout, the loss: 0 (DeepSpeed counts none of them)
// MACs count the multiply-accumulates of the matmuls only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain {

// One module of the model tree; figures include the module's children (DeepSpeed's
// get_module_flops), `own_*` only what the module computes itself (e.g. attention's QKᵀ).
struct ModuleFlops {
  std::string name;  // attribute name as in the Hugging Face model: "wte", "h", "0", "attn", ...
  std::string type;  // "GPT2", "Embedding", "ModuleList", "Block", "Attention", "Linear", ...
  std::int64_t params = 0;
  std::int64_t macs = 0;
  std::int64_t flops = 0;
  std::int64_t own_macs = 0;
  std::int64_t own_flops = 0;
  std::string note;  // e.g. "weight tied to wte"
  std::vector<ModuleFlops> children;
};

// Builders for the trees. A leaf does its own work only.
ModuleFlops flops_leaf(std::string name, std::string type, std::int64_t params, std::int64_t macs, std::int64_t flops);
// A parent: its own work plus its children's (params, macs and flops summed).
ModuleFlops flops_parent(std::string name, std::string type, std::vector<ModuleFlops> children, std::int64_t own_macs = 0,
                         std::int64_t own_flops = 0);
// nn.Linear over `tokens` rows: the matmul plus the bias add (bias false: no bias parameters or adds).
ModuleFlops flops_linear(std::string name, std::int64_t tokens, std::int64_t in, std::int64_t out, bool bias = true);
// LayerNorm with affine weight and bias over `c` channels.
ModuleFlops flops_layernorm(std::string name, std::int64_t tokens, std::int64_t c);
// RMSNorm with a weight over `c` channels: square, mean, rsqrt-scale, weight (4 per element). `type`: the
// module's class name in the family's Hugging Face model (e.g. "LlamaRMSNorm").
ModuleFlops flops_rmsnorm(std::string name, std::string type, std::int64_t tokens, std::int64_t c);

}  // namespace dstrain
