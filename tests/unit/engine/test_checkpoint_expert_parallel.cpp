// Training checkpoints under expert parallelism (docs/checkpoints.md "Expert parallelism",
// docs/parallelism.md §8): an expert-parallel rank holds E/EP whole experts of every stack and
// saves them as runs of the whole stack's elements, the non-expert parameters once over the data
// group, so a checkpoint is of the whole model and loads at any EP, data-parallel size and ZeRO
// stage.
//
//   - save a Mixtral-shaped model (4 experts, top-2, the load-balancing loss) on 4 ranks with EP 2
//     at ZeRO stage 0-3; resume on the same layout bit for bit (the next checkpoint's rank files the
//     same bytes), and on EP 1 x 1 rank, EP 4 x 4 ranks, EP 1 x 2 ranks and EP 2 x 2 ranks: the
//     loaded whole parameters are the saved ones exactly, and one more step equals the saving run's
//     within the reduction-order bound of test_checkpoint_tensor_parallel.cpp;
//   - the manifest lists whole shapes and layout.expert_parallel, and the rank files tile every
//     element of every buffer exactly once — at stage 0 too, where every rank holds its parameters
//     whole and only the first rank of each expert-data group saves its experts;
//   - save_weights after loading it writes the same Hugging Face file on every layout (EP 4, EP 2,
//     no EP: each stack's experts gathered over the EP group), which is also what consolidate writes
//     from the EP checkpoint; load_weights (--init-from) of that file on EP 2 and EP 4 gives each
//     rank its experts' slice: the whole parameters are the file's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_test_files.h"
#include "engine/checkpoint/checkpoint_consolidate.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "models/model_registry.h"
#include "zero/device_mesh.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace checkpoint_testing;
using namespace zero_testing;
namespace fs = std::filesystem;
using Params = std::map<std::string, std::vector<float>>;

constexpr const char* kMoe = "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-aux0.05";
// Every layout trains the same global batch of 4 micro-batches: GAS = 4 / world.
constexpr int kGlobalMicro = 4;

struct Segment {
  int world = 1, ep = 1, stage = 0;
  int from = 0, to = 0;  // optimizer steps [from, to)
  std::optional<fs::path> load_dir;
  std::string load_tag;
  std::optional<fs::path> save_dir;
  int save_mid_after = -1;
  bool save_final = false;
  std::optional<fs::path> weights;    // save_weights right after the load
  std::optional<fs::path> init_from;  // load_weights before anything else (Hugging Face weights)
};

struct Result {
  std::vector<float> losses;
  Params loaded, at_mid, final;
};

Result run(const Segment& seg) {
  const int gas = kGlobalMicro / seg.world;
  RunSpec s;
  s.stage = seg.stage;
  s.world = seg.world;
  s.gas = gas;
  s.knobs.reduce_bucket_size = 3000;  // pieces cut again into several ZeRO pieces
  s.knobs.allgather_bucket_size = 3000;
  s.knobs.persistence_threshold = 200;
  s.knobs.zero_extra_json = R"("stage3_gather_16bit_weights_on_model_save": true)";  // save_weights at stage 3 on several ranks
  std::string json = zero_config_json(s);
  json.pop_back();
  json += fmt::format(R"(, "expert_parallel": {{"enabled": {}, "autoep_size": {}}}}})", seg.ep > 1 ? "true" : "false", seg.ep);
  std::vector<Result> per_rank(static_cast<std::size_t>(seg.world));
  run_local_ranks(seg.world, [&](Communicator& comm) {
    const int r = comm.rank();
    MeshGroups mesh = make_mesh_groups(comm, make_mesh_shape(seg.world, 1, 1, 1, seg.ep));
    Result& me = per_rank[static_cast<std::size_t>(r)];
    config::ConfigOptions copts;
    copts.world_size = seg.world;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = mesh.data.get();
    if (seg.ep > 1) {
      o.expert_parallel = mesh.ep.get();
      o.expert_data = mesh.expert_data.get();
    }
    o.sequence_length = kT;
    Engine e = initialize(make_model(model_architecture(kMoe), {}, {}, {mesh.coord.ep, seg.ep}), c, o);
    CheckpointManager checkpoints(e);
    const auto gather = [&e](Params& into) { e.gather_master_params([&](const std::string& n, const Tensor& v) { into[n] = values(v); }); };
    if (seg.init_from) e.load_weights(*seg.init_from);
    if (seg.load_dir) EXPECT_TRUE(checkpoints.load(*seg.load_dir, seg.load_tag).loaded());
    EXPECT_EQ(e.state().global_steps, seg.from);
    gather(me.loaded);
    if (seg.weights) e.save_weights(*seg.weights);
    for (int step = seg.from; step < seg.to; ++step) {
      for (int g = 0; g < gas; ++g) {
        Tokens b = slot_batch(step, g * seg.world + r);
        e.forward(b.batch());
        e.backward();
        e.step();
      }
      me.losses.push_back(e.state().last_step_loss);
      if (step + 1 == seg.save_mid_after) {
        checkpoints.save(*seg.save_dir, "mid");
        gather(me.at_mid);
      }
    }
    if (seg.save_final) checkpoints.save(*seg.save_dir, "final");
    checkpoints.wait();
    gather(me.final);
  });
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    EXPECT_EQ(per_rank[r].losses, per_rank[0].losses) << "rank " << r;
    EXPECT_TRUE(per_rank[r].loaded == per_rank[0].loaded) << "rank " << r;
    EXPECT_TRUE(per_rank[r].final == per_rank[0].final) << "rank " << r;
  }
  return per_rank.front();
}

