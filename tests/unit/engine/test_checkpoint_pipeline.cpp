// Training checkpoints of a pipeline (docs/checkpoints.md "Pipeline parallelism"): every rank of the
// mesh (stage x data x tensor parallel) saves the pieces of its stage's parameters it owns, in the
// whole model's parameter space, and the manifest lists the whole model — so a checkpoint of a
// pipeline loads at any layout, and one without a pipeline loads into one.
//
// GPT-2 (kModel: embedding, 2 blocks, head tied to the embedding) trained 4 steps on 2 stages, saved
// after step 2 ("mid"), then:
//   (a) resumed on 2 stages: bit for bit the uninterrupted run;
//   (b) loaded into one rank (plain forward / backward / step), into 2 stages x DP 2 at ZeRO 1,
//       into 4 stages and into 2 stages x TP 2: the loaded whole parameters are the saving run's
//       exactly, the continuation equal within mesh_test_util's reduction-order tolerance;
//   (c) a one-rank checkpoint loaded into 2 stages;
//   (d) consolidate of the pipeline checkpoint gives the saving run's gathered parameters;
//   (e) a stage's rank file missing: refused on every rank before anything is loaded, naming it.
// The manifest lists every parameter once (the last stage's copy of the tied embedding is not saved)
// and the saved pieces tile every parameter of every buffer exactly once.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_test_files.h"
#include "engine/checkpoint/checkpoint_consolidate.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "engine/pipeline_engine.h"
#include "mesh_test_util.h"

