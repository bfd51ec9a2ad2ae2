// The model-family interface (models/model_family.h): the registry and spec resolution, the
// built-in families' architectures against their configs, how every parameter may be split
// (models/param_split.h) against AutoTP's rule and hand-written ranges, the stage partitions
// (models/stage_partition.h) against DeepSpeed's own partition functions, the FLOPs trees
// against counts summed from the layers' parameter specs, and a family defined here, outside the
// tree, registered and used as the built-in ones are.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/gpt2/gpt2_family.h"
#include "models/gpt2/gpt2_flops.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/llama/llama_family.h"
#include "models/model_registry.h"
#include "models/param_split.h"
#include "models/stage_partition.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using ::testing::HasSubstr;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- the registry and spec resolution ----

TEST(ModelFamily, BuiltInFamiliesReadTheirSpecs) {
  const auto families = model_families();
  ASSERT_GE(families.size(), 2u);
  EXPECT_EQ(families[0]->name(), "gpt2");
  EXPECT_EQ(families[1]->name(), "llama");
  const auto g = model_architecture("gpt2:L3-C64-H4-V100-T32");
  EXPECT_EQ(&g->family(), &gpt2_family());
  EXPECT_EQ(g->n_layer(), 3);
  EXPECT_EQ(g->n_embd(), 64);
  EXPECT_EQ(g->n_positions(), 32);
  EXPECT_EQ(g->vocab_size(), 100);
  EXPECT_EQ(g->padded_vocab_size(), 128);
  const auto l = model_architecture("llama:L2-C64-H4-KV2-I96-V300-T16");
  EXPECT_EQ(&l->family(), &llama_family());
  EXPECT_EQ(l->n_positions_key(), "max_position_embeddings");
  EXPECT_EQ(l->padded_vocab_size(), 384);
  EXPECT_THAT(error_of([] { model_architecture("bert:base"); }), HasSubstr("gpt2:d6"));
  EXPECT_THAT(error_of([] { model_architecture("bert:base"); }), HasSubstr("llama:L<n>"));
  EXPECT_THAT(error_of([] { model_architecture("gpt2:bogus"); }), HasSubstr("unknown model spec 'gpt2:bogus'"));
}

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("dstrain_model_family_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto p = dir_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigFile, ConfigJsonGoesToTheFamilyThatClaimsIt) {
  const auto gpt2 = write("g/config.json", R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 70})");
  EXPECT_EQ(model_architecture(gpt2.string())->family().name(), "gpt2");
  EXPECT_EQ(model_architecture(gpt2.parent_path().string())->family().name(), "gpt2");  // the folder
  const auto qwen = write("q/config.json", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 200,
      "max_position_embeddings": 64})");
  EXPECT_EQ(model_architecture(qwen.string())->family().name(), "llama");
  // A config.json of no family: its model_type and architectures, and the families, are named.
  const auto bert = write("b/config.json", R"({"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 64})");
  const std::string e = error_of([&] { model_architecture(bert.string()); });
  EXPECT_THAT(e, HasSubstr("\"bert\""));
  EXPECT_THAT(e, HasSubstr("BertForMaskedLM"));
  EXPECT_THAT(e, HasSubstr("the families are gpt2, llama"));
  EXPECT_THAT(error_of([&] { model_architecture((dir_ / "missing.json").string()); }),
              HasSubstr("neither a family's spec nor an existing config.json"));
}

