#include "train/trainer_checkpoints.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <map>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manifest.h"
#include "engine/checkpoint/deepspeed_export.h"
#include "formats/deepspeed_checkpoint.h"
#include "data/run_files.h"
#include "models/model_family.h"
#include "engine/optim/optimizer.h"
#include "ops/error.h"
#include "config_schema/elasticity_config.h"

namespace dstrain {
namespace fs = std::filesystem;

namespace {
void check_resume_point(ResumePoint& rp, const TrainerOptions& options, const Architecture& model, const config::DsConfig& config);

// --resume-deepspeed DIR (or --resume DIR holding a DeepSpeed checkpoint): read whole, mapped to
// this model's parameters and checked against the config, on every rank, before the engine exists.
ResumePoint plan_deepspeed_resume(const fs::path& dir, const TrainerOptions& options, const Architecture& model, const config::DsConfig& config) {
  if (!fs::is_directory(dir)) fail("--resume-deepspeed {}: no such folder; give the save_dir of the DeepSpeed run to continue", dir.string());
  // dstrain's own checkpoints there would take over its `latest` with tags that hold no DeepSpeed
  // files, so DeepSpeed's load_checkpoint of the folder would fail afterwards.
  if (!options.save_dir.empty() && options.save_format == TrainerOptions::SaveFormat::dstrain &&
      (is_inside(options.save_dir, dir) || is_inside(dir, options.save_dir)))
    fail("--save-dir {}: it {} the DeepSpeed checkpoint folder being resumed ({}); dstrain's checkpoints there would replace its `latest` with "
         "tags DeepSpeed cannot load. Give --save-dir another folder, or add --save-format deepspeed to save each checkpoint in DeepSpeed's layout "
         "too",
         options.save_dir.string(), is_inside(options.save_dir, dir) ? "is or lies inside" : "holds", dir.string());
  ResumePoint rp;
  const DeepSpeedTrainingState ds = read_deepspeed_checkpoint(dir, options.load_tag);
  auto resume = std::make_shared<DeepSpeedResume>(deepspeed_resume_state(ds, model, config));
  rp.dir = ds.dir.empty() ? dir : ds.dir;
  rp.tag = ds.tag;
  rp.global_steps = ds.global_steps;
  rp.seed = options.seed;  // DeepSpeed saves no seed of dstrain's: the run's own
  if (ds.dstrain_json) {
    // A folder dstrain wrote (export, --save-format deepspeed) carries its run's data position and
    // seed: the data continues where that run's would.
    const config::Json d = config::Json::parse(*ds.dstrain_json, nullptr, false);
    const auto whole = [&](const config::Json* v, const char* what) {
      if (v == nullptr || !v->is_number_unsigned())
        fail("--resume-deepspeed {}: its model states' \"dstrain\" entry is malformed: {} must be a whole number >= 0 (it is {})", dir.string(),
             what, v == nullptr ? std::string("missing") : v->dump());
      return v->get<std::uint64_t>();
    };
    const auto at = [&](const config::Json& j, const char* k) -> const config::Json* { return j.is_object() && j.contains(k) ? &j.at(k) : nullptr; };
    const config::Json* data = at(d, "data");
    rp.data_epoch = whole(data ? at(*data, "epoch") : nullptr, "data.epoch");
    rp.data_position = whole(data ? at(*data, "position") : nullptr, "data.position");
    rp.seed = whole(at(d, "seed"), "seed");
    if (const config::Json* t = at(d, "sequence_length")) rp.sequence_length = static_cast<std::int64_t>(whole(t, "sequence_length"));
    resume->notes.push_back(fmt::format("{}: written by dstrain, it carries its run's data position (epoch {}, position {}) and seed {}: the data "
                                        "continues where that run's would",
                                        resume->summary, rp.data_epoch, rp.data_position, rp.seed));
  } else {
    resume->notes.push_back(fmt::format(
        "{}: a DeepSpeed checkpoint holds no position of dstrain's data loader; the data starts from the beginning of --data (seed {})",
        resume->summary, options.seed));
  }
  rp.deepspeed = std::move(resume);
  return rp;
}
}

std::optional<ResumePoint> plan_resume(const TrainerOptions& options, const Architecture& model, const config::DsConfig& config) {
  if (options.save_interval < 0) fail("--save-interval {}: give a number of optimizer steps >= 1 (0: only at the end)", options.save_interval);
  if (options.keep_last < 0) fail("--keep-last {}: give how many checkpoints to keep (>= 1; 0: all)", options.keep_last);
  if (options.save_dir.empty()) {
    if (options.save_interval > 0) fail("--save-interval {} needs --save-dir DIR: the folder the checkpoints go to", options.save_interval);
    if (options.keep_last > 0) fail("--keep-last {} needs --save-dir DIR", options.keep_last);
    if (options.resume == "auto") fail("--resume auto resumes from the latest checkpoint under --save-dir; give --save-dir DIR (or --resume DIR)");
    if (options.save_format != TrainerOptions::SaveFormat::dstrain) fail("--save-format {} needs --save-dir DIR: the folder the checkpoints go to", save_format_name(options.save_format));
  } else {
    if (fs::exists(options.save_dir) && !fs::is_directory(options.save_dir)) {
      fail("--save-dir {}: a file of that name exists; give a folder for the checkpoints", options.save_dir.string());
    }
    // Created now, and a file proven creatable in it: a read-only disk is found before step 1.
    prove_writable({options.save_dir / kLatestFile, "--save-dir"});
    // The folders of saves a killed process never finished (docs/checkpoints.md "Atomicity").
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(options.save_dir, ec)) {
      if (e.is_directory() && e.path().filename().string().ends_with(".partial")) fs::remove_all(e.path(), ec);
    }
  }
  if (options.save_format != TrainerOptions::SaveFormat::dstrain) {
    // Written from each committed checkpoint: a decoupled save commits later, in the background.
    if (config.checkpoint.writer_options.decoupled)
      fail("--save-format {}: checkpoint.writer.decoupled is true, so a checkpoint is committed in the background at the next save; the {} "
           "files are written from committed checkpoints — set checkpoint.writer.decoupled to false, or leave out --save-format and run "
           "`dstrain export` on the checkpoints",
           save_format_name(options.save_format), save_format_name(options.save_format));
    try {
      check_deepspeed_exportable(model, config.optimizer.type);
    } catch (const Error& e) {
      fail("--save-format {}: this run cannot be saved in DeepSpeed's layout: {}", save_format_name(options.save_format), e.what());
    }
  }
  if (!options.resume_deepspeed.empty() && !options.resume.empty())
    fail("--resume-deepspeed {} and --resume {}: give one checkpoint to continue", options.resume_deepspeed, options.resume);
  if (!options.resume_deepspeed.empty() ||
      (!options.resume.empty() && options.resume != "auto" && fs::is_directory(options.resume) && is_deepspeed_checkpoint(options.resume))) {
    return plan_deepspeed_resume(options.resume_deepspeed.empty() ? fs::path(options.resume) : fs::path(options.resume_deepspeed), options, model,
                                 config);
  }
  if (!options.load_tag.empty() && options.resume.empty())
    fail("--load-tag {} needs --resume DIR (or --resume auto with --save-dir)", options.load_tag);
  if (options.resume.empty()) return std::nullopt;

