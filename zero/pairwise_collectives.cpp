#include "zero/pairwise_collectives.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "ops/error.h"
#include "zero/rank_reduce.h"

namespace dstrain {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i == 0 ? "" : ", ", ranks[i]);
  return s;
}

}  // namespace

CollectiveCall make_call(std::uint64_t sequence, CollectiveKind kind, DType dtype, std::int64_t count, ReduceOp op, int root) {
  return CollectiveCall{sequence, static_cast<std::int32_t>(kind), static_cast<std::int32_t>(dtype), static_cast<std::int32_t>(op), root, count};
}

std::string describe_call(const CollectiveCall& c, int world) {
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
      // Never in the arrival exchange; a point-to-point call's number is its pair's (transport
      // failures only: describe_point_to_point names both ranks).
      return fmt::format("{} #{} ({}, {} elements)", name, c.sequence, dt, c.count);
  }
  return std::string(name);
}

bool same_call(const CollectiveCall& a, const CollectiveCall& b) {
  if (a.kind != b.kind || a.sequence != b.sequence) return false;
  const auto kind = static_cast<CollectiveKind>(a.kind);
  if (kind == CollectiveKind::barrier) return true;
  // all_to_all_v's sizes differ per rank by design: each pair checks its counts afterwards.
  if (kind == CollectiveKind::all_to_all_v) return a.dtype == b.dtype;
  const bool reduces = kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter;
  return a.dtype == b.dtype && a.count == b.count && (!reduces || a.op == b.op) && (kind != CollectiveKind::broadcast || a.root == b.root);
}

ArrivalBook::ArrivalBook(std::string backend, int rank, int world_size)
    : backend_(std::move(backend)),
      rank_(rank),
      world_(world_size),
      seen_(static_cast<std::size_t>(world_size)),
      has_seen_(static_cast<std::size_t>(world_size), false) {}

void ArrivalBook::record(int peer, const CollectiveCall& call) {
  seen_[static_cast<std::size_t>(peer)] = call;
  has_seen_[static_cast<std::size_t>(peer)] = true;
}

std::string ArrivalBook::last_reached(int peer) const {
  const auto q = static_cast<std::size_t>(peer);
  return has_seen_[q] ? fmt::format("rank {} last reached {}", peer, describe_call(seen_[q], world_))
                      : fmt::format("rank {} has reached no collective yet", peer);
}

void ArrivalBook::check_same(const CollectiveCall& call, const std::function<void(std::string)>& fail_with) const {
  for (int q = 0; q < world_; ++q) {
    const CollectiveCall& other = seen_[static_cast<std::size_t>(q)];
    if (q != rank_ && !same_call(call, other)) {
      fail_with(fmt::format(
          "{} communicator: collective mismatch: rank {} called {} but rank {} called {}. Every rank must issue the same collectives in the "
          "same order with the same dtype, element count, op and root. Fix: look for a rank-dependent branch or size before this call",
          backend_, rank_, describe_call(call, world_), q, describe_call(other, world_)));
    }
  }
}

std::string ArrivalBook::timeout_text(const CollectiveCall& call, const std::vector<int>& missing, std::chrono::milliseconds timeout) const {
  std::string whose;
  for (int q : missing) whose += "; " + last_reached(q);
  return fmt::format(
      "{} communicator: {} on rank {} timed out after {} ms: rank(s) {} of {} did not reach it{}. Every rank must issue the same collectives "
      "in the same order; a rank that skips one (an early return, a rank-dependent branch), is stuck, or whose process ended leaves the "
      "others waiting. Fix: look at rank(s) {}'s own output for its error, or raise DSTRAIN_COMM_TIMEOUT (seconds) if it is only slow",
      backend_, describe_call(call, world_), rank_, timeout.count(), ranks_text(missing), world_, whose, ranks_text(missing));
}

