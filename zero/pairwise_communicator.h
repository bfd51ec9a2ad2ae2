// PairwiseCommunicator: the part every message backend (MPI, Gloo) shares — a collective is its
// arrival (each rank's description of the call to every other: zero/pairwise_collectives.h), then
// PairwiseCollectives' phases over the backend's exchange of pairwise messages. A backend
// implements arrive(), exchange() and fail_with() (and point-to-point, split) on its transport.
#pragma once

#include <string>
#include <vector>

#include "zero/communicator.h"
#include "zero/pairwise_collectives.h"

namespace dstrain {

class PairwiseCommunicator : public Communicator {
 protected:
  // `name` starts the errors ("MPI", "Gloo"): "<name> communicator: ...".
  PairwiseCommunicator(int rank, int world_size, std::string name);

  using Call = CollectiveCall;
  // Step 1: every rank's description of `call`; throws naming the ranks that did not come or the
  // mismatch (after recording what came in arrivals_).
  virtual void arrive(const Call& call) = 0;
  // Step 2: posts every receive and send, returns once all completed; throws naming the peers whose
  // messages did not (the group is unusable afterwards).
  virtual void exchange(const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype, const Call& call) = 0;
  // Records the group's failure and throws it.
  [[noreturn]] virtual void fail_with(std::string message) = 0;

  void do_all_reduce(const Tensor& buf, ReduceOp op) final;
  void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) final;
  void do_all_gather(const Tensor& send, const Tensor& recv) final;
  void do_broadcast(const Tensor& buf, int root) final;
  // Every rank has reached the barrier once every rank's description has come.
  void do_barrier() final;
  void do_all_to_all(const Tensor& send, const Tensor& recv) final;
  // The arrival (kind and dtype; the sizes differ per rank), then each pair's counts, checked on both
  // ranks of the pair, then the blocks: a pair whose counts disagree exchanges no data and both its
  // ranks fail naming both counts; the other pairs complete.
  void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                       std::span<const std::int64_t> recv_counts) final;

  // An Error unless `t` is host memory (these backends communicate nothing else).
  void check_host(const Tensor& t, const char* what) const;
  const std::string& name() const { return name_; }

  ArrivalBook arrivals_;             // per rank: the last description received (this rank's own: its last call)
  PairwiseCollectives collectives_;  // the data phases and their scratch

 private:
  PairwiseExchange exchange_for(const Call& call);
  std::string name_;
};

}  // namespace dstrain