  ResumePoint rp;
  rp.dir = options.resume == "auto" ? options.save_dir : fs::path(options.resume);
  if (!fs::is_directory(rp.dir)) {
    fail("--resume {}: no such folder; give the --save-dir of the run to continue (or --resume auto to start fresh when there is none)",
         options.resume);
  }
  if (options.resume == "auto" && is_deepspeed_checkpoint(rp.dir)) {
    fail("--resume auto: --save-dir {} holds a DeepSpeed checkpoint, not dstrain's; continue it with --resume-deepspeed {} and give --save-dir "
         "another folder (or add --save-format deepspeed to keep saving there in DeepSpeed's layout too)",
         rp.dir.string(), rp.dir.string());
  }
  rp.tag = options.load_tag;
  if (rp.tag.empty()) {
    const std::optional<std::string> latest = read_latest_tag(rp.dir);
    if (!latest) {
      if (options.resume == "auto") return std::nullopt;  // auto: nothing saved yet, a fresh start
      const std::vector<std::string> tags = list_checkpoint_tags(rp.dir);
      if (tags.empty()) {
        fail("--resume {}: it holds no checkpoint (no '{}' file, no checkpoint folder); give the --save-dir of the run to continue", options.resume,
             kLatestFile);
      }
      fail("--resume {}: no '{}' file there names a checkpoint; give --load-tag TAG (the checkpoints there: {})", options.resume, kLatestFile,
           fmt::join(tags, ", "));
    }
    rp.tag = *latest;
  }
  check_checkpoint_tag(rp.tag);
  try {
    check_resume_point(rp, options, model, config);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("--resume: checkpoint '{}' under '{}' has a malformed manifest ({}); resume from another tag (--load-tag)", rp.tag, rp.dir.string(),
         e.what());
  }
  return rp;
}

