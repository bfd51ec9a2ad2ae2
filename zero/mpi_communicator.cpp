#include "zero/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/log.h"
#include "zero/point_to_point.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

// The arrival exchange's tag on ctrl_ (MPI keeps messages of one tag between two ranks in order,
// so rank q's descriptions arrive in q's call order).
constexpr int kArrivalTag = 7;
// The data's tag on data_: each collective sends at most one message each way between two ranks, so
// messages match by order as well.
constexpr int kDataTag = 8;
// Point-to-point: the sender's description (ctrl_), the receiver's (ctrl_), the data (data_).
// One tag each, so a pair's messages one way never match its messages the other way, nor a
// collective's; per tag MPI keeps them in order (the pair's program order).
constexpr int kP2pSendTag = 9;
constexpr int kP2pRecvTag = 10;
constexpr int kP2pDataTag = 11;

// Elements travel as unsigned integers of their size: MPI moves the bits and never rounds them.
MPI_Datatype element_type(DType dtype) {
  switch (dtype_size(dtype)) {
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      break;
  }
  fail("MPI communicator: dtype {} cannot be communicated", dtype_name(dtype));
}

std::string mpi_error_text(int status) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", status);
  return std::string(text, static_cast<std::size_t>(length));
}

// MPI_THREAD_SERIALIZED (init_mpi) lets one thread of the process call MPI at a time. A rank's
// calls are serialized per communicator, but with zero_optimization.overlap_comm the data group's
// collectives run on the CommQueue's worker thread while the main thread drives the pipeline
// group's transfers (and, under tensor parallelism, other groups' collectives): two communicators,
// one process. So every MPI call of this file runs under this process-wide lock, taken per call
// or per test pass — never across a wait for a peer, so each thread's operations progress while
// the other's wait.
std::mutex& mpi_mutex() {
  static std::mutex mu;
  return mu;
}
using MpiLock = std::lock_guard<std::mutex>;

// Polls a set of requests until they are done or the deadline passes: returns false then. The
// first 100 µs test without pause (a collective between processes of one machine often completes
// in that time); afterwards the waits grow to 200 µs so that a rank waiting for a slow peer leaves
// the core to the compute of this machine's other ranks. Each MPI_Test* also advances MPI's
// progress engine, which non-blocking collectives need.
template <typename Test>
bool poll_until(Test test, Clock::time_point deadline) {
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    {
      const MpiLock lock(mpi_mutex());  // each pass of MPI_Test* alone (mpi_mutex above)
      if (test()) return true;
    }
    const auto now = Clock::now();
    if (now > deadline) return false;
    if (now - start > std::chrono::microseconds(100)) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(200));
    }
  }
}

// Tests `requests` until all have completed (true) or the deadline passes (false: the pending
// ones stay non-null, so the caller can name their peers). `status` is MPI_Testsome's; on a
// failure the test stops at once (true) and the caller's check() reports it.
bool test_all_until(std::vector<MPI_Request>& requests, Clock::time_point deadline, int& status) {
  std::vector<int> indices(requests.size());
  status = MPI_SUCCESS;
  return poll_until(
      [&] {
        int done = 0;
        status = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &done, indices.data(), MPI_STATUSES_IGNORE);
        if (status != MPI_SUCCESS) return true;
        return done == MPI_UNDEFINED || std::all_of(requests.begin(), requests.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
      },
      deadline);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout) : MpiCommunicator(comm, timeout, true) {}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout, bool sets_log_rank)
    : PairwiseCommunicator(
          [&] {
            int initialized = 0, finalized = 0;
            MPI_Initialized(&initialized);
            MPI_Finalized(&finalized);
            DSTRAIN_CHECK(initialized && !finalized,
                          "MPI communicator: MPI is {} in this process. Fix: call dstrain::init_mpi() (zero/mpi_process.h) or "
                          "MPI_Init_thread first",
                          finalized ? "already finalized" : "not initialized");
            int r = 0;
            DSTRAIN_CHECK(MPI_Comm_rank(comm, &r) == MPI_SUCCESS, "MPI communicator: MPI_Comm_rank failed (an invalid communicator?)");
            return r;
          }(),
          [&] {
            int w = 0;
            DSTRAIN_CHECK(MPI_Comm_size(comm, &w) == MPI_SUCCESS, "MPI communicator: MPI_Comm_size failed (an invalid communicator?)");
            return w;
          }(),
          "MPI"),
      timeout_(timeout) {
  DSTRAIN_CHECK(timeout.count() > 0, "MPI communicator: the timeout must be positive, got {} ms", timeout.count());
  // Duplicating is collective but MPI_Comm_dup has no deadline; MPI_Comm_idup does.
  for (MPI_Comm* dup : {&ctrl_, &data_}) {
    MPI_Request request = MPI_REQUEST_NULL;
    int status = MPI_SUCCESS;
    {
      const MpiLock lock(mpi_mutex());
      status = MPI_Comm_idup(comm, dup, &request);
    }
    if (status != MPI_SUCCESS) fail("MPI communicator: MPI_Comm_idup on rank {} failed: {}", rank(), mpi_error_text(status));
    int done = 0;
    const bool ok = poll_until([&] { return MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done; }, Clock::now() + timeout_);
    if (!ok) {
      fail(
          "MPI communicator: rank {} of {}: the other processes did not join the communicator within {} ms. Fix: check that every "
          "process of the job starts dstrain the same way, or raise DSTRAIN_COMM_TIMEOUT (seconds)",
          rank(), world_size(), timeout_.count());
    }
    const MpiLock lock(mpi_mutex());
    MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN);
  }
  // One rank per process: its log lines carry its rank, rank 0 prints info.
  if (sets_log_rank) set_log_rank(rank(), world_size());
  received_.assign(static_cast<std::size_t>(world_size()), Call{});
  // The process's communicator learns which ranks share a machine; a split's child inherits them
  // (Communicator::split).
  if (sets_log_rank && world_size() > 1) detect_nodes();
}

