// Communicator: the collectives ZeRO needs (all-reduce, reduce-scatter, all-gather, broadcast,
// barrier, all-to-all) over one group of `world_size` ranks, on flat buffers communicated in place,
// the 1-bit optimizers' compressed all-reduce built on them (compressed_all_reduce below,
// implemented once here for every backend; docs/optimizers_onebit.md), and the point-to-point
// send/recv between two ranks that pipeline parallelism moves activations with.
//
// A backend implements the do_* primitives. send/recv/send_recv, all_to_all and split are the
// newest: every backend must implement them (send/recv — local: a rendezvous of the two threads,
// the receiver copying; MPI: a description exchange, then one message; NCCL: ncclSend/ncclRecv;
// send_recv: the same for a batch, below; all_to_all —
// local: shared-memory copies; NCCL: grouped ncclSend/ncclRecv; MPI: pairwise messages;
// all_to_all_v — local: shared-memory copies after checking every pair's counts at the rendezvous;
// MPI: a per-pair exchange of the counts, then pairwise messages; NCCL: the same counts exchange
// (one grouped ncclSend/ncclRecv of int64 pairs, read back on the host), then grouped
// ncclSend/ncclRecv of the nonzero blocks; split —
// local: a child LocalGroup shared by its member threads; MPI: MPI_Comm_split; NCCL: ncclCommSplit).
//
// Backends: LocalCommunicator (zero/local_communicator.h; ranks are threads of one process, on host
// memory — how CI tests multi-rank training — or on one GPU they share), MpiCommunicator
// (zero/mpi_communicator.h, built with an MPI; one process per rank on host memory, bit-identical
// to the local backend) and NcclCommunicator (zero/nccl_communicator.h, CUDA build; one process
// per GPU).
//
// Contract, identical for every backend (NCCL's):
//   - Every rank issues the same collectives in the same order, with the same dtype, element count,
//     op and root. A backend that can see the other ranks' calls (local, mpi) reports a mismatch as
//     an Error naming both calls; NCCL cannot, and a mismatch there is undefined behaviour.
//   - Buffers are Tensors viewed as flat arrays (their shape is ignored, only numel counts).
//   - dtypes: fp32, fp16, bf16; fp64 for the step's global sums (accumulated in double); int32 for
//     counts (sum and max only). fp16/bf16 reductions accumulate
//     in fp32 and round once to 16 bits at the end (local backend; NCCL's ring/tree kernels may
//     round at each hop, so NCCL results can differ in the last bit, never the local ones). fp32
//     accumulates in fp32; int32 sums wrap around as NCCL's do.
//   - avg = sum / world_size, computed in the accumulation type (NCCL: ncclAvg).
//   - Completion: on host memory the local backend has finished when the call returns; on a GPU it
//     has queued its work on the device's legacy default stream, before any work its ranks queue
//     afterwards. NCCL enqueues on its own stream; order_compute_after_collectives() orders later
//     compute after it, synchronize() waits on the host.
//   - Errors are dstrain::Error, never exit/abort. After a failure the group is unusable.
//
// Point-to-point (send, recv) is not a collective: only the two ranks involved call it, and it
// takes no part in the "every rank issues the same collectives" order above (the other ranks may
// be anywhere, in a collective of their own included). Between one sender and one receiver the
// calls match in program order (MPI's non-overtaking rule: send #k from a to b is received by
// recv #k from a on b), and they must agree on dtype and element count; a backend that can see
// both calls (local, mpi) fails a disagreement on both ranks naming both calls, NCCL cannot.
// Blocking, alike on every backend: a send completes once its receiver has posted the matching
// recv (local: the receiver has copied the data; mpi: the message has left the buffer; nccl: on
// the stream — the host returns once the call is queued, as for collectives), a recv once the data
// is in its buffer. So a program whose sends wait on each other (every rank of a ring sending
// first) fails on the host backends at the timeout, naming the peer, as it would hang on NCCL
// (where synchronize() times out). On a GPU (local on one device, NCCL) the work is queued as the
// collectives' is, and ordered by the same calls.
//
// send_recv(ops) is the batched form (torch.distributed.batch_isend_irecv + wait, NCCL's grouped
// ncclSend/ncclRecv, MPI_Isend/MPI_Irecv + MPI_Waitall): every op of the batch is posted at once
// and the call returns when all have completed, so no op of the batch waits for another. Pipeline
// stages need it: neighbours exchanging activations and gradients, or a rank sending to and
// receiving from one peer, would deadlock with blocking sends that each wait for the other's recv.
// Each op is one send or recv for the rules above (numbered in its pair's order, counted, checked
// against its peer's call, batched or not); ops to one peer in one direction keep their batch order.
// Backends — local: every op posted at once, each moved by whichever of its two ranks posts second;
// MPI: every op's description exchange and data message in flight at once, each progressing on
// its own; NCCL: ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd.
//
// start_send_recv(ops) is its non-blocking half (torch's batch_isend_irecv without the wait,
// Megatron's overlap_p2p_comm): it checks, numbers and posts the batch exactly as send_recv does and
// returns a PointToPointRequest at once, before the peers have posted anything; wait() (the
// request's or the communicator's) returns when every op of the batch has completed (send_recv ==
// start_send_recv + wait). Between the two the caller may compute, issue collectives and start or
// wait other requests, in any order: an op completes once both of its ranks have posted it, never
// waiting for the poster's wait() (local: the second poster copies; MPI: MPI progresses both
// messages; NCCL: the stream runs them) — so waiting for some requests and not (yet) for others
// cannot deadlock where the blocking batches would not. The buffers belong to the request until it
// completed: a send's must not be written, a recv's not read or written, before its wait()
// returned. The timeout counts from wait(). A request must not outlive its communicator; one
// destroyed without wait() is abandoned (PointToPointRequest's destructor below).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ops/tensor.h"
#include "zero/point_to_point.h"

