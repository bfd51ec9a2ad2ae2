#include "zero/nccl_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <vector>
#include <thread>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_scope.h"
#include "ops/error.h"
#include "ops/log.h"
#include "zero/point_to_point.h"

// A non-blocking communicator's call: ncclInProgress is not a failure (see complete()).
#define DSTRAIN_NCCL_ENQUEUE(call) complete((call), #call, __FILE__, __LINE__)

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return ncclFloat32;
    case DType::fp16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::int32:
      return ncclInt32;
    case DType::fp64:
      return ncclFloat64;
    case DType::uint16:
      break;
  }
  fail("NCCL communicator: dtype {} cannot be communicated", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  fail("NCCL communicator: unknown reduce op");
}

// "host:port", brackets around an IPv6 address (NCCL_COMM_ID's format).
std::string comm_id_address(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return ipv6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// The id every rank derives by itself (see the header): from NCCL_COMM_ID, which we set from the
// launcher's master address when the user has not.
ncclUniqueId bootstrap_id(const LaunchEnv& env) {
  const char* preset = std::getenv("NCCL_COMM_ID");
  if (env.world_size > 1 && (preset == nullptr || *preset == '\0')) {
    DSTRAIN_CHECK(!env.master_addr.empty(),
                  "NCCL bootstrap: world size {} ({}) but no address for rank 0. Fix: set MASTER_ADDR and MASTER_PORT "
                  "(torchrun and the deepspeed launcher do; mpirun does not), or NCCL_COMM_ID=host:port",
                  env.world_size, env.launcher);
    const std::string address = comm_id_address(env.master_addr, env.master_port);
    // Before any NCCL call reads it; 0 = do not overwrite a value set meanwhile.
    DSTRAIN_CHECK(::setenv("NCCL_COMM_ID", address.c_str(), 0) == 0, "NCCL bootstrap: setenv(NCCL_COMM_ID={}) failed", address);
    log_debug("NCCL bootstrap through NCCL_COMM_ID={} (rank {} of {})", address, env.rank, env.world_size);
  }
  ncclUniqueId id;
  DSTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

}  // namespace

NcclCommunicator::NcclCommunicator(const LaunchEnv& env, NcclOptions options)
    : Communicator(env.rank, env.world_size), device_(options.device >= 0 ? options.device : env.local_rank), timeout_(options.timeout) {
  if (options.device < 0) {
    // A launcher that isolates GPUs (srun --gpus-per-task=1, containers) shows each process only
    // its own GPU, as device 0, whatever its local rank.
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices == 1) device_ = 0;
    (void)cudaGetLastError();
  }
  init(bootstrap_id(env));
}

NcclCommunicator::NcclCommunicator(int rank, int world_size, const ncclUniqueId& id, NcclOptions options)
    : Communicator(rank, world_size), device_(options.device >= 0 ? options.device : 0), timeout_(options.timeout) {
  init(id);
}

NcclCommunicator::NcclCommunicator(Adopt, ncclComm_t comm, int rank, int world_size, int device, std::chrono::milliseconds timeout,
                                   cudaStream_t compute_stream)
    : Communicator(rank, world_size), device_(device), timeout_(timeout), comm_(comm), compute_stream_(compute_stream) {
  setup(nullptr);
}

void NcclCommunicator::init(const ncclUniqueId& id) { setup(&id); }