namespace {
// The data loader's position the Trainer saved (client_state "data": epoch, position), each a whole
// number >= 0; Error naming the field and the file otherwise.
void read_data_position(ResumePoint& rp, const config::Json& m, const fs::path& manifest) {
  const config::Json* client = m.contains("client_state") && m.at("client_state").is_object() ? &m.at("client_state") : nullptr;
  if (client == nullptr || !client->contains("data") || !client->at("data").is_object()) {
    fail(
        "--resume: checkpoint manifest '{}' has no data loader position (client_state.data); it was not saved by `dstrain train` — load it "
        "with CheckpointManager::load from the program that saved it",
        manifest.string());
  }
  const config::Json& data = client->at("data");
  for (const char* key : {"epoch", "position"}) {
    const auto it = data.find(key);
    if (it == data.end() || !it->is_number_unsigned()) {
      fail("--resume: checkpoint manifest '{}' is malformed: \"client_state.data.{}\" is {}, but it must be a whole number >= 0", manifest.string(),
           key, it == data.end() ? std::string("missing") : it->dump());
    }
    (std::string_view(key) == "epoch" ? rp.data_epoch : rp.data_position) = it->get<std::uint64_t>();
  }
}

// The checkpoint rp names, opened and checked against the run (manifest, indexes, model, optimizer);
// fills its steps, seed, sequence length and data position.
void check_resume_point(ResumePoint& rp, const TrainerOptions& options, const Architecture& model, const config::DsConfig& config) {
  (void)options;
  const CheckpointReader rd(rp.dir, rp.tag);  // the manifest (every field: checkpoint_manifest.h) and every rank's index, checked
  const config::Json& m = rd.manifest();
  const fs::path manifest_path = rd.dir() / kCheckpointManifest;
  // The same model as the manifest records it, key by key: n_head, say, changes no parameter's shape.
  const ArchitectureDifferences differ = architecture_differences(m, manifest_path.string(), model);
  if (!differ.model.empty()) {
    fail("--resume: checkpoint {} was saved from another model than --model gives: {}; resume with the model it was saved from", rd.dir().string(),
         fmt::join(differ.model, "; "));
  }
  rp.changed_settings = differ.settings;
  // The same model: every owned parameter by name and shape.
  std::map<std::string, std::vector<std::int64_t>> saved, mine;
  for (const config::Json& p : m.at("model").at("params")) saved[p.at("name").get<std::string>()] = p.at("shape").get<std::vector<std::int64_t>>();
  for (const auto& layer : model.make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      std::vector<std::int64_t> shape;
      for (int d = 0; d < ps.shape.rank; ++d) shape.push_back(ps.shape[d]);
      mine[ps.name] = shape;
    }
  }
  if (saved != mine) {
    for (const auto& [name, shape] : mine) {
      const auto it = saved.find(name);
      if (it == saved.end() || it->second != shape) {
        fail(
            "--resume: checkpoint {} was saved from another model: parameter '{}' is {} there, {} in --model; resume with the model it "
            "was saved from",
            rd.dir().string(), name, it == saved.end() ? std::string("absent") : fmt::format("{}", fmt::join(it->second, "x")),
            fmt::format("{}", fmt::join(shape, "x")));
      }
    }
    fail("--resume: checkpoint {} was saved from another model ({} parameters, --model has {})", rd.dir().string(), saved.size(), mine.size());
  }
  const auto states = m.at("optimizer").at("states").get<std::vector<std::string>>();
  const std::vector<std::string> want = Optimizer(config.optimizer).state_names();
  if (states != want) {
    fail(
        "--resume: checkpoint {} holds the states [{}] of optimizer \"{}\", but the config's optimizer \"{}\" keeps [{}]; resume with the "
        "optimizer it was saved with",
        rd.dir().string(), fmt::join(states, ", "), m.at("optimizer").value("type", std::string("?")), config.optimizer.type, fmt::join(want, ", "));
  }
  rp.global_steps = m.at("engine").at("global_steps").get<std::int64_t>();
  rp.seed = m.at("seed").get<std::uint64_t>();
  if (m.at("engine").contains("sequence_length")) rp.sequence_length = m.at("engine").at("sequence_length").get<std::int64_t>();
  rp.train_batch_size = m.at("engine").at("train_batch_size").get<std::int64_t>();
  rp.gradient_accumulation_steps = m.at("engine").at("gradient_accumulation_steps").get<std::int64_t>();
  rp.world_size = m.at("layout").at("world_size").get<std::int64_t>();
  if (m.contains("ds_config") && m.at("ds_config").is_object()) {
    const auto it = m.at("ds_config").find("train_micro_batch_size_per_gpu");
    if (it != m.at("ds_config").end() && it->is_number_integer()) rp.micro_batch_size = it->get<std::int64_t>();
  }
  read_data_position(rp, m, manifest_path);
}
}  // namespace