namespace dstrain {

enum class ReduceOp { sum, avg, max };

// The kinds of operation a communicator counts: the collectives, then the two point-to-point ones
// (counted in the same tables, so a per-kind report shows a pipeline's traffic next to ZeRO's), then
// the variable all-to-all (last so that the older kinds keep their numbers).
enum class CollectiveKind : int { all_reduce = 0, reduce_scatter, all_gather, broadcast, barrier, all_to_all, send, recv, all_to_all_v };
inline constexpr int kCollectiveKinds = 9;

std::string_view reduce_op_name(ReduceOp op);           // "sum", "avg", "max"
std::string_view collective_name(CollectiveKind kind);  // "all_reduce", ..., "send", "recv", "all_to_all_v"

// "Bytes sent" by one rank for one collective: the algorithmic volume of a ring implementation,
// not what a particular backend really moves (the local backend moves nothing, NCCL may use trees).
// It is the unit of ZeRO's communication-volume claims (2Ψ for stage 0-2, 3Ψ for stage 3), so a
// test can check that a ZeRO stage issues exactly the traffic the paper says. With N = bytes of
// the full buffer (for reduce-scatter the W·n send buffer, for all-gather the W·n receive buffer)
// and W = world size:
//   all_reduce      2·(W−1)·N / W   (reduce-scatter phase + all-gather phase; rounded down when W
//                                    does not divide N — ZeRO's padded buffers always divide)
//   reduce_scatter  (W−1)·N / W     = (W−1)·n·elem_size: every chunk but the rank's own, exact
//   all_gather      (W−1)·N / W     = (W−1)·n·elem_size, exact
//   broadcast       N on the root, 0 on the others (the root sends the buffer once)
//   barrier         0
//   all_to_all      (W−1)·N / W     (N = the W·n send buffer: every shard but the rank's own), exact
//   send            N               (the buffer, once, to the one peer)
//   recv            0               (the bytes are counted once, by the sender)
//   all_to_all_v    N               (N = the bytes of the blocks to the other ranks: what this rank
//                                    sends, exact; its own block is not sent)
// W = 1: every collective sends 0 bytes (and a group of one has no peer to send to).
std::uint64_t ring_bytes_sent(CollectiveKind kind, std::uint64_t buffer_bytes, int world_size, bool is_root = false);

// "Cross-node bytes" sent by one rank for one collective: the part of its traffic that leaves its
// node (Communicator::set_nodes), what ZeRO++'s hierarchical partitioning and MiCS cut down. The
// "pairwise" model: the bytes this rank addresses to ranks on other nodes if every rank sent its
// data straight to each rank that needs it — exact for all-to-all, and for hierarchical algorithms
// built from per-node groups (each group's own counters); a flat ring crossing nodes may move less
// (only its links between nodes). With o = the number of ranks of the group on other nodes than
// this rank (`ranks_off_node`), N = buffer bytes as ring_bytes_sent defines them, W = world size
// and `node_count` the number of distinct nodes of the group:
//   all_reduce      2·o·N / W     (rounded down, as ring_bytes_sent)
//   reduce_scatter  o·N / W
//   all_gather      o·N / W
//   all_to_all      o·N / W       (exchange_counts: its all_to_all of 8·W bytes, so 8·o)
//   broadcast       N·(node_count − 1) on the root (the buffer once to each other node), 0 elsewhere
//   barrier         0
//   send            N when the peer is on another node (pass ranks_off_node = 1), else 0
//   recv            0             (counted once, by the sender)
//   all_to_all_v    N             (N = the bytes of the blocks to ranks on other nodes: exact, from
//                                  send_counts; the caller passes them)
// One node (o = 0, node_count = 1, every communicator's default): 0 for every kind.
std::uint64_t cross_node_bytes_sent(CollectiveKind kind, std::uint64_t buffer_bytes, int world_size, int ranks_off_node, int node_count,
                                    bool is_root = false);

// Per-rank counters: bytes sent (ring_bytes_sent), of them the bytes that cross nodes
// (cross_node_bytes_sent, with the communicator's nodes) and number of calls, per kind of collective.
struct CommStats {
  std::array<std::uint64_t, kCollectiveKinds> bytes{};
  std::array<std::uint64_t, kCollectiveKinds> calls{};
  std::array<std::uint64_t, kCollectiveKinds> cross_node_bytes{};