void MpiCommunicator::detect_nodes() {
  // The ranks of one shared-memory domain (a node) agree on its smallest rank; every rank learns
  // every rank's by an all-gather. Blocking MPI calls without deadline, as MPI_Comm_split: every
  // process has joined the duplicates above, so they all come here next.
  const int me = rank();
  int leader = me;
  std::vector<int> leaders(static_cast<std::size_t>(world_size()));
  int status = MPI_SUCCESS;
  {
    const MpiLock lock(mpi_mutex());
    MPI_Comm shared = MPI_COMM_NULL;
    status = MPI_Comm_split_type(ctrl_, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &shared);
    if (status == MPI_SUCCESS) {
      status = MPI_Allreduce(&me, &leader, 1, MPI_INT, MPI_MIN, shared);
      MPI_Comm_free(&shared);
    }
    if (status == MPI_SUCCESS) status = MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, ctrl_);
  }
  if (status != MPI_SUCCESS) {
    fail_with(fmt::format("MPI communicator: finding the ranks of each node (MPI_Comm_split_type, MPI_Allgather) failed on rank {}: {}", me,
                          mpi_error_text(status)));
  }
  // Node ids 0, 1, ... in order of first appearance.
  std::vector<int> nodes(leaders.size());
  std::vector<int> seen;
  for (std::size_t r = 0; r < leaders.size(); ++r) {
    const auto it = std::find(seen.begin(), seen.end(), leaders[r]);
    nodes[r] = static_cast<int>(it - seen.begin());
    if (it == seen.end()) seen.push_back(leaders[r]);
  }
  set_nodes(std::move(nodes));
}

