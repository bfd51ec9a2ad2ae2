#include "zero/pairwise_communicator.h"

#include <numeric>
#include <utility>

#include "ops/error.h"

namespace dstrain {

PairwiseCommunicator::PairwiseCommunicator(int rank, int world_size, std::string name)
    : Communicator(rank, world_size), arrivals_(name, rank, world_size), collectives_(rank, world_size), name_(std::move(name)) {}

void PairwiseCommunicator::check_host(const Tensor& t, const char* what) const {
  DSTRAIN_CHECK(t.device.is_cpu(),
                "{} communicator: {} of collective #{} on rank {} is on {}; the {} backend communicates host memory. Fix: use host buffers "
                "(--device cpu), or the nccl backend for GPUs",
                name_, what, sequence(), rank(), t.device.str(), name_);
}

PairwiseExchange PairwiseCommunicator::exchange_for(const Call& call) {
  return [this, call](const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype) {
    exchange(sends, recvs, dtype, call);
  };
}

void PairwiseCommunicator::do_all_reduce(const Tensor& buf, ReduceOp op) {
  check_host(buf, "the buffer");
  const Call call = make_call(sequence(), CollectiveKind::all_reduce, buf.dtype, buf.numel(), op);
  arrive(call);
  collectives_.all_reduce(buf, op, exchange_for(call));
}

void PairwiseCommunicator::do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call = make_call(sequence(), CollectiveKind::reduce_scatter, send.dtype, recv.numel(), op);
  arrive(call);
  collectives_.reduce_scatter(send, recv, op, exchange_for(call));
}

void PairwiseCommunicator::do_all_gather(const Tensor& send, const Tensor& recv) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call = make_call(sequence(), CollectiveKind::all_gather, send.dtype, send.numel());
  arrive(call);
  collectives_.all_gather(send, recv, exchange_for(call));
}

void PairwiseCommunicator::do_broadcast(const Tensor& buf, int root) {
  check_host(buf, "the buffer");
  const Call call = make_call(sequence(), CollectiveKind::broadcast, buf.dtype, buf.numel(), ReduceOp::sum, root);
  arrive(call);
  collectives_.broadcast(buf, root, exchange_for(call));
}

void PairwiseCommunicator::do_barrier() { arrive(make_call(sequence(), CollectiveKind::barrier, DType::fp32, 0)); }

void PairwiseCommunicator::do_all_to_all(const Tensor& send, const Tensor& recv) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call = make_call(sequence(), CollectiveKind::all_to_all, send.dtype, send.numel() / world_size());
  arrive(call);
  collectives_.all_to_all(send, recv, exchange_for(call));
}

void PairwiseCommunicator::do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                                           std::span<const std::int64_t> recv_counts) {
  check_host(send, "send");
  check_host(recv, "recv");
  const Call call =
      make_call(sequence(), CollectiveKind::all_to_all_v, send.dtype, std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0}));
  arrive(call);
  const std::string problem = collectives_.all_to_all_v(send, send_counts, recv, recv_counts, name_, call.sequence, exchange_for(call));
  if (!problem.empty()) fail_with(problem);
}

}  // namespace dstrain
