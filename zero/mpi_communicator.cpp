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
#include "zero/rank_reduce.h"

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

// "all_reduce #3 (fp32, 1024 elements, sum)": how errors name a call (the local backend's words).
std::string describe(const MpiCommunicator::Call& c, int world) {
  const auto kind = static_cast<CollectiveKind>(c.kind);
  const auto name = collective_name(kind);
  const auto dt = dtype_name(static_cast<DType>(c.dtype));
  const auto op = reduce_op_name(static_cast<ReduceOp>(c.op));
  switch (kind) {
    case CollectiveKind::all_reduce:
      return fmt::format("{} #{} ({}, {} elements, {})", name, c.sequence, dt, c.count, op);
    case CollectiveKind::reduce_scatter:
      return fmt::format("{} #{} ({}, {}×{} -> {} elements, {})", name, c.sequence, dt, world, c.count, c.count, op);
    case CollectiveKind::all_gather:
      return fmt::format("{} #{} ({}, {} -> {}×{} elements)", name, c.sequence, dt, c.count, world, c.count);
    case CollectiveKind::broadcast:
      return fmt::format("{} #{} ({}, {} elements, root {})", name, c.sequence, dt, c.count, c.root);
    case CollectiveKind::barrier:
      return fmt::format("{} #{}", name, c.sequence);
    case CollectiveKind::all_to_all:
      return fmt::format("{} #{} ({}, {}×{} elements)", name, c.sequence, dt, world, c.count);
    case CollectiveKind::all_to_all_v:
      return fmt::format("{} #{} ({}, sending {} elements)", name, c.sequence, dt, c.count);
    case CollectiveKind::send:
    case CollectiveKind::recv:
      // Never in the arrival exchange; a point-to-point call's number is its pair's (MPI failures
      // only: describe_point_to_point names both ranks).
      return fmt::format("{} #{} ({}, {} elements)", name, c.sequence, dt, c.count);
  }
  return std::string(name);
}

bool same_call(const MpiCommunicator::Call& a, const MpiCommunicator::Call& b) {
  if (a.kind != b.kind || a.sequence != b.sequence) return false;
  const auto kind = static_cast<CollectiveKind>(a.kind);
  if (kind == CollectiveKind::barrier) return true;
  // all_to_all_v's sizes differ per rank by design: each pair checks its counts afterwards.
  if (kind == CollectiveKind::all_to_all_v) return a.dtype == b.dtype;
  const bool reduces = kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter;
  return a.dtype == b.dtype && a.count == b.count && (!reduces || a.op == b.op) && (kind != CollectiveKind::broadcast || a.root == b.root);
}

std::string mpi_error_text(int status) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", status);
  return std::string(text, static_cast<std::size_t>(length));
}

// MPI counts and displacements are ints.
int as_count(std::int64_t n, const MpiCommunicator::Call& call, int world) {
  DSTRAIN_CHECK(n <= INT_MAX,
                "MPI communicator: {} needs a count or offset of {} elements, above MPI's int limit {}. Fix: use smaller buckets "
                "(zero_optimization.reduce_bucket_size / allgather_bucket_size) or fewer elements per collective",
                describe(call, world), n, INT_MAX);
  return static_cast<int>(n);
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

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i == 0 ? "" : ", ", ranks[i]);
  return s;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout) : MpiCommunicator(comm, timeout, true) {}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout, bool sets_log_rank)
    : Communicator(
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
          }()),
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
  const auto w = static_cast<std::size_t>(world_size());
  seen_.assign(w, Call{});
  has_seen_.assign(w, false);
  received_.assign(w, Call{});
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
    new std::vector<char>(std::move(scratch_));   // NOLINT: deliberately leaked
    new std::vector<Call>(std::move(received_));  // NOLINT
    new std::vector<Call>(std::move(seen_));      // NOLINT
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

