// The MPI backend: one process per rank, on one machine or many, communicating host memory —
// how dstrain trains across processes and machines without GPUs (`mpirun -np N dstrain train`).
// docs/mpi.md says how to run it (§1) and why it is built this way (§2).
//
// Results are bit-identical to the local backend's (zero/local_communicator.h): the collectives are
// zero/pairwise_collectives.h's, over pairwise MPI_Isend/MPI_Irecv messages (no MPI reduction: MPI
// has no bf16 type, and a user-defined MPI_Op would round fp16/bf16 at every hop of MPI's reduction
// tree). A collective that does not complete names the ranks whose messages are missing, which a
// collective request (MPI_Ialltoallv) cannot tell. Element bytes travel as MPI integer types of the
// element's size: MPI never interprets them; a message above MPI's int count goes as several.
//
// Arrival, agreement and deadlines (the Communicator contract: fail, never hang):
//   1. arrival: each rank sends every other rank a 32-byte description of its call (sequence
//      number, kind, dtype, count, op, root) and receives theirs; a rank whose description has not
//      come within the timeout (default_comm_timeout(): 60 s or DSTRAIN_COMM_TIMEOUT) is named in
//      the Error, with the last collective it did reach. Descriptions that differ (another
//      collective, dtype, size, op or root) fail on every rank naming both calls, before any data
//      moves. This exchange is the barrier.
//   2. data: the messages above, tested against a fresh deadline; a timeout here names the ranks
//      whose messages did not complete although they arrived (a process stopped or ended during
//      the collective, the network failed).
//   Every MPI call runs under MPI_ERRORS_RETURN: an MPI failure is an Error naming the call.
//   After a failure the communicator refuses every call with the same message; MPI may still own
//   the last collective's buffers, so the process should end (the CLI calls abort_mpi_job(),
//   zero/mpi_process.h, which ends every rank). The library itself never aborts.
//
// Point-to-point (send / recv / send_recv / start_send_recv): not part of the arrival exchange
// (only two ranks take part). start posts, per op and at once, a description of the call (number in
// the pair's order, dtype, count) to the peer on its own tag of the control communicator, the
// receive of the peer's description, and the data message on the data communicator (a pair's
// messages one way are posted in the pair's order on both ranks, and MPI's non-overtaking rule per
// (source, tag, communicator) matches them in that order), then returns: nothing waits for the
// peer. wait tests them until done: each op's two descriptions are compared as soon as both came
// (a mismatch fails on both ranks naming both calls — the data may have landed partly already, or
// been truncated, which is reported as the mismatch); a description that does not come within the
// timeout (counted from wait) names the peer and the last collective it reached; data that does
// not complete names the peer too. A send completes only once its receiver's description came, so
// a send returns once its recv is posted: the local backend's rendezvous, and NCCL's. The ops of a
// batch, and separate requests, progress independently, so no op waits for another.
//
// Nodes: the communicator the public constructor makes (the process's, MPI_COMM_WORLD's) learns
// which ranks share a machine from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) (detect_nodes below);
// a split's child inherits them (Communicator::split).
//
// Sub-groups (split): the ranks first exchange (color, key) in an all_gather on this communicator
// (step 1 bounds it: a rank that never splits is named within the timeout), then call
// MPI_Comm_split, which has no deadline but runs only once every rank has reached it. The child is
// an MpiCommunicator over duplicates of the split communicator (freed with the child, which does
// not need this one alive), with this one's timeout; it leaves the process's log rank alone.
//
// Threads: one communicator's calls must be serialized (the Communicator contract). With
// overlap_comm the data group's collectives run on a worker thread (zero/comm_queue.h) while the
// main thread uses other communicators of the process — the pipeline group's transfers (under the
// interleaved schedule a chunk's boundary backward queues its gradient reductions several actions
// before the step's last backward drains them), the tensor-parallel group's collectives.
// MPI_THREAD_SERIALIZED (init_mpi() asks for it, the training plan checks it) allows one thread in
// MPI at a time per process, so every MPI call here runs under one process-wide lock, taken per
// call and per test pass, never across a wait for a peer: both threads' operations progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "zero/pairwise_communicator.h"

namespace dstrain {

class MpiCommunicator final : public PairwiseCommunicator {
 public:
  // Over duplicates of `comm` (so no message of another library can match ours); rank and world
  // size are comm's. MPI must be initialized (init_mpi(), zero/mpi_process.h, or the program's own
  // MPI_Init_thread). Collective over comm.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, std::chrono::milliseconds timeout = default_comm_timeout());
  // Frees the duplicates (after a failure they are left to MPI_Abort / MPI_Finalize). Never throws.
  ~MpiCommunicator() override;

  std::string_view backend() const override { return "mpi"; }
  std::chrono::milliseconds timeout() const { return timeout_; }


 protected:
  // Point-to-point (above): start posts every op's descriptions and data message; wait tests them
  // until done. send, recv and send_recv are the base's start + wait; an abandoned request is
  // completed within the timeout (the base's do_abandon: MPI owns the buffers until then).
  std::unique_ptr<PendingPointToPoint> do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) override;
  void do_wait(PendingPointToPoint& pending) override;
  std::unique_ptr<Communicator> do_split(int color, int key) override;

 private:
  // do_wait's work; throws naming the op, both ranks and the peer's last collective.
  void complete(PendingPointToPoint& pending);
  // After a failure MPI may still write a started batch's descriptions and its received data: they
  // live in the batch's own memory, moved to p2p_kept_ / p2p_kept_data_ (never the caller's buffers).
  void keep(PendingPointToPoint& pending) noexcept;
  // `sets_log_rank`: the process's communicator (public constructor) names the log rank; a split's
  // child does not.
  MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout, bool sets_log_rank);

  // The process's communicator (public constructor): each rank's node from
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) — node id = the order in which the nodes' smallest
  // ranks appear (0 for rank 0's) — gathered with MPI_Allgather, then set_nodes. Not counted in
  // sequence() or stats().
  void detect_nodes();
  // Step 1 above: throws naming the missing ranks or the mismatch.
  void arrive(const Call& call) override;
  // Step 2: posts every receive and send, tests them until done, and fails after the timeout naming
  // the peers whose messages did not complete.
  void exchange(const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype, const Call& call) override;
  // An MPI call's status: Error naming `what` unless MPI_SUCCESS.
  void check(int status, const char* what, const Call& call);
  [[noreturn]] void fail_with(std::string message) override;
  void check_usable() const;

  MPI_Comm ctrl_ = MPI_COMM_NULL;  // arrival descriptions
  MPI_Comm data_ = MPI_COMM_NULL;  // collectives' data
  std::chrono::milliseconds timeout_;
  std::vector<Call> received_;  // per rank: receive buffers of the arrival exchange
  std::unique_ptr<Call> own_call_ = std::make_unique<Call>();  // the description being sent (MPI reads it until sent)
  // The descriptions of point-to-point batches that failed: MPI may still write a late one there,
  // so they live as long as the communicator (and are leaked with it after a failure).
  std::vector<std::vector<Call>> p2p_kept_;
  std::vector<std::vector<char>> p2p_kept_data_;
  std::string failure_;
};

}  // namespace dstrain
