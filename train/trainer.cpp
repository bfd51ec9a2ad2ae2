#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "train/rank_trainer.h"
#include "train/trainer_checkpoints.h"
#include "ops/atomic_file.h"
#include "ops/error.h"
#include "zero/launcher_communicator.h"
#include "zero/local_communicator.h"
#include "zero/mpi_process.h"

namespace dstrain {
namespace {

nlohmann::json comm_json(const CommStats& c) {
  nlohmann::json j;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    j[std::string(collective_name(kind))] = {
        {"bytes", c.bytes_sent(kind)}, {"calls", c.call_count(kind)}, {"cross_node_bytes", c.cross_node_bytes_sent(kind)}};
  }
  j["total"] = {{"bytes", c.total_bytes_sent()}, {"calls", c.total_calls()}, {"cross_node_bytes", c.total_cross_node_bytes()}};
  return j;
}

nlohmann::json io_json(const OffloadIo& io) {
  return {{"bytes_read", io.bytes_read}, {"bytes_written", io.bytes_written}, {"wait_seconds", io.wait_seconds}};
}

// --summary-json's "zero" object: the stage, the world size and the ZeroReport of every rank of
// this process (under a launcher, this process's rank alone: the others are in their processes).
nlohmann::json zero_json(const std::vector<ZeroReport>& reports, int world_size) {
  nlohmann::json z;
  z["stage"] = reports.empty() ? 0 : reports.front().stage;
  z["world_size"] = world_size;
  nlohmann::json ranks = nlohmann::json::array();
  for (const ZeroReport& r : reports) {
    ranks.push_back({{"rank", r.rank},
                     {"param_bytes", r.param_bytes},
                     {"grad_bytes", r.grad_bytes},
                     {"optimizer_bytes", r.optimizer_bytes},
                     {"host_optimizer_bytes", r.host_optimizer_bytes},
                     {"optimizer_home", std::string(state_home_name(r.optimizer_home))},
                     {"bytes_held",
                      {{"device", memory_purposes_json(r.device_bytes)},
                       {"host", memory_purposes_json(r.host_bytes)},
                       {"nvme", memory_purposes_json(r.nvme_bytes)}}},
                     {"nvme_step_io", io_json(r.step_io)},
                     {"nvme_train_io", io_json(r.train_io)},
                     {"peak_bytes", r.peak_bytes},
                     {"padded_param_elements", r.padded_param_elements},
                     {"peak_gathered_param_elements", r.peak_gathered_param_elements},
                     {"secondary_param_bytes", r.secondary_param_bytes},
                     {"step_comm", comm_json(r.step_comm)}});
  }
  z["ranks"] = ranks;
  return z;
}

// Every rank's ZeroReport on every process of a process-per-rank group (MPI): one all-gather of
// fp64 values (exact: every figure is an integer below 2^53, or a time), walked in
// for_each_figure's order both ways, so rank 0's --summary-json holds the memory and traffic of all
// ranks, as a run of local ranks' does.
std::vector<ZeroReport> gather_reports(Communicator& comm, const ZeroReport& mine) {
  std::vector<double> own;
  for_each_figure(mine, [&own](const auto& field) {
    if constexpr (std::is_enum_v<std::remove_cvref_t<decltype(field)>>) {
      own.push_back(static_cast<double>(static_cast<int>(field)));
    } else {
      own.push_back(static_cast<double>(field));
    }
  });
  const std::size_t fields = own.size();
  const int w = comm.world_size();
  std::vector<double> all(fields * static_cast<std::size_t>(w));
  comm.all_gather(Tensor(own.data(), DType::fp64, Shape{static_cast<std::int64_t>(fields)}),
                  Tensor(all.data(), DType::fp64, Shape{static_cast<std::int64_t>(all.size())}));
  std::vector<ZeroReport> reports(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) {
    const double* f = all.data() + fields * static_cast<std::size_t>(q);
    for_each_figure(reports[static_cast<std::size_t>(q)], [&f](auto& field) {
      using T = std::remove_cvref_t<decltype(field)>;
      if constexpr (std::is_enum_v<T>) {
        field = static_cast<T>(static_cast<int>(*f++));
      } else {
        field = static_cast<T>(*f++);
      }
    });
  }
  return reports;
}

// The world communicator's nodes (docs/parallelism.md "Nodes"), set before the mesh splits it (its
// groups inherit them): --ranks-per-node N puts rank r on node r / N (over what MPI found); without
// it a launcher's processes (nccl) are placed by its local world size when it gives one, MPI's by
// MPI_Comm_split_type (the communicator did it), local ranks stay on one node. Returns where the
// layout came from ("" when nothing set it).
std::string set_world_nodes(Communicator& comm, const TrainingPlan& plan, const TrainerOptions& options) {
  const auto by_blocks = [&comm](int per_node) {
    std::vector<int> nodes(static_cast<std::size_t>(comm.world_size()));
    for (int r = 0; r < comm.world_size(); ++r) nodes[static_cast<std::size_t>(r)] = r / per_node;
    comm.set_nodes(std::move(nodes));
  };
  if (options.ranks_per_node > 0) {
    by_blocks(static_cast<int>(options.ranks_per_node));
    return "--ranks-per-node";
  }
  if (plan.comm == "mpi") return "MPI_Comm_split_type";
  if (plan.launcher_group && plan.launch.local_world_size > 0 && comm.world_size() % plan.launch.local_world_size == 0) {
    by_blocks(plan.launch.local_world_size);
    return fmt::format("the local world size of {}", plan.launch.launcher);
  }
  return "";
}

// "world 8 ranks on 2 nodes of 4 ranks (from --ranks-per-node)"; "" on one node.
std::string nodes_line(const Communicator& comm, const std::string& source) {
  if (comm.node_count() <= 1) return "";
  int least = comm.world_size(), most = 0;
  std::vector<int> seen;
  for (int r = 0; r < comm.world_size(); ++r) {
    const int node = comm.node_of(r);
    if (std::find(seen.begin(), seen.end(), node) != seen.end()) continue;
    seen.push_back(node);
    least = std::min(least, comm.ranks_on_node(node));
    most = std::max(most, comm.ranks_on_node(node));
  }
  return fmt::format("world {} ranks on {} nodes of {} ranks (from {})", comm.world_size(), comm.node_count(),
                     least == most ? fmt::format("{}", least) : fmt::format("{} to {}", least, most), source);
}

}  // namespace

