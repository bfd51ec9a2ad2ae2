// Training checkpoints under tensor parallelism (docs/checkpoints.md "Tensor parallelism"): a
// checkpoint stores the WHOLE model's parameter space — each piece of a cut parameter as runs of
// the whole parameter's elements (models/param_split.h piece_runs) — so it loads at any
// tensor-parallel size, data-parallel size and ZeRO stage.
//
//   - piece_runs against a naive element-by-element map written here from AutoTP's rule (rows,
//     columns, fused parts with units, uneven splits, ranks without units, sub-ranges);
//   - save on a TP 2 x DP 2 mesh at ZeRO stage 0-3 (GPT-2 and the GQA Llama with tied embeddings),
//     load at TP 1 x DP 1, TP 4 x DP 1, TP 1 x DP 2, TP 2 x DP 1: the loaded whole parameters are
//     the saving run's exactly, and one more step equals the saving run's own next step within the
//     tensor-parallel tolerance of test_tensor_parallel.cpp (a different mesh sums in another
//     order); at TP 2 x DP 2 it is bit for bit, and the next checkpoint's rank files are the same
//     bytes (one of them written by the decoupled writer);
//   - the manifest records whole shapes and the mesh; the saved pieces tile every parameter once;
//   - consolidate of the TP checkpoint is byte for byte the one-rank engine's save_weights;
//   - OLMoE, whose q/k norm weights are cut with the heads: saved at TP 2, loaded at TP 1 and 4,
//     consolidated and written by save_weights at TP 4 as one rank writes them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_test_files.h"
#include "olmoe_test_model.h"
#include "tp_mesh_run.h"
#include "engine/checkpoint/checkpoint_consolidate.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "models/param_split.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace mesh_run;

using namespace checkpoint_testing;

namespace fs = std::filesystem;
using namespace zero_testing;
using Params = std::map<std::string, std::vector<float>>;

// ---- piece_runs against a naive map ----

// The whole-parameter index of every element of rank `rank`'s piece, in the piece's row-major
// order, from AutoTP's rule written out here: n units over W ranks give rank r n / W + (r < n % W)
// consecutive units, part by part; the piece is the rank's indices along the cut dimension, packed.
std::vector<std::int64_t> naive_map(const ParamSplit& split, const Shape& whole, int ranks, int rank) {
  const int dim = split.dim();
  std::vector<std::int64_t> along;  // the rank's indices along the cut dimension, in piece order
  std::vector<ParamSplit::Part> parts = split.parts;
  if (parts.empty()) parts.push_back({whole[dim], 1});
  std::int64_t part_begin = 0;
  for (const ParamSplit::Part& p : parts) {
    const std::int64_t n = p.size / p.unit;
    std::int64_t unit = 0;
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t mine = n / ranks + (r < n % ranks ? 1 : 0);
      if (r == rank)
        for (std::int64_t i = unit * p.unit; i < (unit + mine) * p.unit; ++i) along.push_back(part_begin + i);
      unit += mine;
    }
    part_begin += p.size;
  }
  // Strides of the whole; the piece has the same shape with dim `dim` = along.size().
  std::vector<std::int64_t> dims(static_cast<std::size_t>(whole.rank));
  for (int d = 0; d < whole.rank; ++d) dims[static_cast<std::size_t>(d)] = whole[d];
  std::vector<std::int64_t> pdims = dims;
  pdims[static_cast<std::size_t>(dim)] = static_cast<std::int64_t>(along.size());
  std::int64_t pn = 1;
  for (std::int64_t d : pdims) pn *= d;
  std::vector<std::int64_t> out;
  for (std::int64_t l = 0; l < pn; ++l) {
    std::vector<std::int64_t> idx(pdims.size());
    std::int64_t rest = l;
    for (int d = whole.rank - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rest % pdims[static_cast<std::size_t>(d)];
      rest /= pdims[static_cast<std::size_t>(d)];
    }
    idx[static_cast<std::size_t>(dim)] = along[static_cast<std::size_t>(idx[static_cast<std::size_t>(dim)])];
    std::int64_t w = 0;
    for (int d = 0; d < whole.rank; ++d) w = w * dims[static_cast<std::size_t>(d)] + idx[static_cast<std::size_t>(d)];
    out.push_back(w);
  }
  return out;
}

