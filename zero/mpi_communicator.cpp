#include "zero/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/log.h"
#include "zero/rank_reduce.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

// The arrival exchange's tag on ctrl_ (MPI keeps messages of one tag between two ranks in order,
// so rank q's descriptions arrive in q's call order).
constexpr int kArrivalTag = 7;

// Elements travel as unsigned integers of their size: MPI moves the bits and never rounds them.
MPI_Datatype element_type(DType dtype) {
  switch (dtype_size(dtype)) {
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    default: break;
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
    case CollectiveKind::all_reduce: return fmt::format("{} #{} ({}, {} elements, {})", name, c.sequence, dt, c.count, op);
    case CollectiveKind::reduce_scatter:
      return fmt::format("{} #{} ({}, {}×{} -> {} elements, {})", name, c.sequence, dt, world, c.count, c.count, op);
    case CollectiveKind::all_gather: return fmt::format("{} #{} ({}, {} -> {}×{} elements)", name, c.sequence, dt, c.count, world, c.count);
    case CollectiveKind::broadcast: return fmt::format("{} #{} ({}, {} elements, root {})", name, c.sequence, dt, c.count, c.root);
    case CollectiveKind::barrier: return fmt::format("{} #{}", name, c.sequence);
  }
  return std::string(name);
}

bool same_call(const MpiCommunicator::Call& a, const MpiCommunicator::Call& b) {
  if (a.kind != b.kind || a.sequence != b.sequence) return false;
  const auto kind = static_cast<CollectiveKind>(a.kind);
  if (kind == CollectiveKind::barrier) return true;
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
    if (test()) return true;
    const auto now = Clock::now();
    if (now > deadline) return false;
    if (now - start > std::chrono::microseconds(100)) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(200));
    }
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i == 0 ? "" : ", ", ranks[i]);
  return s;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout)
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
    const int status = MPI_Comm_idup(comm, dup, &request);
    if (status != MPI_SUCCESS) fail("MPI communicator: MPI_Comm_idup on rank {} failed: {}", rank(), mpi_error_text(status));
    int done = 0;
    const bool ok = poll_until([&] { return MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done; },
                               Clock::now() + timeout_);
    if (!ok) {
      fail("MPI communicator: rank {} of {}: the other processes did not join the communicator within {} ms. Fix: check that every "
           "process of the job starts dstrain the same way, or raise DSTRAIN_COMM_TIMEOUT (seconds)",
           rank(), world_size(), timeout_.count());
    }
    MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN);
  }
  set_log_rank(rank(), world_size());  // one rank per process: its log lines carry its rank, rank 0 prints info
  const auto w = static_cast<std::size_t>(world_size());
  seen_.assign(w, Call{});
  has_seen_.assign(w, false);
  received_.assign(w, Call{});
}

MpiCommunicator::~MpiCommunicator() {
  if (!failure_.empty()) {
    // MPI may still write the buffers of the exchange that failed (scratch, arrival receives, this
    // rank's pending description): leave them to the process's end, which follows a failure.
    new std::vector<char>(std::move(scratch_));     // NOLINT: deliberately leaked
    new std::vector<Call>(std::move(received_));  // NOLINT
    new std::vector<Call>(std::move(seen_));      // NOLINT
    return;
  }
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
    throw Error(fmt::format("MPI communicator: rank {} cannot issue collective #{}: the group failed earlier: {}", rank(), sequence(),
                            failure_));
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
  std::vector<int> indices(requests.size());
  int status = MPI_SUCCESS;
  const bool all = poll_until(
      [&] {
        int done = 0;
        status = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &done, indices.data(), MPI_STATUSES_IGNORE);
        if (status != MPI_SUCCESS) return true;
        return done == MPI_UNDEFINED || std::all_of(requests.begin(), requests.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
      },
      Clock::now() + timeout_);
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
    fail_with(fmt::format(
        "MPI communicator: {} on rank {} timed out after {} ms: rank(s) {} of {} did not reach it{}. Every rank must issue the same "
        "collectives in the same order; a rank that skips one (an early return, a rank-dependent branch), is stuck, or whose process "
        "ended leaves the others waiting. Fix: look at rank(s) {}'s own output for its error, or raise DSTRAIN_COMM_TIMEOUT (seconds) "
        "if it is only slow",
        describe(call, w), me, timeout_.count(), ranks_text(missing), w, whose, ranks_text(missing)));
  }
  for (int q = 0; q < w; ++q) {
    const Call& other = seen_[static_cast<std::size_t>(q)];
    if (q != me && !same_call(call, other)) {
      fail_with(fmt::format(
          "MPI communicator: collective mismatch: rank {} called {} but rank {} called {}. Every rank must issue the same collectives "
          "in the same order with the same dtype, element count, op and root. Fix: look for a rank-dependent branch or size before "
          "this call",
          me, describe(call, w), q, describe(other, w)));
    }
  }
}