std::string ArrivalBook::stuck_text(const CollectiveCall& call, const std::vector<int>& stuck, std::chrono::milliseconds timeout) const {
  return fmt::format(
      "{} communicator: {} on rank {} timed out after {} ms: rank(s) {} of {} did not complete their part of it, although every rank "
      "reached it: a process stopped or ended during the collective, or the network between the processes failed. Fix: look at rank(s) "
      "{}'s own output and the launcher's messages, or raise DSTRAIN_COMM_TIMEOUT (seconds) if the transfers are only slow",
      backend_, describe_call(call, world_), rank_, timeout.count(), ranks_text(stuck), world_, ranks_text(stuck));
}

std::string point_to_point_disagreement(std::string_view backend, const PointToPointCall& mine, const CollectiveCall& theirs) {
  PointToPointCall other = mine;
  other.is_send = !mine.is_send;
  other.number = theirs.sequence;
  other.dtype = static_cast<DType>(theirs.dtype);
  other.count = theirs.count;
  return mine.is_send ? point_to_point_mismatch(backend, mine, other) : point_to_point_mismatch(backend, other, mine);
}

std::string point_to_point_unmatched_text(std::string_view backend, const std::string& name, const PointToPointCall& mine,
                                          std::chrono::milliseconds timeout, const std::string& last_reached) {
  PointToPointCall owed = mine;
  owed.is_send = !mine.is_send;
  const int peer = mine.is_send ? mine.receiver : mine.sender;
  return fmt::format(
      "{} communicator: {} timed out after {} ms: rank {} did not post the matching {} ({}). A send returns once its receiver has posted "
      "the recv, and the sends and recvs between two ranks match in program order. Fix: post the matching call on rank {}, order the calls "
      "so that no two ranks wait on each other (in a ring, even ranks send first and odd ranks receive first, or one send_recv batch), look "
      "at rank {}'s own output for its error, or raise DSTRAIN_COMM_TIMEOUT (seconds) if it is only slow",
      backend, name, timeout.count(), peer, describe_point_to_point(owed), last_reached, peer, peer);
}

std::string point_to_point_stuck_text(std::string_view backend, const std::string& name, const PointToPointCall& mine,
                                      std::chrono::milliseconds timeout) {
  const int peer = mine.is_send ? mine.receiver : mine.sender;
  return fmt::format(
      "{} communicator: {} timed out after {} ms: its data did not {} rank {}, although both ranks posted their calls: a process stopped or "
      "ended meanwhile, or the network between them failed. Fix: look at rank {}'s own output and the launcher's messages, or raise "
      "DSTRAIN_COMM_TIMEOUT (seconds) if the transfer is only slow",
      backend, name, timeout.count(), mine.is_send ? "reach" : "come from", peer, peer);
}

