// Helpers shared by the engine-level ZeRO tests (test_zero_equivalence.cpp, test_zero_memory.cpp,
// test_zero_comm.cpp): a ds_config for a ZeRO run, a multi-rank training run on local ranks
// (zero/local_communicator.h) that collects every rank's losses, parameters and ZeroReport, and
// the layout arithmetic of zero/flat_layout.h written out independently from the model's
// ParamSpecs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "models/model.h"
#include "engine_test_util.h"
#include "models/gpt2/gpt2_config.h"
#include "zero/local_communicator.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_family.h"

namespace dstrain::zero_testing {

using namespace engine_testing;

// The model of every ZeRO engine test: 2 blocks, C = 32, 2 heads, vocab 96, T = 16 — small enough
// that the whole equivalence matrix runs in seconds on 2 cores, large enough that a block
// (12·C² + 13·C = 12704 elements) splits into several chunks of a small reduce_bucket_size.
inline constexpr const char* kModel = "gpt2:L2-C32-H2-V96-T16";
// The Llama-family model of the same tests (docs/models.md): grouped KV heads, tied embeddings (the
// head reads the embedding's parameter, gathered for it under ZeRO-3), the same T and vocabulary.
inline constexpr const char* kLlamaModel = "llama:L2-C32-H4-KV2-I48-V96-T16-tied";
inline constexpr std::int64_t kT = 16;
inline constexpr std::int32_t kVocab = 96;
inline constexpr std::int64_t kMicro = 2;

enum class Precision { fp32, bf16, fp16 };
inline const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : p == Precision::bf16 ? "bf16" : "fp16"; }
inline std::size_t storage_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

struct ZeroKnobs {
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;
  std::int64_t prefetch_bucket_size = 50'000'000;
  std::int64_t persistence_threshold = 100'000;
  std::int64_t max_live = 1'000'000'000;
  std::int64_t max_reuse_distance = 1'000'000'000;
  bool reduce_scatter = true;                   // false: DeepSpeed's all-reduce path
  std::int64_t sub_group_size = 1'000'000'000;  // the optimizer partition's sub-groups
  // The "optimizer" block; empty: AdamW with decay (below).
  std::string optimizer_json{};
  bool allow_untested_optimizer = false;  // zero_allow_untested_optimizer (optimizers off ZeRO's whitelist)
  // More top-level keys, written as `"key": value, ...` (e.g. "gradient_allreduce_op": "sum").
  std::string extra_json{};
  // More zero_optimization keys, the same way (e.g. "offload_optimizer": {"device": "cpu"}).
  std::string zero_extra_json{};
};

struct RunSpec {
  int stage = 0;
  int world = 1;
  int gas = 1;
  Precision precision = Precision::fp32;
  bool ckpt = false;
  int steps = 3;
  ZeroKnobs knobs{};
  int fp16_initial_scale_power = 8;  // 2^8: no step of these runs overflows (asserted by the tests)
  float dropout = 0.0f;
  // Per rank: optimizer steps (1-based) at which that rank injects an inf gradient.
  std::vector<std::vector<std::int64_t>> inject_overflow{};
  Device device = Device::cpu();  // every rank's engine trains there (tests/gpu: cuda:0)
  const char* model = kModel;     // kModel (GPT-2, with `dropout`) or a llama: descriptor
  int ranks_per_node = 0;         // > 0: the ranks modelled as nodes of this many (Communicator::set_nodes)
};

// AdamW with decay and clipping, so that the global norm (one all-reduce across ranks) matters.
inline std::string zero_config_json(const RunSpec& s) {
  std::string prec;
  if (s.precision == Precision::bf16) prec = R"(, "bf16": {"enabled": true})";
  if (s.precision == Precision::fp16) prec = fmt::format(R"(, "fp16": {{"enabled": true, "initial_scale_power": {}}})", s.fp16_initial_scale_power);
  const ZeroKnobs& k = s.knobs;
  const std::string optimizer =
      k.optimizer_json.empty() ? std::string(R"({"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}})")
                               : k.optimizer_json;
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
    "optimizer": {},
    "zero_optimization": {{"stage": {}, "reduce_bucket_size": {}, "allgather_bucket_size": {}, "overlap_comm": {},
      "stage3_prefetch_bucket_size": {}, "stage3_param_persistence_threshold": {}, "stage3_max_live_parameters": {},
      "stage3_max_reuse_distance": {}, "reduce_scatter": {}, "sub_group_size": {}{}}}, "zero_allow_untested_optimizer": {}{}{}}})",
                     kMicro, s.gas, optimizer, s.stage, k.reduce_bucket_size, k.allgather_bucket_size, k.overlap_comm ? "true" : "false",
                     k.prefetch_bucket_size, k.persistence_threshold, k.max_live, k.max_reuse_distance, k.reduce_scatter ? "true" : "false",
                     k.sub_group_size, k.zero_extra_json.empty() ? "" : ", " + k.zero_extra_json, k.allow_untested_optimizer ? "true" : "false", prec,
                     k.extra_json.empty() ? "" : ", " + k.extra_json);
}

