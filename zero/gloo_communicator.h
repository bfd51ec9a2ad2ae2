// The Gloo backend: one process per rank on host memory, on one machine or many, for processes a
// launcher other than mpirun started — torchrun (its elastic agent included), srun, or a script
// exporting RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT. Gloo (Debian's libgloo-dev, the
// transport torch's CPU process groups use) moves the bytes over TCP; dstrain computes every
// reduction itself, so results are bit-identical to the local and MPI backends.
//
// Bootstrap: rank 0 serves a TcpStore (zero/tcp_store.h) at MASTER_ADDR:MASTER_PORT (MASTER_PORT + 1
// under torchrun's static rendezvous, whose agent holds MASTER_PORT itself; DSTRAIN_STORE_PORT
// overrides both), every rank
// publishes its Gloo address there and connects to every other rank (Gloo's full mesh: one TCP
// connection per pair), then a barrier confirms the group. The network interface is the one
// GLOO_SOCKET_IFNAME names (torch's variable), else the address the host name resolves to (the
// loopback when MASTER_ADDR is a loopback address: one machine).
//
// Collectives: zero/pairwise_collectives.h's, as the MPI backend's — an arrival exchange of each
// call's 32-byte description (a mismatch fails on every rank naming both calls; a rank that does
// not come within the timeout is named with the last collective it reached), then one message each
// way per pair and phase as Gloo unbound buffers. Messages of one group and kind travel on one Gloo
// slot; Gloo matches a pair's messages on a slot in posting order.
//
// Failures (the Communicator contract: an Error, never a hang or an exit): a peer whose process ends
// closes its connections, and every rank waiting on it fails at once naming it ("rank 3's
// connection closed") — how an elastic run notices a dead node within a step, not after a timeout;
// a peer that stops answering is named after the timeout (DSTRAIN_COMM_TIMEOUT, 60 s). After a
// failure Gloo closes every connection of the process's group (its timeouts do), so every
// communicator of the process (split children included) refuses further calls.
//
// Point-to-point: as MPI's, each op sends its description (number in the pair's order, dtype,
// count) and receives the peer's; a recv posts its data buffer at once; a send posts its data only
// once the receiver's description came and agrees — Gloo aborts the process when a message is
// longer than the buffer it lands in, so a disagreement must never reach the wire. That wait runs
// on a thread per peer (made at the first send to it), which posts the sends to that peer in the
// pair's order, so a send completes once its receiver posted, whether or not the sender is in
// wait(): the contract's "an op never waits for its poster's wait()".
//
// Sub-groups (split): the (color, key) all_gather of the contract, then the child talks over the
// same connections with its members' ranks and its own slots (no new rendezvous, no store).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "zero/communicator.h"
#include "zero/launch_env.h"
#include "zero/pairwise_communicator.h"

namespace gloo::transport {
class UnboundBuffer;
}  // namespace gloo::transport

namespace dstrain {

class GlooCommunicator final : public PairwiseCommunicator {
 public:
  // Joins the launcher's group: rank env.rank of env.world_size, the store at env.master_addr
  // (empty: localhost) and env.master_port. Collective over every process of the job; Error naming
  // the address and the variables when the others do not join within `join_timeout` (the store,
  // the connections and a first barrier; default: `timeout`, the collectives' afterwards).
  explicit GlooCommunicator(const LaunchEnv& env, std::chrono::milliseconds timeout = default_comm_timeout(),
                            std::chrono::milliseconds join_timeout = std::chrono::milliseconds(0));
  ~GlooCommunicator() override;

  std::string_view backend() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  struct Shared;  // the process's Gloo context, device and store (shared with split children)

 protected:
  std::unique_ptr<PendingPointToPoint> do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) override;
  void do_wait(PendingPointToPoint& pending) override;
  void do_abandon(PendingPointToPoint& pending) noexcept override;
  std::unique_ptr<Communicator> do_split(int color, int key) override;

 private:
  // A split child: `members` are its ranks' ranks in the process group, `slot_base` its slots.
  GlooCommunicator(std::shared_ptr<Shared> shared, std::vector<int> members, int rank, std::uint64_t slot_base,
                   std::chrono::milliseconds timeout);

  // The arrival exchange (pairwise_collectives.h): throws naming the missing ranks or the mismatch.
  void arrive(const Call& call) override;
  // One phase's messages: posts every receive and send, waits for all until the timeout.
  void exchange(const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype, const Call& call) override;
  // do_wait's work.
  void complete(PendingPointToPoint& pending);
  // After a failure: what Gloo may still write lives as long as the process's group (Shared::kept).
  void keep(std::shared_ptr<void> what) noexcept;
  void keep_ops(PendingPointToPoint& pending) noexcept;
  struct SendPoster;  // per peer: posts the data of the sends to it in the pair's order
  SendPoster& poster(int peer);
  std::uint64_t slot(int channel) const { return slot_base_ + static_cast<std::uint64_t>(channel); }
  int process_rank(int rank) const { return members_[static_cast<std::size_t>(rank)]; }
  // A Gloo exception while waiting on `peer` in `what`: records the failure and throws its Error.
  [[noreturn]] void fail_on(const std::exception& e, int peer, const std::string& what);
  [[noreturn]] void fail_with(std::string message) override;
  void check_usable() const;

  std::shared_ptr<Shared> shared_;
  std::vector<int> members_;  // this group's ranks -> the process group's ranks
  std::uint64_t slot_base_;
  std::chrono::milliseconds timeout_;
  std::uint64_t splits_ = 0;  // children made so far (their slots derive from it)
  std::vector<Call> received_;  // per rank: receive buffers of the arrival exchange
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> arrival_in_, arrival_out_;  // per peer, over received_
  std::string failure_;
  std::vector<std::unique_ptr<SendPoster>> posters_;  // per peer, made at its first send with data
};

}  // namespace dstrain