char* PairwiseCollectives::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void PairwiseCollectives::all_reduce(const Tensor& buf, ReduceOp op, const PairwiseExchange& exchange) {
  const int w = world_;
  const int me = rank_;
  if (w == 1 || buf.numel() == 0) return;
  const std::int64_t n = buf.numel();
  const std::size_t es = dtype_size(buf.dtype);
  // Chunk k = elements [n·k/W, n·(k+1)/W): the local backend's split, so any n works.
  std::vector<std::int64_t> begin(static_cast<std::size_t>(w) + 1);
  for (int k = 0; k <= w; ++k) begin[static_cast<std::size_t>(k)] = n * k / w;
  const auto len = [&](int k) { return begin[static_cast<std::size_t>(k) + 1] - begin[static_cast<std::size_t>(k)]; };
  const std::int64_t mine = len(me);
  char* base = static_cast<char*>(buf.data);
  const auto at = [&](std::int64_t elements) { return base + static_cast<std::size_t>(elements) * es; };
  const auto slot = [&](char* slots, int q) { return slots + static_cast<std::size_t>(q) * static_cast<std::size_t>(mine) * es; };
  // 1. all-to-all: chunk k of this buffer to rank k; chunk `me` of rank q's buffer into slot q.
  char* slots = scratch(static_cast<std::size_t>(w) * static_cast<std::size_t>(mine) * es);
  std::vector<PairwiseMessage> sends, recvs;
  for (int q = 0; q < w; ++q) {
    if (q == me) continue;
    sends.push_back({q, at(begin[static_cast<std::size_t>(q)]), len(q)});
    recvs.push_back({q, slot(slots, q), mine});
  }
  exchange(sends, recvs, buf.dtype);
  // 2. reduce chunk `me` over ranks 0..W−1 in order, into this buffer (its own chunk read in place).
  char* own = at(begin[static_cast<std::size_t>(me)]);
  if (mine > 0) {
    std::vector<const void*> in(static_cast<std::size_t>(w));
    for (int q = 0; q < w; ++q) in[static_cast<std::size_t>(q)] = q == me ? own : slot(slots, q);
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
  exchange(sends, recvs, buf.dtype);
}

void PairwiseCollectives::reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op, const PairwiseExchange& exchange) {
  const int w = world_;
  const int me = rank_;
  const std::int64_t n = recv.numel();
  if (n == 0) return;
  const std::size_t shard = static_cast<std::size_t>(n) * dtype_size(send.dtype);
  const char* own = static_cast<const char*>(send.data) + shard * static_cast<std::size_t>(me);
  char* slots = nullptr;
  if (w > 1) {
    // all-to-all: shard k of send to rank k; shard `me` of rank q's send into scratch slot q.
    slots = scratch(static_cast<std::size_t>(w) * shard);
    std::vector<PairwiseMessage> sends, recvs;
    for (int q = 0; q < w; ++q) {
      if (q == me) continue;
      const std::size_t offset = static_cast<std::size_t>(q) * shard;
      sends.push_back({q, static_cast<char*>(send.data) + offset, n});
      recvs.push_back({q, slots + offset, n});
    }
    exchange(sends, recvs, send.dtype);
  }
  // In place (recv = this rank's shard of send) the output aliases input `me`: reduce_over_ranks
  // reads a block's inputs before writing it.
  std::vector<const void*> in(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) in[static_cast<std::size_t>(q)] = q == me ? own : slots + static_cast<std::size_t>(q) * shard;
  reduce_over_ranks(send.dtype, in, {recv.data}, n, op);
}

void PairwiseCollectives::all_gather(const Tensor& send, const Tensor& recv, const PairwiseExchange& exchange) {
  const std::int64_t n = send.numel();
  if (n == 0) return;
  const std::size_t bytes = send.nbytes();
  char* base = static_cast<char*>(recv.data);
  char* own = base + static_cast<std::size_t>(rank_) * bytes;
  if (send.data != own) std::memcpy(own, send.data, bytes);
  if (world_ == 1) return;
  std::vector<PairwiseMessage> sends, recvs;
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    sends.push_back({q, own, n});
    recvs.push_back({q, base + static_cast<std::size_t>(q) * bytes, n});
  }
  exchange(sends, recvs, send.dtype);
}

void PairwiseCollectives::broadcast(const Tensor& buf, int root, const PairwiseExchange& exchange) {
  if (world_ == 1 || buf.numel() == 0) return;
  // From the root to every rank directly (the engine broadcasts nothing per step).
  std::vector<PairwiseMessage> sends, recvs;
  if (rank_ == root) {
    for (int q = 0; q < world_; ++q) {
      if (q != root) sends.push_back({q, buf.data, buf.numel()});
    }
  } else {
    recvs.push_back({root, buf.data, buf.numel()});
  }
  exchange(sends, recvs, buf.dtype);
}