inline Gpt2Config model_config(float dropout) {
  Gpt2Config c = model_config_from_spec(kModel);
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = dropout;
  return c;
}

// The model of a run: GPT-2 (kModel with s.dropout) or the Llama-family descriptor s.model.
inline Model make_test_model(const RunSpec& s) {
  if (std::string_view(s.model).starts_with("llama:")) return make_llama_model(llama_config_from_spec(s.model));
  return make_gpt2_model(model_config(s.dropout));
}

// The micro-batch at global slot `slot` of optimizer step `step`: what the data loader gives rank
// r at micro-step m when slot = m·W + r (data/data_loader.h), so one rank with GAS·W
// micro-steps sees the same global batch in slot order.
inline Tokens slot_batch(int step, int slot) { return random_tokens(kMicro, kT, kVocab, static_cast<std::uint32_t>(1000 * step + slot + 1)); }

struct RankResult {
  std::vector<float> losses;                         // state().last_step_loss after every optimizer step
  std::map<std::string, std::vector<float>> params;  // gather_master_params() after the last step
  std::int64_t skipped_steps = 0;
  std::vector<double> loss_scales;  // state().loss_scale after every optimizer step
  std::vector<double> grad_norms;   // grad_norm() after every optimizer step
  ZeroReport report;                // report().zero after the last step
  MemoryStats memory;               // report().memory after the last step
  MemoryStats host_memory;          // report().host_memory after the last step
};

struct RunResult {
  std::vector<RankResult> ranks;
  const RankResult& r0() const { return ranks.front(); }
};

// Trains `s.steps` optimizer steps on s.world local ranks: rank r feeds slot m·W + r at micro-step
// m. Each rank's results are collected; gather_master_params is called on every rank (collective).
inline RunResult run_zero(const RunSpec& s) {
  RunResult out;
  out.ranks.resize(static_cast<std::size_t>(s.world));
  const std::string json = zero_config_json(s);
  run_local_ranks(s.world, [&](Communicator& comm) {
    const int r = comm.rank();
    RankResult& me = out.ranks[static_cast<std::size_t>(r)];
    if (s.ranks_per_node > 0) {
      std::vector<int> nodes(static_cast<std::size_t>(s.world));
      for (int i = 0; i < s.world; ++i) nodes[static_cast<std::size_t>(i)] = i / s.ranks_per_node;
      comm.set_nodes(nodes);
    }
    config::ConfigOptions copts;
    copts.world_size = s.world;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = &comm;
    o.sequence_length = kT;
    o.checkpoint_activations = s.ckpt;
    o.device = s.device;
    if (static_cast<std::size_t>(r) < s.inject_overflow.size()) o.inject_overflow_steps = s.inject_overflow[static_cast<std::size_t>(r)];
    Engine e = initialize(make_test_model(s), c, o);
    for (int step = 0; step < s.steps; ++step) {
      for (int m = 0; m < s.gas; ++m) {
        Tokens t = slot_batch(step, m * s.world + r);
        e.forward(t.batch());
        e.backward();
        e.step();
      }
      me.losses.push_back(e.state().last_step_loss);
      me.loss_scales.push_back(e.state().loss_scale);
      me.grad_norms.push_back(e.state().grad_norm);
    }
    me.skipped_steps = e.state().skipped_steps;
    me.report = e.report().zero;
    me.memory = e.report().memory;
    me.host_memory = e.report().host_memory;
    e.gather_master_params([&](const std::string& n, const Tensor& t) { me.params[n] = values(t); });
  });
  return out;
}

// ---- the layout arithmetic of zero/flat_layout.h, from the specs ----

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// A layer's owned (untied) parameter elements with each parameter starting 64-byte aligned, the
// end aligned too ("used").
inline std::int64_t aligned_used(const std::vector<ParamSpec>& specs, std::size_t ebytes) {
  const std::int64_t ealign = 64 / static_cast<std::int64_t>(ebytes);
  std::int64_t at = 0;
  for (const bool decay : {true, false})
    for (const ParamSpec& p : specs)
      if (!p.tied() && p.weight_decay == decay) at = round_up(at, ealign) + p.shape.numel();
  return round_up(at, ealign);
}

