// The NCCL backend (CUDA build only): one process per GPU, collectives on the GPU's memory.
//
// Bootstrap without MPI or a side channel: NCCL's own NCCL_COMM_ID mechanism. With NCCL_COMM_ID
// set to host:port, ncclGetUniqueId returns an id made from that address alone (identical on every
// rank) and ncclCommInitRank on rank 0 starts the bootstrap root listening there; every other rank
// connects to it. So each rank computes the id itself. When NCCL_COMM_ID is unset we set it to
// MASTER_ADDR:MASTER_PORT from the LaunchEnv before the first NCCL call. (MASTER_PORT is free for
// us: dstrain runs no torch TCPStore on it.) World size 1 needs no address at all.
//
// Streams: collectives run on the communicator's own stream (stream()), so they can overlap the
// compute stream (set_compute_stream(), default: the legacy default stream 0). Ordering:
//   - before every collective the communicator's stream waits for everything enqueued so far on the
//     compute stream (an event, no host sync), so a buffer written by compute is complete;
//   - the compute stream does NOT wait for the collective by itself (that is the overlap): call
//     compute_wait_for_comm() before compute reads or overwrites a communicated buffer, or
//     synchronize() to wait on the host.
// The timeout guards the host only inside this class: a collective whose peer died blocks the
// streams that wait for it, so a host that then waits on the compute stream itself (a
// cudaStreamSynchronize elsewhere) is not protected. Call synchronize() (or barrier()) at least
// once per step, before such host waits, so a dead peer surfaces as an Error here.
//
// Point-to-point (send / recv): ncclSend / ncclRecv on the communicator's stream, after it waited
// for the compute stream, like a collective. The host returns once the call is enqueued; the
// stream then waits until the peer's matching call (NCCL matches a pair's sends and recvs in
// order), so a send without its recv, or two ranks that send to each other first, surface as the
// timeout of synchronize(), which names the last call issued (both ranks of it). NCCL cannot see
// a mismatched size or dtype (undefined behaviour, as for collectives). A send or recv re-records
// the event of the last collective (marks_), so order_compute_after(s) orders after the
// point-to-point calls issued since collective s too: more, never less, and a CommQueue ticket
// that holds a send is ordered after it. send_recv puts every op of its batch between
// ncclGroupStart and ncclGroupEnd (the same stream, event and ordering): NCCL then progresses them
// together, so neighbours that send to each other in one batch do not wait on each other.
//
// Sub-groups (split): ncclCommSplit of this communicator, non-blocking and polled like the bootstrap
// (bounded by the timeout), with splitShare = 0 so that the child has resources of its own and
// does not depend on this communicator staying alive. The child is an NcclCommunicator on the
// same GPU with this one's timeout and compute stream, and a stream of its own. The split is not
// counted in sequence() or stats(). It leaves the process's log rank alone.
//
// Failure: the communicator is created non-blocking (ncclConfig_t.blocking = 0), so neither the
// bootstrap nor a collective can block the host forever. Bootstrap, enqueue and synchronize() poll
// ncclCommGetAsyncError and give up after the timeout (default_comm_timeout(): 60 s or
// DSTRAIN_COMM_TIMEOUT): the communicator is aborted (ncclCommAbort) and an Error names the rank,
// the last collective issued and the likely causes. Afterwards every call throws that Error.
// Mismatched collectives between ranks cannot be detected by NCCL (they hang or corrupt); the local
// backend, which runs the same ZeRO code in CI, detects them.
#pragma once

#include <array>

#include <chrono>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ops/cuda/compute_stream.h"
#include "zero/communicator.h"
#include "zero/launch_env.h"

namespace dstrain {

struct NcclOptions {
  // CUDA device ordinal; -1: the LaunchEnv's local rank (one process per GPU), or 0 when the
  // process sees a single GPU (the launcher isolated it with CUDA_VISIBLE_DEVICES).
  int device = -1;
  std::chrono::milliseconds timeout = default_comm_timeout();
};

class NcclCommunicator final : public Communicator {
 public:
  // Bootstraps through NCCL_COMM_ID (set from env.master_addr:master_port when absent) and blocks
  // until every rank joined, or fails after the timeout. Selects the device (cudaSetDevice) and
  // sets the process's log rank (set_log_rank).
  explicit NcclCommunicator(const LaunchEnv& env, NcclOptions options = {});

  // From an id the caller distributed itself (or ncclGetUniqueId for world size 1).
  NcclCommunicator(int rank, int world_size, const ncclUniqueId& id, NcclOptions options);

  // Finalizes (flushes outstanding work, bounded by the timeout) and destroys the communicator;
  // aborts it instead after a failure. Never throws: problems are logged.
  ~NcclCommunicator() override;

  std::string_view backend() const override { return "nccl"; }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t handle() const { return comm_; }

  void set_compute_stream(cudaStream_t stream) { compute_stream_ = stream; }
  cudaStream_t compute_stream() const { return compute_stream_; }