void NcclCommunicator::setup(const ncclUniqueId* id) {
  try {
    DSTRAIN_CHECK(timeout_.count() > 0, "NCCL communicator: the timeout must be positive, got {} ms", timeout_.count());
    int devices = 0;
    DSTRAIN_CUDA_CHECK(cudaGetDeviceCount(&devices));
    DSTRAIN_CHECK(device_ < devices,
                  "NCCL communicator: rank {} wants GPU {} but this process sees {} GPU(s). Fix: one process per GPU, "
                  "with LOCAL_RANK below the number of GPUs per node (check CUDA_VISIBLE_DEVICES)",
                  rank(), device_, devices);
    DSTRAIN_CUDA_CHECK(cudaSetDevice(device_));
    DSTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    DSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    for (cudaEvent_t& e : marks_) DSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    DSTRAIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(int)));
    if (id == nullptr) return;  // a split's child: comm_ is made already

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a rank that never joins gives a timeout, not a hang
    const char* comm_id = std::getenv("NCCL_COMM_ID");
    last_call_ = fmt::format("the bootstrap (ncclCommInitRankConfig as rank {} of {}, NCCL_COMM_ID={})", rank(), world_size(),
                             comm_id != nullptr ? comm_id : "unset");
    const ncclResult_t status = ncclCommInitRankConfig(&comm_, world_size(), *id, rank(), &config);
    if (comm_ == nullptr) DSTRAIN_NCCL_CHECK(status);  // failed before a communicator existed
    complete(status, "ncclCommInitRankConfig", __FILE__, __LINE__);
    last_call_ = "no collective yet";
    // One process per rank: the process-wide log rank is this communicator's (ops/log.h).
    set_log_rank(rank(), world_size());
  } catch (...) {
    // The destructor does not run for a failed constructor: release here.
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
    if (comm_done_ != nullptr) (void)cudaEventDestroy(comm_done_);
    for (cudaEvent_t e : marks_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (compute_ready_ != nullptr) (void)cudaEventDestroy(compute_ready_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    try {
      DSTRAIN_NCCL_ENQUEUE(ncclCommFinalize(comm_));  // flushes outstanding collectives, bounded
      if (comm_ != nullptr) {
        // After finalize this only frees memory; the handle is gone, so there is nothing to poll.
        const ncclResult_t status = ncclCommDestroy(comm_);
        comm_ = nullptr;
        if (status != ncclSuccess && status != ncclInProgress)
          log_warning("NCCL communicator of rank {}: ncclCommDestroy failed: {}", rank(), ncclGetErrorString(status));
      }
    } catch (const std::exception& e) {
      log_warning("NCCL communicator of rank {}: shutdown failed, aborting it: {}", rank(), e.what());
      if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  // Statuses are only logged: a destructor must not throw, and after a device error these fail too.
  const auto warn = [this](cudaError_t e, const char* what) {
    if (e != cudaSuccess) log_warning("NCCL communicator of rank {}: {} failed: {}", rank(), what, cudaGetErrorString(e));
  };
  if (barrier_word_ != nullptr) warn(cudaFree(barrier_word_), "cudaFree(barrier word)");
  if (counts_device_ != nullptr) warn(cudaFree(counts_device_), "cudaFree(counts)");
  if (counts_host_ != nullptr) warn(cudaFreeHost(counts_host_), "cudaFreeHost(counts)");
  if (comm_done_ != nullptr) warn(cudaEventDestroy(comm_done_), "cudaEventDestroy");
  for (cudaEvent_t e : marks_) {
    if (e != nullptr) warn(cudaEventDestroy(e), "cudaEventDestroy(mark)");
  }
  if (compute_ready_ != nullptr) warn(cudaEventDestroy(compute_ready_), "cudaEventDestroy");
  if (stream_ != nullptr) warn(cudaStreamDestroy(stream_), "cudaStreamDestroy");
}

void NcclCommunicator::abort_with(const std::string& message) {
  if (failure_.empty()) failure_ = message;
  if (comm_ != nullptr) {
    (void)ncclCommAbort(comm_);  // frees the peers' resources and stops our kernels; its own status is moot
    comm_ = nullptr;
  }
  throw Error(failure_);
}

void NcclCommunicator::check_usable() const {
  if (!failure_.empty()) throw Error(failure_);
  DSTRAIN_CHECK(comm_ != nullptr, "NCCL communicator of rank {} has no communicator (it was shut down)", rank());
}

void NcclCommunicator::check_device(const Tensor& t, const char* what, const char* call) const {
  if (t.device.is_cuda() && t.device.index == device_) return;
  check_device_named(t, what, fmt::format("{} #{}", call, sequence()));
}

void NcclCommunicator::check_device_named(const Tensor& t, const char* what, const std::string& call) const {
  DSTRAIN_CHECK(t.device.is_cuda() && t.device.index == device_,
                "{} on rank {}: {} is {} but this NCCL communicator works on cuda:{}. Fix: communicate buffers on "
                "the rank's own GPU (host buffers: the local backend)",
                call, rank(), what, t.str(), device_);
}

template <typename Done>
void NcclCommunicator::poll_until(Done done, const std::string& waiting_for) {
  const auto deadline = Clock::now() + timeout_;
  for (int spin = 0;; ++spin) {
    ncclResult_t async = ncclSuccess;
    DSTRAIN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      const char* detail = ncclGetLastError(comm_);
      abort_with(
          fmt::format("NCCL failed on rank {} of {} while {}: {}{}{}. The communicator was aborted. Fix: check the other ranks' "
                      "logs (a dead peer shows here as a remote/system error) and rerun with NCCL_DEBUG=WARN",
                      rank(), world_size(), waiting_for, ncclGetErrorString(async), detail != nullptr && *detail != '\0' ? ": " : "",
                      detail != nullptr ? detail : ""));
    }
    if (async == ncclSuccess && done()) return;
    if (Clock::now() >= deadline) {
      abort_with(
          fmt::format("NCCL on rank {} of {} timed out after {} ms while {} (last issued: {}). A peer rank is dead or stuck, is "
                      "waiting in a different collective (ranks must issue the same collectives in the same order), or cannot "
                      "reach this one (MASTER_ADDR/MASTER_PORT, NCCL_SOCKET_IFNAME). The communicator was aborted. Fix: read the "
                      "other ranks' logs first, rerun with NCCL_DEBUG=WARN, or raise DSTRAIN_COMM_TIMEOUT (seconds) if the step "
                      "is legitimately slow",
                      rank(), world_size(), timeout_.count(), waiting_for, last_call_));
    }
    if (spin < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void NcclCommunicator::complete(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess) return;
  if (status == ncclInProgress) {
    poll_until([] { return true; }, fmt::format("completing {}", call));
    return;
  }
  try {
    detail::throw_nccl_error(status, call, file, line);
  } catch (const Error& e) {
    abort_with(e.what());
  }
}

void NcclCommunicator::wait_for_compute() {
  DSTRAIN_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_stream_));
  DSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
}

void NcclCommunicator::compute_wait_for_comm() { DSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, comm_done_, 0)); }

