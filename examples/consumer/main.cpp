// A program outside the dstrain tree, built against the installed package (find_package(dstrain)):
// it reads a DeepSpeed config the way DeepSpeed does, embeds the engine the way a DeepSpeed user
// drives `model_engine` (initialize, then forward / backward / step), runs the whole training
// loop `dstrain train` runs through dstrain::Trainer, and defines a model family of its own
// (bigram_family.h), registers it and trains it with ZeRO as it trains the built-in ones.
//
//   dstrain_consumer ds_config.json
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <dstrain/dstrain.h>

#include "bigram_family.h"

namespace {

// dstrain::Trainer's whole run of `model` at ZeRO stage 2 with AdamW at `lr`, on the token file
// `data` (kept until the run ends).
dstrain::TrainResult train_zero2(const std::string& model, double lr, int print_every, const dstrain::TrainerOptions& options) {
  const std::string config =
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": )" + std::to_string(print_every) +
      R"(, "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": )" + std::to_string(lr) + R"(, "weight_decay": 0.0}}})";
  dstrain::Trainer trainer(dstrain::ConfigText{dstrain::config::Json::parse(config), "consumer", {}}, model, options);
  return trainer.run();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ds_config.json\n", argv[0]);
    return 1;
  }
  try {
    // 1. The config, as a 2-rank job would see it.
    const dstrain::ConfigText text = dstrain::load_config_file(argv[1]);
    dstrain::config::ConfigOptions options;
    options.world_size = 2;
    const dstrain::config::DsConfig cfg = dstrain::config::parse_ds_config(text.tree, options);
    std::printf("zero stage %d, precision %s, train_batch_size %lld = %lld x %lld x 2\n", cfg.zero_optimization.stage,
                dstrain::config::to_string(cfg.precision()), static_cast<long long>(cfg.train_batch_size),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu), static_cast<long long>(cfg.gradient_accumulation_steps));

    // 2. Embed the engine: a tiny GPT-2 learning to repeat a short token pattern (fp32, one process).
    const dstrain::config::DsConfig train_cfg =
        dstrain::config::parse_ds_config(dstrain::config::Json::parse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}}})"),
                                         {});
    dstrain::EngineOptions engine_options;
    engine_options.seed = 1;
    dstrain::Engine engine = dstrain::initialize(dstrain::make_gpt2_model("gpt2:tiny"), train_cfg, engine_options);

    const std::int64_t B = engine.config().train_micro_batch_size_per_gpu, T = engine.sequence_length();
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), targets(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<std::int32_t>(i % 7);
      targets[i] = static_cast<std::int32_t>((i + 1) % 7);
    }
    const dstrain::Batch batch{dstrain::Tensor(tokens.data(), dstrain::DType::int32, {B, T}),
                               dstrain::Tensor(targets.data(), dstrain::DType::int32, {B, T})};
    float first = 0.0f, last = 0.0f;
    for (int micro = 0; micro < 40; ++micro) {
      const float loss = engine.forward(batch);
      engine.backward();
      engine.step();  // steps the optimizer at each gradient-accumulation boundary
      if (micro == 0) first = loss;
      last = loss;
    }
    std::printf("embedded engine: %lld optimizer steps, loss %.3f -> %.3f\n", static_cast<long long>(engine.state().global_steps),
                static_cast<double>(first), static_cast<double>(last));
    if (!(last < first)) return 4;

    // 3. The training loop of `dstrain train` (data, evaluation, progress, summary) through
    // dstrain::Trainer, on 2 ranks (threads of this process) at ZeRO stage 2, on a token file of a
    // repeated pattern; its lines come back through options.print.
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "dstrain_consumer_data";
    std::filesystem::create_directories(dir);
    std::vector<std::int32_t> stream(4096);
    for (std::size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<std::int32_t>(i % 7);
    dstrain::write_token_file(dir / "train.bin", stream);
    dstrain::TrainerOptions run_options;
    run_options.data = dir / "train.bin";
    run_options.val_data = dir / "train.bin";
    run_options.val_batches = 2;
    run_options.steps = 10;
    run_options.num_ranks = 2;
    run_options.sample_tokens = 0;
    std::size_t lines = 0;
    run_options.print = [&lines](std::string_view) { ++lines; };
    const dstrain::TrainResult result = train_zero2("gpt2:tiny", 0.01, 5, run_options);
    const dstrain::TrainSummary& s = *result.summary;
    std::printf("trainer: %lld steps on %zu ranks, loss %.3f -> %.3f, val loss %.3f, %zu lines printed\n", static_cast<long long>(s.steps),
                result.reports.size(), s.train_losses.front(), s.train_losses.back(), *s.final_val_loss(), lines);
    if (!(s.train_losses.back() < s.train_losses.front())) return 5;

    // 4. A model family of our own: registered, then named by its spec like the built-in ones, and
    // trained by the same Trainer at ZeRO stage 2 on 2 ranks (the gradients reduce-scattered, each
    // rank updating half of the optimizer state).
    dstrain::register_model_family(std::make_shared<consumer::BigramFamily>());
    run_options.val_data.clear();
    run_options.steps = 30;
    const dstrain::TrainResult bigram = train_zero2("bigram:V7-C16", 0.05, 10, run_options);
    std::filesystem::remove_all(dir);
    const dstrain::TrainSummary& b = *bigram.summary;
    std::printf("own family: %s, ZeRO stage %d on %zu ranks, %lld steps, loss %.3f -> %.3f\n", b.model.c_str(), bigram.reports.front().stage,
                bigram.reports.size(), static_cast<long long>(b.steps), b.train_losses.front(), b.train_losses.back());
    return b.train_losses.back() < 0.5f * b.train_losses.front() ? 0 : 6;
  } catch (const dstrain::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