std::vector<std::string> check_resume_against_run(const ResumePoint& rp, const TrainerOptions& options, const Architecture& model, std::int64_t T,
                                                  std::int64_t window_count) {
  std::vector<std::string> warnings;
  const std::string where = (rp.dir / rp.tag).string();
  if (!rp.changed_settings.empty()) {
    warnings.push_back(fmt::format("--resume {}: the model's training settings differ from the checkpoint's ({}); the run continues with --model's",
                                   where, fmt::join(rp.changed_settings, "; ")));
  }
  // DeepSpeed restores its RNG state from a checkpoint; dstrain's streams are the seed's, so the
  // saved seed is the one that continues the run.
  if (options.seed_given && options.seed != rp.seed) {
    warnings.push_back(fmt::format(
        "--seed {} is not used for training: checkpoint {} was saved with seed {}, and the resumed run continues with it (its data order, "
        "dropout streams and stochastic rounding, as DeepSpeed restores the RNG state from a checkpoint); only the text samples take --seed "
        "{}",
        options.seed, where, rp.seed, options.seed));
  }
  const std::uint64_t windows = static_cast<std::uint64_t>(window_count);
  if (rp.sequence_length && *rp.sequence_length != T) {
    warnings.push_back(fmt::format(
        "--sequence-length {} differs from the {} checkpoint {} was trained with: the weights carry over as saved (the model keeps its {} = "
        "{} positions; the run now trains on the first {}), but the data loader's saved position, window {} of epoch {} counted in windows "
        "of {} tokens, is taken as window {} of the file's {} windows of {} tokens, in their own shuffle order: the data does not continue "
        "where the saved run stopped (some text is seen again, some skipped). Resume with --sequence-length {} to continue it exactly",
        T, *rp.sequence_length, where, model.n_positions_key(), model.n_positions(), T, rp.data_position, rp.data_epoch, *rp.sequence_length,
        rp.data_position, windows, T, *rp.sequence_length));
  }
  if (rp.data_position >= windows) {
    fail(
        "--resume: checkpoint {} stopped at window {} of epoch {} of its training data, but --data {} holds {} windows of {} tokens: it is "
        "another data file{}; resume with the --data{} it was trained with",
        where, rp.data_position, rp.data_epoch, options.data.string(), windows, T,
        rp.sequence_length && *rp.sequence_length != T ? fmt::format(" or the sequence length differs (the checkpoint's: {})", *rp.sequence_length)
                                                       : std::string(),
        rp.sequence_length && *rp.sequence_length != T ? std::string(" and --sequence-length") : std::string());
  }
  return warnings;
}