// Checks piece_runs(first, count) against the naive map: the runs, expanded, are exactly local
// elements [first, first + count) in order with their whole indices, and no two runs continue each
// other in both spaces (they are merged). Returns the number of runs.
std::size_t check_runs(const ParamSplit& split, const Shape& whole, int ranks, int rank, std::int64_t first, std::int64_t count,
                       const std::vector<std::int64_t>& map) {
  const std::vector<ElementRun> runs = piece_runs(split, whole, ranks, rank, first, count, "p");
  std::int64_t at = first;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const ElementRun& r = runs[k];
    EXPECT_EQ(r.local_offset, at) << "run " << k;
    EXPECT_GT(r.numel, 0) << "run " << k;
    for (std::int64_t i = 0; i < r.numel; ++i) {
      if (map[static_cast<std::size_t>(r.local_offset + i)] != r.whole_offset + i) {
        ADD_FAILURE() << "local element " << r.local_offset + i << " is whole element " << map[static_cast<std::size_t>(r.local_offset + i)]
                      << ", run " << k << " says " << r.whole_offset + i;
        return runs.size();
      }
    }
    if (k > 0) {
      EXPECT_FALSE(runs[k - 1].whole_offset + runs[k - 1].numel == r.whole_offset) << "runs " << k - 1 << " and " << k << " not merged";
    }
    at += r.numel;
  }
  EXPECT_EQ(at, first + count);
  return runs.size();
}

struct RunsCase {
  const char* what;
  ParamSplit split;
  Shape whole;
};

TEST(PieceRuns, MatchNaiveElementMap) {
  const std::vector<RunsCase> cases = {
      {"rows, one part", ParamSplit::rows(), Shape{12, 5}},
      {"rows, uneven (7 rows)", ParamSplit::rows(), Shape{7, 3}},
      {"rows, fused q|k|v in heads of 4", ParamSplit::rows({{16, 4}, {8, 4}, {8, 4}}), Shape{32, 6}},
      {"rows, bias of fused parts", ParamSplit::rows({{12, 4}, {12, 4}, {12, 4}}), Shape{36}},
      {"vocabulary, uneven", ParamSplit::vocabulary(), Shape{10, 4}},
      {"columns, one part", ParamSplit::columns(), Shape{5, 12}},
      {"columns, uneven (7 columns)", ParamSplit::columns(), Shape{4, 7}},
      {"columns in heads of 3, two parts", ParamSplit::columns({{9, 3}, {6, 3}}), Shape{3, 15}},
      {"columns of a 3-D tensor", ParamSplit::columns(), Shape{3, 5, 2}},
      {"experts", ParamSplit::experts(), Shape{5, 2, 3}},
  };
  std::mt19937 rng(7);
  for (const RunsCase& c : cases) {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      for (int rank = 0; rank < ranks; ++rank) {
        SCOPED_TRACE(fmt::format("{} {} over {} ranks, rank {}", c.what, c.whole.str(), ranks, rank));
        const std::vector<std::int64_t> map = naive_map(c.split, c.whole, ranks, rank);
        ASSERT_EQ(static_cast<std::int64_t>(map.size()), piece_shape(c.split, c.whole, ranks, rank, "p").numel());
        const std::int64_t n = static_cast<std::int64_t>(map.size());
        const std::size_t whole_runs = check_runs(c.split, c.whole, ranks, rank, 0, n, map);
        // The counts the format promises: one rank holds the whole in one run; a dim-0 split one run
        // per part it holds rows of; a dim-1 split one per row and part.
        std::int64_t parts_held = 0;
        for (const SplitRange& r : split_ranges(c.split, c.whole, ranks, rank, "p")) parts_held += r.size > 0 ? 1 : 0;
        if (ranks == 1) {
          EXPECT_EQ(whole_runs, n > 0 ? 1u : 0u);
        } else if (c.split.dim() == 0) {
          EXPECT_EQ(static_cast<std::int64_t>(whole_runs), parts_held);
        } else {
          EXPECT_EQ(static_cast<std::int64_t>(whole_runs), c.whole[0] * parts_held);
        }
        // Every sub-range of small pieces, random ones of the others (ZeRO cuts a piece anywhere).
        if (n <= 24) {
          for (std::int64_t a = 0; a <= n; ++a)
            for (std::int64_t b = a; b <= n; ++b) check_runs(c.split, c.whole, ranks, rank, a, b - a, map);
        } else {
          for (int k = 0; k < 200; ++k) {
            const std::int64_t a = std::uniform_int_distribution<std::int64_t>(0, n)(rng);
            const std::int64_t b = std::uniform_int_distribution<std::int64_t>(a, n)(rng);
            check_runs(c.split, c.whole, ranks, rank, a, b - a, map);
          }
        }
      }
    }
  }
}

