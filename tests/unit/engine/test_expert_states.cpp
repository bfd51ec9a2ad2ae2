// ModelStates over two groups (expert parallelism, zero/model_states.h): on 4 local ranks with
// expert-data-parallel groups {0, 2} and {1, 3} (EP 2), the expert specs' gradients are averaged over
// the rank's expert group and the others over all 4 ranks, at every ZeRO stage, with overlap_comm
// off and on, reduce_scatter on and off, in fp32 and bf16; the expert unit is sharded over 2 ranks
// and the rest over 4; masters and params round-trip per group; and without an expert group the
// layout is the one-unit layout of old. Every expected value is computed here from the known
// per-rank inputs, never by ModelStates.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "ops/allocator.h"
#include "ops/kernels/tensor_ops.h"
#include "zero/local_communicator.h"
#include "zero/model_states.h"

namespace dstrain {
namespace {

constexpr int kWorld = 4;
constexpr int kExpertWorld = 2;  // ranks r and r + 2 hold the same experts

ParamSpec param(std::string name, Shape shape, bool decay = true, bool expert = false) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.weight_decay = decay;
  if (expert) p.split = ParamSplit::experts();
  return p;
}

// Five layers: a dense embedding; two MoE layers (a replicated spec beside the experts' stacks,
// (E_local, a, b)); a layer of experts only (an empty primary unit); a head tied to the embedding.
std::vector<std::vector<ParamSpec>> model_specs() {
  ParamSpec tied = param("head.w", Shape{16, 12});
  tied.tied_to = "wte";
  return {
      {param("wte", Shape{16, 12})},
      {param("ln1.w", Shape{12}, false), param("experts1.w1", Shape{2, 12, 8}, true, true), param("experts1.b", Shape{2, 8}, false, true)},
      {param("experts2.w", Shape{2, 8, 12}, true, true), param("router2", Shape{12, 4})},
      {param("experts3.w", Shape{2, 5}, true, true)},
      {tied, param("head.b", Shape{16}, false)},
  };
}

std::vector<std::string> layer_names(std::size_t n) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back("layer" + std::to_string(i));
  return v;
}

bool is_expert(const ParamSpec& ps) { return ps.split.kind == SplitKind::experts; }

// The gradient rank r writes into element e of a parameter (index p in model order): quarters and
// eighths, so that sums and means over 2 or 4 ranks are exact in bf16.
double grad_value(int r, int p, std::int64_t e) { return static_cast<double>(e % 4) * 0.5 + r * 0.25 + (p % 2) * 0.125; }

// The masters set per group: the same on every rank that holds the parameter (an expert's differs
// between the two expert groups, which hold different experts).
double master_value(int group, int p, std::int64_t e, bool expert) {
  return static_cast<double>(e % 8) * 0.25 + p + (expert ? 8.0 * (group + 1) : 0.0);
}

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  convert_tensor(Tensor(v.data(), DType::fp32, Shape{t.numel()}), t);
  return v;
}

void from_f32(const Tensor& t, std::vector<float> v) { convert_tensor(t, Tensor(v.data(), DType::fp32, Shape{t.numel()})); }

struct Config {
  int stage;
  bool overlap;
  bool reduce_scatter;
  DType storage;
};

void PrintTo(const Config& c, std::ostream* os) {
  *os << "stage " << c.stage << (c.overlap ? " overlap" : "") << (c.reduce_scatter ? "" : " no-reduce-scatter") << " " << dtype_name(c.storage);
}

ZeroSettings settings(const Config& c) {
  ZeroSettings zs;
  zs.stage = c.stage;
  zs.storage = c.storage;
  zs.optimizer_states = {"exp_avg"};
  zs.overlap_comm = c.overlap;
  zs.reduce_scatter = c.reduce_scatter;
  zs.reduce_bucket_size = 200;  // several chunks / buckets per unit
  zs.allgather_bucket_size = 200;
  zs.param_persistence_threshold = 64;  // stage 3: the small units stay whole, the rest are gathered
  return zs;
}