  std::uint64_t bytes_sent(CollectiveKind kind) const { return bytes[static_cast<std::size_t>(kind)]; }
  std::uint64_t call_count(CollectiveKind kind) const { return calls[static_cast<std::size_t>(kind)]; }
  std::uint64_t cross_node_bytes_sent(CollectiveKind kind) const { return cross_node_bytes[static_cast<std::size_t>(kind)]; }
  std::uint64_t total_bytes_sent() const;
  std::uint64_t total_calls() const;
  std::uint64_t total_cross_node_bytes() const;
};

// What was sent between two snapshots of one rank's counters (later − earlier, per kind).
CommStats operator-(const CommStats& later, const CommStats& earlier);
// Adds another group's counters (a rank's traffic over several groups, per kind).
CommStats& operator+=(CommStats& sum, const CommStats& more);

// How long a collective waits for the other ranks before failing: DSTRAIN_COMM_TIMEOUT (seconds,
// decimals allowed, > 0) or 60 s. Throws Error naming the variable when it is not a positive number.
std::chrono::milliseconds default_comm_timeout();

// Shard `index` of `world_size` equal shards of `full` viewed as a flat array: the rank's slice of
// a flat buffer, for the in-place forms below. Throws Error when world_size does not divide numel.
Tensor shard_of(const Tensor& full, int index, int world_size);

// The Error text every backend gives when all_to_all_v #`sequence`'s counts disagree: rank
// `sender` sends `sent` elements to rank `receiver` (its send_counts[receiver]), which expects
// `expected` (its recv_counts[sender]). `backend` starts the text ("local communicator", ...).
std::string all_to_all_v_mismatch(std::string_view backend, std::uint64_t sequence, int sender, std::int64_t sent, int receiver,
                                  std::int64_t expected);

// One operation of a send_recv batch (torch.distributed.P2POp).
struct PointToPointOp {
  bool is_send = true;
  Tensor buffer;  // send: read; recv: written
  int peer = 0;   // a rank of this communicator
};

class Communicator;

// What a backend keeps of a started batch until it completes (its own subclass).
struct PendingPointToPoint {
  virtual ~PendingPointToPoint() = default;
};

// A started send_recv batch (Communicator::start_send_recv). Move-only; empty (default-made, moved
// from, or waited) is complete. Destroyed while pending — a wait() skipped, or an exception
// unwinding past it — it is abandoned, never thrown from and never hung on: the local backend
// withdraws the ops no peer has matched yet (waiting only for a copy in progress) and poisons the
// group with an Error naming them, so the peers fail now instead of at the timeout; MPI, which owns
// the buffers until its messages end, completes it within the timeout; NCCL orders later compute
// after it. Either way the Error is logged (log_error), not thrown, and the pair's numbering is
// broken: the communicator is not to be used for point-to-point afterwards.
class PointToPointRequest {
 public:
  PointToPointRequest() = default;
  PointToPointRequest(PointToPointRequest&& other) noexcept;
  PointToPointRequest& operator=(PointToPointRequest&& other) noexcept;  // abandons a pending *this first
  PointToPointRequest(const PointToPointRequest&) = delete;
  PointToPointRequest& operator=(const PointToPointRequest&) = delete;
  ~PointToPointRequest();