void MpiCommunicator::complete(MPI_Request& request, const Call& call) {
  int status = MPI_SUCCESS;
  int done = 0;
  const bool ok = poll_until(
      [&] {
        status = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        return status != MPI_SUCCESS || done;
      },
      Clock::now() + timeout_);
  check(status, "MPI_Test", call);
  if (!ok) {
    fail_with(fmt::format(
        "MPI communicator: {} on rank {} did not complete within {} ms although every rank reached it: a process probably ended during "
        "it, or the network between the processes failed. Fix: look at the other ranks' output and the launcher's messages, or raise "
        "DSTRAIN_COMM_TIMEOUT (seconds) if the transfers are only slow",
        describe(call, world_size()), rank(), timeout_.count()));
  }
}

void MpiCommunicator::do_all_reduce(const Tensor& buf, ReduceOp op) {
  check_host(buf, "the buffer");
  const Call call{sequence(), static_cast<std::int32_t>(CollectiveKind::all_reduce), static_cast<std::int32_t>(buf.dtype),
                  static_cast<std::int32_t>(op), 0, buf.numel()};
  arrive(call);
  const int w = world_size();
  const int me = rank();
  if (w == 1 || buf.numel() == 0) return;
  const std::int64_t n = buf.numel();
  const std::size_t es = dtype_size(buf.dtype);
  const MPI_Datatype type = element_type(buf.dtype);
  // Chunk k = elements [n·k/W, n·(k+1)/W): the local backend's split, so any n works.
  std::vector<int> begin(static_cast<std::size_t>(w) + 1);
  for (int k = 0; k <= w; ++k) begin[static_cast<std::size_t>(k)] = as_count(n * k / w, call, w);
  const auto len = [&](int k) { return begin[static_cast<std::size_t>(k) + 1] - begin[static_cast<std::size_t>(k)]; };
  const int mine = len(me);
  // 1. alltoallv: chunk k of this buffer to rank k; chunk `me` of rank q's into scratch slot q.
  char* slots = scratch(static_cast<std::size_t>(w) * static_cast<std::size_t>(mine) * es);
  std::vector<int> send_counts(static_cast<std::size_t>(w)), send_displs(static_cast<std::size_t>(w));
  std::vector<int> recv_counts(static_cast<std::size_t>(w)), recv_displs(static_cast<std::size_t>(w));
  for (int k = 0; k < w; ++k) {
    const auto i = static_cast<std::size_t>(k);
    send_counts[i] = k == me ? 0 : len(k);
    send_displs[i] = begin[i];
    recv_counts[i] = k == me ? 0 : mine;
    recv_displs[i] = as_count(static_cast<std::int64_t>(k) * mine, call, w);
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ialltoallv(buf.data, send_counts.data(), send_displs.data(), type, slots, recv_counts.data(), recv_displs.data(), type, data_,
                       &request),
        "MPI_Ialltoallv", call);
  complete(request, call);
  // 2. reduce chunk `me` over ranks 0..W−1 in order, into this buffer (its own chunk read in place).
  char* own = static_cast<char*>(buf.data) + static_cast<std::size_t>(begin[static_cast<std::size_t>(me)]) * es;
  if (mine > 0) {
    std::vector<const void*> in(static_cast<std::size_t>(w));
    for (int q = 0; q < w; ++q) in[static_cast<std::size_t>(q)] = q == me ? own : slots + static_cast<std::size_t>(q) * mine * es;
    reduce_over_ranks(buf.dtype, in, {own}, mine, op);
  }
  // 3. allgatherv in place: every rank's reduced chunk to every rank.
  std::vector<int> counts(static_cast<std::size_t>(w));
  for (int k = 0; k < w; ++k) counts[static_cast<std::size_t>(k)] = len(k);
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data, counts.data(), begin.data(), type, data_, &request), "MPI_Iallgatherv",
        call);
  complete(request, call);
}