void MpiCommunicator::check_host(const Tensor& t, const char* what) const {
  DSTRAIN_CHECK(t.device.is_cpu(),
                "MPI communicator: {} of collective #{} on rank {} is on {}; the MPI backend communicates host memory. Fix: use host "
                "buffers (--device cpu), or the nccl backend for GPUs",
                what, sequence(), rank(), t.device.str());
}

void MpiCommunicator::check(int status, const char* what, const Call& call) {
  if (status == MPI_SUCCESS) return;
  fail_with(fmt::format("MPI communicator: {} failed on rank {} in {}: {}", what, rank(), describe(call, world_size()), mpi_error_text(status)));
}

char* MpiCommunicator::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void MpiCommunicator::arrive(const Call& call) {
  check_usable();
  const int w = world_size();
  const int me = rank();
  seen_[static_cast<std::size_t>(me)] = call;
  has_seen_[static_cast<std::size_t>(me)] = true;
  if (w == 1) return;
  // Receives first (indices 0..w−2 map to the peers in rank order), then sends.
  std::vector<MPI_Request> requests;
  std::vector<int> peer_of;
  requests.reserve(static_cast<std::size_t>(2 * (w - 1)));
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
    check(MPI_Isend(&seen_[static_cast<std::size_t>(me)], sizeof(Call), MPI_BYTE, q, kArrivalTag, ctrl_, &r), "MPI_Isend", call);
    requests.push_back(r);
  }
  lock.unlock();
  int status = MPI_SUCCESS;
  const bool all = test_all_until(requests, Clock::now() + timeout_, status);
  check(status, "MPI_Testsome", call);
  // The descriptions that came, then who is missing.
  std::vector<int> missing;
  for (std::size_t i = 0; i < peer_of.size(); ++i) {
    const auto q = static_cast<std::size_t>(peer_of[i]);
    if (requests[i] == MPI_REQUEST_NULL) {
      seen_[q] = received_[q];
      has_seen_[q] = true;
    } else {
      missing.push_back(peer_of[i]);
    }
  }
  if (!all) {
    std::string whose;
    for (int q : missing) {
      const auto k = static_cast<std::size_t>(q);
      whose += has_seen_[k] ? fmt::format("; rank {} last reached {}", q, describe(seen_[k], w))
                            : fmt::format("; rank {} has reached no collective yet", q);
    }
    fail_with(
        fmt::format("MPI communicator: {} on rank {} timed out after {} ms: rank(s) {} of {} did not reach it{}. Every rank must issue the same "
                    "collectives in the same order; a rank that skips one (an early return, a rank-dependent branch), is stuck, or whose process "
                    "ended leaves the others waiting. Fix: look at rank(s) {}'s own output for its error, or raise DSTRAIN_COMM_TIMEOUT (seconds) "
                    "if it is only slow",
                    describe(call, w), me, timeout_.count(), ranks_text(missing), w, whose, ranks_text(missing)));
  }
  for (int q = 0; q < w; ++q) {
    const Call& other = seen_[static_cast<std::size_t>(q)];
    if (q != me && !same_call(call, other)) {
      fail_with(
          fmt::format("MPI communicator: collective mismatch: rank {} called {} but rank {} called {}. Every rank must issue the same collectives "
                      "in the same order with the same dtype, element count, op and root. Fix: look for a rank-dependent branch or size before "
                      "this call",
                      me, describe(call, w), q, describe(other, w)));
    }
  }
}

void MpiCommunicator::exchange(const std::vector<Part>& sends, const std::vector<Part>& recvs, DType dtype, const Call& call) {
  const MPI_Datatype type = element_type(dtype);
  std::vector<MPI_Request> requests;
  std::vector<int> peer_of;
  requests.reserve(sends.size() + recvs.size());
  std::unique_lock<std::mutex> lock(mpi_mutex());
  for (const Part& p : recvs) {
    if (p.count == 0) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Irecv(p.data, p.count, type, p.peer, kDataTag, data_, &r), "MPI_Irecv", call);
    requests.push_back(r);
    peer_of.push_back(p.peer);
  }
  for (const Part& p : sends) {
    if (p.count == 0) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Isend(p.data, p.count, type, p.peer, kDataTag, data_, &r), "MPI_Isend", call);
    requests.push_back(r);
    peer_of.push_back(p.peer);
  }
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
  fail_with(
      fmt::format("MPI communicator: {} on rank {} timed out after {} ms: rank(s) {} of {} did not complete their part of it, although every rank "
                  "reached it: a process stopped or ended during the collective, or the network between the processes failed. Fix: look at rank(s) "
                  "{}'s own output and the launcher's messages, or raise DSTRAIN_COMM_TIMEOUT (seconds) if the transfers are only slow",
                  describe(call, world_size()), rank(), timeout_.count(), ranks_text(stuck), world_size(), ranks_text(stuck)));
}