TEST(PieceRuns, ReplicatedIsOneIdentityRunAndOutOfRangeIsAnError) {
  EXPECT_EQ(piece_runs(ParamSplit::replicated(), Shape{4, 8}, 4, 2, 5, 20, "ln.weight"), (std::vector<ElementRun>{{5, 5, 20}}));
  EXPECT_TRUE(piece_runs(ParamSplit::rows(), Shape{4, 8}, 2, 1, 16, 0, "w").empty());
  try {
    piece_runs(ParamSplit::rows(), Shape{4, 8}, 2, 1, 10, 7, "h.0.mlp.c_fc.weight");  // the piece has 16 elements
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.mlp.c_fc.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not inside"), std::string::npos) << e.what();
  }
}

// ---- checkpoints on a DP x TP mesh of local ranks ----



// GPT-2 with 4 heads (4 ranks hold one each), vocabulary 100 padded to 128; the GQA Llama with tied
// embeddings (4 ranks leave 2 without key/value heads): test_tensor_parallel.cpp's models.
constexpr const char* kGpt2Heads4 = "gpt2:L2-C32-H4-V100-T16";


// The whole-model view of the manifest: names and whole shapes, the mesh, and saved pieces that
// tile every parameter of every buffer exactly once, in whole-parameter offsets.
void check_manifest(const fs::path& dir, const std::string& model, int tp, int dp, int stage) {
  const config::Json m = config::Json::parse(file_bytes(dir / "checkpoint.json"));
  EXPECT_EQ(m.at("layout").at("world_size"), tp * dp);
  EXPECT_EQ(m.at("layout").value("tensor_parallel", 1), tp);
  const std::size_t files = stage >= 1 ? static_cast<std::size_t>(tp * dp) : static_cast<std::size_t>(tp);
  ASSERT_EQ(m.at("ranks").size(), files);
  const Model whole = build_model(model, {0, 1});
  std::map<std::string, std::int64_t> numel;
  std::int64_t count = 0;
  for (const auto& layer : whole.layers) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      numel[ps.name] = ps.shape.numel();
      count += ps.shape.numel();
    }
  }
  EXPECT_EQ(m.at("model").at("parameter_count"), count);
  ASSERT_EQ(m.at("model").at("params").size(), numel.size());
  for (const config::Json& p : m.at("model").at("params")) {
    const std::string name = p.at("name").get<std::string>();
    ASSERT_TRUE(numel.count(name)) << name;
    std::int64_t n = 1;
    for (const auto& d : p.at("shape")) n *= d.get<std::int64_t>();
    EXPECT_EQ(n, numel.at(name)) << name << " has not its whole shape in the manifest";
  }
  // (buffer, param) -> element -> times saved
  std::map<std::pair<std::string, std::string>, std::vector<int>> seen;
  for (std::size_t k = 0; k < files; ++k) {
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
  EXPECT_EQ(seen.size(), 3 * numel.size());  // master, exp_avg, exp_avg_sq
  for (const auto& [key, v] : seen) {
    const auto bad = std::find_if(v.begin(), v.end(), [](int c) { return c != 1; });
    EXPECT_TRUE(bad == v.end()) << key.first << "/" << key.second << " element " << (bad - v.begin()) << " saved " << (bad == v.end() ? 1 : *bad)
                                << " times";
  }
}

using Combo = std::tuple<int, std::string>;  // stage, model

class TensorParallelCheckpoint : public ::testing::TestWithParam<Combo> {};