namespace dstrain {
namespace {

using namespace checkpoint_testing;

namespace fs = std::filesystem;
using namespace mesh_testing;
using Params = std::map<std::string, std::vector<float>>;

constexpr int kGlobalMicro = 4;  // micro-batches per optimizer step, over the data-parallel ranks
constexpr int kSteps = 4;



// Steps [from, to) on a PP x DP x TP mesh of local ranks, optionally loading a checkpoint first and
// saving one after step `save_after`.
struct Segment {
  int pp = 2, dp = 1, tp = 1, stage = 0;
  int from = 0, to = kSteps;
  std::optional<fs::path> load_dir;
  std::string load_tag = "mid";
  std::optional<fs::path> save_dir;
  int save_after = -1;
  std::string save_tag = "mid";
};

struct SegmentResult {
  std::vector<float> losses;             // after each step (every rank reports the same)
  Params initial, loaded, saved, final;  // whole parameters: at the start, after the load, at the save, at the end
  std::vector<std::string> load_errors;  // per rank: the load's Error ("" when it loaded)
};

SegmentResult run_segment(const Segment& seg) {
  const int world = seg.pp * seg.dp * seg.tp, gas = kGlobalMicro / seg.dp;
  MeshRun m;
  m.pp = seg.pp;
  m.dp = seg.dp;
  m.tp = seg.tp;
  m.stage = seg.stage;
  m.gas = gas;
  const std::string json = mesh_config_json(m);
  struct PerRank {
    std::vector<float> losses;
    Params initial, loaded, saved, final;
    std::string error;
  };
  std::vector<PerRank> per_rank(static_cast<std::size_t>(world));
  run_local_ranks(world, [&](Communicator& comm) {
    PerRank& me = per_rank[static_cast<std::size_t>(comm.rank())];
    MeshGroups mesh = make_mesh_groups(comm, make_mesh_shape(world, seg.tp, 1, seg.pp));
    config::ConfigOptions copts;
    copts.world_size = world;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = mesh.data.get();
    o.tensor_parallel = seg.tp > 1 ? mesh.tp.get() : nullptr;
    o.sequence_length = kT;
    Model model = build_model(kModel, {mesh.coord.tp, seg.tp}, {});
    std::unique_ptr<Communicator> ties;
    if (seg.pp > 1) ties = make_test_pipeline_stage(comm, mesh, seg.pp, 1, PipelineScheduleKind::one_f_one_b, gas, "uniform", model, o);
    Engine e = initialize(std::move(model), c, o);
    CheckpointManager checkpoints(e);
    const auto gather = [&e](Params& into) { e.gather_master_params([&](const std::string& n, const Tensor& v) { into[n] = values(v); }); };
    gather(me.initial);
    if (seg.load_dir) {
      try {
        EXPECT_TRUE(checkpoints.load(*seg.load_dir, seg.load_tag).loaded());
        EXPECT_EQ(e.state().global_steps, seg.from);
      } catch (const Error& err) {
        me.error = err.what();
      }
    }
    gather(me.loaded);
    if (!me.error.empty()) return;
    std::optional<PipelineEngine> pipe;
    if (seg.pp > 1) pipe.emplace(e, *mesh.pp, PipelineScheduleKind::one_f_one_b, 1);
    for (int step = seg.from; step < seg.to; ++step) {
      std::vector<Tokens> held;
      for (int g = 0; g < gas; ++g) held.push_back(slot_batch(step, g * seg.dp + mesh.coord.dp));
      if (pipe) {
        std::vector<Batch> batches;
        for (Tokens& b : held) batches.push_back(b.batch());
        pipe->train_batch(batches);
      } else {
        for (Tokens& b : held) {
          e.forward(b.batch());
          e.backward();
          e.step();
        }
      }
      me.losses.push_back(e.state().last_step_loss);
      if (step + 1 == seg.save_after) {
        checkpoints.save(*seg.save_dir, seg.save_tag);
        gather(me.saved);
      }
    }
    gather(me.final);
  });
  SegmentResult out;
  std::vector<Params> initial, loaded, saved, final;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    EXPECT_EQ(per_rank[r].losses, per_rank[0].losses) << "rank " << r;
    initial.push_back(per_rank[r].initial);
    loaded.push_back(per_rank[r].loaded);
    saved.push_back(per_rank[r].saved);
    final.push_back(per_rank[r].final);
    out.load_errors.push_back(per_rank[r].error);
  }
  out.losses = per_rank[0].losses;
  out.initial = merge_stage_params(initial);
  out.loaded = merge_stage_params(loaded);
  out.saved = merge_stage_params(saved);
  out.final = merge_stage_params(final);
  return out;
}

// A continuation on another layout against the uninterrupted run: the losses and the parameters
// within mesh_test_util's tolerance (tp_tolerance: the gradients summed in another order over the
// stages' data groups and tensor-parallel pieces), the update measured from the loaded state.
void expect_close(const SegmentResult& got, const SegmentResult& ref, const Params& from) {
  const Tolerance tol = tp_tolerance(Precision::fp32);
  ASSERT_EQ(got.losses.size(), 2u);
  for (std::size_t k = 0; k < got.losses.size(); ++k) {
    const double a = got.losses[k], b = ref.losses[2 + k];
    EXPECT_LE(std::abs(a - b), tol.loss_rtol * std::abs(b)) << "step " << 3 + k << ": loss " << a << ", uninterrupted " << b;
  }
  ASSERT_EQ(got.final.size(), ref.final.size());
  const ParamDiff d = compare_params(got.final, ref.final, from, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs;
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
  EXPECT_LE(d.update_rel, tol.update_rel);
  EXPECT_LE(d.key_bias_max_abs, tol.key_bias_abs);
}

// The manifest of a pipeline checkpoint: the mesh (every rank counted, the stages recorded), the
// whole model's parameters once each at whole shapes, and pieces that tile each parameter of each
// buffer exactly once across the stages' files.
void check_manifest(const fs::path& dir, int pp, int dp, int stage) {
  const config::Json m = config::Json::parse(file_bytes(dir / kCheckpointManifest));
  EXPECT_EQ(m.at("layout").at("world_size"), pp * dp);
  EXPECT_EQ(m.at("layout").value("pipeline_stages", 1), pp);
  EXPECT_FALSE(m.at("layout").contains("tensor_parallel"));
  const std::size_t files = static_cast<std::size_t>(stage >= 1 ? pp * dp : pp);
  ASSERT_EQ(m.at("ranks").size(), files);
  const Model whole = build_model(kModel, {0, 1}, {});
  std::map<std::string, std::int64_t> numel;
  std::int64_t count = 0;
  std::vector<std::string> order;
  for (const auto& layer : whole.layers) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      numel[ps.name] = ps.shape.numel();
      count += ps.shape.numel();
      order.push_back(ps.name);
    }
  }
  EXPECT_EQ(m.at("model").at("parameter_count"), count);
  ASSERT_EQ(m.at("model").at("params").size(), order.size());
  for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(m.at("model").at("params")[i].at("name"), order[i]);  // the one-rank order
  std::map<std::pair<std::string, std::string>, std::vector<int>> seen;
  for (std::size_t k = 0; k < files; ++k) {
    const config::Json idx = config::Json::parse(file_bytes(dir / rank_file_name(static_cast<int>(k), ".json")));
    for (const config::Json& t : idx.at("tensors")) {
      const std::string param = t.at("param").get<std::string>();
      ASSERT_TRUE(numel.count(param)) << param;
      auto& v = seen[{t.at("buffer").get<std::string>(), param}];
      v.resize(static_cast<std::size_t>(numel.at(param)), 0);
      const std::int64_t off = t.at("offset").get<std::int64_t>(), n = t.at("numel").get<std::int64_t>();
      ASSERT_LE(off + n, numel.at(param)) << param;
      for (std::int64_t i = off; i < off + n; ++i) ++v[static_cast<std::size_t>(i)];
    }
  }
  EXPECT_EQ(seen.size(), 3 * numel.size());  // master, exp_avg, exp_avg_sq
  for (const auto& [key, v] : seen) {
    const auto bad = std::find_if(v.begin(), v.end(), [](int c) { return c != 1; });
    EXPECT_TRUE(bad == v.end()) << key.first << "/" << key.second << " element " << (bad - v.begin()) << " saved " << (bad == v.end() ? 1 : *bad)
                                << " times";
  }
}