class ExpertStates : public ::testing::TestWithParam<Config> {};

TEST_P(ExpertStates, TwoGroupsReduceShardAndGatherTheirOwnParameters) {
  const Config cfg = GetParam();
  const auto specs = model_specs();
  const std::size_t L = specs.size();
  // Model-order index of every owned parameter, and its spec.
  std::map<std::string, int> index;
  std::map<std::string, ParamSpec> by_name;
  for (const auto& layer : specs)
    for (const ParamSpec& ps : layer)
      if (!ps.tied()) {
        index.emplace(ps.name, static_cast<int>(index.size()));
        by_name.emplace(ps.name, ps);
      }
  // How many params() entries read each parameter (the tied head adds its gradient into wte's).
  std::map<std::string, int> uses;
  for (const auto& layer : specs)
    for (const ParamSpec& ps : layer) uses[ps.tied() ? ps.tied_to : ps.name] += 1;
  // Expected averaged gradient: over all 4 ranks, or over the rank's expert group.
  const auto expected_grad = [&](int r, const std::string& name, std::int64_t e) {
    const int p = index.at(name);
    double sum = 0;
    int n = 0;
    for (int q = 0; q < kWorld; ++q) {
      if (is_expert(by_name.at(name)) && q % kExpertWorld != r % kExpertWorld) continue;
      sum += grad_value(q, p, e);
      ++n;
    }
    return uses.at(name) * sum / n;
  };

  std::mutex mu;
  std::map<std::tuple<int, std::string>, std::vector<int>> covered;  // (expert group or -1, name) -> per element: holders
  run_local_ranks(kWorld, [&](Communicator& comm) {
    const int r = comm.rank();
    const int group = r % kExpertWorld;
    std::unique_ptr<Communicator> expert_comm = comm.split(group, r);
    ASSERT_EQ(expert_comm->world_size(), kExpertWorld);
    CpuAllocator alloc;
    ModelStates ms(specs, layer_names(L), settings(cfg), &comm, alloc, expert_comm.get());
    EXPECT_EQ(ms.expert_communicator(), expert_comm.get());

    // ---- layout: which unit holds what, and each unit's split ----
    const int pw = cfg.stage >= 1 ? kWorld : 1, pwe = cfg.stage >= 1 ? kExpertWorld : 1;
    std::int64_t shard = 0;
    std::int32_t tensor = 0;
    std::map<std::int32_t, std::string> tensor_name;
    for (std::size_t i = 0; i < L; ++i) {
      const FlatLayout* ex = ms.expert_layout(i);
      const bool has_expert = i == 1 || i == 2 || i == 3;
      ASSERT_EQ(ex != nullptr, has_expert) << "layer " << i;
      EXPECT_EQ(ms.layout(i).world, pw);
      for (const FlatSlot& sl : ms.layout(i).slots) EXPECT_FALSE(is_expert(ms.spec(i, sl))) << ms.spec(i, sl).name;
      shard += ms.layout(i).numel / pw;
      if (ex != nullptr) {
        EXPECT_EQ(ex->world, pwe);
        for (const FlatSlot& sl : ex->slots) EXPECT_TRUE(is_expert(ms.spec(i, sl))) << ms.spec(i, sl).name;
        shard += ex->numel / pwe;
      }
      // slots(i): primary then expert unit, numbered as the owned tensors are.
      std::vector<const FlatSlot*> want;
      for (const FlatSlot& sl : ms.layout(i).slots) want.push_back(&sl);
      if (ex != nullptr)
        for (const FlatSlot& sl : ex->slots) want.push_back(&sl);
      EXPECT_EQ(ms.slots(i), want);
      for (const FlatSlot* sl : want) tensor_name[tensor++] = ms.spec(i, *sl).name;
    }
    EXPECT_EQ(ms.layout(3).numel, 0);  // only experts: an empty primary unit
    EXPECT_EQ(ms.tensor_count(), tensor);
    EXPECT_EQ(ms.store().layout().numel, shard);
    std::int64_t seg_numel = 0;
    for (const PartitionSegment& sg : ms.partitions()) {
      seg_numel += sg.numel;
      for (const TensorPiece& tp : sg.pieces) EXPECT_EQ(sg.expert, is_expert(by_name.at(tensor_name.at(tp.tensor)))) << tensor_name.at(tp.tensor);
    }
    EXPECT_EQ(seg_numel, shard);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const OwnedPiece& p : ms.owned_pieces()) {
        const ParamSpec& ps = ms.spec(p.layer, *p.slot);
        EXPECT_EQ(tensor_name.at(p.tensor), ps.name);
        std::vector<int>& c = covered[{is_expert(ps) ? group : -1, ps.name}];
        c.resize(static_cast<std::size_t>(ps.shape.numel()), 0);
        for (std::int64_t e = 0; e < p.numel; ++e) c[static_cast<std::size_t>(p.tensor_offset + e)] += 1;
      }
    }

    // ---- one micro-step's backward: rank-dependent gradients, then the reductions ----
    std::vector<std::size_t> trace;
    for (std::size_t i = 0; i < L; ++i) trace.push_back(i);
    for (std::size_t i = L; i-- > 0;) trace.push_back(i);
    ms.set_traces(trace, std::vector<std::size_t>(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(L)));
    ms.begin_pass(true);
    std::vector<Tensor> params, grads;
    for (std::size_t i = 0; i < L; ++i) {
      ms.acquire(i);
      ms.views(i, params, nullptr);
      EXPECT_EQ(params.size(), specs[i].size());
      ms.release(i);
    }
    for (std::size_t i = L; i-- > 0;) {
      ms.acquire(i);
      ms.before_backward(i);
      ms.views(i, params, &grads);
      ASSERT_EQ(grads.size(), specs[i].size());
      for (std::size_t j = 0; j < specs[i].size(); ++j) {
        const ParamSpec& ps = specs[i][j];
        EXPECT_EQ(grads[j].shape, ps.shape) << ps.name;
        const int p = index.at(ps.tied() ? ps.tied_to : ps.name);
        std::vector<float> g = to_f32(grads[j]);  // accumulate, as a layer's backward does (the tied head)
        for (std::size_t e = 0; e < g.size(); ++e) g[e] += static_cast<float>(grad_value(r, p, static_cast<std::int64_t>(e)));
        from_f32(grads[j], g);
      }
      ms.after_backward(i, true);
      ms.release(i);
    }
    ms.end_backward(true);

    // Every partition segment's reduced gradient (stage 0: the whole model) against the means.
    for (const PartitionSegment& sg : ms.partitions()) {
      const std::vector<float> g = to_f32(sg.grads);
      for (const TensorPiece& tp : sg.pieces) {
        const std::string& name = tensor_name.at(tp.tensor);
        for (std::int64_t e = 0; e < tp.numel; ++e) {
          ASSERT_EQ(g[static_cast<std::size_t>(tp.offset + e)], expected_grad(r, name, tp.tensor_offset + e))
              << "rank " << r << " " << name << "[" << tp.tensor_offset + e << "]";
        }
      }
    }
    // Stages 0-1 keep the whole gradients: at stage 0 (and stage 1 with reduce_scatter off) all of it is the mean.
    if (cfg.stage == 0 || (cfg.stage == 1 && !cfg.reduce_scatter)) {
      for (std::size_t i = 0; i < L; ++i) {
        for (const FlatSlot* sl : ms.slots(i)) {
          const ParamSpec& ps = ms.spec(i, *sl);
          const std::vector<float> g = to_f32(ms.full_grad(i, *sl));
          for (std::size_t e = 0; e < g.size(); ++e)
            ASSERT_EQ(g[e], expected_grad(r, ps.name, static_cast<std::int64_t>(e))) << "rank " << r << " " << ps.name << "[" << e << "]";
        }
      }
    }

    // ---- masters: set per group, gathered back whole; params rounded from them ----
    const auto master_of = [&](const ParamSpec& ps, std::int64_t e) { return master_value(group, index.at(ps.name), e, is_expert(ps)); };
    ms.set_masters([&](std::size_t layer, const FlatSlot& sl, const Tensor& out) {
      const ParamSpec& ps = ms.spec(layer, sl);
      std::vector<float> v(static_cast<std::size_t>(out.numel()));
      for (std::size_t e = 0; e < v.size(); ++e) v[e] = static_cast<float>(master_of(ps, static_cast<std::int64_t>(e)));
      copy_tensor(out, Tensor(v.data(), DType::fp32, out.shape));
    });
    int gathered = 0;
    ms.gather_masters([&](std::size_t layer, const FlatSlot& sl, const Tensor& fp32) {
      const ParamSpec& ps = ms.spec(layer, sl);
      ++gathered;
      const std::vector<float> v = to_f32(fp32);
      ASSERT_EQ(static_cast<std::int64_t>(v.size()), ps.shape.numel());
      for (std::size_t e = 0; e < v.size(); ++e) ASSERT_EQ(v[e], master_of(ps, static_cast<std::int64_t>(e))) << ps.name << "[" << e << "]";
    });
    EXPECT_EQ(gathered, tensor);
    // Whole params on every rank: in place (stages 0-2, stage 3's persistent units) or gathered.
    const auto check_params = [&](const std::function<double(const ParamSpec&, std::int64_t)>& want) {
      ms.begin_pass(false);
      for (std::size_t i = 0; i < L; ++i) {
        ms.acquire(i);
        ms.views(i, params, nullptr);
        for (std::size_t j = 0; j < specs[i].size(); ++j) {
          const ParamSpec& owner = specs[i][j].tied() ? by_name.at(specs[i][j].tied_to) : specs[i][j];
          const std::vector<float> v = to_f32(params[j]);
          for (std::size_t e = 0; e < v.size(); ++e)
            ASSERT_EQ(v[e], want(owner, static_cast<std::int64_t>(e))) << "rank " << r << " " << specs[i][j].name << "[" << e << "]";
        }
        ms.release(i);
      }
      ms.end_eval();
    };
    check_params(master_of);

    // ---- an update written through this rank's owned pieces, spread by after_update ----
    const auto updated = [&](const ParamSpec& ps, std::int64_t e) { return master_of(ps, e) + 0.5; };
    for (const OwnedPiece& p : ms.owned_pieces()) {
      const ParamSpec& ps = ms.spec(p.layer, *p.slot);
      std::vector<float> v(static_cast<std::size_t>(p.numel));
      for (std::size_t e = 0; e < v.size(); ++e) v[e] = static_cast<float>(updated(ps, p.tensor_offset + static_cast<std::int64_t>(e)));
      ms.write_owned_param(p, Tensor(v.data(), DType::fp32, Shape{p.numel}));
      std::vector<float> back(v.size());  // read in the storage dtype (4 bytes per element hold either)
      ms.read_owned_param(p, Tensor(back.data(), cfg.storage, Shape{p.numel}));
      EXPECT_EQ(to_f32(Tensor(back.data(), cfg.storage, Shape{p.numel})), v) << ps.name;
    }
    ms.after_update();
    check_params(updated);
  });

  // Every element of every owned parameter once per holder group: a replicated one in exactly one
  // rank's partition of the 4 (stage 0: in all 4), an expert one once in each expert group (stage 0: twice).
  for (const auto& [name, ps] : by_name) {
    for (const int g : is_expert(ps) ? std::vector<int>{0, 1} : std::vector<int>{-1}) {
      const int want = cfg.stage >= 1 ? 1 : (g < 0 ? kWorld : kExpertWorld);
      const std::vector<int>& c = covered.at({g, name});
      ASSERT_EQ(static_cast<std::int64_t>(c.size()), ps.shape.numel()) << name;
      for (std::size_t e = 0; e < c.size(); ++e) ASSERT_EQ(c[e], want) << name << " group " << g << " [" << e << "]";
    }
  }
}