void NcclCommunicator::order_compute_after(std::uint64_t sequence) {
  if (sequence == 0) return;
  DSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, marks_[sequence % kMarkEvents], 0));
}

void NcclCommunicator::after_enqueue() {
  DSTRAIN_CUDA_CHECK(cudaEventRecord(comm_done_, stream_));
  DSTRAIN_CUDA_CHECK(cudaEventRecord(marks_[sequence() % kMarkEvents], stream_));
}

void NcclCommunicator::synchronize() {
  check_usable();
  poll_until(
      [this] {
        const cudaError_t e = cudaEventQuery(comm_done_);
        if (e == cudaErrorNotReady) return false;
        DSTRAIN_CUDA_CHECK(e);
        return true;
      },
      fmt::format("waiting for {} to complete", last_call_));
}

void NcclCommunicator::do_all_reduce(const Tensor& buf, ReduceOp op) {
  check_usable();
  check_device(buf, "the buffer", "all_reduce");
  wait_for_compute();
  last_call_ = fmt::format("all_reduce #{} ({}, {} elements, {})", sequence(), dtype_name(buf.dtype), buf.numel(), reduce_op_name(op));
  DSTRAIN_NCCL_ENQUEUE(ncclAllReduce(buf.data, buf.data, static_cast<std::size_t>(buf.numel()), nccl_type(buf.dtype), nccl_op(op), comm_, stream_));
  after_enqueue();
}