// The padded buffer length: used rounded up so that `world` ranks get equal 64-byte aligned shards.
inline std::int64_t padded_numel(const std::vector<ParamSpec>& specs, int world, std::size_t ebytes) {
  return round_up(aligned_used(specs, ebytes), world * (64 / static_cast<std::int64_t>(ebytes)));
}

inline std::int64_t owned_params(const std::vector<ParamSpec>& specs) {
  std::int64_t n = 0;
  for (const ParamSpec& p : specs)
    if (!p.tied()) n += p.shape.numel();
  return n;
}

// Every layer's specs of the test model.
inline std::vector<std::vector<ParamSpec>> model_specs() {
  const Model m = make_gpt2_model(model_config(0.0f));
  std::vector<std::vector<ParamSpec>> specs;
  for (const auto& l : m.layers) specs.push_back(l->params());
  return specs;
}

// The layers whose parameters layer i reads: itself (if it owns any) and the owners of its tied
// parameters (GPT-2's head reads the embedding's wte).
inline std::vector<std::vector<std::size_t>> layer_needs(const std::vector<std::vector<ParamSpec>>& specs) {
  std::map<std::string, std::size_t> owner;
  std::vector<std::vector<std::size_t>> needs(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    for (const ParamSpec& p : specs[i]) {
      if (p.tied()) {
        needs[i].push_back(owner.at(p.tied_to));
      } else {
        owner[p.name] = i;
        if (needs[i].empty() || needs[i].front() != i) needs[i].insert(needs[i].begin(), i);
      }
    }
  }
  return needs;
}

// Stage 3 with stage3_max_reuse_distance 0 and no live cap: after a call an owner stays gathered
// only if its next use is at distance 0 — no call in between needs any gathered parameters — so it
// is gathered at every use whose previous use is farther away (or absent). Owners below the
// persistence threshold are kept whole and never gathered. The training trace without
// checkpointing is forward 0..L-1, then backward L-1..0. Returns one micro-step's gathers in order:
// the owner, its padded elements for `w` ranks, and whether the pass gathered it before (hpZ takes
// those from its secondary shards).
struct Stage3Gather {
  std::size_t owner = 0;
  std::int64_t elements = 0;
  bool again = false;
};
inline std::vector<Stage3Gather> stage3_gathers(int w, std::size_t s, std::int64_t persistence_threshold = 0) {
  const auto specs = model_specs();
  const auto needs = layer_needs(specs);
  const std::size_t L = specs.size();
  std::vector<std::int64_t> numel(L);
  for (std::size_t o = 0; o < L; ++o) numel[o] = owned_params(specs[o]) < persistence_threshold ? 0 : padded_numel(specs[o], w, s);
  std::vector<std::size_t> trace;
  for (std::size_t i = 0; i < L; ++i) trace.push_back(i);
  for (std::size_t i = L; i-- > 0;) trace.push_back(i);
  const auto uses = [&](std::size_t p, std::size_t o) {
    return numel[o] > 0 && std::find(needs[trace[p]].begin(), needs[trace[p]].end(), o) != needs[trace[p]].end();
  };
  std::vector<Stage3Gather> out;
  std::vector<bool> gathered_before(L, false);
  for (std::size_t p = 0; p < trace.size(); ++p) {
    for (std::size_t o : needs[trace[p]]) {
      if (!uses(p, o)) continue;
      std::int64_t between = 0;
      bool kept = false;
      for (std::size_t q = p; q-- > 0;) {
        if (uses(q, o)) {
          kept = between == 0;
          break;
        }
        for (std::size_t o2 : needs[trace[q]]) between += numel[o2];
      }
      if (kept) continue;
      out.push_back({o, numel[o], gathered_before[o]});
      gathered_before[o] = true;
    }
  }
  return out;
}

// ---- comparing parameters with a reference run ----

// GPT-2's attention key bias (elements [C, 2C) of every "attn.c_attn.bias") has a gradient that is
// zero up to rounding noise — softmax ignores a constant added to every score of a row — and Adam
// turns that noise into steps of up to ~lr of either sign (m/√v of pure noise is O(1)). Any change
// of summation order moves it by O(lr) per step, so it is compared on its own, against that bound.
inline constexpr std::int64_t kC = 32;
inline bool is_key_bias(const std::string& name, std::size_t i) {
  return name.ends_with("attn.c_attn.bias") && static_cast<std::int64_t>(i) >= kC && static_cast<std::int64_t>(i) < 2 * kC;
}