void MpiCommunicator::do_all_reduce(const Tensor& buf, ReduceOp op) {
  check_host(buf, "the buffer");
  const Call call{sequence(),
                  static_cast<std::int32_t>(CollectiveKind::all_reduce),
                  static_cast<std::int32_t>(buf.dtype),
                  static_cast<std::int32_t>(op),
                  0,
                  buf.numel()};
  arrive(call);
  const int w = world_size();
  const int me = rank();
  if (w == 1 || buf.numel() == 0) return;
  const std::int64_t n = buf.numel();
  const std::size_t es = dtype_size(buf.dtype);
  // Chunk k = elements [n·k/W, n·(k+1)/W): the local backend's split, so any n works.
  std::vector<int> begin(static_cast<std::size_t>(w) + 1);
  for (int k = 0; k <= w; ++k) begin[static_cast<std::size_t>(k)] = as_count(n * k / w, call, w);
  const auto len = [&](int k) { return begin[static_cast<std::size_t>(k) + 1] - begin[static_cast<std::size_t>(k)]; };
  const int mine = len(me);
  char* base = static_cast<char*>(buf.data);
  const auto at = [&](std::int64_t elements) { return base + static_cast<std::size_t>(elements) * es; };
  // 1. all-to-all: chunk k of this buffer to rank k; chunk `me` of rank q's buffer into slot q.
  char* slots = scratch(static_cast<std::size_t>(w) * static_cast<std::size_t>(mine) * es);
  std::vector<Part> sends, recvs;
  for (int q = 0; q < w; ++q) {
    if (q == me) continue;
    sends.push_back({q, at(begin[static_cast<std::size_t>(q)]), len(q)});
    recvs.push_back({q, slots + static_cast<std::size_t>(q) * static_cast<std::size_t>(mine) * es, mine});
  }
  exchange(sends, recvs, buf.dtype, call);
  // 2. reduce chunk `me` over ranks 0..W−1 in order, into this buffer (its own chunk read in place).
  char* own = at(begin[static_cast<std::size_t>(me)]);
  if (mine > 0) {
    std::vector<const void*> in(static_cast<std::size_t>(w));
    for (int q = 0; q < w; ++q) in[static_cast<std::size_t>(q)] = q == me ? own : slots + static_cast<std::size_t>(q) * mine * es;
    reduce_over_ranks(buf.dtype, in, {own}, mine, op);
  }
  // 3. all-gather in place: this rank's reduced chunk to every rank, theirs into their places.
  sends.clear();
  recvs.clear();
  for (int q = 0; q < w; ++q) {
    if (q == me) continue;
    sends.push_back({q, own, mine});
    recvs.push_back({q, at(begin[static_cast<std::size_t>(q)]), len(q)});
  }
  exchange(sends, recvs, buf.dtype, call);
}