void NcclCommunicator::do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_usable();
  check_device(send, "send", "reduce_scatter");
  check_device(recv, "recv", "reduce_scatter");
  wait_for_compute();
  last_call_ = fmt::format("reduce_scatter #{} ({}, {}×{} -> {} elements, {})", sequence(), dtype_name(send.dtype), world_size(), recv.numel(),
                           recv.numel(), reduce_op_name(op));
  // In place is NCCL's own convention too: recv == send + rank·n.
  DSTRAIN_NCCL_ENQUEUE(
      ncclReduceScatter(send.data, recv.data, static_cast<std::size_t>(recv.numel()), nccl_type(send.dtype), nccl_op(op), comm_, stream_));
  after_enqueue();
}

void NcclCommunicator::do_all_gather(const Tensor& send, const Tensor& recv) {
  check_usable();
  check_device(send, "send", "all_gather");
  check_device(recv, "recv", "all_gather");
  wait_for_compute();
  last_call_ = fmt::format("all_gather #{} ({}, {} -> {}×{} elements)", sequence(), dtype_name(send.dtype), send.numel(), world_size(), send.numel());
  // In place: send == recv + rank·n, as NCCL defines it.
  DSTRAIN_NCCL_ENQUEUE(ncclAllGather(send.data, recv.data, static_cast<std::size_t>(send.numel()), nccl_type(send.dtype), comm_, stream_));
  after_enqueue();
}

void NcclCommunicator::do_broadcast(const Tensor& buf, int root) {
  check_usable();
  check_device(buf, "the buffer", "broadcast");
  wait_for_compute();
  last_call_ = fmt::format("broadcast #{} ({}, {} elements, root {})", sequence(), dtype_name(buf.dtype), buf.numel(), root);
  DSTRAIN_NCCL_ENQUEUE(ncclBroadcast(buf.data, buf.data, static_cast<std::size_t>(buf.numel()), nccl_type(buf.dtype), root, comm_, stream_));
  after_enqueue();
}

void NcclCommunicator::do_all_to_all(const Tensor& send, const Tensor& recv) {
  check_usable();
  check_device(send, "send", "all_to_all");
  check_device(recv, "recv", "all_to_all");
  wait_for_compute();
  const std::int64_t n = send.numel() / world_size();
  last_call_ = fmt::format("all_to_all #{} ({}, {}×{} elements)", sequence(), dtype_name(send.dtype), world_size(), n);
  // NCCL has no all-to-all collective: one group of W sends and W receives (NCCL's documented
  // pattern), which NCCL schedules as a single operation.
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(send.dtype);
  DSTRAIN_NCCL_ENQUEUE(ncclGroupStart());
  for (int r = 0; r < world_size(); ++r) {
    DSTRAIN_NCCL_ENQUEUE(ncclSend(static_cast<const char*>(send.data) + bytes * static_cast<std::size_t>(r), static_cast<std::size_t>(n),
                                  nccl_type(send.dtype), r, comm_, stream_));
    DSTRAIN_NCCL_ENQUEUE(ncclRecv(static_cast<char*>(recv.data) + bytes * static_cast<std::size_t>(r), static_cast<std::size_t>(n),
                                  nccl_type(recv.dtype), r, comm_, stream_));
  }
  DSTRAIN_NCCL_ENQUEUE(ncclGroupEnd());
  after_enqueue();
}

