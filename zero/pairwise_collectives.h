// The collectives of the host backends whose processes move data as messages between pairs of
// ranks — MPI (zero/mpi_communicator.h) and Gloo (zero/gloo_communicator.h) — written once, over a
// backend's "exchange": post every send and receive of a phase at once, return when all completed
// (or throw naming the peers whose messages did not). Both backends therefore compute the same bits
// as each other and as the local backend: no library reduction is used (MPI has no bf16 and a
// user-defined op would round fp16/bf16 at every hop; Gloo's ring rounds per hop too); the
// reductions are an all-to-all and an all-gather around the local backend's own rank-order
// reduction (zero/rank_reduce.h):
//   all_reduce      all-to-all: rank r receives chunk r (elements [n·r/W, n·(r+1)/W), the local
//                   backend's split, any n) of every rank's buffer; reduces it over ranks 0..W−1;
//                   all-gather in place sends the reduced chunks back. (W−1)/W·N bytes sent by
//                   each rank in each phase: the ring volume the byte counters state.
//   reduce_scatter  all-to-all of the shards, then the same reduction into recv.
//   all_gather      every rank's shard to every rank (in place when send is its shard of recv).
//   broadcast       the root sends the buffer to every rank (the engine broadcasts nothing per step).
//   all_to_all      shard q of send to rank q, one message each way per pair.
//   all_to_all_v    each pair's counts (both directions) in one message each way, checked on both
//                   ranks of the pair, then the blocks of the pairs that agree.
// One message each way per pair and phase — the pairwise algorithm MPI's own alltoallv uses — so a
// phase that does not complete names the ranks whose messages are missing.
//
// The arrival protocol both backends share (the Communicator contract: fail, never hang) is
// described by CollectiveCall and ArrivalBook: each rank sends every other rank a 32-byte
// description of its call before any data moves; a rank whose description does not come within the
// timeout is named with the last collective it reached; descriptions that differ fail on every rank
// naming both calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/tensor.h"
#include "zero/communicator.h"
#include "zero/point_to_point.h"

namespace dstrain {

// The description one rank sends the others when it reaches a collective (and, with the pair's
// number as `sequence`, a point-to-point call's). Plain bytes on the wire: both ends are dstrain.
struct CollectiveCall {
  std::uint64_t sequence = 0;
  std::int32_t kind = 0;   // CollectiveKind
  std::int32_t dtype = 0;  // DType
  std::int32_t op = 0;     // ReduceOp
  std::int32_t root = 0;
  std::int64_t count = 0;  // all_reduce/broadcast: buffer; reduce_scatter: recv; all_gather: send;
                           // all_to_all: per rank; all_to_all_v: elements sent
};

CollectiveCall make_call(std::uint64_t sequence, CollectiveKind kind, DType dtype, std::int64_t count, ReduceOp op = ReduceOp::sum,
                         int root = 0);
// "all_reduce #3 (fp32, 1024 elements, sum)": how errors name a call (the local backend's words).
std::string describe_call(const CollectiveCall& c, int world);
// Whether two ranks' descriptions are the same collective (all_to_all_v: only kind, number and
// dtype; its sizes differ per rank by design).
bool same_call(const CollectiveCall& a, const CollectiveCall& b);

// What each rank of a group last said it reached, and the arrival errors that name it.
class ArrivalBook {
 public:
  ArrivalBook(std::string backend, int rank, int world_size);
  void record(int peer, const CollectiveCall& call);
  // "rank 2 last reached all_reduce #7 (...)" or "rank 2 has reached no collective yet".
  std::string last_reached(int peer) const;
  // Throws (through `fail_with`) the mismatch Error when a peer's recorded call differs from `call`.
  void check_same(const CollectiveCall& call, const std::function<void(std::string)>& fail_with) const;
  // The Error text for peers (`missing`, sorted) whose descriptions did not come within `timeout`.
  std::string timeout_text(const CollectiveCall& call, const std::vector<int>& missing, std::chrono::milliseconds timeout) const;
  // The Error text for a phase whose messages with `stuck` did not complete although every rank arrived.
  std::string stuck_text(const CollectiveCall& call, const std::vector<int>& stuck, std::chrono::milliseconds timeout) const;

 private:
  std::string backend_;
  int rank_;
  int world_;
  std::vector<CollectiveCall> seen_;
  std::vector<bool> has_seen_;
};

// Point-to-point between message backends: `theirs` is the description the peer sent for its side
// of `mine` (its number in the pair's order as `sequence`). "" when they agree, else
// point_to_point_mismatch's text (both calls named).
std::string point_to_point_disagreement(std::string_view backend, const PointToPointCall& mine, const CollectiveCall& theirs);
// The Error text for op `name` (this rank's side, `mine`) whose peer did not post its side within
// `timeout`; `last_reached` says where the peer is (ArrivalBook::last_reached).
std::string point_to_point_unmatched_text(std::string_view backend, const std::string& name, const PointToPointCall& mine,
                                          std::chrono::milliseconds timeout, const std::string& last_reached);
// The Error text for op `name` whose data did not move within `timeout` although both ranks posted.
std::string point_to_point_stuck_text(std::string_view backend, const std::string& name, const PointToPointCall& mine,
                                      std::chrono::milliseconds timeout);

// One message of an exchange: `count` elements (of the exchange's dtype) to or from `peer`.
struct PairwiseMessage {
  int peer = 0;
  void* data = nullptr;
  std::int64_t count = 0;
};

// A backend's exchange: posts every receive and send (of `dtype` elements; a message of count 0
// posts nothing), returns once all completed; throws otherwise.
using PairwiseExchange = std::function<void(const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype)>;

// The data phases of the collectives above for one rank of a group (after its arrival). Holds the
// scratch the all-to-all phases receive into: grown, never shrunk; after a failure a backend whose
// library may still write it keeps it alive (release_scratch).
class PairwiseCollectives {
 public:
  PairwiseCollectives(int rank, int world_size) : rank_(rank), world_(world_size) {}

  void all_reduce(const Tensor& buf, ReduceOp op, const PairwiseExchange& exchange);
  void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op, const PairwiseExchange& exchange);
  void all_gather(const Tensor& send, const Tensor& recv, const PairwiseExchange& exchange);
  void broadcast(const Tensor& buf, int root, const PairwiseExchange& exchange);
  void all_to_all(const Tensor& send, const Tensor& recv, const PairwiseExchange& exchange);
  // Returns the first disagreement of the pairs' counts (all_to_all_v_mismatch's text, `backend`
  // and `sequence` naming the call), empty when every pair agrees; the agreeing pairs' blocks have
  // moved either way.
  std::string all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                           std::span<const std::int64_t> recv_counts, std::string_view backend, std::uint64_t sequence,
                           const PairwiseExchange& exchange);

  std::vector<char> release_scratch() { return std::move(scratch_); }

 private:
  char* scratch(std::size_t bytes);
  int rank_;
  int world_;
  std::vector<char> scratch_;
};

}  // namespace dstrain