void MpiCommunicator::do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call{sequence(),
                  static_cast<std::int32_t>(CollectiveKind::reduce_scatter),
                  static_cast<std::int32_t>(send.dtype),
                  static_cast<std::int32_t>(op),
                  0,
                  recv.numel()};
  arrive(call);
  const int w = world_size();
  const int me = rank();
  const std::int64_t n = recv.numel();
  if (n == 0) return;
  const std::size_t es = dtype_size(send.dtype);
  const char* own = static_cast<const char*>(send.data) + static_cast<std::size_t>(n) * static_cast<std::size_t>(me) * es;
  char* slots = nullptr;
  if (w > 1) {
    // all-to-all: shard k of send to rank k; shard `me` of rank q's send into scratch slot q.
    const int count = as_count(n, call, w);
    slots = scratch(static_cast<std::size_t>(w) * static_cast<std::size_t>(n) * es);
    std::vector<Part> sends, recvs;
    for (int q = 0; q < w; ++q) {
      if (q == me) continue;
      const std::size_t offset = static_cast<std::size_t>(q) * static_cast<std::size_t>(n) * es;
      sends.push_back({q, static_cast<char*>(send.data) + offset, count});
      recvs.push_back({q, slots + offset, count});
    }
    exchange(sends, recvs, send.dtype, call);
  }
  // In place (recv = this rank's shard of send) the output aliases input `me`: reduce_over_ranks
  // reads a block's inputs before writing it.
  std::vector<const void*> in(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q)
    in[static_cast<std::size_t>(q)] = q == me ? own : slots + static_cast<std::size_t>(q) * static_cast<std::size_t>(n) * es;
  reduce_over_ranks(send.dtype, in, {recv.data}, n, op);
}

void MpiCommunicator::do_all_gather(const Tensor& send, const Tensor& recv) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call{sequence(),
                  static_cast<std::int32_t>(CollectiveKind::all_gather),
                  static_cast<std::int32_t>(send.dtype),
                  static_cast<std::int32_t>(ReduceOp::sum),
                  0,
                  send.numel()};
  arrive(call);
  const std::int64_t n = send.numel();
  if (n == 0) return;
  if (world_size() == 1) {
    if (send.data != recv.data) std::memcpy(recv.data, send.data, send.nbytes());
    return;
  }
  const int w = world_size();
  const int count = as_count(n, call, w);
  const std::size_t bytes = send.nbytes();
  char* base = static_cast<char*>(recv.data);
  if (send.data != base + static_cast<std::size_t>(rank()) * bytes) std::memcpy(base + static_cast<std::size_t>(rank()) * bytes, send.data, bytes);
  std::vector<Part> sends, recvs;
  for (int q = 0; q < w; ++q) {
    if (q == rank()) continue;
    sends.push_back({q, send.data, count});
    recvs.push_back({q, base + static_cast<std::size_t>(q) * bytes, count});
  }
  exchange(sends, recvs, send.dtype, call);
}

// Shard q of send to rank q, rank q's shard `rank` into recv's shard q: the pairwise messages of
// the exchange below (the compressed all-reduce's first phase, zero/compressed_all_reduce.cpp).
void MpiCommunicator::do_all_to_all(const Tensor& send, const Tensor& recv) {
  check_host(send, "send");
  check_host(recv, "recv");
  const std::int64_t n = send.numel() / world_size();
  const Call call{sequence(),
                  static_cast<std::int32_t>(CollectiveKind::all_to_all),
                  static_cast<std::int32_t>(send.dtype),
                  static_cast<std::int32_t>(ReduceOp::sum),
                  0,
                  n};
  arrive(call);
  if (n == 0) return;
  const int w = world_size();
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(send.dtype);
  const char* src = static_cast<const char*>(send.data);
  char* dst = static_cast<char*>(recv.data);
  std::memcpy(dst + static_cast<std::size_t>(rank()) * bytes, src + static_cast<std::size_t>(rank()) * bytes, bytes);
  if (w == 1) return;
  const int count = as_count(n, call, w);
  std::vector<Part> sends, recvs;
  for (int q = 0; q < w; ++q) {
    if (q == rank()) continue;
    sends.push_back({q, const_cast<char*>(src) + static_cast<std::size_t>(q) * bytes, count});
    recvs.push_back({q, dst + static_cast<std::size_t>(q) * bytes, count});
  }
  exchange(sends, recvs, send.dtype, call);
}