// The uninterrupted run on 2 stages (ZeRO 0: data rank 0 of each stage writes, files 0 and 1),
// saving "mid" after step 2; shared by the tests below.
const SegmentResult& uninterrupted(const fs::path& dir) {
  static std::optional<SegmentResult> r;
  if (!r) {
    Segment s;
    s.save_dir = dir;
    s.save_after = 2;
    r = run_segment(s);
  }
  return *r;
}

class PipelineCheckpoint : public ::testing::Test {
 protected:
  // The uninterrupted run saves "mid" first: ctest runs every test in a process of its own, and a
  // test's resume must find the checkpoint whatever ran before it.
  static void SetUpTestSuite() {
    dir_ = new TempDir("mid");
    (void)uninterrupted(dir_->path);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static const fs::path& dir() { return dir_->path; }
  static const SegmentResult& full() { return uninterrupted(dir()); }
  static Segment resume(int pp, int dp, int tp, int stage) {
    Segment s;
    s.pp = pp;
    s.dp = dp;
    s.tp = tp;
    s.stage = stage;
    s.from = 2;
    s.load_dir = dir();
    return s;
  }
  static TempDir* dir_;
};
TempDir* PipelineCheckpoint::dir_ = nullptr;

TEST_F(PipelineCheckpoint, ManifestListsTheWholeModelOnce) {
  ASSERT_EQ(full().losses.size(), static_cast<std::size_t>(kSteps));
  check_manifest(dir() / "mid", 2, 1, 0);
}

// (a) The same layout: bit for bit.
TEST_F(PipelineCheckpoint, ResumeOnTwoStagesIsBitIdentical) {
  const SegmentResult r = run_segment(resume(2, 1, 1, 0));
  for (const std::string& e : r.load_errors) ASSERT_EQ(e, "");
  EXPECT_TRUE(r.loaded == full().saved);
  EXPECT_EQ(r.losses, std::vector<float>(full().losses.begin() + 2, full().losses.end()));
  EXPECT_TRUE(r.final == full().final);
}

// (b) Other layouts: the loaded whole parameters exactly; the continuation within the tolerance.
TEST_F(PipelineCheckpoint, LoadsIntoOneRank) {
  const SegmentResult r = run_segment(resume(1, 1, 1, 0));
  EXPECT_TRUE(r.loaded == full().saved);
  expect_close(r, full(), full().saved);
}

TEST_F(PipelineCheckpoint, LoadsIntoTwoStagesWithDataParallelZero1AndSavesAgain) {
  TempDir again("again");
  Segment s = resume(2, 2, 1, 1);
  s.save_dir = again.path;
  s.save_after = 3;
  s.save_tag = "step3";
  const SegmentResult r = run_segment(s);
  EXPECT_TRUE(r.loaded == full().saved);
  expect_close(r, full(), full().saved);
  // ZeRO 1 on 2 stages x DP 2: every rank of the mesh wrote its partition, files 0-3.
  check_manifest(again.path / "step3", 2, 2, 1);
}

TEST_F(PipelineCheckpoint, LoadsIntoFourStages) {
  const SegmentResult r = run_segment(resume(4, 1, 1, 0));
  EXPECT_TRUE(r.loaded == full().saved);
  expect_close(r, full(), full().saved);
}

TEST_F(PipelineCheckpoint, LoadsIntoTwoStagesWithTensorParallel) {
  const SegmentResult r = run_segment(resume(2, 1, 2, 1));
  EXPECT_TRUE(r.loaded == full().saved);
  expect_close(r, full(), full().saved);
}

// (c) A checkpoint of one rank (no pipeline) loads into 2 stages: the one-rank run's state.
TEST_F(PipelineCheckpoint, OneRankCheckpointLoadsIntoTwoStages) {
  TempDir one("one");
  Segment a;
  a.pp = 1;
  a.to = 2;
  a.save_dir = one.path;
  a.save_after = 2;
  const SegmentResult saved = run_segment(a);
  Segment b = resume(2, 1, 1, 0);
  b.load_dir = one.path;
  const SegmentResult r = run_segment(b);
  EXPECT_TRUE(r.loaded == saved.saved);
  // The one-rank start equals the pipeline's (the same seed's parameters): the continuation is the
  // uninterrupted pipeline run's within the tolerance.
  expect_close(r, full(), full().saved);
}

// (d) consolidate reads every stage's pieces: the saving run's gathered parameters, loaded into one
// rank from the consolidated file, exactly.
TEST_F(PipelineCheckpoint, ConsolidateGivesTheRunsParameters) {
  ASSERT_FALSE(full().saved.empty());
  TempDir out("consolidated");
  const fs::path file = out.path / "model.safetensors";
  EXPECT_EQ(consolidate_checkpoint(dir(), "mid", file, DType::fp32), "mid");
  Params got;
  run_local_ranks(1, [&](Communicator& comm) {
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(mesh_config_json(MeshRun{})), {});
    EngineOptions o;
    o.comm = &comm;
    o.sequence_length = kT;
    o.init_params = false;
    Engine e = initialize(build_model(kModel, {0, 1}, {}), c, o);
    e.load_weights(file);
    e.gather_master_params([&](const std::string& n, const Tensor& v) { got[n] = values(v); });
  });
  EXPECT_TRUE(got == full().saved);
}

// (e) Stage 1's rank file missing: every rank of the mesh refuses the load before anything is read
// (the engine keeps its initial parameters), and the message names the file.
TEST_F(PipelineCheckpoint, MissingStageFileIsRefusedBeforeLoading) {
  ASSERT_FALSE(full().saved.empty());
  for (const char* ext : {".safetensors", ".json"}) {
    SCOPED_TRACE(ext);
    TempDir broken("broken");
    fs::copy(dir() / "mid", broken.path / "mid", fs::copy_options::recursive);
    const std::string name = rank_file_name(1, ext);
    fs::remove(broken.path / "mid" / name);
    // Opening the checkpoint finds it (the rank that would read that file may not be first to read).
    try {
      CheckpointReader rd(broken.path, "mid");
      ADD_FAILURE() << "opened a checkpoint without " << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    Segment s = resume(2, 1, 1, 0);
    s.load_dir = broken.path;
    const SegmentResult r = run_segment(s);
    for (const std::string& e : r.load_errors) {
      EXPECT_NE(e.find(name), std::string::npos) << e;
      EXPECT_NE(e.find("missing"), std::string::npos) << e;
    }
    EXPECT_TRUE(r.loaded == r.initial);
  }
}

}  // namespace
}  // namespace dstrain