  // The communicator's stream waits for work enqueued so far on the compute stream (done before
  // every collective; public for callers that enqueue on stream() themselves).
  void wait_for_compute();
  // The compute stream waits for every collective issued so far (no host sync).
  void compute_wait_for_comm();
  void order_compute_after_collectives() override { compute_wait_for_comm(); }
  // The compute stream waits for the event recorded after collective `sequence` (a ring of
  // kMarkEvents: a collective older than that waits on the newer one that reused its event, which
  // finishes later on the same in-order stream — still correct, never too early).
  void order_compute_after(std::uint64_t sequence) override;
  // The host waits for every collective issued so far, failing after the timeout.
  void synchronize() override;

 protected:
  void do_all_reduce(const Tensor& buf, ReduceOp op) override;
  void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) override;
  void do_all_gather(const Tensor& send, const Tensor& recv) override;
  void do_broadcast(const Tensor& buf, int root) override;
  // NCCL has no barrier: an all-reduce of one int32, then synchronize().
  void do_barrier() override;
  // Grouped ncclSend / ncclRecv to and from every rank.
  void do_all_to_all(const Tensor& send, const Tensor& recv) override;
  // First each pair's counts (exchange_pairs: send_counts[q] and recv_counts[q] to rank q), read
  // back on the host and checked on both ranks of every pair; then one group of ncclSend /
  // ncclRecv, one per peer and direction with a nonzero count, on stream(). A pair whose counts
  // disagree exchanges no data: its two ranks wait for their other peers' blocks, then fail naming
  // both counts (and abort the communicator, as after any failure).
  void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                       std::span<const std::int64_t> recv_counts) override;
  // Staged through device memory (exchange_pairs with one value per peer).
  void do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out) override;
  // ncclSend / ncclRecv (above).
  void do_send(const Tensor& buf, int peer) override;
  void do_recv(const Tensor& buf, int peer) override;
  // Every op between ncclGroupStart and ncclGroupEnd, on stream(), as send / recv are.
  void do_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) override;
  // start_send_recv: the same group, then an event recorded on stream() after it; wait: the compute
  // stream waits for that event (no host sync; synchronize() bounds a hang by the timeout). An
  // abandoned request is waited for so (the base's do_abandon): later compute is ordered after it.
  std::unique_ptr<PendingPointToPoint> do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) override;
  void do_wait(PendingPointToPoint& pending) override;
  std::unique_ptr<Communicator> do_split(int color, int key) override;

 private:
  // A split's child: adopts `comm` (made by ncclCommSplit), aborting it if the setup fails.
  struct Adopt {};
  NcclCommunicator(Adopt, ncclComm_t comm, int rank, int world_size, int device, std::chrono::milliseconds timeout, cudaStream_t compute_stream);
  void init(const ncclUniqueId& id);
  // The device, stream, events and barrier word; then, when `id` is given, the bootstrap.
  void setup(const ncclUniqueId* id);
  // Throws the stored failure, if any; checks that `t` lives on this communicator's GPU.
  void check_usable() const;
  void check_device(const Tensor& t, const char* what, const char* call) const;
  // The same, the call named in full ("send #2 from rank 0 to rank 1 (...)").
  void check_device_named(const Tensor& t, const char* what, const std::string& call) const;
  // Handles a non-blocking NCCL call's status: ncclInProgress is polled to completion (bounded by
  // the timeout), any other failure aborts and throws, naming `call` as written.
  void complete(ncclResult_t status, const char* call, const char* file, int line);
  // Polls until `done()` or the async error is set or the deadline passes; aborts and throws then.
  template <typename Done>
  void poll_until(Done done, const std::string& waiting_for);
  // Records the failure, aborts the communicator, throws; later calls throw the same message.
  [[noreturn]] void abort_with(const std::string& message);
  // Marks the end of the collectives issued so far (synchronize(), compute_wait_for_comm()).
  void after_enqueue();
  // An all-to-all of `per_peer` int64 values with every rank, host to host: out[per_peer·q ..] go
  // to rank q, in[per_peer·q ..] come from it. Staged through counts_device_ (pinned counts_host_
  // for the copies, so that the wait is synchronize()'s, bounded by the timeout); returns once
  // `in` holds the values. `call` names it in errors.
  void exchange_pairs(const std::int64_t* out, std::int64_t* in, int per_peer, const std::string& call);

  int device_ = 0;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_stream_ = cuda::compute_stream();
  cudaEvent_t compute_ready_ = nullptr;
  cudaEvent_t comm_done_ = nullptr;
  static constexpr std::size_t kMarkEvents = 64;
  std::array<cudaEvent_t, kMarkEvents> marks_{};  // marks_[s % kMarkEvents]: recorded after collective s
  int* barrier_word_ = nullptr;                   // 4 bytes of device memory for barrier()
  // exchange_pairs' staging, 4·W int64 each (out, then in), allocated on first use.
  std::int64_t* counts_device_ = nullptr;
  std::int64_t* counts_host_ = nullptr;
  std::string last_call_ = "no collective yet";
  std::string failure_;
};

}  // namespace dstrain
