// The model-family interface: everything dstrain asks of a kind of model beyond the Layer
// interface (models/layer.h). A family (GPT-2, the Llama family, an embedding program's own) is a
// ModelFamily that reads its specs and config files, and an Architecture per model shape that
// builds the layers and answers for them: sizes, FLOPs, weights in the family's Hugging Face
// layout, and — through each layer's ParamSpecs and type_name() — how every parameter may be
// split across tensor- or expert-parallel ranks (models/param_split.h) and how the layers group
// into pipeline stages (models/stage_partition.h). No file outside a family's folder names the
// family: the engine, the trainer and the CLI see only this interface.
//
// Adding a family (docs/design.md "Adding a model family"): a folder models/<name>/ with its
// config, its layers and a ModelFamily, and one line in models/model_registry.cpp — or, from an
// application that embeds dstrain, dstrain::register_model_family(...) before the first spec is
// read (examples/consumer does so).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "models/expert_parallel.h"
#include "models/hf_param_names.h"
#include "models/layer.h"
#include "models/module_flops.h"
#include "models/moe_config.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "ops/device.h"
#include "ops/dtype.h"
#include "ops/tensor.h"

namespace dstrain {

class ModelFamily;

// Our parameter with this name (a ParamSpec name; a tied name resolves to its owner), as a host
// tensor of the parameter's shape: what weight import writes into and export reads from.
using ParamLookup = std::function<Tensor(const std::string& name)>;

// One model's shape within its family: GPT-2 d12, a Llama config.json.
class Architecture {
 public:
  virtual ~Architecture() = default;
  Architecture() = default;
  Architecture(const Architecture&) = delete;
  Architecture& operator=(const Architecture&) = delete;

  virtual const ModelFamily& family() const = 0;

  // ---- shape ----
  virtual std::int64_t n_layer() const = 0;      // transformer blocks
  virtual std::int64_t n_embd() const = 0;       // width of the residual stream between layers
  virtual std::int64_t n_positions() const = 0;  // the longest sequence (T <= n_positions)
  virtual std::int64_t vocab_size() const = 0;   // token ids are < vocab_size
  // Rows of the embedding as stored (the built-in families pad to a multiple of 128; models/vocab.h).
  virtual std::int64_t padded_vocab_size() const { return vocab_size(); }
  // The config key that bounds T, for messages: GPT-2's "n_positions", Llama's "max_position_embeddings".
  virtual std::string n_positions_key() const { return "n_positions"; }
  // Parameters with the real vocabulary, tied weights once (a model card's figure), and as stored
  // (padded rows too). In double: a descriptor may ask for more than an int64 holds; exact below 2^53.
  virtual double parameter_count() const = 0;
  virtual double stored_parameter_count() const = 0;
  // One line for the top of a run.
  virtual std::string describe() const = 0;