MpiCommunicator::~MpiCommunicator() {
  if (!failure_.empty()) {
    // MPI may still write the buffers of the exchange that failed (scratch, arrival receives, this
    // rank's pending description): leave them to the process's end, which follows a failure.
    new std::vector<char>(collectives_.release_scratch());  // NOLINT: deliberately leaked
    new std::vector<Call>(std::move(received_));            // NOLINT
    own_call_.release();                                    // NOLINT
    new std::vector<std::vector<Call>>(std::move(p2p_kept_));  // NOLINT
    new std::vector<std::vector<char>>(std::move(p2p_kept_data_));  // NOLINT: a failed batch's receives in flight
    return;
  }
  const MpiLock lock(mpi_mutex());
  for (MPI_Comm* c : {&ctrl_, &data_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

void MpiCommunicator::fail_with(std::string message) {
  if (failure_.empty()) failure_ = message;
  throw Error(message);
}

void MpiCommunicator::check_usable() const {
  if (!failure_.empty()) {
    throw Error(fmt::format("MPI communicator: rank {} cannot issue collective #{}: the group failed earlier: {}", rank(), sequence(), failure_));
  }
}

void MpiCommunicator::check(int status, const char* what, const Call& call) {
  if (status == MPI_SUCCESS) return;
  fail_with(fmt::format("MPI communicator: {} failed on rank {} in {}: {}", what, rank(), describe_call(call, world_size()), mpi_error_text(status)));
}

void MpiCommunicator::arrive(const Call& call) {
  check_usable();
  const int w = world_size();
  const int me = rank();
  arrivals_.record(me, call);
  if (w == 1) return;
  // Receives first (indices 0..w−2 map to the peers in rank order), then sends.
  std::vector<MPI_Request> requests;
  std::vector<int> peer_of;
  requests.reserve(static_cast<std::size_t>(2 * (w - 1)));
  *own_call_ = call;
  std::unique_lock<std::mutex> lock(mpi_mutex());
  for (int q = 0; q < w; ++q) {
    if (q == me) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Irecv(&received_[static_cast<std::size_t>(q)], sizeof(Call), MPI_BYTE, q, kArrivalTag, ctrl_, &r), "MPI_Irecv", call);
    requests.push_back(r);
    peer_of.push_back(q);
  }
  for (int q = 0; q < w; ++q) {
    if (q == me) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Isend(own_call_.get(), sizeof(Call), MPI_BYTE, q, kArrivalTag, ctrl_, &r), "MPI_Isend", call);
    requests.push_back(r);
  }
  lock.unlock();
  int status = MPI_SUCCESS;
  const bool all = test_all_until(requests, Clock::now() + timeout_, status);
  check(status, "MPI_Testsome", call);
  // The descriptions that came, then who is missing.
  std::vector<int> missing;
  for (std::size_t i = 0; i < peer_of.size(); ++i) {
    if (requests[i] == MPI_REQUEST_NULL) {
      arrivals_.record(peer_of[i], received_[static_cast<std::size_t>(peer_of[i])]);
    } else {
      missing.push_back(peer_of[i]);
    }
  }
  if (!all) fail_with(arrivals_.timeout_text(call, missing, timeout_));
  arrivals_.check_same(call, [this](std::string message) { fail_with(std::move(message)); });
}

void MpiCommunicator::exchange(const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype, const Call& call) {
  const MPI_Datatype type = element_type(dtype);
  const std::size_t es = dtype_size(dtype);
  std::vector<MPI_Request> requests;
  std::vector<int> peer_of;
  requests.reserve(sends.size() + recvs.size());
  // MPI counts are ints: a longer message goes as several, which MPI keeps in order (one tag).
  const auto post = [&](const PairwiseMessage& m, bool is_send) {
    for (std::int64_t done = 0; done < m.count;) {
      const auto piece = static_cast<int>(std::min<std::int64_t>(m.count - done, INT_MAX));
      char* at = static_cast<char*>(m.data) + static_cast<std::size_t>(done) * es;
      MPI_Request r = MPI_REQUEST_NULL;
      if (is_send) check(MPI_Isend(at, piece, type, m.peer, kDataTag, data_, &r), "MPI_Isend", call);
      else check(MPI_Irecv(at, piece, type, m.peer, kDataTag, data_, &r), "MPI_Irecv", call);
      requests.push_back(r);
      peer_of.push_back(m.peer);
      done += piece;
    }
  };
  std::unique_lock<std::mutex> lock(mpi_mutex());
  for (const PairwiseMessage& m : recvs) post(m, false);
  for (const PairwiseMessage& m : sends) post(m, true);
  lock.unlock();
  if (requests.empty()) return;
  int status = MPI_SUCCESS;
  const bool all = test_all_until(requests, Clock::now() + timeout_, status);
  check(status, "MPI_Testsome", call);
  if (all) return;
  std::vector<int> stuck;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] != MPI_REQUEST_NULL && std::find(stuck.begin(), stuck.end(), peer_of[i]) == stuck.end()) stuck.push_back(peer_of[i]);
  }
  std::sort(stuck.begin(), stuck.end());
  fail_with(arrivals_.stuck_text(call, stuck, timeout_));
}