void MpiCommunicator::do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                                      std::span<const std::int64_t> recv_counts) {
  check_host(send, "send");
  check_host(recv, "recv");
  const int w = world_size();
  const int me = rank();
  const auto at = [](std::span<const std::int64_t> v, int i) { return v[static_cast<std::size_t>(i)]; };
  const Call call{sequence(),
                  static_cast<std::int32_t>(CollectiveKind::all_to_all_v),
                  static_cast<std::int32_t>(send.dtype),
                  static_cast<std::int32_t>(ReduceOp::sum),
                  0,
                  std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0})};
  arrive(call);
  // 1. Each pair's counts: to rank q (send_counts[q], recv_counts[q]); from it (what q sends this
  // rank, what q expects from it). In scratch (MPI may still write it after a timeout): the
  // incoming pairs first, then the outgoing ones.
  auto* pairs = reinterpret_cast<std::int64_t*>(scratch(static_cast<std::size_t>(4 * w) * sizeof(std::int64_t)));
  std::int64_t* in = pairs;
  std::int64_t* out = pairs + 2 * w;
  std::vector<Part> sends, recvs;
  for (int q = 0; q < w; ++q) {
    out[2 * q] = at(send_counts, q);
    out[2 * q + 1] = at(recv_counts, q);
    in[2 * q] = out[2 * q];  // for q = me: this rank's own pair, checked below like a peer's
    in[2 * q + 1] = out[2 * q + 1];
    if (q == me) continue;
    sends.push_back({q, out + 2 * q, 2});
    recvs.push_back({q, in + 2 * q, 2});
  }
  exchange(sends, recvs, DType::fp64, call);  // 8-byte elements, moved as bits
  // 2. Both directions of every pair, on both of its ranks: the lower rank's sends first, so that
  // both ranks of a pair report the same disagreement.
  std::string problem;
  std::vector<bool> agreed(static_cast<std::size_t>(w), true);
  for (int q = 0; q < w; ++q) {
    const std::int64_t q_sends = in[2 * q], q_expects = in[2 * q + 1];  // q's send_counts[me], recv_counts[me]
    const std::int64_t me_sends = at(send_counts, q), me_expects = at(recv_counts, q);
    std::string text;
    const bool q_to_me = q_sends == me_expects;
    const bool me_to_q = me_sends == q_expects;
    if (q < me) {
      if (!q_to_me) text = all_to_all_v_mismatch("MPI communicator", call.sequence, q, q_sends, me, me_expects);
      else if (!me_to_q) text = all_to_all_v_mismatch("MPI communicator", call.sequence, me, me_sends, q, q_expects);
    } else {
      if (!me_to_q) text = all_to_all_v_mismatch("MPI communicator", call.sequence, me, me_sends, q, q_expects);
      else if (!q_to_me) text = all_to_all_v_mismatch("MPI communicator", call.sequence, q, q_sends, me, me_expects);
    }
    if (!text.empty()) {
      agreed[static_cast<std::size_t>(q)] = false;
      if (problem.empty()) problem = std::move(text);
    }
  }
  // 3. The blocks, with every peer whose counts agree (the others' parts of this collective still
  // complete); a block above MPI's int count as several messages, which MPI keeps in order.
  const std::size_t es = dtype_size(send.dtype);
  const auto* src = static_cast<const char*>(send.data);
  auto* dst = static_cast<char*>(recv.data);
  sends.clear();
  recvs.clear();
  std::int64_t send_at = 0, recv_at = 0;
  const auto add_parts = [es](std::vector<Part>& parts, int peer, char* base, std::int64_t n) {
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t piece = std::min<std::int64_t>(n - done, INT_MAX);
      parts.push_back({peer, base + static_cast<std::size_t>(done) * es, static_cast<int>(piece)});
      done += piece;
    }
  };
  for (int q = 0; q < w; ++q) {
    const std::int64_t ns = at(send_counts, q), nr = at(recv_counts, q);
    if (q == me) {
      if (agreed[static_cast<std::size_t>(q)] && ns > 0) std::memcpy(dst + static_cast<std::size_t>(recv_at) * es, src + static_cast<std::size_t>(send_at) * es,
                                          static_cast<std::size_t>(ns) * es);
    } else if (agreed[static_cast<std::size_t>(q)]) {
      add_parts(sends, q, const_cast<char*>(src) + static_cast<std::size_t>(send_at) * es, ns);
      add_parts(recvs, q, dst + static_cast<std::size_t>(recv_at) * es, nr);
    }
    send_at += ns;
    recv_at += nr;
  }
  exchange(sends, recvs, send.dtype, call);
  if (!problem.empty()) fail_with(problem);
}