void NcclCommunicator::exchange_pairs(const std::int64_t* out, std::int64_t* in, int per_peer, const std::string& call) {
  const auto w = static_cast<std::size_t>(world_size());
  const std::size_t n = w * static_cast<std::size_t>(per_peer);  // values each way
  CudaDeviceScope current(device_);
  if (counts_device_ == nullptr) {
    DSTRAIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&counts_device_), 4 * w * sizeof(std::int64_t)));
    DSTRAIN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&counts_host_), 4 * w * sizeof(std::int64_t)));
  }
  // The previous exchange was waited for, so the staging buffers are free.
  std::copy(out, out + n, counts_host_);
  last_call_ = call;
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(counts_device_, counts_host_, n * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream_));
  DSTRAIN_NCCL_ENQUEUE(ncclGroupStart());
  for (std::size_t q = 0; q < w; ++q) {
    const std::size_t at = q * static_cast<std::size_t>(per_peer);
    DSTRAIN_NCCL_ENQUEUE(ncclSend(counts_device_ + at, static_cast<std::size_t>(per_peer), ncclInt64, static_cast<int>(q), comm_, stream_));
    DSTRAIN_NCCL_ENQUEUE(ncclRecv(counts_device_ + n + at, static_cast<std::size_t>(per_peer), ncclInt64, static_cast<int>(q), comm_, stream_));
  }
  DSTRAIN_NCCL_ENQUEUE(ncclGroupEnd());
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(counts_host_ + n, counts_device_ + n, n * sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream_));
  after_enqueue();
  synchronize();
  std::copy(counts_host_ + n, counts_host_ + 2 * n, in);
}

void NcclCommunicator::do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out) {
  check_usable();
  exchange_pairs(send_counts.data(), out.data(), 1, fmt::format("exchange_counts (all_to_all #{}, {} int64 values)", sequence(), world_size()));
}

void NcclCommunicator::do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                                       std::span<const std::int64_t> recv_counts) {
  check_usable();
  check_device(send, "send", "all_to_all_v");
  check_device(recv, "recv", "all_to_all_v");
  const int w = world_size();
  const int me = rank();
  const auto at = [](std::span<const std::int64_t> v, int i) { return v[static_cast<std::size_t>(i)]; };
  // 1. Each pair's counts, read back on the host (NCCL cannot see the other ranks' calls, and a
  // disagreement would otherwise be a hang or corrupt data).
  std::vector<std::int64_t> out(static_cast<std::size_t>(2 * w)), in(static_cast<std::size_t>(2 * w));
  for (int q = 0; q < w; ++q) {
    out[static_cast<std::size_t>(2 * q)] = at(send_counts, q);
    out[static_cast<std::size_t>(2 * q + 1)] = at(recv_counts, q);
  }
  exchange_pairs(out.data(), in.data(), 2, fmt::format("all_to_all_v #{} (the counts exchange)", sequence()));
  // 2. Both directions of every pair, the lower rank's sends first (both ranks report the same).
  std::string problem;
  std::vector<bool> agreed(static_cast<std::size_t>(w), true);
  for (int q = 0; q < w; ++q) {
    const std::int64_t q_sends = in[static_cast<std::size_t>(2 * q)], q_expects = in[static_cast<std::size_t>(2 * q + 1)];
    const std::int64_t me_sends = at(send_counts, q), me_expects = at(recv_counts, q);
    const auto q_to_me = [&] { return all_to_all_v_mismatch("NCCL communicator", sequence(), q, q_sends, me, me_expects); };
    const auto me_to_q = [&] { return all_to_all_v_mismatch("NCCL communicator", sequence(), me, me_sends, q, q_expects); };
    std::string text;
    if (q < me) {
      text = q_sends != me_expects ? q_to_me() : me_sends != q_expects ? me_to_q() : std::string();
    } else {
      text = me_sends != q_expects ? me_to_q() : q_sends != me_expects ? q_to_me() : std::string();
    }
    if (!text.empty()) {
      agreed[static_cast<std::size_t>(q)] = false;
      if (problem.empty()) problem = std::move(text);
    }
  }
  // 3. The blocks: one group, a send and a recv per agreeing peer with a nonzero count.
  wait_for_compute();
  last_call_ = fmt::format("all_to_all_v #{} ({}, sending {} elements)", sequence(), dtype_name(send.dtype),
                           std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0}));
  const std::size_t es = dtype_size(send.dtype);
  std::size_t send_at = 0, recv_at = 0;
  DSTRAIN_NCCL_ENQUEUE(ncclGroupStart());
  for (int q = 0; q < w; ++q) {
    const auto ns = static_cast<std::size_t>(at(send_counts, q)), nr = static_cast<std::size_t>(at(recv_counts, q));
    if (agreed[static_cast<std::size_t>(q)]) {
      if (ns > 0) DSTRAIN_NCCL_ENQUEUE(ncclSend(static_cast<const char*>(send.data) + send_at * es, ns, nccl_type(send.dtype), q, comm_, stream_));
      if (nr > 0) DSTRAIN_NCCL_ENQUEUE(ncclRecv(static_cast<char*>(recv.data) + recv_at * es, nr, nccl_type(recv.dtype), q, comm_, stream_));
    }
    send_at += ns;
    recv_at += nr;
  }
  DSTRAIN_NCCL_ENQUEUE(ncclGroupEnd());
  after_enqueue();
  if (!problem.empty()) {
    synchronize();  // the agreeing peers' blocks first, so that their ranks complete
    abort_with(problem);
  }
}