  // Started and not yet waited for.
  bool pending() const { return comm_ != nullptr; }
  // Communicator::wait(*this).
  void wait();

 private:
  friend class Communicator;
  void abandon() noexcept;

  Communicator* comm_ = nullptr;
  std::unique_ptr<PendingPointToPoint> state_;  // null: the backend completed the batch at once
  struct Counted {
    bool is_send;
    std::uint64_t bytes;  // the buffer's
    int peer;
  };
  std::vector<Counted> counted_;  // per op, for stats()
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  virtual std::string_view backend() const = 0;  // "local", "mpi", "nccl"

  // In place: on return every rank's `buf` holds op over all ranks' `buf`, element by element.
  void all_reduce(Tensor buf, ReduceOp op);

  // send: W·n elements on every rank; recv: n elements = op over all ranks of send's shard `rank`.
  // In-place form: recv = shard_of(send, rank, W) (exactly that memory). Otherwise recv must not
  // overlap send.
  void reduce_scatter(Tensor send, Tensor recv, ReduceOp op);

  // send: n elements; recv: W·n elements, shard r = rank r's send. In-place form:
  // send = shard_of(recv, rank, W). Otherwise send must not overlap recv.
  void all_gather(Tensor send, Tensor recv);

  // In place: every rank's `buf` becomes rank `root`'s.
  void broadcast(Tensor buf, int root);

  // Returns once every rank has called it.
  void barrier();

  // send, recv: W·n elements each, any collective dtype, not overlapping. Shard j of send goes to
  // rank j; on return shard i of recv holds rank i's shard `rank` (MPI_Alltoall, all_to_all_single).
  void all_to_all(Tensor send, Tensor recv);

  // Variable all-to-all (MPI_Alltoallv, torch.distributed.all_to_all_single with split sizes):
  // send holds W consecutive blocks, block j (send_counts[j] elements) going to rank j; recv
  // receives W consecutive blocks, block i (recv_counts[i] elements) from rank i. Counts are in
  // elements of the tensors' dtype (send and recv the same collective dtype), blocks packed in rank
  // order with no gaps (offsets are the prefix sums); send.numel() >= sum(send_counts),
  // recv.numel() >= sum(recv_counts); send and recv must not overlap. recv_counts[i] must equal
  // rank i's send_counts[rank()] — an Error naming both ranks and both counts when they disagree
  // (every backend checks it).
  // Every rank calls it (a rank that exchanges nothing passes zero counts). Elements of recv past
  // sum(recv_counts) are left as they were. Counted in sequence() like any collective and in
  // stats() as CollectiveKind::all_to_all_v, its bytes those of the blocks to the other ranks.
  // On NCCL the counts check reads a small exchange back on the host, so the call waits for the
  // work queued before it (the counts live on the host anyway, as torch's split sizes do).
  void all_to_all_v(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv, std::span<const std::int64_t> recv_counts);
  // The counts every rank will send to this one: out[i] = rank i's send_counts[rank()] (one
  // all_to_all of W int64-sized values; host vectors in and out on every backend, staged through
  // device memory where the backend needs it). What a caller runs before all_to_all_v when only the
  // sender knows the sizes (MoE routing).
  // Counted in sequence() and in stats() as one all_to_all of W int64 values (8·W bytes).
  std::vector<std::int64_t> exchange_counts(std::span<const std::int64_t> send_counts);

