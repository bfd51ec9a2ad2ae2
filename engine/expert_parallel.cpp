#include "engine/expert_parallel.h"

#include "engine/config_checks.h"

#include "ops/buffer.h"
#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

std::vector<std::int64_t> CommunicatorExpertGroup::exchange_counts(std::span<const std::int64_t> send_counts, std::int64_t n) {
  const int W = comm_.world_size();
  if (n < 1 || static_cast<std::int64_t>(send_counts.size()) != W * n)
    fail("expert parallelism: exchange_counts got {} values for {} ranks of {} each", send_counts.size(), W, n);
  if (n == 1) return comm_.exchange_counts(send_counts);
  // n values per peer: one all_to_all of int32 (a micro-batch's token counts are far below 2^31;
  // checked), through device memory where the group moves device memory.
  std::vector<std::int32_t> send(send_counts.size()), recv(send_counts.size());
  for (std::size_t i = 0; i < send.size(); ++i) {
    if (send_counts[i] < 0 || send_counts[i] > INT32_MAX) fail("expert parallelism: a token count of {} is out of range", send_counts[i]);
    send[i] = static_cast<std::int32_t>(send_counts[i]);
  }
  const Shape shape{static_cast<std::int64_t>(send.size())};
  if (staging_ == nullptr) {
    comm_.all_to_all(Tensor(send.data(), DType::int32, shape), Tensor(recv.data(), DType::int32, shape));
  } else {
    // Every sparse layer's forward exchanges its counts: the device buffer is kept, not allocated per call.
    const std::size_t bytes = 2 * send.size() * sizeof(std::int32_t);
    if (staging_buffer_.bytes() < bytes) staging_buffer_ = Buffer(*staging_, bytes, MemoryPurpose::buffers);
    const Tensor ds = staging_buffer_.tensor(DType::int32, shape);
    const Tensor dr = staging_buffer_.tensor(DType::int32, shape, send.size() * sizeof(std::int32_t));
    copy_tensor(ds, Tensor(send.data(), DType::int32, shape));
    comm_.all_to_all(ds, dr);
    comm_.order_compute_after_collectives();
    copy_tensor(Tensor(recv.data(), DType::int32, shape), dr);
  }
  return std::vector<std::int64_t>(recv.begin(), recv.end());
}

void CommunicatorExpertGroup::all_to_all_v(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
                                           std::span<const std::int64_t> recv_counts) {
  comm_.all_to_all_v(send, send_counts, recv, recv_counts);
  comm_.order_compute_after_collectives();  // the layer reads recv next (NCCL: a stream of its own)
}

int check_expert_groups(Communicator* expert_parallel, Communicator* expert_data, Communicator* data) {
  if ((expert_parallel == nullptr) != (expert_data == nullptr)) {
    fail("initialize: EngineOptions::expert_parallel and expert_data come together (the expert-parallel group and the ranks that hold the same "
         "experts); one of them is null");
  }
  const int ep = expert_parallel != nullptr ? expert_parallel->world_size() : 1;
  const int world = data != nullptr ? data->world_size() : 1;
  if (ep > 1 && (data == nullptr || expert_data->world_size() * ep != world)) {
    fail("initialize: an expert-parallel group of {} ranks and an expert-data group of {} must split the data group of {} ranks", ep,
         expert_data->world_size(), world);
  }
  return ep;
}

void check_expert_parallel_engine(const config::DsConfig& config, const Device& device, int ep_ranks, std::string_view ep_backend) {
  if (ep_ranks <= 1) return;
  using config::OptimizerKind;
  const OptimizerKind k = config.optimizer.kind;
  if (k == OptimizerKind::lamb || k == OptimizerKind::muon || k == OptimizerKind::adafactor || config.optimizer.is_onebit()) {
    fail(
        "optimizer.type \"{}\" with expert_parallel.autoep_size {}: its rule reads each parameter tensor whole (a trust ratio, an "
        "orthogonalised matrix, factored statistics or one compression scale), and each expert-parallel rank holds only its own experts of "
        "every expert stack, so each rank would take another step. Fix: an element-wise optimizer (Adam, AdamW, SGD, Lion, Adagrad, RMSprop), "
        "or expert_parallel.enabled false",
        config.optimizer.type, ep_ranks);
  }
  // The layers exchange their tokens in place, in the training device's memory.
  check_group_backend(device, ep_backend, fmt::format("expert_parallel.autoep_size {}", ep_ranks), "the MoE layers move their tokens",
                      "the expert-parallel group");
}

}  // namespace dstrain