void NcclCommunicator::do_send(const Tensor& buf, int peer) {
  check_usable();
  const std::string name = describe_point_to_point({true, rank(), peer, sends_to(peer), buf.dtype, buf.numel()});
  check_device_named(buf, "the buffer", name);
  wait_for_compute();
  last_call_ = name;
  // One call needs no group: NCCL matches it with the peer's ncclRecv, in the pair's order.
  DSTRAIN_NCCL_ENQUEUE(ncclSend(buf.data, static_cast<std::size_t>(buf.numel()), nccl_type(buf.dtype), peer, comm_, stream_));
  after_enqueue();
}

void NcclCommunicator::do_recv(const Tensor& buf, int peer) {
  check_usable();
  const std::string name = describe_point_to_point({false, peer, rank(), recvs_from(peer), buf.dtype, buf.numel()});
  check_device_named(buf, "the buffer", name);
  wait_for_compute();
  last_call_ = name;
  DSTRAIN_NCCL_ENQUEUE(ncclRecv(buf.data, static_cast<std::size_t>(buf.numel()), nccl_type(buf.dtype), peer, comm_, stream_));
  after_enqueue();
}

void NcclCommunicator::do_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) {
  check_usable();
  std::string names;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::string name = describe_point_to_point(calls[i]);
    check_device_named(ops[i].buffer, "the buffer", name);
    names += (i == 0 ? "" : ", ") + name;
  }
  wait_for_compute();
  last_call_ = fmt::format("send_recv of {}", names);
  // One group: NCCL posts every op of it before any waits (the deadlock-free exchange between
  // neighbours), and matches each with the peer's call in the pair's order as single calls are.
  DSTRAIN_NCCL_ENQUEUE(ncclGroupStart());
  for (const PointToPointOp& op : ops) {
    const auto count = static_cast<std::size_t>(op.buffer.numel());
    if (op.is_send) {
      DSTRAIN_NCCL_ENQUEUE(ncclSend(op.buffer.data, count, nccl_type(op.buffer.dtype), op.peer, comm_, stream_));
    } else {
      DSTRAIN_NCCL_ENQUEUE(ncclRecv(op.buffer.data, count, nccl_type(op.buffer.dtype), op.peer, comm_, stream_));
    }
  }
  DSTRAIN_NCCL_ENQUEUE(ncclGroupEnd());
  after_enqueue();
}

namespace {

// A started batch: the event recorded on the communicator's stream right after its group.
struct NcclPending final : PendingPointToPoint {
  int device = 0;
  cudaEvent_t done = nullptr;
  ~NcclPending() override {
    if (done != nullptr) {
      CudaDeviceScope current(device);
      cudaEventDestroy(done);  // deferred by CUDA until the event completed
    }
  }
};

}  // namespace