  // Point-to-point (MPI_Send / MPI_Recv, ncclSend / ncclRecv; see the top of this file): `buf`
  // (any collective dtype, viewed as a flat array; host memory for local and mpi, the rank's GPU
  // for nccl) goes to, or is filled from, rank `peer` of this communicator, which must not be this
  // rank. The peer's matching call must have the same dtype and element count. Counted in stats()
  // (send: the buffer's bytes; recv: 0) but not in sequence(): each is numbered per pair instead,
  // the k-th send to `peer` being "send #k", which errors name along with both ranks.
  void send(Tensor buf, int peer);
  void recv(Tensor buf, int peer);
  // Posts every op of `ops` at once, then returns when all have completed (torch.distributed's
  // batch_isend_irecv + wait). Sends and recvs match their peers' calls exactly as send()/recv() do
  // (FIFO per ordered pair, counting standalone and batched calls alike, agreeing on dtype and
  // count), but no op of the batch waits for another: a rank may send to and receive from the same
  // or different peers in one call, and two neighbours that each send to the other in one batch do
  // not deadlock. Ops to the same peer in the same direction keep their order in the batch. A recv's
  // buffer must not overlap another op's (they run concurrently). Counted in stats() as the same
  // sends and recvs one by one. An empty batch returns at once.
  void send_recv(std::span<const PointToPointOp> ops);
  // send_recv without the wait (the top of this file): checks, numbers and posts `ops`, returns at
  // once. The ops are counted in stats() when the request completes. An empty batch gives an empty
  // request. wait(request): returns when every op of it has completed (an Error naming the op, both
  // ranks and what the peer is doing after the timeout, counted from here, or on a mismatch); the
  // request is then empty, also when it threw. Requests of one communicator may be waited in any
  // order, each once; call both from the thread that uses the communicator.
  PointToPointRequest start_send_recv(std::span<const PointToPointOp> ops);
  void wait(PointToPointRequest& request);
  // How many sends to (receives from) `peer` this rank has issued; the next is number +1.
  std::uint64_t sends_to(int peer) const;
  std::uint64_t recvs_from(int peer) const;

  // DeepSpeed's compressed all-reduce (deepspeed/runtime/comm/nccl.py compressed_allreduce), the
  // average over the ranks of `buf` sent as 1 bit per element, with error feedback:
  //   worker: x = buf + worker_error; s = ‖x‖/√n; worker_error = x − s·sign(x);
  //           sign(x) packed 8 per byte, cut into W chunks; chunk j and s go to rank j (all_to_all)
  //   server (rank r, for chunk r): y = Σ_i sign_i·(s_i/W) over ranks i in order + server_error;
  //           t = ‖y‖/√(n/W); server_error = y − t·sign(y); sign(y) packed, t (all_gather)
  //   result: buf chunk j = t_j·sign(y_j)
  // sign(v) is +1 for v ≥ 0 (zero included) and −1 otherwise, as DeepSpeed's sign().add_(1).bool().
  // buf, worker_error: n fp32 elements; server_error: n/W; n a multiple of 8·W (DeepSpeed pads each
  // tensor to W·lcm(W, 8)); errors start at zero and persist between calls (the caller owns them).
  // The bits travel as int32 words (the bytes of DeepSpeed's uint8 buffer, in order, each chunk's
  // bytes padded to whole words, its scale's bits in one more word): one all_to_all and one
  // all_gather, about n/8·2(W−1)/W bytes instead of the fp32 all-reduce's 8n(W−1)/W — 1/32, as the
  // byte counters show. Deterministic: the same bits on every rank, in every run, for any W.
  // The arithmetic runs on the host (device buffers are copied there and back). The bits travel
  // through host memory, or, when `workspace` is given (int32, compressed_workspace_numel(n)
  // elements, e.g. on the GPU for NCCL, which communicates device memory only), through it. W = 1: buf is compressed and decompressed once, as
  // DeepSpeed's formula gives, with no collective.
  void compressed_all_reduce(Tensor buf, Tensor worker_error, Tensor server_error, Tensor workspace = {});
  std::int64_t compressed_workspace_numel(std::int64_t n) const;