// Shard q of send to rank q, rank q's shard `rank` into recv's shard q (the compressed
// all-reduce's first phase, zero/compressed_all_reduce.cpp).
void PairwiseCollectives::all_to_all(const Tensor& send, const Tensor& recv, const PairwiseExchange& exchange) {
  const std::int64_t n = send.numel() / world_;
  if (n == 0) return;
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(send.dtype);
  auto* src = static_cast<char*>(send.data);
  auto* dst = static_cast<char*>(recv.data);
  std::memcpy(dst + static_cast<std::size_t>(rank_) * bytes, src + static_cast<std::size_t>(rank_) * bytes, bytes);
  if (world_ == 1) return;
  std::vector<PairwiseMessage> sends, recvs;
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    sends.push_back({q, src + static_cast<std::size_t>(q) * bytes, n});
    recvs.push_back({q, dst + static_cast<std::size_t>(q) * bytes, n});
  }
  exchange(sends, recvs, send.dtype);
}

std::string PairwiseCollectives::all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                                              std::span<const std::int64_t> recv_counts, std::string_view backend, std::uint64_t sequence,
                                              const PairwiseExchange& exchange) {
  const int w = world_;
  const int me = rank_;
  const auto at = [](std::span<const std::int64_t> v, int i) { return v[static_cast<std::size_t>(i)]; };
  // 1. Each pair's counts: to rank q (send_counts[q], recv_counts[q]); from it (what q sends this
  // rank, what q expects from it). In scratch (a library may still write it after a timeout): the
  // incoming pairs first, then the outgoing ones.
  auto* pairs = reinterpret_cast<std::int64_t*>(scratch(static_cast<std::size_t>(4 * w) * sizeof(std::int64_t)));
  std::int64_t* in = pairs;
  std::int64_t* out = pairs + 2 * w;
  std::vector<PairwiseMessage> sends, recvs;
  for (int q = 0; q < w; ++q) {
    out[2 * q] = at(send_counts, q);
    out[2 * q + 1] = at(recv_counts, q);
    in[2 * q] = out[2 * q];  // for q = me: this rank's own pair, checked below like a peer's
    in[2 * q + 1] = out[2 * q + 1];
    if (q == me) continue;
    sends.push_back({q, out + 2 * q, 2});
    recvs.push_back({q, in + 2 * q, 2});
  }
  exchange(sends, recvs, DType::fp64);  // 8-byte elements, moved as bits
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
    const std::string name = fmt::format("{} communicator", backend);
    if (q < me) {
      if (!q_to_me) text = all_to_all_v_mismatch(name, sequence, q, q_sends, me, me_expects);
      else if (!me_to_q) text = all_to_all_v_mismatch(name, sequence, me, me_sends, q, q_expects);
    } else {
      if (!me_to_q) text = all_to_all_v_mismatch(name, sequence, me, me_sends, q, q_expects);
      else if (!q_to_me) text = all_to_all_v_mismatch(name, sequence, q, q_sends, me, me_expects);
    }
    if (!text.empty()) {
      agreed[static_cast<std::size_t>(q)] = false;
      if (problem.empty()) problem = std::move(text);
    }
  }
  // 3. The blocks, with every peer whose counts agree (the others' parts of this collective still
  // complete).
  const std::size_t es = dtype_size(send.dtype);
  auto* src = static_cast<char*>(send.data);
  auto* dst = static_cast<char*>(recv.data);
  sends.clear();
  recvs.clear();
  std::int64_t send_at = 0, recv_at = 0;
  for (int q = 0; q < w; ++q) {
    const std::int64_t ns = at(send_counts, q), nr = at(recv_counts, q);
    if (agreed[static_cast<std::size_t>(q)]) {
      char* from = src + static_cast<std::size_t>(send_at) * es;
      char* to = dst + static_cast<std::size_t>(recv_at) * es;
      if (q == me) {
        if (ns > 0) std::memcpy(to, from, static_cast<std::size_t>(ns) * es);
      } else {
        sends.push_back({q, from, ns});
        recvs.push_back({q, to, nr});
      }
    }
    send_at += ns;
    recv_at += nr;
  }
  exchange(sends, recvs, send.dtype);
  return problem;
}

}  // namespace dstrain