// The group as send_recv queues it, then an event of its own: wait() orders compute after this
// batch only (not after collectives queued since), and the host never blocks.
std::unique_ptr<PendingPointToPoint> NcclCommunicator::do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) {
  do_send_recv(ops, calls);
  CudaDeviceScope current(device_);
  auto pending = std::make_unique<NcclPending>();
  pending->device = device_;
  DSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming));
  DSTRAIN_CUDA_CHECK(cudaEventRecord(pending->done, stream_));
  return pending;
}

void NcclCommunicator::do_wait(PendingPointToPoint& pending) {
  auto& p = static_cast<NcclPending&>(pending);
  CudaDeviceScope current(device_);
  DSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, p.done, 0));
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key) {
  check_usable();
  CudaDeviceScope current(device_);
  last_call_ = fmt::format("split (ncclCommSplit, color {}, key {}) after collective #{}", color, key, sequence());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;    // as the parent: a rank that never splits gives a timeout, not a hang
  config.splitShare = 0;  // the child's own channels and buffers: it must outlive the parent if need be
  ncclComm_t child = nullptr;
  const ncclResult_t status = ncclCommSplit(comm_, color, key, &child, &config);
  if (status != ncclSuccess && status != ncclInProgress) {
    if (child != nullptr) (void)ncclCommAbort(child);
    DSTRAIN_NCCL_ENQUEUE(status);  // aborts this communicator and throws, naming the call
  }
  DSTRAIN_CHECK(child != nullptr, "NCCL on rank {}: ncclCommSplit (color {}, key {}) returned no communicator", rank(), color, key);
  // Non-blocking: both the parent (the split is its collective) and the child report ncclInProgress
  // until the child is connected; poll_until watches the parent and the deadline, `done` the child.
  std::string child_failure;
  try {
    poll_until(
        [&] {
          ncclResult_t state = ncclSuccess;
          const ncclResult_t query = ncclCommGetAsyncError(child, &state);
          if (query != ncclSuccess) state = query;
          if (state == ncclInProgress) return false;
          if (state != ncclSuccess) {
            const char* detail = ncclGetLastError(child);
            child_failure =
                fmt::format("{}{}{}", ncclGetErrorString(state), detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : "");
          }
          return true;
        },
        fmt::format("splitting the communicator (color {}, key {})", color, key));
  } catch (...) {
    if (child != nullptr) (void)ncclCommAbort(child);
    throw;
  }
  if (!child_failure.empty()) {
    (void)ncclCommAbort(child);
    abort_with(
        fmt::format("NCCL failed on rank {} of {} while splitting the communicator (color {}, key {}): {}. The communicator was "
                    "aborted. Fix: check the other ranks' logs and rerun with NCCL_DEBUG=WARN",
                    rank(), world_size(), color, key, child_failure));
  }
  int child_rank = 0, child_size = 0;
  const ncclResult_t rank_status = ncclCommUserRank(child, &child_rank);
  const ncclResult_t size_status = ncclCommCount(child, &child_size);
  if (rank_status != ncclSuccess || size_status != ncclSuccess) {
    (void)ncclCommAbort(child);
    abort_with(fmt::format("NCCL on rank {}: the communicator split off (color {}) cannot tell its rank and size: {}", rank(), color,
                           ncclGetErrorString(rank_status != ncclSuccess ? rank_status : size_status)));
  }
  last_call_ = fmt::format("split (color {}, key {}) after collective #{}", color, key, sequence());
  // The child's own stream and events; the same device and compute stream. Its constructor
  // aborts `child` if it fails.
  return std::unique_ptr<Communicator>(new NcclCommunicator(Adopt{}, child, child_rank, child_size, device_, timeout_, compute_stream_));
}

void NcclCommunicator::do_barrier() {
  check_usable();
  wait_for_compute();
  last_call_ = fmt::format("barrier #{}", sequence());
  DSTRAIN_NCCL_ENQUEUE(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_));
  after_enqueue();
  synchronize();
}

}  // namespace dstrain