struct ParamDiff {
  double max_abs = 0;         // elementwise, key bias excluded
  double max_excess = 0;      // max over elements of |diff| / (atol + rtol·|ref|), key bias excluded
  double max_update_rel = 0;  // max over tensors of ‖got − ref‖₂ / ‖ref − init‖₂, key bias excluded
  double update_rel = 0;      // the same over all parameters at once
  double key_bias_max_abs = 0;
  bool finite = true;
  std::string worst_element, worst_tensor;
};

inline ParamDiff compare_params(const std::map<std::string, std::vector<float>>& got, const std::map<std::string, std::vector<float>>& ref,
                                const std::map<std::string, std::vector<float>>& init, double atol, double rtol) {
  ParamDiff d;
  double all_num = 0, all_den = 0;
  for (const auto& [name, want] : ref) {
    const auto it = got.find(name);
    if (it == got.end() || it->second.size() != want.size() || init.at(name).size() != want.size()) {
      ADD_FAILURE() << "parameter " << name << " missing or of another size";
      d.finite = false;
      continue;
    }
    const auto& g = it->second;
    const auto& i0 = init.at(name);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(g[i])) d.finite = false;
      const double diff = std::abs(double(g[i]) - double(want[i]));
      if (is_key_bias(name, i)) {
        d.key_bias_max_abs = std::max(d.key_bias_max_abs, diff);
        continue;
      }
      if (diff > d.max_abs) d.max_abs = diff;
      const double excess = diff / (atol + rtol * std::abs(double(want[i])));
      if (excess > d.max_excess) {
        d.max_excess = excess;
        d.worst_element = name + "[" + std::to_string(i) + "]";
      }
      num += diff * diff;
      den += (double(want[i]) - i0[i]) * (double(want[i]) - i0[i]);
    }
    all_num += num;
    all_den += den;
    const double rel = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
    if (rel > d.max_update_rel) {
      d.max_update_rel = rel;
      d.worst_tensor = name;
    }
  }
  d.update_rel = all_den > 0 ? std::sqrt(all_num / all_den) : (all_num > 0 ? INFINITY : 0.0);
  return d;
}

// Tolerances of a W-rank ZeRO run against stage 0 on one rank (same global batch, 3 optimizer
// steps of AdamW lr 1e-2 with clipping 1.0). loss: |x − ref| <= loss_rtol·|ref| at every step.
// Parameters (fp32 masters; the key bias apart): elementwise |x − ref| <= atol + rtol·|ref|; per
// tensor ‖x − ref‖₂ <= tensor_update_rel·‖ref − init‖₂ (relative to how far training moved it);
// over all parameters at once the same with update_rel. Key bias: |x − ref| <= key_bias_abs.
// Measured over the 144-case matrix of test_zero_equivalence.cpp (max over cases, printed with
// DSTRAIN_ZERO_EQ_VERBOSE=1); each bound is the measured maximum with a margin.
struct Tolerance {
  double loss_rtol, atol, rtol, tensor_update_rel, update_rel, key_bias_abs;
};
inline Tolerance tolerance(Precision p) {
  switch (p) {
    case Precision::fp32:
      // Reduction order only (gradient sums per rank, then averaged over the ranks, vs one running
      // sum): measured loss 1.0e-7 relative (most cases bit-identical), parameters 1.05e-6
      // absolute, per tensor 1.6e-6 and overall 5.4e-7 of the update, key bias 2.0e-5.
      return {1e-6, 2e-6, 1e-5, 1e-5, 3e-6, 1e-4};
    case Precision::bf16:
      // bf16 gradients: the reference rounds its running sum to bf16 after every micro-step (one
      // extra rounding of 2^-9 relative per micro-batch), W ranks round their local sums and then
      // the average. Where a gradient element is the near-cancelling sum of its micro-batches,
      // that flips the sign of Adam's first, normalised step (±lr each): measured elementwise up to
      // 0.031 (≈ 3·lr, a few elements), per tensor up to 17% of the update (a 32-element LayerNorm
      // tensor with one flipped element), overall 4.6%; loss 9.6e-5 relative. The elementwise bound
      // is only the sanity bound of two 3-step Adam trajectories (< 2·3·lr·~1.2); the overall
      // update bound is the real check.
      return {5e-4, 0.07, 0.0, 0.4, 0.1, 0.07};
    case Precision::fp16:
      // fp16 gradients (3 more mantissa bits than bf16, scaled by 2^8): the same effect, smaller.
      // Measured: loss 1.1e-5 relative, elementwise 0.0196, per tensor 4.3%, overall 1.5% of the
      // update, key bias 0.012.
      return {1e-4, 0.05, 0.0, 0.1, 0.04, 0.07};
  }
  return {};
}

}  // namespace dstrain::zero_testing