void check_resume_batch(const ResumePoint& rp, const config::DsConfig& cfg, int dp, int ranks_per_dp, bool train_batch_size_given) {
  const std::int64_t saved = rp.train_batch_size, now = cfg.train_batch_size;
  if (saved <= 0 || saved == now) return;  // a DeepSpeed checkpoint (its own check), or the same global batch
  const std::string where = (rp.dir / rp.tag).string();
  const std::int64_t micro = cfg.train_micro_batch_size_per_gpu, gas = cfg.gradient_accumulation_steps;
  std::string how_saved = fmt::format("train_batch_size {}", saved);
  if (rp.micro_batch_size > 0 && rp.gradient_accumulation_steps > 0 && saved % (rp.micro_batch_size * rp.gradient_accumulation_steps) == 0)
    how_saved += fmt::format(" = micro-batch {} x gradient_accumulation_steps {} x {} data-parallel rank{}", rp.micro_batch_size,
                             rp.gradient_accumulation_steps, saved / (rp.micro_batch_size * rp.gradient_accumulation_steps),
                             saved == rp.micro_batch_size * rp.gradient_accumulation_steps ? "" : "s");
  how_saved += fmt::format(", world size {}", rp.world_size);
  const std::string how_now = fmt::format("train_batch_size {} = micro-batch {} x gradient_accumulation_steps {} x {} data-parallel rank{}, world size {}",
                                          now, micro, gas, dp, dp == 1 ? "" : "s", dp * ranks_per_dp);
  const auto worlds = [&](const std::vector<std::int64_t>& dps) {
    std::vector<std::string> out;
    for (std::int64_t d : dps) out.push_back(ranks_per_dp == 1 ? std::to_string(d) : fmt::format("{} ({} data-parallel)", d * ranks_per_dp, d));
    return fmt::format("{}", fmt::join(out, ", "));
  };
  if (cfg.elasticity.enabled) {
    // DeepSpeed's elastic arithmetic (config_schema/elasticity_config.h) at each data-parallel size:
    // the sizes at which it gives the saved global batch.
    std::vector<std::int64_t> keep;
    for (std::int64_t d = 1; d <= std::min<std::int64_t>({saved, cfg.elasticity.max_gpus, 4096}); ++d) {
      try {
        if (config::compute_elastic_batch(cfg.elasticity, d).train_batch_size == saved) keep.push_back(d);
      } catch (const Error&) {
      }
    }
    fail(
        "--resume: checkpoint {} was trained with a global batch of {} sequences ({}), but the config's elasticity section gives {} at this "
        "world size ({}): a resumed run keeps the global batch, so the same steps are the same batches and the data order, LR schedule and "
        "loss scale continue. {}",
        where, saved, how_saved, now, how_now,
        keep.empty() ? fmt::format("No world size gives train_batch_size {} under this elasticity section; resume with the elasticity section "
                                   "the checkpoint was trained with",
                                   saved)
                     : fmt::format("Relaunch on one of the world sizes elasticity gives train_batch_size {} at: {}", saved, worlds(keep)));
  }
  std::vector<std::string> fixes;
  if (train_batch_size_given) {
    // The config fixes the global batch (GAS follows the world size): it was changed.
    fail(
        "--resume: checkpoint {} was trained with a global batch of {} sequences ({}), but the config's train_batch_size is {} ({}): a resumed "
        "run keeps the global batch, so the same steps are the same batches and the data order, LR schedule and loss scale continue. Set "
        "\"train_batch_size\": {} again (gradient_accumulation_steps follows the world size)",
        where, saved, how_saved, now, how_now, saved);
  }
  if (saved % (micro * gas) == 0) fixes.push_back(fmt::format("relaunch on {} ranks (micro-batch {} x gradient_accumulation_steps {} x {} = {})",
                                                              worlds({saved / (micro * gas)}), micro, gas, saved / (micro * gas), saved));
  if (saved % (micro * dp) == 0)
    fixes.push_back(fmt::format("keep this world size and set \"gradient_accumulation_steps\": {} (micro-batch {} x {} x {} = {}), or set "
                                "\"train_batch_size\": {} and leave gradient_accumulation_steps out (it is then derived for every world size "
                                "that divides it)",
                                saved / (micro * dp), micro, saved / (micro * dp), dp, saved, saved));
  else
    fixes.push_back(fmt::format("set \"train_batch_size\": {} in the config and relaunch on a world size whose micro-batch x data-parallel ranks "
                                "divides it",
                                saved));
  fail(
      "--resume: checkpoint {} was trained with a global batch of {} sequences ({}), but this run's is {} ({}): a resumed run keeps the global "
      "batch, so the same steps are the same batches and the data order, LR schedule and loss scale continue. To keep it: {}",
      where, saved, how_saved, now, how_now, fmt::join(fixes, "; or "));
}

