// The seeds tests/fuzz/corpus/torch_state_dict/writer_*.pt (fuzz_torch_state_dict's corpus) are
// TorchSaveWriter's output (formats/torch_save.h) for small DeepSpeed-shaped trees: a ZeRO-2
// optimizer file with its DynamicLossScaler, ZeroStageEnum and flat fp32 partition, a model-states
// file, and a bf16 optimizer file with fragment_address mappings. This test writes them again and
// compares byte for byte, so the corpus cannot drift from the writer; to regenerate after a
// deliberate change of the format:
//   DSTRAIN_WRITE_FUZZ_SEEDS=tests/fuzz/corpus/torch_state_dict build/tests/unit/test_torch_save
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "formats/torch_pickle.h"
#include "formats/torch_save.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;
using W = TorchSaveWriter;

TorchValuePair kv(const char* k, TorchValue v) { return {W::string(k), std::move(v)}; }
TorchValuePair kv(std::int64_t k, TorchValue v) { return {W::integer(k), std::move(v)}; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// DeepSpeed-shaped trees, small: a ZeRO-2 optimizer file (DynamicLossScaler, ZeroStageEnum, the flat
// fp32 partition), a model-states file (fp16 module, shapes, counters) and a bf16 optimizer file
// (fragment_address mappings, torch.bfloat16).
std::map<std::string, std::pair<W, TorchValue>> seed_trees() {
  std::map<std::string, std::pair<W, TorchValue>> out;
  {
    W w;
    const std::vector<float> flat = {0.5f, -1, 0.25f, 2, 0, 1e-3f, -7, 3};
    const TorchValue scaler = W::object(
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", {},
        W::dict({kv("cur_scale", W::real(32768.0)), kv("cur_iter", W::integer(10)), kv("last_overflow_iter", W::integer(-1)),
                 kv("scale_factor", W::real(2.0)), kv("scale_window", W::integer(1000)), kv("min_scale", W::integer(1)),
                 kv("delayed_shift", W::integer(2)), kv("cur_hysteresis", W::integer(2)), kv("dynamic", W::boolean(true)),
                 kv("dtype", W::object("torch.float16", {}, std::nullopt))}));
    const TorchValue state = W::dict({kv(std::int64_t{0}, W::dict({kv("step", W::integer(10)), kv("exp_avg", w.tensor_from_fp32("F32", {8}, flat)),
                                                     kv("exp_avg_sq", w.tensor_from_fp32("F32", {8}, {1, 1, 1, 1, 2, 2, 2, 2}))}))});
    const TorchValue groups = W::list({W::dict({kv("lr", W::real(1e-3)), kv("betas", W::tuple({W::real(0.9), W::real(0.999)})), kv("eps", W::real(1e-8)),
                                                kv("weight_decay", W::real(0.01)), kv("params", W::list({W::integer(0)}))})});
    TorchValue root = W::dict({kv("optimizer_state_dict",
                                  W::dict({kv("loss_scaler", scaler), kv("dynamic_loss_scale", W::boolean(true)), kv("overflow", W::boolean(false)),
                                           kv("clip_grad", W::real(1.0)),
                                           kv("base_optimizer_state", W::dict({kv("state", state), kv("param_groups", groups)})),
                                           kv("single_partition_of_fp32_groups", W::list({w.tensor_from_fp32("F32", {8}, flat)})),
                                           kv("zero_stage", W::object("deepspeed.runtime.zero.config.ZeroStageEnum", {W::integer(2)}, std::nullopt)),
                                           kv("group_paddings", W::list({W::integer(0)})), kv("partition_count", W::list({W::integer(1)})),
                                           kv("ds_version", W::string("0.16.4"))})),
                               kv("ds_config", W::dict({kv("train_batch_size", W::integer(8)), kv("fp16", W::dict({kv("enabled", W::boolean(true))}))})),
                               kv("ds_version", W::string("0.16.4"))});
    out.emplace("writer_zero2_optim_states.pt", std::make_pair(std::move(w), std::move(root)));
  }
  {
    W w;
    TorchValue root = W::dict({kv("module", W::dict({kv("w", w.tensor_from_fp32("F16", {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})),
                                                     kv("b", w.tensor_from_fp32("F16", {4}, {0.1f, 0.2f, 0.3f, 0.4f}))})),
                               kv("buffer_names", W::list({})),
                               kv("param_shapes", W::list({W::dict({kv("w", W::tuple({W::integer(2), W::integer(4)})), kv("b", W::tuple({W::integer(4)}))})})),
                               kv("lr_scheduler", W::dict({kv("last_batch_iteration", W::integer(9))})), kv("global_steps", W::integer(10)),
                               kv("global_samples", W::integer(80)), kv("skipped_steps", W::integer(0)), kv("dp_world_size", W::integer(1)),
                               kv("mp_world_size", W::integer(1)), kv("ds_version", W::string("0.16.4"))});
    out.emplace("writer_model_states.pt", std::make_pair(std::move(w), std::move(root)));
  }
  {
    W w;
    const TorchValue frag = W::object("deepspeed.utils.tensor_fragment.fragment_address", {},
                                      W::dict({kv("numel", W::integer(8)), kv("start", W::integer(0))}));
    TorchValue root = W::dict({kv("optimizer_state_dict",
                                  W::dict({kv("param_slice_mappings", W::list({W::dict({kv("module.w", frag)})})),
                                           kv("fp32_flat_groups", W::list({w.tensor_from_fp32("F32", {8}, {1, 2, 3, 4, 5, 6, 7, 8})})),
                                           kv("zero_stage", W::object("deepspeed.runtime.zero.config.ZeroStageEnum", {W::integer(1)}, std::nullopt)),
                                           kv("dtype", W::object("torch.bfloat16", {}, std::nullopt)),
                                           kv("bf16", w.tensor_from_fp32("BF16", {3}, {1.5f, -2, 1e-3f}))})),
                               kv("ds_version", W::string("0.16.4"))});
    out.emplace("writer_bf16_optim_states.pt", std::make_pair(std::move(w), std::move(root)));
  }
  return out;
}

TEST(TorchSaveSeeds, TheFuzzSeedsAreThisWritersOutputAndReadBack) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dstrain_torch_save_seeds_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path corpus = fs::path(DSTRAIN_SOURCE_DIR) / "tests/fuzz/corpus/torch_state_dict";
  const char* regenerate = std::getenv("DSTRAIN_WRITE_FUZZ_SEEDS");
  for (auto& [name, tree] : seed_trees()) {
    SCOPED_TRACE(name);
    const fs::path p = dir / name;
    tree.first.save(p, tree.second);
    const std::string bytes = slurp(p);
    EXPECT_LT(bytes.size(), 4096u);
    if (regenerate != nullptr && *regenerate != '\0') fs::copy_file(p, fs::path(regenerate) / name, fs::copy_options::overwrite_existing);
    EXPECT_TRUE(slurp(corpus / name) == bytes) << "the committed seed differs from the writer's output (regenerate it: see this test)";
    const TorchPickle back(p);
    EXPECT_TRUE(back.root().is_dict());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dstrain