// Every element of every buffer (masters, exp_avg, exp_avg_sq) of every whole parameter saved
// exactly once across the rank files, and the layout recorded.
void check_tiling(const fs::path& dir, int world, int ep) {
  const config::Json m = config::Json::parse(file_bytes(dir / "checkpoint.json"));
  EXPECT_EQ(m.at("layout").at("world_size"), world);
  EXPECT_EQ(m.at("layout").value("expert_parallel", 1), ep);
  std::map<std::string, std::int64_t> numel;
  for (const config::Json& p : m.at("model").at("params")) {
    std::int64_t n = 1;
    for (const auto& d : p.at("shape")) n *= d.get<std::int64_t>();
    numel[p.at("name").get<std::string>()] = n;
  }
  ASSERT_TRUE(numel.count("model.layers.0.mlp.experts.gate_proj.weight"));
  EXPECT_EQ(numel.at("model.layers.0.mlp.experts.gate_proj.weight"), 4 * 24 * 32) << "the manifest must list the whole expert stack";
  std::map<std::pair<std::string, std::string>, std::vector<int>> seen;
  for (std::size_t k = 0; k < m.at("ranks").size(); ++k) {
    const config::Json idx = config::Json::parse(file_bytes(dir / rank_file_name(static_cast<int>(k), ".json")));
    for (const config::Json& t : idx.at("tensors")) {
      const std::string param = t.at("param").get<std::string>();
      auto& v = seen[{t.at("buffer").get<std::string>(), param}];
      v.resize(static_cast<std::size_t>(numel.at(param)), 0);
      const std::int64_t off = t.at("offset").get<std::int64_t>(), n = t.at("numel").get<std::int64_t>();
      ASSERT_LE(off + n, numel.at(param)) << param;
      for (std::int64_t i = off; i < off + n; ++i) ++v[static_cast<std::size_t>(i)];
    }
  }
  EXPECT_EQ(seen.size(), 3 * numel.size());
  for (const auto& [key, v] : seen) {
    const auto bad = std::find_if(v.begin(), v.end(), [](int c) { return c != 1; });
    EXPECT_TRUE(bad == v.end()) << key.first << "/" << key.second << " element " << (bad - v.begin()) << " saved " << (bad == v.end() ? 1 : *bad)
                                << " times";
  }
}

class ExpertParallelCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(ExpertParallelCheckpoint, SaveOnEp2ResumeOnAnyLayout) {
  const int stage = GetParam();
  TempDir dir("ep_save"), again("ep_again"), weights("ep_weights");
  Segment a;
  a.world = 4;
  a.ep = 2;
  a.stage = stage;
  a.to = 3;
  a.save_dir = dir.path;
  a.save_mid_after = 2;
  a.save_final = true;
  const Result saved = run(a);
  ASSERT_EQ(saved.losses.size(), 3u);
  check_tiling(dir.path / "mid", 4, 2);
  {
    SCOPED_TRACE("resume at EP 2 x 4 ranks");
    Segment b = a;
    b.from = 2;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    b.save_dir = again.path;
    b.save_mid_after = -1;
    const Result r = run(b);
    EXPECT_TRUE(r.loaded == saved.at_mid);
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_EQ(r.losses[0], saved.losses[2]);
    EXPECT_TRUE(r.final == saved.final);
    for (std::size_t k = 0; k < 4; ++k) {
      const std::string name = rank_file_name(static_cast<int>(k), ".safetensors");
      EXPECT_TRUE(file_bytes(dir.path / "final" / name) == file_bytes(again.path / "final" / name)) << name << " differs";
    }
  }
  // test_checkpoint_tensor_parallel.cpp's one-step bound: another layout sums the gradients in
  // another order; a wrongly loaded state (an expert's moments on another expert) moves the step by
  // O(lr) = 1e-2.
  const Tolerance tol{1e-6, 1.5e-6, 0.0, 3e-5, 3e-6, 2e-4};
  for (const auto& [world, ep] : std::vector<std::pair<int, int>>{{1, 1}, {4, 4}, {2, 1}, {2, 2}}) {
    SCOPED_TRACE(fmt::format("resume at EP {} x {} ranks", ep, world));
    Segment b;
    b.world = world;
    b.ep = ep;
    b.stage = stage;
    b.from = 2;
    b.to = 3;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    b.weights = weights.path / fmt::format("ep{}_world{}.safetensors", ep, world);
    const Result r = run(b);
    ASSERT_EQ(r.loaded.size(), saved.at_mid.size());
    for (const auto& [name, v] : saved.at_mid) EXPECT_TRUE(r.loaded.at(name) == v) << name << " loaded differs from the saved value";
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_LE(std::abs(r.losses[0] - saved.losses[2]), tol.loss_rtol * std::abs(saved.losses[2])) << r.losses[0] << " vs " << saved.losses[2];
    const ParamDiff d = compare_params(r.final, saved.final, saved.at_mid, tol.atol, tol.rtol);
    EXPECT_TRUE(d.finite);
    EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs;
    EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
    EXPECT_LE(d.update_rel, tol.update_rel);
  }
  // save_weights gathers each stack's experts over the EP group: the same file from every layout,
  // and the one consolidate writes from the checkpoint.
  const std::string one_rank = file_bytes(weights.path / "ep1_world1.safetensors");
  EXPECT_FALSE(one_rank.empty());
  for (const char* name : {"ep4_world4.safetensors", "ep2_world2.safetensors", "ep1_world2.safetensors"})
    EXPECT_TRUE(file_bytes(weights.path / name) == one_rank) << name << " differs from one rank's weights";
  const fs::path out = weights.path / "consolidated.safetensors";
  EXPECT_EQ(consolidate_checkpoint(dir.path, "mid", out, DType::fp32), "mid");
  EXPECT_TRUE(file_bytes(out) == one_rank) << "consolidated weights differ from one rank's";
  // --init-from those weights on EP layouts: each rank takes its experts' slice of every stack.
  for (const auto& [world, ep] : std::vector<std::pair<int, int>>{{4, 2}, {4, 4}}) {
    SCOPED_TRACE(fmt::format("init from weights at EP {} x {} ranks", ep, world));
    Segment c;
    c.world = world;
    c.ep = ep;
    c.stage = stage;
    c.init_from = weights.path / "ep1_world1.safetensors";
    const Result r = run(c);
    for (const auto& [name, v] : saved.at_mid) EXPECT_TRUE(r.loaded.at(name) == v) << name << " differs from the weights file";
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ExpertParallelCheckpoint, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return fmt::format("stage{}", info.param); });

// The reverse: one rank's checkpoint (every expert on it) resumes on EP 2 and EP 4, each rank
// taking its experts' runs of the saved stacks.
TEST(ExpertParallelCheckpointReverse, OneRankCheckpointLoadsOnExpertParallelLayouts) {
  TempDir dir("ep_one");
  Segment a;
  a.world = 1;
  a.stage = 1;
  a.to = 2;
  a.save_dir = dir.path;
  a.save_mid_after = 2;
  const Result saved = run(a);
  for (const auto& [world, ep] : std::vector<std::pair<int, int>>{{2, 2}, {4, 4}, {4, 2}}) {
    SCOPED_TRACE(fmt::format("EP {} x {} ranks", ep, world));
    Segment b;
    b.world = world;
    b.ep = ep;
    b.stage = 3;
    b.from = 2;
    b.to = 2;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    const Result r = run(b);
    ASSERT_EQ(r.loaded.size(), saved.at_mid.size());
    for (const auto& [name, v] : saved.at_mid) EXPECT_TRUE(r.loaded.at(name) == v) << name;
  }
}

}  // namespace
}  // namespace dstrain
