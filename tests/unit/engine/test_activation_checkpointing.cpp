// Activation checkpointing in the engine's layer loop, against independent references: the same
// engine without checkpointing (gradients, losses and parameters must be bitwise equal, dropout on),
// memory formulas summed here from the layers' declared output / saved_activations specs, and
// transfer / synchronize counts written out from the segment plan by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/activation_checkpointing.h"
#include "engine/engine.h"
#include "ops/error.h"
#include "ops/log.h"
#include "models/gpt2/gpt2_layers.h"

#include "engine_test_util.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_family.h"

namespace dstrain {
namespace {

using namespace engine_testing;

// AdamW, clipping on (the global norm touches every gradient), plus an activation_checkpointing block.
std::string config_json(int micro, int gas, const std::string& ckpt_section) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1}}}}{}}})",
                     micro, gas, ckpt_section.empty() ? "" : ", \"activation_checkpointing\": " + ckpt_section);
}

// gpt2:tiny (2 blocks) and a 4-block model, both with every dropout on.
Gpt2Config model(const std::string& spec) {
  Gpt2Config c = model_config_from_spec(spec);
  c.resid_pdrop = 0.1f;
  c.attn_pdrop = 0.15f;
  c.embd_pdrop = 0.2f;
  return c;
}
const char* kTiny = "gpt2:tiny";
const char* kFour = "gpt2:L4-C16-H2-V61-T8";
// A 4-block Llama-family model (multi-query attention, untied head) with attention dropout on.
const char* kLlamaFour = "llama:L4-C16-H2-KV1-I32-V61-T8";

// The model of a spec: GPT-2 with every dropout on, or a Llama-family descriptor with attention dropout.
Model make_any(const std::string& spec) {
  if (spec.starts_with("llama:")) {
    LlamaConfig c = llama_config_from_spec(spec);
    c.attention_dropout = 0.15f;
    return make_llama_model(c);
  }
  return make_gpt2_model(model(spec));
}

// The checkpointing variants every equality test runs.
struct Variant {
  std::optional<int> k;  // number_checkpoints; nullopt: unset
  bool cpu = false, contiguous = false;
  std::string section() const {
    std::string s = "{";
    if (k) s += fmt::format("\"number_checkpoints\": {}, ", *k);
    s += fmt::format("\"cpu_checkpointing\": {}, \"contiguous_memory_optimization\": {}, \"synchronize_checkpoint_boundary\": true}}", cpu,
                     contiguous);
    return s;
  }
  std::string name() const { return fmt::format("k={} cpu={} contiguous={}", k ? std::to_string(*k) : "unset", cpu, contiguous); }
};
std::vector<Variant> variants(int n_layer) {
  std::vector<Variant> v;
  for (const std::optional<int> k : {std::optional<int>{}, std::optional<int>{1}, std::optional<int>{2}, std::optional<int>{n_layer}}) {
    if (k && *k > n_layer) continue;
    for (int mode = 0; mode < 4; ++mode) v.push_back({k, (mode & 1) != 0, (mode & 2) != 0});
  }
  return v;
}

Engine make_engine(Model m, int micro, int gas, const std::string& section, bool on, Allocator* alloc = nullptr, Allocator* host = nullptr) {
  return initialize(std::move(m), ds(config_json(micro, gas, section)),
                    {.seed = 11, .sequence_length = 8, .allocator = alloc, .checkpoint_activations = on, .host_allocator = host});
}
Engine make_engine(const Gpt2Config& cfg, int micro, int gas, const std::string& section, bool on, Allocator* alloc = nullptr,
                   Allocator* host = nullptr) {
  return make_engine(make_gpt2_model(cfg), micro, gas, section, on, alloc, host);
}

// ---- the segment plan ----
TEST(ActivationCheckpointing, SegmentsAreEvenAndConsecutive) {
  const auto sizes = [](std::size_t n, std::optional<std::int64_t> k) {
    std::vector<std::size_t> out;
    std::size_t next = 1;
    for (const CheckpointSegment& s : plan_checkpoint_segments(1, n, k)) {
      EXPECT_EQ(s.first, next);
      next = s.last + 1;
      out.push_back(s.size());
    }
    EXPECT_EQ(next, n + 1);
    return out;
  };
  EXPECT_EQ(sizes(12, std::nullopt), std::vector<std::size_t>(12, 1));
  EXPECT_EQ(sizes(12, 5), (std::vector<std::size_t>{3, 3, 2, 2, 2}));
  EXPECT_EQ(sizes(12, 1), (std::vector<std::size_t>{12}));
  EXPECT_EQ(sizes(12, 4), (std::vector<std::size_t>{3, 3, 3, 3}));
  EXPECT_EQ(sizes(4, 3), (std::vector<std::size_t>{2, 1, 1}));
}