namespace {

// A started batch (MpiCommunicator::do_start_send_recv): per op its two descriptions and its data
// message, all in flight from the start.
struct MpiPending final : PendingPointToPoint {
  std::vector<PointToPointCall> mine;
  std::vector<int> peers;
  std::vector<std::string> names;
  // The descriptions: ours out, the peer's in. MPI writes `in` until they complete (kept by the
  // communicator after a failure: MpiCommunicator::keep).
  std::vector<CollectiveCall> out, in;
  std::vector<MPI_Request> described;  // [2i]: op i's incoming description, [2i+1]: its outgoing one
  std::vector<MPI_Request> data;       // op i's data message (null when it carries no element)
  std::vector<int> data_status;        // MPI_Test's status of a data message that failed
  std::vector<char> compared, moved;
  // A recv's data lands in `staging` (the batch's own memory) and is copied into the caller's
  // buffer once the op has completed and matched: after a failure (a timeout, a mismatch) MPI may
  // still be writing a posted receive, and the caller's buffer may be gone by then.
  std::vector<std::vector<char>> staging;
  std::vector<void*> dest;
};

}  // namespace

void MpiCommunicator::keep(PendingPointToPoint& pending) noexcept {
  auto& p = static_cast<MpiPending&>(pending);
  p2p_kept_.push_back(std::move(p.out));
  p2p_kept_.push_back(std::move(p.in));
  for (std::size_t i = 0; i < p.staging.size(); ++i)
    if (!p.staging[i].empty() && !p.moved[i]) p2p_kept_data_.push_back(std::move(p.staging[i]));
}

std::unique_ptr<PendingPointToPoint> MpiCommunicator::do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> mine) {
  const std::size_t n = ops.size();
  auto p = std::make_unique<MpiPending>();
  p->names.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    p->names[i] = describe_point_to_point(mine[i]);
    DSTRAIN_CHECK(ops[i].buffer.device.is_cpu(),
                  "MPI communicator: the buffer of {} is on {}; the MPI backend communicates host memory. Fix: use host buffers (--device "
                  "cpu), or the nccl backend for GPUs",
                  p->names[i], ops[i].buffer.device.str());
  }
  check_usable();
  p->mine.assign(mine.begin(), mine.end());
  p->out.assign(n, Call{});
  p->in.assign(n, Call{});
  p->described.assign(2 * n, MPI_REQUEST_NULL);
  p->data.assign(n, MPI_REQUEST_NULL);
  p->data_status.assign(n, MPI_SUCCESS);
  p->compared.assign(n, 0);
  p->moved.assign(n, 0);
  p->staging.resize(n);
  p->dest.assign(n, nullptr);
  std::vector<int> counts(n);
  for (std::size_t i = 0; i < n; ++i) {
    // The descriptions carry the pair's number where a collective's carries its sequence number.
    const auto kind = mine[i].is_send ? CollectiveKind::send : CollectiveKind::recv;
    p->out[i] = make_call(mine[i].number, kind, mine[i].dtype, mine[i].count);
    DSTRAIN_CHECK(mine[i].count <= INT_MAX,
                  "MPI communicator: {} has {} elements, above MPI's int count limit {}. Fix: send it in smaller pieces", p->names[i],
                  mine[i].count, INT_MAX);
    counts[i] = static_cast<int>(mine[i].count);
    p->peers.push_back(ops[i].peer);
  }
  // Everything at once, in batch order: per op the peer's description in, ours out, and the data
  // message (posted ahead of the check: a pair's messages one way are posted in the pair's order
  // on both ranks, and MPI matches them in that order, so the descriptions only confirm what MPI
  // paired).
  try {
    const MpiLock lock(mpi_mutex());
    for (std::size_t i = 0; i < n; ++i) {
      const bool sending = mine[i].is_send;
      const int peer = ops[i].peer;
      check(MPI_Irecv(&p->in[i], sizeof(Call), MPI_BYTE, peer, sending ? kP2pRecvTag : kP2pSendTag, ctrl_, &p->described[2 * i]), "MPI_Irecv",
            p->out[i]);
      check(MPI_Isend(&p->out[i], sizeof(Call), MPI_BYTE, peer, sending ? kP2pSendTag : kP2pRecvTag, ctrl_, &p->described[2 * i + 1]), "MPI_Isend",
            p->out[i]);
      if (counts[i] == 0) {
        p->moved[i] = 1;
        continue;
      }
      const Tensor& buf = ops[i].buffer;
      if (sending) {
        check(MPI_Isend(buf.data, counts[i], element_type(buf.dtype), peer, kP2pDataTag, data_, &p->data[i]), "MPI_Isend", p->out[i]);
      } else {
        p->staging[i].resize(static_cast<std::size_t>(counts[i]) * dtype_size(buf.dtype));
        p->dest[i] = buf.data;
        check(MPI_Irecv(p->staging[i].data(), counts[i], element_type(buf.dtype), peer, kP2pDataTag, data_, &p->data[i]), "MPI_Irecv", p->out[i]);
      }
    }
  } catch (...) {
    keep(*p);
    throw;
  }
  return p;
}