// Save on TP 2 x DP 2 after 2 steps; resume on every other mesh for one step.
// A resume at another mesh of `saved`'s "mid" checkpoint: the loaded whole parameters exactly the
// saved ones, and the one step after them (the saved run's third) within `tol`. The comparison of
// the parameters, returned for the caller's further checks.
ParamDiff expect_resumed_as_saved(const MeshResult& r, const MeshResult& saved, const Tolerance& tol) {
  EXPECT_EQ(r.loaded.size(), saved.at_mid.size());
  for (const auto& [name, v] : saved.at_mid) {
    const auto it = r.loaded.find(name);
    EXPECT_TRUE(it != r.loaded.end() && it->second == v) << name << " loaded differs from the saved value";
  }
  EXPECT_EQ(r.losses.size(), 1u);
  if (!r.losses.empty()) {
    EXPECT_LE(std::abs(r.losses[0] - saved.losses[2]), tol.loss_rtol * std::abs(saved.losses[2])) << r.losses[0] << " vs " << saved.losses[2];
  }
  const ParamDiff d = compare_params(r.final, saved.final, saved.at_mid, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs;
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
  return d;
}

TEST_P(TensorParallelCheckpoint, SaveOnTp2Dp2ResumeOnAnyMesh) {
  const auto& [stage, model] = GetParam();
  TempDir dir("save"), again("again"), weights("weights");
  MeshSegment a;
  a.model = model;
  a.tp = 2;
  a.dp = 2;
  a.stage = stage;
  a.to = 3;
  a.save_dir = dir.path;
  a.save_mid_after = 2;
  a.save_final = true;
  const MeshResult saved = run_mesh(a);
  ASSERT_EQ(saved.losses.size(), 3u);
  check_manifest(dir.path / "mid", model, 2, 2, stage);

  // The same mesh: bit for bit, and the next checkpoint the same bytes (written decoupled).
  {
    SCOPED_TRACE("resume at TP 2 x DP 2");
    MeshSegment b = a;
    b.from = 2;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    b.save_dir = again.path;
    b.save_mid_after = -1;
    b.decoupled = true;
    const MeshResult r = run_mesh(b);
    EXPECT_TRUE(r.loaded == saved.at_mid);
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_EQ(r.losses[0], saved.losses[2]);
    EXPECT_TRUE(r.final == saved.final);
    const std::size_t files = stage >= 1 ? 4 : 2;
    for (std::size_t k = 0; k < files; ++k) {
      const std::string name = rank_file_name(static_cast<int>(k), ".safetensors");
      EXPECT_TRUE(file_bytes(dir.path / "final" / name) == file_bytes(again.path / "final" / name)) << name << " differs";
    }
  }
  // Other meshes: the loaded whole parameters exactly; the next step within the tolerance.
  const Tolerance tol = one_step_tolerance();
  for (const auto& [tp, dp] : std::vector<std::pair<int, int>>{{1, 1}, {4, 1}, {1, 2}, {2, 1}}) {
    SCOPED_TRACE(fmt::format("resume at TP {} x DP {}", tp, dp));
    MeshSegment b;
    b.model = model;
    b.tp = tp;
    b.dp = dp;
    b.stage = stage;
    b.from = 2;
    b.to = 3;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    if (tp == 1 && dp == 1) b.weights = weights.path / "one_rank.safetensors";
    const MeshResult r = run_mesh(b);
    const ParamDiff d = expect_resumed_as_saved(r, saved, tol);
    EXPECT_LE(d.update_rel, tol.update_rel);
    EXPECT_LE(d.key_bias_max_abs, tol.key_bias_abs) << "attention key bias";
    if (std::getenv("DSTRAIN_TP_VERBOSE") != nullptr) {
      std::printf("MEASURE stage %d %s -> tp %d dp %d: loss %.3g abs %.3g upd_rel %.3g all %.3g keyb %.3g\n", stage, model.c_str(), tp, dp,
                  std::abs(r.losses[0] - saved.losses[2]) / std::abs(saved.losses[2]), d.max_abs, d.max_update_rel, d.update_rel,
                  d.key_bias_max_abs);
    }
  }
  // consolidate of the TP checkpoint: whole Hugging Face tensors, byte for byte what one rank that
  // loaded it writes with save_weights.
  const fs::path out = weights.path / "consolidated.safetensors";
  EXPECT_EQ(consolidate_checkpoint(dir.path, "mid", out, DType::fp32), "mid");
  EXPECT_TRUE(file_bytes(out) == file_bytes(weights.path / "one_rank.safetensors")) << "consolidated weights differ from one rank's";
  EXPECT_FALSE(file_bytes(out).empty());
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  return fmt::format("stage{}_{}", std::get<0>(info.param), std::get<1>(info.param).starts_with("llama") ? "llama" : "gpt2");
}

INSTANTIATE_TEST_SUITE_P(Stages, TensorParallelCheckpoint,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(std::string(kGpt2Heads4), std::string(kLlamaModel))),
                         combo_name);