  // ---- the layers, in the order the engine runs them ----
  virtual std::vector<std::unique_ptr<Layer>> make_layers() const = 0;
  // ---- tensor parallelism (models/tensor_parallel.h, docs/parallelism.md) ----
  // Error naming the config key and the limit when the layers cannot be cut across `ranks`
  // tensor-parallel ranks (what DeepSpeed's AutoTP refuses, or what this family's layers cannot
  // do). The default: only ranks == 1, with an Error naming the family otherwise.
  virtual void check_tensor_parallel(int ranks) const;
  // The layers of tensor-parallel rank tp.rank of tp.ranks: each cut parameter reduced to the
  // rank's piece (ParamSpec::piece), the layers calling their group through
  // ForwardArgs::tensor_parallel. The default: make_layers() for one rank, else
  // check_tensor_parallel's Error.
  virtual std::vector<std::unique_ptr<Layer>> make_tensor_parallel_layers(TensorParallelRank tp) const;
  // The same shape with n_layer transformer blocks, all alike: the memory estimate
  // (train/memory_estimate.h) builds the layers of a one- and a two-block copy to count one
  // tensor-parallel rank's parameters from the layers' own cut (their difference is one block, of
  // which there are n_layer()), since building every block of a large model — or of an absurd
  // descriptor such as gpt2:L4294967296-C4294967296-H2 — would take minutes or never end. nullptr
  // (the default): the family has no such copy, and the estimate builds every layer.
  virtual std::shared_ptr<const Architecture> with_n_layer(std::int64_t n_layer) const;
  // ---- the Hugging Face names: what tensor_parallel.partition_config's patterns match ----
  // The model_type of the family's Hugging Face config ("gpt2", "llama", "qwen2"): what a layer
  // spec's model_types name. The default: the family's name.
  virtual std::string hf_model_type() const;
  // Every parameter as the Hugging Face model names it, with how dstrain cuts it
  // (models/hf_param_names.h). The default: hf_param_names_of(make_layers(), vocab_size()), for a
  // family whose parameter names are Hugging Face's.
  virtual std::vector<HfParamName> hf_param_names() const;
  // ---- sequence parallelism (models/sequence_parallel.h) ----
  // Error naming the key when `sp_ranks` sequence-parallel ranks cannot split this model's
  // attention with `tp_ranks` tensor-parallel ranks (DeepSpeed-Ulysses: each tensor-parallel
  // rank's heads and key/value heads divide by sp_ranks). The default: only sp_ranks == 1.
  virtual void check_sequence_parallel(int sp_ranks, int tp_ranks) const;
  // The layers of tensor-parallel rank tp and sequence-parallel rank sp. The default: the tensor-
  // parallel layers for one sequence-parallel rank, else check_sequence_parallel's Error.
  virtual std::vector<std::unique_ptr<Layer>> make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp) const;
  // ---- expert parallelism (models/expert_parallel.h) ----
  // Error naming expert_parallel.autoep_size when the model's experts cannot be spread over
  // `ranks` expert-parallel ranks (no experts, or a count that does not divide). The default:
  // only ranks == 1 (the family has no experts).
  virtual void check_expert_parallel(int ranks) const;
  // The layers of tensor-parallel rank tp, sequence-parallel rank sp and expert-parallel rank ep:
  // each sparse layer holding ep's E/EP experts (ParamSpec::piece), calling its group through
  // ForwardArgs::expert_parallel; everything else as make_parallel_layers(tp, sp). The default:
  // make_parallel_layers(tp, sp) for one expert-parallel rank, else check_expert_parallel's Error.
  // What a rank builds only: sizes, FLOPs and Hugging Face names stay the whole model's.
  virtual std::vector<std::unique_ptr<Layer>> make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep) const;
  // ---- mixtures of experts (models/moe_config.h) ----
  // The model's mixture-of-experts settings; nullptr (the default) for a model without experts.
  virtual const MoeConfig* moe_config() const { return nullptr; }
  // The same model with `moe` for its mixture-of-experts settings (what a config's expert_parallel
  // routing keys ask for: top_k, score_func, ...), validated. The default: an Error naming the family,
  // which has no experts.
  virtual std::shared_ptr<const Architecture> with_moe_config(const MoeConfig& moe) const;
  // Error naming the config key when this model cannot train sequences of T tokens on `device`.
  // The default: 1 <= T <= n_positions().
  virtual void check_sequence(std::int64_t T, const Device& device) const;

  // ---- FLOPs ----
  // Training FLOPs per token, forward and backward, for MFU: llm.c's and PaLM's 6·N + 6·L·C·T
  // by default (N stored parameters; the attention term counts the causal half of QKᵀ and AV).
  virtual double flops_per_token(std::int64_t T) const;
  // The forward pass of a micro-batch of B sequences of T tokens as the flops profiler prints
  // it. The default: one module per layer, 2 FLOPs per parameter of its matrices per token (a
  // family's own tree adds attention and the element-wise work).
  virtual ModuleFlops forward_flops(std::int64_t B, std::int64_t T) const;

  // ---- files ----
  // The architecture as JSON text that family().from_config_json() reads back into an equal one:
  // what a training checkpoint's manifest keeps, so that `consolidate` rebuilds the model. For the
  // built-in families, the Hugging Face config.json.
  virtual std::string config_json() const = 0;
  // Weights in the family's Hugging Face layout: read every tensor of `path` into `param`, or write
  // them from it with dtype `file_dtype` (atomically). The default: an Error saying the family
  // has no weight files.
  virtual void import_weights(const std::filesystem::path& path, const ParamLookup& param) const;
  virtual void export_weights(const std::filesystem::path& path, const ParamLookup& param, DType file_dtype = DType::fp32) const;
};

// A kind of model: its name, the specs and config files it reads.
class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  ModelFamily() = default;
  ModelFamily(const ModelFamily&) = delete;
  ModelFamily& operator=(const ModelFamily&) = delete;

  // "gpt2": its specs start with "gpt2:" and checkpoints name the family so.
  virtual std::string name() const = 0;
  // The forms of its specs, for --help and errors, e.g. "gpt2:d12, gpt2:L<n>-C<c>-H<h>[-V<v>][-T<t>]".
  virtual std::string spec_forms() const = 0;
  // A spec with this family's prefix. Error naming the spec and the accepted forms.
  virtual std::shared_ptr<const Architecture> from_spec(std::string_view spec) const = 0;
  // True when a Hugging Face config.json (its text, parsed without error) is one this family
  // reads: its model_type or architectures name it.
  virtual bool reads_hf_config(std::string_view json_text) const;
  // The config.json files it reads, by model_type and architecture, for the registry's messages:
  // "\"gpt2\" (GPT2LMHeadModel)". Empty (the default) when it reads none.
  virtual std::string hf_config_forms() const;
  // An architecture from config JSON text: a Hugging Face config.json, or what
  // Architecture::config_json() wrote. `source` names it in errors.
  virtual std::shared_ptr<const Architecture> from_config_json(std::string_view json_text, std::string_view source) const = 0;
};

}  // namespace dstrain