void MpiCommunicator::do_wait(PendingPointToPoint& pending) {
  try {
    complete(pending);
  } catch (...) {
    keep(pending);
    throw;
  }
}

void MpiCommunicator::complete(PendingPointToPoint& pending) {
  auto& p = static_cast<MpiPending&>(pending);
  const std::size_t n = p.mine.size();
  check_usable();
  const Clock::time_point deadline = Clock::now() + timeout_;
  // One pass over the ops (under the MPI lock, poll_until): advances each as far as it can; true
  // once all are done. A failure (an MPI error, a mismatch) throws from here; a missed deadline
  // leaves `late` set. A data message that failed (a size mismatch truncates) is reported once
  // the descriptions came, so that a mismatch is named as one.
  std::size_t late = n;
  const auto advance = [&] {
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (!p.compared[i]) {
        int done = 0;
        check(MPI_Testall(2, &p.described[2 * i], &done, MPI_STATUSES_IGNORE), "MPI_Testall", p.out[i]);
        if (done) {
          const std::string problem = point_to_point_disagreement("MPI", p.mine[i], p.in[i]);
          if (!problem.empty()) fail_with(problem);
          p.compared[i] = 1;
        }
      }
      if (!p.moved[i]) {
        int done = 0;
        const int status = MPI_Test(&p.data[i], &done, MPI_STATUS_IGNORE);
        if (status != MPI_SUCCESS) {
          p.data_status[i] = status;
          done = 1;
        }
        if (done) p.moved[i] = 1;
      }
      if (p.compared[i] && p.data_status[i] != MPI_SUCCESS) check(p.data_status[i], "MPI_Test", p.out[i]);
      if (!p.compared[i] || !p.moved[i]) {
        all = false;
        if (late == n && Clock::now() > deadline) late = i;
      }
    }
    return all || late < n;
  };
  poll_until(advance, Clock::time_point::max());  // advance() watches the deadline
  if (late == n) {
    for (std::size_t i = 0; i < n; ++i)
      if (p.dest[i] != nullptr) std::memcpy(p.dest[i], p.staging[i].data(), p.staging[i].size());
    return;
  }
  const std::size_t i = late;
  const int peer = p.peers[i];
  if (!p.compared[i]) fail_with(point_to_point_unmatched_text("MPI", p.names[i], p.mine[i], timeout_, arrivals_.last_reached(peer)));
  fail_with(point_to_point_stuck_text("MPI", p.names[i], p.mine[i], timeout_));
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key) {
  // Arrival with a deadline (and a mismatch named), which MPI_Comm_split has not.
  std::int32_t mine[2] = {color, key};
  std::vector<std::int32_t> table(static_cast<std::size_t>(2 * world_size()));
  all_gather(Tensor(mine, DType::int32, Shape{2}), Tensor(table.data(), DType::int32, Shape{2 * static_cast<std::int64_t>(world_size())}));
  check_usable();
  MPI_Comm split = MPI_COMM_NULL;
  int status = MPI_SUCCESS;
  {
    // Blocking (MPI has no MPI_Comm_isplit): the other thread's MPI calls wait meanwhile, so split
    // while no overlapped collective is in flight (the engine splits its groups before training).
    const MpiLock lock(mpi_mutex());
    status = MPI_Comm_split(ctrl_, color, key, &split);
  }
  if (status != MPI_SUCCESS) {
    fail_with(fmt::format("MPI communicator: MPI_Comm_split (color {}, key {}) failed on rank {} after collective #{}: {}", color, key, rank(),
                          sequence(), mpi_error_text(status)));
  }
  std::unique_ptr<Communicator> child;
  try {
    child.reset(new MpiCommunicator(split, timeout_, false));
  } catch (...) {
    const MpiLock lock(mpi_mutex());
    MPI_Comm_free(&split);
    throw;
  }
  const MpiLock lock(mpi_mutex());
  MPI_Comm_free(&split);  // the child works on its own duplicates
  return child;
}

}  // namespace dstrain