// OLMoE: its q/k norm weights (NH·D and NKV·D) are cut with the heads like q_proj's and k_proj's
// rows. A TP 2 checkpoint stores each rank's piece as runs of the whole weight (every element
// once); it loads at TP 1 and at TP 4 (two ranks without heads, so without norm columns) to the
// saved whole parameters exactly, the next step within the tolerance; consolidate, and
// save_weights at TP 4, write the whole Hugging Face tensors byte for byte as one rank does.
TEST(TensorParallelCheckpointOlmoe, CutQkNormsSaveLoadAndWriteWholeWeights) {
  const std::string model = olmoe_testing::gqa_model();
  TempDir dir("olmoe"), weights("olmoe_weights");
  MeshSegment a;
  a.model = model;
  a.tp = 2;
  a.stage = 1;
  a.to = 3;
  a.save_dir = dir.path;
  a.save_mid_after = 2;
  const MeshResult saved = run_mesh(a);
  check_manifest(dir.path / "mid", model, 2, 1, 1);
  ASSERT_TRUE(saved.at_mid.count("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_EQ(saved.at_mid.at("model.layers.0.self_attn.q_norm.weight").size(), 32u);
  EXPECT_EQ(saved.at_mid.at("model.layers.1.self_attn.k_norm.weight").size(), 16u);
  const Tolerance tol = one_step_tolerance();
  for (const int tp : {1, 4}) {
    SCOPED_TRACE(fmt::format("resume at TP {}", tp));
    MeshSegment b;
    b.model = model;
    b.tp = tp;
    b.stage = 1;
    b.from = 2;
    b.to = 3;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    b.weights = weights.path / fmt::format("tp{}.safetensors", tp);
    const MeshResult r = run_mesh(b);
    expect_resumed_as_saved(r, saved, tol);
  }
  EXPECT_FALSE(file_bytes(weights.path / "tp1.safetensors").empty());
  EXPECT_TRUE(file_bytes(weights.path / "tp4.safetensors") == file_bytes(weights.path / "tp1.safetensors"))
      << "save_weights at TP 4 differs from one rank's";
  const fs::path out = weights.path / "consolidated.safetensors";
  EXPECT_EQ(consolidate_checkpoint(dir.path, "mid", out, DType::fp32), "mid");
  EXPECT_TRUE(file_bytes(out) == file_bytes(weights.path / "tp1.safetensors")) << "consolidated weights differ from one rank's";
}

// The reverse: a checkpoint of one rank (the format without tensor parallelism) resumes on TP 2 x
// DP 2 and TP 4 x DP 1, uneven TP 3 too, with the loaded whole parameters exactly the saved ones.
TEST(TensorParallelCheckpointReverse, OneRankCheckpointLoadsOnMeshes) {
  TempDir dir("reverse");
  MeshSegment a;
  a.model = kLlamaModel;
  a.stage = 1;
  a.to = 2;
  a.save_dir = dir.path;
  a.save_mid_after = 1;
  a.save_final = true;
  const MeshResult saved = run_mesh(a);
  const config::Json m = config::Json::parse(file_bytes(dir.path / "mid" / "checkpoint.json"));
  EXPECT_FALSE(m.at("layout").contains("tensor_parallel")) << "a checkpoint without tensor parallelism keeps the format it had";
  for (const auto& [tp, dp, stage] : std::vector<std::tuple<int, int, int>>{{2, 2, 3}, {4, 1, 2}, {3, 1, 0}}) {
    SCOPED_TRACE(fmt::format("resume at TP {} x DP {}, stage {}", tp, dp, stage));
    MeshSegment b;
    b.model = kLlamaModel;
    b.tp = tp;
    b.dp = dp;
    b.stage = stage;
    b.from = 1;
    b.to = 2;
    b.load_dir = dir.path;
    b.load_tag = "mid";
    const MeshResult r = run_mesh(b);
    for (const auto& [name, v] : saved.at_mid) EXPECT_TRUE(r.loaded.at(name) == v) << name;
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_LE(std::abs(r.losses[0] - saved.losses[1]), 1e-6 * std::abs(saved.losses[1]));
    const Tolerance tol = one_step_tolerance();
    const ParamDiff d = compare_params(r.final, saved.final, saved.at_mid, tol.atol, tol.rtol);
    EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs;
    EXPECT_LE(d.update_rel, tol.update_rel);
  }
}

// bf16: the 16-bit params are saved too (buffer "param", so that a resume rounds nothing), as runs
// like the masters; a resume at the same mesh continues bit for bit, and the loaded masters at one
// rank are the saving run's exactly.
TEST(TensorParallelCheckpointBf16, ParamsSavedAsRunsResumeBitwise) {
  TempDir dir("bf16"), again("bf16_again");
  MeshSegment a;
  a.model = kGpt2Heads4;
  a.tp = 2;
  a.dp = 2;
  a.stage = 2;
  a.precision = Precision::bf16;
  a.to = 3;
  a.save_dir = dir.path;
  a.save_mid_after = 2;
  a.save_final = true;
  const MeshResult saved = run_mesh(a);
  const config::Json idx = config::Json::parse(file_bytes(dir.path / "mid" / rank_file_name(1, ".json")));
  std::size_t params = 0;
  for (const config::Json& t : idx.at("tensors")) params += t.at("buffer") == "param" && t.at("dtype") == "bf16" ? 1 : 0;
  EXPECT_GT(params, 0u) << "no bf16 params saved";
  MeshSegment b = a;
  b.from = 2;
  b.load_dir = dir.path;
  b.load_tag = "mid";
  b.save_dir = again.path;
  b.save_mid_after = -1;
  const MeshResult r = run_mesh(b);
  EXPECT_TRUE(r.loaded == saved.at_mid);
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_EQ(r.losses[0], saved.losses[2]);
  EXPECT_TRUE(r.final == saved.final);
  for (int k = 0; k < 4; ++k) {
    const std::string name = rank_file_name(k, ".safetensors");
    EXPECT_TRUE(file_bytes(dir.path / "final" / name) == file_bytes(again.path / "final" / name)) << name << " differs";
  }
  MeshSegment c;
  c.model = kGpt2Heads4;
  c.precision = Precision::bf16;
  c.stage = 1;
  c.from = c.to = 2;
  c.load_dir = dir.path;
  c.load_tag = "mid";
  EXPECT_TRUE(run_mesh(c).loaded == saved.at_mid);
}

// The manifest's mesh is validated: tensor_parallel must divide world_size, and stage 0 wrote one
// rank file per tensor-parallel rank.
TEST(TensorParallelCheckpointManifest, MeshFieldsAreChecked) {
  TempDir dir("manifest");
  MeshSegment a;
  a.model = kGpt2Heads4;
  a.tp = 2;
  a.stage = 0;
  a.to = 1;
  a.save_dir = dir.path;
  a.save_final = true;
  run_mesh(a);
  const fs::path mpath = dir.path / "final" / "checkpoint.json";
  const std::string original = file_bytes(mpath);
  const auto expect_error = [&](const std::function<void(config::Json&)>& edit, const std::string& field) {
    config::Json m = config::Json::parse(original);
    edit(m);
    std::ofstream(mpath, std::ios::binary | std::ios::trunc) << m.dump(1);
    try {
      CheckpointReader rd(dir.path, "final");
      ADD_FAILURE() << "no Error for " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_error([](config::Json& m) { m["layout"]["tensor_parallel"] = 3; }, "layout.tensor_parallel");
  expect_error([](config::Json& m) { m["layout"]["tensor_parallel"] = 0; }, "layout.tensor_parallel");
  expect_error([](config::Json& m) { m["layout"].erase("tensor_parallel"); }, "ranks");  // 2 files, but TP 1 at stage 0 writes one
  std::ofstream(mpath, std::ios::binary | std::ios::trunc) << original;
  EXPECT_NO_THROW(CheckpointReader(dir.path, "final"));
}

}  // namespace
}  // namespace dstrain