// A config.json with neither model_type nor architectures is read as GPT-2 (older GPT-2 configs
// have neither); a Llama config without them failed on "key 'n_layer' is missing; a GPT-2
// config.json needs it", naming no family and no fix.
TEST_F(ConfigFile, ConfigJsonNamingNoFamilyIsReadAsGpt2AndSaysSoWhenThatFails) {
  const auto old_gpt2 = write("g/config.json", R"({"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 70})");
  EXPECT_EQ(model_architecture(old_gpt2.string())->family().name(), "gpt2");
  const auto llama = write("l/config.json", R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 96, "vocab_size": 200, "max_position_embeddings": 64})");
  const std::string e = error_of([&] { model_architecture(llama.string()); });
  EXPECT_THAT(e, HasSubstr("has neither \"model_type\" nor \"architectures\", so dstrain read it as a gpt2 config.json")) << e;
  EXPECT_THAT(e, HasSubstr("n_layer")) << e;  // what GPT-2's reader found missing
  EXPECT_THAT(e, HasSubstr("add \"model_type\"")) << e;
  EXPECT_THAT(e, HasSubstr("gpt2: \"gpt2\" (GPT2LMHeadModel); llama: \"llama\" (LlamaForCausalLM), \"mistral\" (MistralForCausalLM), "
                           "\"qwen2\" (Qwen2ForCausalLM), \"qwen3\" (Qwen3ForCausalLM)"))
      << e;
}

// config_json() is what a checkpoint keeps: read back, it is the same architecture.
TEST(ModelFamily, ConfigJsonRoundTrips) {
  for (const char* spec : {"gpt2:L3-C64-H4-V100-T32", "gpt2:d12", "llama:L2-C64-H4-KV2-I96-V300-T16-tied", "llama:L1-C32-H2"}) {
    const auto a = model_architecture(spec);
    const auto b = a->family().from_config_json(a->config_json(), "test");
    EXPECT_EQ(b->describe(), a->describe()) << spec;
    EXPECT_EQ(b->config_json(), a->config_json()) << spec;
    const auto la = a->make_layers(), lb = b->make_layers();
    ASSERT_EQ(la.size(), lb.size());
    for (std::size_t i = 0; i < la.size(); ++i) {
      const auto pa = la[i]->params(), pb = lb[i]->params();
      ASSERT_EQ(pa.size(), pb.size());
      for (std::size_t k = 0; k < pa.size(); ++k) EXPECT_EQ(pa[k].shape.str(), pb[k].shape.str()) << pa[k].name;
    }
  }
}

// The counts the families report against the layers they build.
TEST(ModelFamily, ParameterCountsAreTheLayers) {
  for (const char* spec : {"gpt2:L3-C64-H4-V100-T32", "llama:L2-C64-H4-KV2-I96-V300-T16", "llama:L2-C64-H4-KV2-I96-V300-T16-tied"}) {
    const auto a = model_architecture(spec);
    double stored = 0.0;
    for (const auto& layer : a->make_layers())
      for (const ParamSpec& p : layer->params())
        if (!p.tied()) stored += static_cast<double>(p.shape.numel());
    EXPECT_EQ(a->stored_parameter_count(), stored) << spec;
    const double pad_rows = static_cast<double>(a->padded_vocab_size() - a->vocab_size());
    const bool two_tables = std::string(spec).find("llama") != std::string::npos && std::string(spec).find("tied") == std::string::npos;
    EXPECT_EQ(a->parameter_count(), stored - pad_rows * static_cast<double>(a->n_embd()) * (two_tables ? 2 : 1)) << spec;
  }
}

// ---- how parameters split ----

TEST(ParamSplit, AutoTpDistributesUnitsAsDeepSpeed) {
  // DeepSpeed's tp_shard.get_shard_size: n / W + (r < n % W).
  EXPECT_EQ(units_of_rank(6, 4, 0), 2);
  EXPECT_EQ(units_of_rank(6, 4, 1), 2);
  EXPECT_EQ(units_of_rank(6, 4, 2), 1);
  EXPECT_EQ(units_of_rank(6, 4, 3), 1);
  EXPECT_EQ(units_of_rank(2, 4, 2), 0);  // more ranks than key/value heads: the surplus hold none
  EXPECT_EQ(units_of_rank(12, 3, 2), 4);
}