void MpiCommunicator::do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call{sequence(), static_cast<std::int32_t>(CollectiveKind::reduce_scatter), static_cast<std::int32_t>(send.dtype),
                  static_cast<std::int32_t>(op), 0, recv.numel()};
  arrive(call);
  const int w = world_size();
  const int me = rank();
  const std::int64_t n = recv.numel();
  if (n == 0) return;
  const std::size_t es = dtype_size(send.dtype);
  const char* own = static_cast<const char*>(send.data) + static_cast<std::size_t>(n) * static_cast<std::size_t>(me) * es;
  char* slots = nullptr;
  if (w > 1) {
    // alltoallv: shard k of send to rank k; shard `me` of rank q's send into scratch slot q.
    const int count = as_count(n, call, w);
    slots = scratch(static_cast<std::size_t>(w) * static_cast<std::size_t>(n) * es);
    std::vector<int> send_counts(static_cast<std::size_t>(w)), recv_counts(static_cast<std::size_t>(w)), displs(static_cast<std::size_t>(w));
    for (int k = 0; k < w; ++k) {
      const auto i = static_cast<std::size_t>(k);
      send_counts[i] = k == me ? 0 : count;
      recv_counts[i] = send_counts[i];
      displs[i] = as_count(static_cast<std::int64_t>(k) * n, call, w);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const MPI_Datatype type = element_type(send.dtype);
    check(MPI_Ialltoallv(send.data, send_counts.data(), displs.data(), type, slots, recv_counts.data(), displs.data(), type, data_, &request),
          "MPI_Ialltoallv", call);
    complete(request, call);
  }
  // In place (recv = this rank's shard of send) the output aliases input `me`: reduce_over_ranks
  // reads a block's inputs before writing it.
  std::vector<const void*> in(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) in[static_cast<std::size_t>(q)] = q == me ? own : slots + static_cast<std::size_t>(q) * static_cast<std::size_t>(n) * es;
  reduce_over_ranks(send.dtype, in, {recv.data}, n, op);
}

void MpiCommunicator::do_all_gather(const Tensor& send, const Tensor& recv) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call{sequence(), static_cast<std::int32_t>(CollectiveKind::all_gather), static_cast<std::int32_t>(send.dtype),
                  static_cast<std::int32_t>(ReduceOp::sum), 0, send.numel()};
  arrive(call);
  const std::int64_t n = send.numel();
  if (n == 0) return;
  if (world_size() == 1) {
    if (send.data != recv.data) std::memcpy(recv.data, send.data, send.nbytes());
    return;
  }
  const int count = as_count(n, call, world_size());
  as_count(n * world_size(), call, world_size());
  const MPI_Datatype type = element_type(send.dtype);
  const bool in_place = send.data == shard_of(recv, rank(), world_size()).data;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send.data, in_place ? 0 : count, in_place ? MPI_DATATYPE_NULL : type, recv.data, count, type,
                       data_, &request),
        "MPI_Iallgather", call);
  complete(request, call);
}

void MpiCommunicator::do_broadcast(const Tensor& buf, int root) {
  check_host(buf, "the buffer");
  const Call call{sequence(), static_cast<std::int32_t>(CollectiveKind::broadcast), static_cast<std::int32_t>(buf.dtype),
                  static_cast<std::int32_t>(ReduceOp::sum), root, buf.numel()};
  arrive(call);
  if (world_size() == 1 || buf.numel() == 0) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibcast(buf.data, as_count(buf.numel(), call, world_size()), element_type(buf.dtype), root, data_, &request), "MPI_Ibcast", call);
  complete(request, call);
}

// Every rank has reached the barrier once every rank's description has come.
void MpiCommunicator::do_barrier() {
  arrive(Call{sequence(), static_cast<std::int32_t>(CollectiveKind::barrier), 0, 0, 0, 0});
}

}  // namespace dstrain