Trainer::Trainer(ConfigText config, std::string model, TrainerOptions options)
    : config_(std::move(config)), model_(std::move(model)), options_(std::move(options)) {}

const TrainingPlan& Trainer::prepare() {
  if (!plan_) plan_ = plan_training(config_, model_, options_);
  return *plan_;
}

const TrainingPlan& Trainer::plan() const {
  DSTRAIN_CHECK(plan_.has_value(), "Trainer::plan(): call prepare() (or run()) first");
  return *plan_;
}

TrainResult Trainer::run() {
  const TrainingPlan& plan = prepare();
  TrainResult result;
  // Each rank fills its own slot (threads of one process); they are read after every rank is done.
  std::vector<std::optional<TrainSummary>> summaries;
  std::optional<StopSignalHandler> signals;
  if (options_.handle_signals) signals.emplace();
  double join_seconds = 0.0;
  const auto train_rank = [&](Communicator* comm, std::size_t slot) {
    if (comm != nullptr) {
      const std::string line = nodes_line(*comm, set_world_nodes(*comm, plan, options_));
      if (comm->rank() == 0 && !line.empty()) trainer_print(options_, line);
    }
    RankTrainer rank(plan, options_, comm);
    rank.set_join_seconds(join_seconds);
    rank.run();
    result.reports[slot] = rank.zero_report();
    if (rank.lead()) {
      summaries[slot] = rank.take_summary();
      result.stopped_by_signal = rank.stopped_by_signal();
    }
  };
  try {
    if (plan.comm == "mpi") {
      // This process is rank plan.launch.rank of MPI_COMM_WORLD; the others' reports come by all-gather.
      const auto join_start = std::chrono::steady_clock::now();
      const std::unique_ptr<Communicator> comm = join_mpi_world();
      join_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - join_start).count();
      result.reports.assign(1, ZeroReport{});
      summaries.resize(1);
      train_rank(comm.get(), 0);
      result.reports = gather_reports(*comm, result.reports.front());
    } else if (plan.launcher_group) {
      // This process is one rank; the reports of the others stay in their processes.
      const auto join_start = std::chrono::steady_clock::now();
      const std::unique_ptr<Communicator> comm = join_launcher_group(plan.launch, plan.device);
      join_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - join_start).count();
      result.reports.assign(1, ZeroReport{});
      summaries.resize(1);
      train_rank(comm.get(), 0);
    } else if (options_.num_ranks == 1) {
      result.reports.assign(1, ZeroReport{});
      summaries.resize(1);
      train_rank(nullptr, 0);
    } else {
      result.reports.assign(static_cast<std::size_t>(plan.world), ZeroReport{});
      summaries.resize(static_cast<std::size_t>(plan.world));
      run_local_ranks(plan.world, [&](Communicator& comm) { train_rank(&comm, static_cast<std::size_t>(comm.rank())); });
    }
  } catch (const StopRequested& e) {
    // NVMe swap I/O gave up on a stop request that waited stop_grace() for a step boundary: the run
    // ends as a stop at a boundary does (exit 75), without the checkpoint it could not make.
    trainer_print(options_, e.what());
    result.stopped_by_signal = e.signal_number();
    return result;
  }
  for (std::optional<TrainSummary>& s : summaries) {
    if (s) result.summary = std::move(*s);
  }
  write_summary_json(result);
  return result;
}

void Trainer::write_summary_json(const TrainResult& result) const {
  if (options_.summary_json.empty() || !result.summary) return;
  nlohmann::json j = to_json(*result.summary);
  j["device"] = plan_->device.str();
  j["zero"] = zero_json(result.reports, plan_->world);
  // Atomic (ops/atomic_file.h): a reader never sees half a summary; its folder was created and
  // proven writable before step 1 (plan_training).
  write_file_atomically(options_.summary_json, j.dump(2) + "\n");
}

}  // namespace dstrain