void MpiCommunicator::do_broadcast(const Tensor& buf, int root) {
  check_host(buf, "the buffer");
  const Call call{sequence(),
                  static_cast<std::int32_t>(CollectiveKind::broadcast),
                  static_cast<std::int32_t>(buf.dtype),
                  static_cast<std::int32_t>(ReduceOp::sum),
                  root,
                  buf.numel()};
  arrive(call);
  if (world_size() == 1 || buf.numel() == 0) return;
  // From the root to every rank directly (the engine broadcasts nothing per step).
  const int count = as_count(buf.numel(), call, world_size());
  std::vector<Part> sends, recvs;
  if (rank() == root) {
    for (int q = 0; q < world_size(); ++q) {
      if (q != root) sends.push_back({q, buf.data, count});
    }
  } else {
    recvs.push_back({root, buf.data, count});
  }
  exchange(sends, recvs, buf.dtype, call);
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
  std::vector<MpiCommunicator::Call> out, in;
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
    p->out[i] = Call{mine[i].number, static_cast<std::int32_t>(kind), static_cast<std::int32_t>(mine[i].dtype), 0, 0, mine[i].count};
    counts[i] = as_count(mine[i].count, p->out[i], world_size());
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
          const Call& theirs = p.in[i];
          PointToPointCall other = p.mine[i];
          other.is_send = !p.mine[i].is_send;
          other.number = theirs.sequence;
          other.dtype = static_cast<DType>(theirs.dtype);
          other.count = theirs.count;
          const std::string problem =
              p.mine[i].is_send ? point_to_point_mismatch("MPI", p.mine[i], other) : point_to_point_mismatch("MPI", other, p.mine[i]);
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
  if (!p.compared[i]) {
    const auto q = static_cast<std::size_t>(peer);
    PointToPointCall owed = p.mine[i];
    owed.is_send = !p.mine[i].is_send;
    const std::string last_reached = has_seen_[q] ? fmt::format("rank {} last reached {}", peer, describe(seen_[q], world_size()))
                                                  : fmt::format("rank {} has reached no collective yet", peer);
    fail_with(
        fmt::format("MPI communicator: {} timed out after {} ms: rank {} did not post the matching {} ({}). A send returns once its receiver has "
                    "posted the recv, and the sends and recvs between two ranks match in program order. Fix: post the matching call on rank {}, "
                    "order the calls so that no two ranks wait on each other (in a ring, even ranks send first and odd ranks receive first, or "
                    "one send_recv batch), look at rank {}'s own output for its error, or raise DSTRAIN_COMM_TIMEOUT (seconds) if it is only slow",
                    p.names[i], timeout_.count(), peer, describe_point_to_point(owed), last_reached, peer, peer));
  }
  fail_with(
      fmt::format("MPI communicator: {} timed out after {} ms: its data did not {} rank {}, although both ranks posted their calls: a process "
                  "stopped or ended meanwhile, or the network between them failed. Fix: look at rank {}'s own output and the launcher's "
                  "messages, or raise DSTRAIN_COMM_TIMEOUT (seconds) if the transfer is only slow",
                  p.names[i], timeout_.count(), p.mine[i].is_send ? "reach" : "come from", peer, peer));
}

// Every rank has reached the barrier once every rank's description has come.
void MpiCommunicator::do_barrier() { arrive(Call{sequence(), static_cast<std::int32_t>(CollectiveKind::barrier), 0, 0, 0, 0}); }

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
