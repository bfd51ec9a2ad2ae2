#include "train/trainer_checkpoints.h"

#include <csignal>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/checkpoint/checkpoint_files.h"
#include "data/run_files.h"
#include "models/model_family.h"
#include "engine/optim/optimizer.h"
#include "ops/error.h"

namespace dstrain {
namespace fs = std::filesystem;

namespace {
void check_resume_point(ResumePoint& rp, const TrainerOptions& options, const Architecture& model, const config::DsConfig& config);
}

std::optional<ResumePoint> plan_resume(const TrainerOptions& options, const Architecture& model, const config::DsConfig& config) {
  if (options.save_interval < 0) fail("--save-interval {}: give a number of optimizer steps >= 1 (0: only at the end)", options.save_interval);
  if (options.keep_last < 0) fail("--keep-last {}: give how many checkpoints to keep (>= 1; 0: all)", options.keep_last);
  if (options.save_dir.empty()) {
    if (options.save_interval > 0) fail("--save-interval {} needs --save-dir DIR: the folder the checkpoints go to", options.save_interval);
    if (options.keep_last > 0) fail("--keep-last {} needs --save-dir DIR", options.keep_last);
    if (options.resume == "auto") fail("--resume auto resumes from the latest checkpoint under --save-dir; give --save-dir DIR (or --resume DIR)");
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
  if (!options.load_tag.empty() && options.resume.empty())
    fail("--load-tag {} needs --resume DIR (or --resume auto with --save-dir)", options.load_tag);
  if (options.resume.empty()) return std::nullopt;

  ResumePoint rp;
  rp.dir = options.resume == "auto" ? options.save_dir : fs::path(options.resume);
  if (!fs::is_directory(rp.dir)) {
    fail("--resume {}: no such folder; give the --save-dir of the run to continue (or --resume auto to start fresh when there is none)",
         options.resume);
  }
  rp.tag = options.load_tag;
  if (rp.tag.empty()) {
    const std::optional<std::string> latest = read_latest_tag(rp.dir);
    if (!latest) {
      if (options.resume == "auto") return std::nullopt;  // auto: nothing saved yet, a fresh start
      fail("--resume {}: no '{}' file there names a checkpoint; give --load-tag TAG (the checkpoints there: {})", options.resume, kLatestFile,
           fmt::join(list_checkpoint_tags(rp.dir), ", "));
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
// The checkpoint rp names, opened and checked against the run (manifest, indexes, model, optimizer);
// fills its steps and seed.
void check_resume_point(ResumePoint& rp, const TrainerOptions& options, const Architecture& model, const config::DsConfig& config) {
  (void)options;
  const CheckpointReader rd(rp.dir, rp.tag);  // the manifest and every rank's index, checked
  const config::Json& m = rd.manifest();
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
}
}  // namespace

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