std::string init_error(const std::string& section, bool on) {
  try {
    make_engine(model(kFour), 2, 1, section, on);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ActivationCheckpointing, BadNumberCheckpointsNamesTheKey) {
  for (const char* bad : {R"({"number_checkpoints": 0})", R"({"number_checkpoints": -1})", R"({"number_checkpoints": 5})"}) {
    EXPECT_NE(init_error(bad, true).find("activation_checkpointing.number_checkpoints"), std::string::npos) << bad;
  }
  EXPECT_EQ(init_error(R"({"number_checkpoints": 4})", true), "<no error>");
  // Off: the section only configures; nothing to refuse.
  EXPECT_EQ(init_error(R"({"number_checkpoints": 5})", false), "<no error>");
  // No longer refused: partition_activations (a warning) and cpu_checkpointing (provided).
  EXPECT_EQ(init_error(R"({"partition_activations": true, "cpu_checkpointing": true})", true), "<no error>");
}

// ---- gradients, losses and parameters: bitwise equal to the run that keeps every activation ----
void expect_same_run(const std::string& spec, const Variant& v) {
  Engine ref = make_engine(make_any(spec), 2, 2, "", false);
  Engine ck = make_engine(make_any(spec), 2, 2, v.section(), true);
  ASSERT_NE(ck.report().checkpointing, nullptr);
  ASSERT_EQ(ref.report().checkpointing, nullptr);
  for (int micro = 0; micro < 6; ++micro) {  // 3 optimizer steps of 2 micro-batches
    Tokens tk = random_tokens(2, 8, 61, static_cast<std::uint32_t>(micro + 1), 3);
    ASSERT_EQ(ref.forward(tk.batch()), ck.forward(tk.batch())) << spec << " " << v.name() << " micro " << micro;
    ref.backward();
    ck.backward();
    if (micro == 0 || micro == 3) {  // gradients of a first micro-batch, and accumulated over a step's two
      for (const std::string& n : ref.param_names()) ASSERT_EQ(values(ref.grad(n)), values(ck.grad(n))) << spec << " " << v.name() << " " << n;
    }
    ref.step();
    ck.step();
  }
  EXPECT_EQ(ref.state().last_step_loss, ck.state().last_step_loss);
  EXPECT_EQ(ref.state().grad_norm, ck.state().grad_norm);
  for (const std::string& n : ref.param_names()) ASSERT_EQ(values(ref.param(n)), values(ck.param(n))) << spec << " " << v.name() << " " << n;
  // Dropout was on: the evaluation (dropout off) loss differs from the training loss; equal in both.
  Tokens tk = random_tokens(2, 8, 61, 99, 3);
  EXPECT_EQ(ref.evaluate(tk.batch()), ck.evaluate(tk.batch()));
}

TEST(ActivationCheckpointing, BitwiseEqualTinyAllVariants) {
  for (const Variant& v : variants(2)) expect_same_run(kTiny, v);
}

TEST(ActivationCheckpointing, BitwiseEqualFourBlocksAllVariants) {
  for (const Variant& v : variants(4)) expect_same_run(kFour, v);
  expect_same_run(kFour, {3, true, false});  // uneven segments 2,1,1 through the host
}

TEST(ActivationCheckpointing, BitwiseEqualLlamaFourBlocksAllVariants) {
  for (const Variant& v : variants(4)) expect_same_run(kLlamaFour, v);
}

// The recompute really matters: a run whose dropout masks differed would differ. (Guards the
// equality tests against passing because dropout was off.)
TEST(ActivationCheckpointing, DropoutIsOnInTheseRuns) {
  for (const char* spec : {kFour, kLlamaFour}) {
    Engine a = make_engine(make_any(spec), 2, 1, "", false);
    Tokens tk = random_tokens(2, 8, 61, 1, 3);
    const float train_loss = a.forward(tk.batch());
    EXPECT_NE(train_loss, a.evaluate(tk.batch())) << spec;
  }
}

// ---- memory: the formula, from the layers' specs summed here ----
struct Sizes {
  std::size_t btc = 0, first_saved = 0, head = 0, all = 0;
  std::vector<std::size_t> block;  // output + saved of each block
};
Sizes sizes_of(const Gpt2Config& cfg, std::int64_t B, std::int64_t T) {
  const LayerDims d{B, T, DType::fp32};
  const auto layers = make_gpt2_layers(cfg);
  Sizes z;
  z.btc = static_cast<std::size_t>(B * T * cfg.n_embd) * 4;
  const auto sum = [&](const Layer& l) {
    std::size_t b = l.output(d).nbytes();
    EXPECT_EQ(b % 64, 0u) << "choose shapes with no alignment padding";
    for (const ActivationSpec& s : l.saved_activations(d)) {
      EXPECT_EQ(s.nbytes() % 64, 0u) << s.name << ": choose shapes with no alignment padding";
      b += s.nbytes();
    }
    return b;
  };
  for (const ActivationSpec& s : layers.front()->saved_activations(d)) z.first_saved += s.nbytes();
  for (std::size_t i = 1; i + 1 < layers.size(); ++i) z.block.push_back(sum(*layers[i]));
  z.head = sum(*layers.back());
  z.all = sum(*layers.front()) + z.head;
  for (std::size_t b : z.block) z.all += b;
  return z;
}

TEST(ActivationCheckpointing, PeakActivationMemoryIsTheFormula) {
  for (const char* spec : {kTiny, kFour}) {
    const Gpt2Config cfg = model(spec);
    const Sizes z = sizes_of(cfg, 2, 8);
    const std::size_t n = z.block.size();
    // Without checkpointing: every layer's output and saved activations, plus the residual gradient.
    {
      CpuAllocator alloc;
      Engine e = make_engine(cfg, 2, 1, "", false, &alloc);
      EXPECT_EQ(alloc.stats()[MemoryPurpose::activations].peak, z.all + z.btc) << spec;
    }
    for (const Variant& v : variants(static_cast<int>(n))) {
      const std::size_t K = v.k ? static_cast<std::size_t>(*v.k) : n;
      // The largest segment: blocks split K ways, the first n % K segments one block longer.
      std::size_t seg = 0, b = 0;
      for (std::size_t s = 0; s < K; ++s) {
        std::size_t bytes = 0;
        for (std::size_t j = 0; j < n / K + (s < n % K ? 1 : 0); ++j) bytes += z.block[b++];
        seg = std::max(seg, bytes);
      }
      const std::size_t area = std::max(seg, z.head);
      const std::size_t device = v.cpu ? 2 * z.btc + area + z.first_saved + z.btc           // two boundary buffers
                                       : K * z.btc + z.btc + area + z.first_saved + z.btc;  // kept inputs + head input
      const std::size_t host = v.cpu ? (K - 1) * z.btc : 0;
      CpuAllocator alloc, host_alloc;
      Engine e = make_engine(cfg, 2, 1, v.section(), true, &alloc, &host_alloc);
      EXPECT_EQ(alloc.stats()[MemoryPurpose::activations].peak, device) << spec << " " << v.name();
      EXPECT_EQ(host_alloc.stats()[MemoryPurpose::activations].peak, host) << spec << " " << v.name();
      EXPECT_EQ(e.report().host_memory[MemoryPurpose::activations].current, host);
      // contiguous: the kept inputs are one block; otherwise one block each (+ boundary, area, dresidual).
      const std::size_t kept_blocks = v.cpu ? K - 1 : K;
      const std::size_t kept_allocs = kept_blocks == 0 ? 0 : v.contiguous ? 1 : kept_blocks;
      EXPECT_EQ(alloc.stats()[MemoryPurpose::activations].live_blocks(), (v.cpu ? 0 : kept_allocs) + 3) << spec << " " << v.name();
      EXPECT_EQ(host_alloc.stats()[MemoryPurpose::activations].live_blocks(), v.cpu ? kept_allocs : 0) << spec << " " << v.name();
      // Training allocates nothing: the peak stays the formula.
      for (int m = 0; m < 2; ++m) {
        Tokens tk = random_tokens(2, 8, 61, static_cast<std::uint32_t>(m), 3);
        e.forward(tk.batch());
        e.backward();
        e.step();
      }
      EXPECT_EQ(alloc.stats().total.peak, alloc.stats().total.current);
      EXPECT_EQ(alloc.stats()[MemoryPurpose::activations].peak, device);
    }
  }
  // It falls: per-block checkpoints of the 4-block model hold less than keeping everything.
  const Sizes z = sizes_of(model(kFour), 2, 8);
  EXPECT_LT(4 * z.btc + z.btc + std::max(z.block[0], z.head) + z.btc, z.all + z.btc);
}

// ---- cpu_checkpointing: every kept input but the last travels to the host and back, once ----
TEST(ActivationCheckpointing, CpuCheckpointingCopiesEachKeptInputOutAndBack) {
  const Sizes z = sizes_of(model(kFour), 2, 8);
  for (int k : {1, 2, 3, 4}) {
    Engine e = make_engine(model(kFour), 2, 1, fmt::format(R"({{"cpu_checkpointing": true, "number_checkpoints": {}}})", k), true);
    const CopyStream& t = e.report().checkpointing->transfer();
    Tokens tk = random_tokens(2, 8, 61, 1, 3);
    e.evaluate(tk.batch());  // evaluation keeps nothing
    EXPECT_EQ(t.bytes_to_host(), 0u);
    for (std::uint64_t m = 1; m <= 2; ++m) {
      e.forward(tk.batch());
      EXPECT_EQ(t.bytes_to_host(), m * static_cast<std::uint64_t>(k - 1) * z.btc) << k;
      EXPECT_EQ(t.bytes_to_device(), (m - 1) * static_cast<std::uint64_t>(k - 1) * z.btc) << k;
      e.backward();
      EXPECT_EQ(t.bytes_to_device(), m * static_cast<std::uint64_t>(k - 1) * z.btc) << k;
      e.step();
    }
  }
}

// ---- synchronize_checkpoint_boundary: start and end of each segment's forward and backward ----
TEST(ActivationCheckpointing, SynchronizesAtEveryBoundary) {
  for (bool sync : {false, true}) {
    Engine e = make_engine(model(kFour), 2, 1, fmt::format(R"({{"number_checkpoints": 3, "synchronize_checkpoint_boundary": {}}})", sync), true);
    Tokens tk = random_tokens(2, 8, 61, 1, 3);
    e.forward(tk.batch());
    EXPECT_EQ(e.report().checkpointing->transfer().synchronizations(), sync ? 2u * 3 : 0u);
    e.backward();
    EXPECT_EQ(e.report().checkpointing->transfer().synchronizations(), sync ? 4u * 3 : 0u);
  }
}

// ---- profile: a line per segment with its forward, recompute and backward times ----
TEST(ActivationCheckpointing, ProfileLogsEverySegment) {
  Engine e = make_engine(model(kFour), 2, 1, R"({"number_checkpoints": 2, "profile": true})", true);
  Tokens tk = random_tokens(2, 8, 61, 1, 3);
  e.forward(tk.batch());
  const LogLevel before = log_level();
  set_log_level(LogLevel::info);
  testing::internal::CaptureStderr();
  e.backward();
  const std::string err = testing::internal::GetCapturedStderr();
  set_log_level(before);
  EXPECT_NE(err.find("segment 1/2 (h.0..h.1): forward "), std::string::npos) << err;
  EXPECT_NE(err.find("segment 2/2 (h.2..h.3): forward "), std::string::npos) << err;
  EXPECT_NE(err.find("recompute "), std::string::npos);
  ASSERT_EQ(e.report().checkpointing->profile().size(), 2u);
  for (const SegmentProfile& p : e.report().checkpointing->profile()) {
    EXPECT_GT(p.forward_s, 0.0);
    EXPECT_GT(p.recompute_s, 0.0);
    EXPECT_GT(p.backward_s, 0.0);
  }
}

// ---- notes: never silently ignored ----
TEST(ActivationCheckpointing, NotesSayHowToEnableAndWhatHasNoEffect) {
  config::ActivationCheckpointingConfig c;
  EXPECT_TRUE(activation_checkpointing_notes(c, false).empty());
  EXPECT_TRUE(activation_checkpointing_notes(c, true).empty());
  c.number_checkpoints = 4;
  auto off = activation_checkpointing_notes(c, false);
  ASSERT_EQ(off.size(), 1u);
  EXPECT_TRUE(off[0].warning);
  EXPECT_NE(off[0].text.find("only configures"), std::string::npos);
  EXPECT_NE(off[0].text.find("--checkpoint-activations"), std::string::npos);
  EXPECT_NE(off[0].text.find("EngineOptions::checkpoint_activations"), std::string::npos);
  EXPECT_TRUE(activation_checkpointing_notes(c, true).empty());
  // A section with only default values still warns: its presence says the user expected checkpointing.
  config::ActivationCheckpointingConfig empty_section;
  empty_section.present = true;
  ASSERT_EQ(activation_checkpointing_notes(empty_section, false).size(), 1u);
  EXPECT_TRUE(activation_checkpointing_notes(empty_section, false)[0].warning);
  EXPECT_TRUE(activation_checkpointing_notes(empty_section, true).empty());
  c.partition_activations = true;
  auto on = activation_checkpointing_notes(c, true);
  ASSERT_EQ(on.size(), 1u);
  EXPECT_TRUE(on[0].warning);
  EXPECT_NE(on[0].text.find("activation_checkpointing.partition_activations"), std::string::npos);
  EXPECT_NE(on[0].text.find("tensor"), std::string::npos);
}

}  // namespace
}  // namespace dstrain