std::int64_t checkpoint_saves(std::int64_t from, std::int64_t to, std::int64_t save_interval) {
  // RankTrainer::run saves after step s when s % interval == 0 and s < to; finish() saves at the end.
  if (save_interval <= 0 || to - 1 <= from) return 1;
  return 1 + (to - 1) / save_interval - from / save_interval;
}

std::int64_t checkpoints_at_once(std::int64_t prior, std::int64_t saves, std::int64_t keep_last) {
  if (saves <= 0) return 0;
  if (keep_last <= 0) return saves;
  // Before save j > 1 the folder holds min(prior + j - 1, K) (pruned after each save), during it one
  // more; counted against the `prior` already on the disk, fullest at the last save. The first save
  // adds one whatever was there.
  return std::max<std::int64_t>(1, std::min(prior + saves - 1, keep_last) + 1 - prior);
}

CheckpointSpace checkpoint_space(const TrainerOptions& options, const Architecture& model, const config::DsConfig& config, int world,
                                 std::int64_t from_step, std::int64_t to_step) {
  CheckpointSpace c;
  if (options.save_dir.empty()) return c;
  const DType params = config.fp16.enabled ? DType::fp16 : config.bf16.enabled ? DType::bf16 : DType::fp32;
  c.bytes_each =
      model.stored_parameter_count() * static_cast<double>(checkpoint_bytes_per_element(Optimizer(config.optimizer).state_names().size(), params));
  // ZeRO stage >= 1: each rank writes its partition; stage 0: rank 0 writes the whole.
  c.largest_file = config.zero_optimization.stage >= 1 ? std::ceil(c.bytes_each / world) : c.bytes_each;
  c.saves = checkpoint_saves(from_step, to_step, options.save_interval);
  std::error_code ec;
  const std::int64_t prior = fs::is_directory(options.save_dir, ec) ? static_cast<std::int64_t>(list_checkpoint_tags(options.save_dir).size()) : 0;
  c.at_once = checkpoints_at_once(prior, c.saves, options.keep_last);
  c.bytes = c.bytes_each * static_cast<double>(c.at_once);
  return c;
}

std::vector<std::string> prune_checkpoints(const fs::path& save_dir, std::int64_t keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  const std::vector<std::string> tags = list_checkpoint_tags(save_dir);  // oldest first
  const std::optional<std::string> latest = read_latest_tag(save_dir);
  std::int64_t excess = static_cast<std::int64_t>(tags.size()) - keep;
  for (const std::string& t : tags) {
    if (excess <= 0) break;
    if (latest && t == *latest) continue;
    std::error_code ec;
    fs::remove_all(save_dir / t, ec);
    if (!ec) removed.push_back(t);
    --excess;
  }
  return removed;
}

namespace {

void on_stop_signal(int sig) { request_stop(sig); }

struct SavedHandlers {
  struct sigaction term {};
  struct sigaction intr {};
};
SavedHandlers g_saved;

}  // namespace

StopSignalHandler::StopSignalHandler() {
  clear_stop_request();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ::sigaction(SIGTERM, &sa, &g_saved.term);
  ::sigaction(SIGINT, &sa, &g_saved.intr);
}

StopSignalHandler::~StopSignalHandler() {
  ::sigaction(SIGTERM, &g_saved.term, nullptr);
  ::sigaction(SIGINT, &g_saved.intr, nullptr);
}

}  // namespace dstrain