std::vector<Config> configs() {
  std::vector<Config> v;
  for (const DType t : {DType::fp32, DType::bf16})
    for (const int stage : {0, 1, 2, 3})
      for (const bool overlap : {false, true})
        for (const bool rs : {true, false})
          if (rs || stage >= 1) v.push_back({stage, overlap, rs, t});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Matrix, ExpertStates, ::testing::ValuesIn(configs()), [](const auto& pinfo) {
  const Config& c = pinfo.param;
  return "Stage" + std::to_string(c.stage) + (c.overlap ? "_Overlap" : "") + (c.reduce_scatter ? "" : "_NoReduceScatter") +
         (c.storage == DType::fp32 ? "_fp32" : "_bf16");
});

// Without an expert group every owned spec is in the one unit of its layer, laid out as
// make_flat_layout lays out the whole params() list, and the shard space is those units back to
// back: the layout every existing caller had before expert parallelism.
TEST(ExpertStatesOff, NullExpertGroupKeepsTheOneUnitLayout) {
  const auto specs = model_specs();
  for (const int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    run_local_ranks(kWorld, [&](Communicator& comm) {
      const Config cfg{stage, false, true, DType::bf16};
      CpuAllocator alloc;
      ModelStates plain(specs, layer_names(specs.size()), settings(cfg), &comm, alloc);
      ModelStates none(specs, layer_names(specs.size()), settings(cfg), &comm, alloc, nullptr);
      EXPECT_EQ(none.expert_communicator(), nullptr);
      const int pw = stage >= 1 ? kWorld : 1;
      std::int64_t max_chunk = 0;
      if (stage == 1 || stage == 2) max_chunk = 200;
      if (stage == 3) max_chunk = 200;
      std::int64_t shard = 0;
      for (std::size_t i = 0; i < specs.size(); ++i) {
        EXPECT_EQ(none.expert_layout(i), nullptr);
        const FlatLayout want = make_flat_layout(specs[i], pw, dtype_size(DType::bf16), max_chunk);
        for (const ModelStates* ms : {&plain, &none}) {
          const FlatLayout& lo = ms->layout(i);
          EXPECT_EQ(lo.numel, want.numel);
          EXPECT_EQ(lo.chunk, want.chunk);
          ASSERT_EQ(lo.slots.size(), want.slots.size());
          for (std::size_t k = 0; k < want.slots.size(); ++k) {
            EXPECT_EQ(lo.slots[k].spec, want.slots[k].spec);
            EXPECT_EQ(lo.slots[k].offset, want.slots[k].offset);
          }
          EXPECT_EQ(ms->slots(i).size(), want.slots.size());
        }
        shard += want.numel / pw;
      }
      EXPECT_EQ(none.store().layout().numel, shard);
      ASSERT_EQ(plain.partitions().size(), none.partitions().size());
      for (std::size_t k = 0; k < plain.partitions().size(); ++k) {
        const PartitionSegment &a = plain.partitions()[k], &b = none.partitions()[k];
        EXPECT_EQ(std::tie(a.layer, a.layer_offset, a.shard_offset, a.numel, a.group), std::tie(b.layer, b.layer_offset, b.shard_offset, b.numel, b.group));
        EXPECT_FALSE(b.expert);
      }
      ASSERT_EQ(plain.owned_pieces().size(), none.owned_pieces().size());
      for (std::size_t k = 0; k < plain.owned_pieces().size(); ++k) {
        const OwnedPiece &a = plain.owned_pieces()[k], &b = none.owned_pieces()[k];
        EXPECT_EQ(std::tie(a.layer, a.tensor, a.tensor_offset, a.numel, a.shard_offset), std::tie(b.layer, b.tensor, b.tensor_offset, b.numel, b.shard_offset));
      }
      EXPECT_EQ(plain.padded_numel(), none.padded_numel());
    });
  }
}

}  // namespace
}  // namespace dstrain