  // Collective over this group (every rank calls it, in order with the other collectives): the ranks
  // passing the same `color` (>= 0) form a new group, ordered by (key, rank in this group), as
  // MPI_Comm_split. Returns this rank's communicator of that group; it does not depend on this one
  // staying alive. Its stats() count its own collectives only (per-group byte counters).
  //
  // The tensor- and sequence-parallel groups of the device mesh (zero/device_mesh.h) are made
  // this way. The child is of the same backend (and on the same device, stream policy and
  // timeout) as this communicator. How the ranks agree on the groups is the backend's: local and
  // mpi exchange (color, key) in one all_gather of 2 int32 per rank on this communicator, which
  // its sequence() and stats() count like any other (and which names a rank that does not come,
  // or calls something else, within the timeout); nccl calls ncclCommSplit, which they do not
  // count. A color < 0 (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR: "no group for this rank") is refused:
  // every rank gets a group. Errors poison this group as a failed collective does.
  //
  // The child inherits this group's nodes (set_nodes below). When this group spans nodes
  // (node_count() > 1), split() then runs one exchange_counts on the child, each rank sending its
  // node to every member (that works on every backend: NCCL stages it through device memory), and
  // sets the child's nodes from it; that exchange is counted in the child's sequence() and stats()
  // (an all_to_all of 8·W bytes, its cross-node bytes counted as 0: the child's nodes are not known
  // yet). With one node (the default) split issues nothing more than the backend's agreement above.
  std::unique_ptr<Communicator> split(int color, int key);

  // The node (machine) of each rank of this group: ZeRO++ and MiCS build their hierarchical
  // collectives from it, and stats() counts the bytes that cross nodes with it
  // (cross_node_bytes_sent). Default: every rank on node 0. Node ids are kept as given (a split
  // child keeps its parent's), so a group on one node may have every rank on, say, node 1.
  int node_of(int rank) const;        // Error naming the rank when outside [0, world_size())
  int node_count() const;             // number of distinct node ids
  int ranks_on_node(int node) const;  // how many ranks of this group are on that node (0 for an id none has)
  // Sets the node of every rank of this group (node_of_rank.size() == world_size(), ids >= 0; an
  // Error naming the sizes / the bad id otherwise). Every rank must pass the same vector (not
  // checked: no collective). Call before issuing collectives whose cross-node bytes matter: the
  // counters count each call with the nodes set at that time. The world communicator gets it from
  // the launcher (MpiCommunicator: MPI_Comm_split_type; dstrain train: --ranks-per-node or the
  // launcher's local world size; docs/parallelism.md "Nodes").
  void set_nodes(std::vector<int> node_of_rank);

  // Blocks the calling thread until every collective issued so far has completed (no-op for
  // backends that complete on return). Fails with Error after the timeout rather than hang.
  virtual void synchronize() {}

  // Orders the device work the caller queues from now on after every collective issued so far,
  // without blocking the host (NCCL: the compute stream waits for the communicator's stream). Call
  // it before compute reads, overwrites or frees a communicated buffer. No-op for backends whose
  // collectives have completed when they return.
  virtual void order_compute_after_collectives() {}

  // Like order_compute_after_collectives(), but only after collective number `sequence` (see
  // sequence()) and those before it, not after collectives issued since: waiting for layer i's
  // gather must not also wait for layer i+1's prefetch. A backend may order after more (never
  // less); the default orders after everything. 0 orders after nothing.
  virtual void order_compute_after(std::uint64_t sequence) {
    if (sequence != 0) order_compute_after_collectives();
  }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  // Number of collectives this rank has issued (barriers included); the next one is sequence()+1.
  // Errors name collectives by this number: "all_reduce #17". Point-to-point calls are not
  // counted (only two ranks take part; see sends_to / recvs_from).
  std::uint64_t sequence() const { return sequence_; }

 protected:
  Communicator(int rank, int world_size);