ParamSpec find_param(const Architecture& a, const std::string& name) {
  for (const auto& layer : a.make_layers())
    for (const ParamSpec& p : layer->params())
      if (p.name == name) return p;
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

TEST(ParamSplit, Gpt2FusedQkvIsCutHeadByHead) {
  // C = 64, 4 heads of 16: at TP 2 rank 1 holds heads 2 and 3 of q, of k and of v.
  const auto a = model_architecture("gpt2:L1-C64-H4-V100-T8");
  const ParamSpec qkv = find_param(*a, "h.0.attn.c_attn.weight");
  EXPECT_EQ(qkv.split.kind, SplitKind::rows);
  const auto r1 = split_ranges(qkv.split, qkv.shape, 2, 1, qkv.name);
  ASSERT_EQ(r1.size(), 3u);
  EXPECT_EQ(r1[0].begin, 32);
  EXPECT_EQ(r1[0].size, 32);
  EXPECT_EQ(r1[1].begin, 64 + 32);
  EXPECT_EQ(r1[2].begin, 128 + 32);
  // At TP 3 the 4 heads go 2, 1, 1: rank 2 holds head 3 alone.
  const auto r2 = split_ranges(qkv.split, qkv.shape, 3, 2, qkv.name);
  EXPECT_EQ(r2[0].begin, 48);
  EXPECT_EQ(r2[0].size, 16);
  // The output projection is cut by the same heads along its input columns.
  const ParamSpec proj = find_param(*a, "h.0.attn.c_proj.weight");
  EXPECT_EQ(proj.split.kind, SplitKind::columns);
  EXPECT_EQ(proj.split.dim(), 1);
  EXPECT_EQ(split_ranges(proj.split, proj.shape, 3, 2, proj.name)[0].begin, 48);
  // Row-parallel biases are added once, after the sum: replicated.
  EXPECT_TRUE(find_param(*a, "h.0.attn.c_proj.bias").split.is_replicated());
  EXPECT_TRUE(find_param(*a, "h.0.mlp.c_proj.bias").split.is_replicated());
  EXPECT_EQ(find_param(*a, "h.0.mlp.c_fc.weight").split.kind, SplitKind::rows);
  EXPECT_EQ(find_param(*a, "h.0.mlp.c_proj.weight").split.kind, SplitKind::columns);
  EXPECT_EQ(find_param(*a, "wte.weight").split.kind, SplitKind::vocabulary);
  EXPECT_EQ(find_param(*a, "lm_head.weight").split.kind, SplitKind::vocabulary);
  EXPECT_TRUE(find_param(*a, "wpe.weight").split.is_replicated());
  EXPECT_TRUE(find_param(*a, "h.0.ln_1.weight").split.is_replicated());
}

TEST(ParamSplit, LlamaGroupedQueryAttentionIsCutByKeyValueHead) {
  // 12 query heads, 6 key/value heads of 8: over 4 ranks the kv heads go 2, 2, 1, 1 and each
  // rank's queries are the 2 query heads of each of its kv heads.
  const auto a = model_architecture("llama:L1-C96-H12-KV6-D8-I64-V50-T8");
  const ParamSpec qkv = find_param(*a, "model.layers.0.self_attn.qkv_proj.weight");
  const std::int64_t q = 96, kv = 48;
  std::vector<std::int64_t> kv_heads;
  for (int r = 0; r < 4; ++r) {
    const auto ranges = split_ranges(qkv.split, qkv.shape, 4, r, qkv.name);
    ASSERT_EQ(ranges.size(), 3u);
    kv_heads.push_back(ranges[1].size / 8);
    EXPECT_EQ(ranges[0].size, 2 * ranges[1].size) << r;  // two query heads per kv head
    EXPECT_EQ(ranges[1].size, ranges[2].size) << r;
    EXPECT_EQ(ranges[1].begin - q, ranges[2].begin - q - kv) << r;  // the same kv heads for k and v
    EXPECT_EQ(ranges[0].begin, 2 * (ranges[1].begin - q)) << r;     // queries of exactly those
  }
  EXPECT_EQ(kv_heads, (std::vector<std::int64_t>{2, 2, 1, 1}));
  // With more ranks than kv heads the surplus ranks hold no attention weights.
  const auto none = split_ranges(qkv.split, qkv.shape, 8, 7, qkv.name);
  for (const auto& r : none) EXPECT_EQ(r.size, 0);
  const ParamSpec o = find_param(*a, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(o.split.kind, SplitKind::columns);
  EXPECT_EQ(split_ranges(o.split, o.shape, 4, 2, o.name)[0].begin, 8 * 2 * 4);  // after kv heads 0-3's queries
  EXPECT_EQ(find_param(*a, "model.layers.0.mlp.down_proj.weight").split.kind, SplitKind::columns);
  EXPECT_EQ(find_param(*a, "model.layers.0.mlp.gate_proj.weight").split.kind, SplitKind::rows);
  EXPECT_TRUE(find_param(*a, "model.norm.weight").split.is_replicated());
}

// Every parameter of every built-in family, at every TP degree: the ranks' ranges tile the cut
// dimension exactly once, in order (an independent check of split_ranges and of each family's
// parts and units).
TEST(ParamSplit, EveryParameterTilesItsDimension) {
  for (const char* spec : {"gpt2:L2-C48-H6-V100-T8", "llama:L2-C96-H12-KV6-D8-I72-V130-T8", "llama:L1-C64-H4-KV4-I80-V64-T8-tied"}) {
    const auto a = model_architecture(spec);
    for (const auto& layer : a->make_layers()) {
      for (const ParamSpec& p : layer->params()) {
        const int dim = p.split.is_replicated() ? 0 : p.split.dim();
        const std::int64_t extent = p.shape[dim];
        for (int tp = 1; tp <= 8; ++tp) {
          std::vector<int> covered(static_cast<std::size_t>(extent), 0);
          for (int r = 0; r < tp; ++r) {
            for (const SplitRange& s : split_ranges(p.split, p.shape, tp, r, p.name)) {
              for (std::int64_t i = s.begin; i < s.begin + s.size; ++i) covered[static_cast<std::size_t>(i)] += 1;
            }
            if (p.split.is_replicated()) break;  // every rank holds it whole
          }
          for (std::int64_t i = 0; i < extent; ++i)
            ASSERT_EQ(covered[static_cast<std::size_t>(i)], 1) << spec << " " << p.name << " tp " << tp << " element " << i;
        }
      }
    }
  }
}

TEST(ParamSplit, InconsistentSplitsAreErrors) {
  const ParamSplit bad = ParamSplit::rows({{10, 4}});  // 10 is not whole units of 4
  EXPECT_THAT(error_of([&] { split_ranges(bad, Shape{10, 3}, 2, 0, "w"); }), HasSubstr("not a whole number of units of 4"));
  EXPECT_THAT(error_of([&] { split_ranges(ParamSplit::rows({{8, 4}}), Shape{10, 3}, 2, 0, "w"); }), HasSubstr("add up to 8"));
  EXPECT_THAT(error_of([&] { split_ranges(ParamSplit::columns(), Shape{10}, 2, 0, "b"); }), HasSubstr("dimension 1"));
}

// ---- pipeline stages: against DeepSpeed 0.19.6's ds_utils.partition_uniform / partition_balanced,
// whose outputs for these inputs were taken from running them ----

TEST(StagePartition, UniformAsDeepSpeed) {
  EXPECT_EQ(partition_uniform(10, 4), (StageParts{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(3, 4), (StageParts{0, 1, 2, 3, 3}));
  EXPECT_EQ(partition_uniform(14, 3), (StageParts{0, 5, 10, 14}));
}

StageParts balanced(std::vector<double> w, std::size_t stages) { return partition_balanced(w, stages); }

TEST(StagePartition, BalancedAsDeepSpeed) {
  EXPECT_EQ(balanced({1, 2, 3, 4, 5, 6, 7, 8, 9}, 3), (StageParts{0, 5, 7, 9}));
  EXPECT_EQ(balanced({5, 1, 1, 1, 1, 1, 1, 5}, 3), (StageParts{0, 2, 7, 8}));
  EXPECT_EQ(balanced({0, 1, 1, 1, 1, 1, 1, 0}, 4), (StageParts{0, 3, 5, 6, 8}));
  EXPECT_EQ(balanced({10, 1, 1, 1, 1, 10}, 2), (StageParts{0, 3, 6}));
  EXPECT_EQ(balanced({3, 3, 3}, 5), (StageParts{0, 1, 2, 3, 3, 3}));
  EXPECT_EQ(balanced({1000, 100, 100, 100, 100, 1010}, 3), (StageParts{0, 1, 5, 6}));
  EXPECT_EQ(balanced({0, 1, 1, 1, 1, 1, 0}, 2), (StageParts{0, 4, 7}));
  EXPECT_EQ(balanced({7, 2, 5, 10, 8}, 2), (StageParts{0, 3, 5}));
}

// Of all splits into contiguous stages, the one partition_balanced picks has the smallest spread
// between its heaviest and lightest stage (brute force over every split, small inputs).
TEST(StagePartition, BalancedMinimisesTheSpread) {
  std::uint32_t lcg = 7;
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t n = 3 + trial % 6, m = 2 + trial % 3;
    if (n <= m) continue;
    std::vector<double> w(n);
    for (double& x : w) x = static_cast<double>((lcg = lcg * 1664525u + 1013904223u) >> 26);
    const auto spread = [&](const StageParts& p) {
      double hi = -1e300, lo = 1e300;
      for (std::size_t s = 0; s < m; ++s) {
        double sum = 0;
        for (std::size_t i = p[s]; i < p[s + 1]; ++i) sum += w[i];
        hi = std::max(hi, sum), lo = std::min(lo, sum);
      }
      return hi - lo;
    };
    double best = 1e300;
    // Every choice of m - 1 cut points in [1, n - 1] (stages non-empty).
    std::vector<std::size_t> cut(m - 1);
    for (std::size_t k = 0; k < m - 1; ++k) cut[k] = k + 1;
    while (true) {
      StageParts p{0};
      p.insert(p.end(), cut.begin(), cut.end());
      p.push_back(n);
      best = std::min(best, spread(p));
      int k = static_cast<int>(m) - 2;
      while (k >= 0 && cut[static_cast<std::size_t>(k)] == n - (m - 1) + static_cast<std::size_t>(k)) --k;
      if (k < 0) break;
      ++cut[static_cast<std::size_t>(k)];
      for (std::size_t j = static_cast<std::size_t>(k) + 1; j < m - 1; ++j) cut[j] = cut[j - 1] + 1;
    }
    EXPECT_EQ(spread(partition_balanced(w, m)), best) << "trial " << trial;
  }
}

TEST(StagePartition, LayersByMethod) {
  const auto layers = model_architecture("llama:L6-C32-H2-I64-V64-T8")->make_layers();  // embedding, 6 blocks, head
  ASSERT_EQ(layers.size(), 8u);
  EXPECT_EQ(partition_layers(layers, 3, "uniform"), (StageParts{0, 3, 6, 8}));
  // type:decoder balances the 6 decoder layers (LlamaDecoderLayer), 2 per stage.
  EXPECT_EQ(partition_layers(layers, 3, "type:decoderlayer"), (StageParts{0, 3, 5, 8}));
  // parameters: the embedding (64·32) and the head (32 + 64·32) weigh about as much as a block.
  const StageParts p = partition_layers(layers, 2, "parameters");
  std::vector<double> w;
  for (const auto& l : layers) {
    double s = 0;
    for (const ParamSpec& ps : l->params()) s += static_cast<double>(ps.shape.numel());
    w.push_back(s);
  }
  EXPECT_EQ(p, partition_balanced(w, 2));
  EXPECT_EQ(partition_layers(layers, 2, "best"), p);
  EXPECT_THAT(error_of([&] { partition_layers(layers, 2, "type:Conv2d"); }), HasSubstr("LlamaDecoderLayer"));
  EXPECT_THAT(error_of([&] { partition_layers(layers, 2, "profile"); }), HasSubstr("\"parameters\""));
  EXPECT_THAT(error_of([&] { partition_layers(layers, 2, "type:(("); }), HasSubstr("not a valid regular expression"));
}

// ---- FLOPs ----

// The Llama tree's matmul MACs are every linear weight once per token plus attention's QKᵀ and AV
// (summed here from the layers' parameter specs), and its parameters are the stored ones.
TEST(ModelFamily, LlamaFlopsTreeAgainstTheLayers) {
  for (const char* spec : {"llama:L2-C64-H4-KV2-I96-V300-T16", "llama:L1-C64-H4-KV4-D32-I64-V100-T16-tied"}) {
    const auto a = model_architecture(spec);
    const LlamaConfig& c = *llama_config_of(*a);
    const std::int64_t B = 3, T = 16;
    std::int64_t linear = 0;
    for (const auto& layer : a->make_layers())
      for (const ParamSpec& p : layer->params())
        if (p.shape.rank == 2 && p.name != "model.embed_tokens.weight") linear += p.shape.numel();
    const ModuleFlops tree = a->forward_flops(B, T);
    EXPECT_EQ(tree.macs, B * T * linear + c.n_layer * 2 * B * c.n_head * T * T * c.head_dim) << spec;
    EXPECT_EQ(static_cast<double>(tree.params), a->stored_parameter_count()) << spec;
    EXPECT_EQ(tree.type, "LlamaForCausalLM");
    EXPECT_DOUBLE_EQ(a->flops_per_token(T), 6.0 * a->stored_parameter_count() + 6.0 * c.n_layer * c.q_dim() * T);
  }
}

TEST(ModelFamily, Gpt2FlopsAreTheProfilersTree) {
  const auto a = model_architecture("gpt2:L2-C64-H4-V100-T32");
  const Gpt2Config& c = *gpt2_config_of(*a);
  const ModuleFlops tree = a->forward_flops(2, 16);
  const ModuleFlops direct =
      gpt2_forward_flops({.batch = 2, .seq_len = 16, .channels = 64, .heads = 4, .vocab = c.padded_vocab_size, .layers = 2, .max_seq_len = 32});
  EXPECT_EQ(tree.flops, direct.flops);
  EXPECT_EQ(tree.params, direct.params);
  EXPECT_DOUBLE_EQ(a->flops_per_token(16), 6.0 * a->stored_parameter_count() + 6.0 * 2 * 64 * 16);  // llm.c's 6N + 6LCT
}

// ---- a family of our own, as an application defines one ----

// A bag-of-embeddings model: the embedding, then a head that projects back onto the vocabulary.
// Layers are borrowed from GPT-2 so that only the family is new; what matters is that the
// registry, make_model and the Architecture defaults serve it.
class TinyArchitecture final : public Architecture {
 public:
  explicit TinyArchitecture(const ModelFamily& f, std::int64_t layers) : family_(f), cfg_(model_config_from_spec("gpt2:L1-C16-H2-V40-T8")) {
    cfg_.n_layer = layers;
  }
  const ModelFamily& family() const override { return family_; }
  std::int64_t n_layer() const override { return cfg_.n_layer; }
  std::int64_t n_embd() const override { return cfg_.n_embd; }
  std::int64_t n_positions() const override { return cfg_.n_positions; }
  std::int64_t vocab_size() const override { return cfg_.vocab_size; }
  double parameter_count() const override { return stored_parameter_count(); }
  double stored_parameter_count() const override { return static_cast<double>(parameter_count_padded(cfg_)); }
  std::string describe() const override { return "tiny"; }
  std::vector<std::unique_ptr<Layer>> make_layers() const override { return make_gpt2_layers(cfg_); }
  std::string config_json() const override { return "{\"layers\": " + std::to_string(cfg_.n_layer) + "}"; }

 private:
  const ModelFamily& family_;
  Gpt2Config cfg_;
};

class TinyFamily final : public ModelFamily {
 public:
  std::string name() const override { return "tinytest"; }
  std::string spec_forms() const override { return "tinytest:<layers>"; }
  std::shared_ptr<const Architecture> from_spec(std::string_view spec) const override {
    return std::make_shared<TinyArchitecture>(*this, std::stoll(std::string(spec.substr(9))));
  }
  std::shared_ptr<const Architecture> from_config_json(std::string_view text, std::string_view) const override {
    return std::make_shared<TinyArchitecture>(*this, std::stoll(std::string(text.substr(11))));
  }
};

TEST(ModelFamily, AnApplicationRegistersItsOwnFamily) {
  static const bool registered = [] {
    register_model_family(std::make_shared<TinyFamily>());
    return true;
  }();
  ASSERT_TRUE(registered);
  EXPECT_THAT(error_of([] { register_model_family(std::make_shared<TinyFamily>()); }), HasSubstr("already registered"));
  EXPECT_EQ(model_families().back()->name(), "tinytest");
  EXPECT_EQ(&model_family("tinytest"), model_families().back().get());
  EXPECT_THAT(error_of([] { model_family("nope"); }), HasSubstr("gpt2, llama, moe, tinytest"));

  const Model m = make_model("tinytest:3");
  EXPECT_EQ(m.layers.size(), 5u);  // embedding, 3 blocks, head
  EXPECT_EQ(m.description, "tiny");
  EXPECT_EQ(m.architecture->n_layer(), 3);
  // Read back from what a checkpoint keeps.
  EXPECT_EQ(model_family("tinytest").from_config_json(m.architecture->config_json(), "x")->n_layer(), 3);
  // The defaults: no weight files (named), T within n_positions, 6N + 6LCT, a tree of the layers.
  EXPECT_THAT(error_of([&] { m.architecture->export_weights("w.safetensors", {}); }), HasSubstr("'tinytest' writes no weight files"));
  EXPECT_THAT(error_of([&] { m.architecture->check_sequence(9, Device::cpu()); }), HasSubstr("n_positions (8)"));
  m.architecture->check_sequence(8, Device::cpu());
  const ModuleFlops tree = m.architecture->forward_flops(1, 4);
  ASSERT_EQ(tree.children.size(), 5u);
  EXPECT_EQ(tree.children[0].flops, 0);  // the embedding looks up
  EXPECT_EQ(tree.children[1].type, "GPT2Block");
  EXPECT_EQ(tree.children[1].macs, 4 * (12 * 16 * 16));  // c_attn 3C², c_proj C², c_fc 4C², c_proj 4C²
  EXPECT_EQ(static_cast<double>(tree.params), m.architecture->stored_parameter_count());
  // The registry's names for rejected families.
  struct Colon final : ModelFamily {
    std::string name() const override { return "a:b"; }
    std::string spec_forms() const override { return ""; }
    std::shared_ptr<const Architecture> from_spec(std::string_view) const override { return nullptr; }
    std::shared_ptr<const Architecture> from_config_json(std::string_view, std::string_view) const override { return nullptr; }
  };
  EXPECT_THAT(error_of([] { register_model_family(std::make_shared<Colon>()); }), HasSubstr("hold no ':'"));
}

}  // namespace
}  // namespace dstrain