  // Called after the arguments were checked (dtypes, sizes, op/dtype, root, device consistency);
  // sequence() already counts this call.
  virtual void do_all_reduce(const Tensor& buf, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
  virtual void do_all_gather(const Tensor& send, const Tensor& recv) = 0;
  virtual void do_broadcast(const Tensor& buf, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_all_to_all(const Tensor& send, const Tensor& recv) = 0;
  // Called after the front checked this rank's arguments: both spans hold world_size() counts,
  // none negative, their sums within send's and recv's numel, same dtype and device, no overlap.
  // The backend checks recv_counts against the senders' send_counts (the front cannot see them).
  virtual void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                               std::span<const std::int64_t> recv_counts) = 0;
  // exchange_counts' work, `out` sized world_size(). The default runs do_all_to_all on host int32
  // tensors (each count as two int32 words, its bytes moved unchanged); a backend that communicates
  // device memory only (NCCL) or a wrapper forwards or stages it.
  virtual void do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out);
  // Called after the buffer and the peer were checked; sends_to(peer) / recvs_from(peer) already
  // count this call (its number in the pair's order).
  // Default: a batch of one through do_send_recv.
  virtual void do_send(const Tensor& buf, int peer);
  virtual void do_recv(const Tensor& buf, int peer);
  // Called after every op was checked; calls[i] names ops[i] (sender, receiver, its number in its
  // pair's order, dtype, count): sends_to / recvs_from already count the whole batch. Never empty.
  // Default: do_start_send_recv, then do_wait.
  virtual void do_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls);
  // The non-blocking batch. A backend implements either do_start_send_recv + do_wait + do_abandon,
  // or only do_send_recv (blocking), which the default do_start_send_recv runs at once (returning
  // null: complete). The defaults of do_send / do_recv / do_send_recv go through
  // do_start_send_recv + do_wait, so a backend implementing neither recurses: implement one.
  // do_start_send_recv is called after every op was checked and numbered (as do_send_recv), and
  // must not wait for a peer; do_wait completes it (the timeout counted from the call); do_abandon
  // is the destructor's (PointToPointRequest), must not throw, and logs what it gives up.
  virtual std::unique_ptr<PendingPointToPoint> do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls);
  virtual void do_wait(PendingPointToPoint& pending);
  virtual void do_abandon(PendingPointToPoint& pending) noexcept;
  // Called by split() after color was checked; returns the new group's communicator (never null).
  virtual std::unique_ptr<Communicator> do_split(int color, int key) = 0;

  // Called with any Error a collective raises on this rank (its own bad arguments included) before
  // it propagates: the local backend poisons the group so the other ranks fail now, not at timeout.
  virtual void on_error(const std::string& /*message*/) noexcept {}

 private:
  template <typename Fn>
  void run(CollectiveKind kind, std::uint64_t buffer_bytes, bool is_root, Fn&& fn);
  friend class PointToPointRequest;
  // send and recv: checks, numbers, do_send / do_recv, counts.
  void point_to_point(CollectiveKind kind, const Tensor& buf, int peer);
  // One completed send or recv of `bytes` with `peer` into stats().
  void count_point_to_point(CollectiveKind kind, std::uint64_t bytes, int peer);
  // An Error naming `name` unless `peer` is another rank of this communicator.
  void check_peer(std::string_view name, int peer, bool sending) const;
  void check_full_and_shard(const std::string& call, const Tensor& full, const char* full_name, const Tensor& shard, const char* shard_name) const;
  std::int64_t check_counts(const std::string& call, std::span<const std::int64_t> counts, const char* name, const Tensor& t,
                            const char* what) const;

  int rank_;
  int world_size_;
  std::uint64_t sequence_ = 0;
  std::vector<std::uint64_t> sends_to_;    // per peer
  std::vector<std::uint64_t> recvs_from_;  // per peer
  CommStats stats_;
  // set_nodes: the node of each rank, the number of distinct ids, the ranks on other nodes than
  // this one (o of cross_node_bytes_sent), and whether set_nodes was called (split inherits only
  // into a child that has no nodes of its own yet: a wrapper's child copies its inner child's).
  std::vector<int> node_of_rank_;
  int node_count_ = 1;
  int ranks_off_node_ = 0;
  bool nodes_given_ = false;
};

}  // namespace dstrain
