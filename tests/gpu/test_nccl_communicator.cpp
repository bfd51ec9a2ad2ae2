// NcclCommunicator (label gpu). One GPU: every collective at world size 1, stream ordering, device
// checks, split, and the bootstrap timeout when a peer never joins. Two GPUs: the collectives,
// split and send/recv across two processes (this binary re-launched as rank 0 and rank 1) against independently
// computed sums, and a peer that leaves without the collective. Skipped, with the reason, without
// the GPUs.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpu_test.h"
#include "ops/cuda/cuda_check.h"
#include "device_buf.h"
#include "ops/error.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/nccl_communicator.h"

extern char** environ;

using namespace dstrain;
using dstrain::testing_comm::DeviceBuf;
using dstrain::testing_comm::expected_bits;
using dstrain::testing_comm::HostBuf;
using dstrain::testing_comm::input_value;
using ::testing::HasSubstr;

namespace {

HostBuf inputs(int rank, DType dt, std::int64_t n) {
  HostBuf h(dt, n);
  for (std::int64_t i = 0; i < n; ++i) h.set(i, input_value(rank, i));
  return h;
}

std::unique_ptr<NcclCommunicator> single_rank(std::chrono::milliseconds timeout = std::chrono::milliseconds(30'000)) {
  ncclUniqueId id;
  DSTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::make_unique<NcclCommunicator>(0, 1, id, NcclOptions{0, timeout});
}

constexpr DType kDtypes[] = {DType::fp32, DType::fp16, DType::bf16};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

}  // namespace

TEST(NcclCommunicator, NeedsAMasterAddressForMoreThanOneRank) {
  // No GPU needed: the check comes before any CUDA or NCCL call.
  const char* preset = std::getenv("NCCL_COMM_ID");
  if (preset != nullptr) GTEST_SKIP() << "NCCL_COMM_ID is set in this environment";
  LaunchEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.launcher = "mpirun";
  try {
    NcclCommunicator comm(env);
    FAIL() << "constructed without an address";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no address for rank 0"));
    EXPECT_THAT(e.what(), HasSubstr("MASTER_ADDR"));
  }
}

TEST(NcclCommunicator, WorldSizeOneEveryCollectiveAndDtype) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  auto comm = single_rank();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->backend(), "nccl");
  const std::int64_t n = 1003;
  for (const DType dt : kDtypes) {
    for (const ReduceOp op : kOps) {
      DeviceBuf d(inputs(0, dt, n));
      comm->all_reduce(d.tensor(), op);
      comm->synchronize();
      const HostBuf out = d.to_host();
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(out.bits(i), expected_bits(op, dt, 1, i)) << dtype_name(dt) << " " << reduce_op_name(op) << " " << i;
    }
    // Out of place, W = 1: reduce-scatter and all-gather are copies; NCCL must move every byte.
    DeviceBuf src(inputs(0, dt, n));
    DeviceBuf dst(HostBuf(dt, n));
    comm->reduce_scatter(src.tensor(), dst.tensor(), ReduceOp::sum);
    comm->synchronize();
    HostBuf out = dst.to_host();
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(out.get(i), input_value(0, i)) << "reduce_scatter " << i;
    DeviceBuf dst2(HostBuf(dt, n));
    comm->all_gather(src.tensor(), dst2.tensor());
    comm->broadcast(src.tensor(), 0);
    comm->barrier();
    out = dst2.to_host();
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(out.get(i), input_value(0, i)) << "all_gather " << i;
    // In place forms.
    comm->reduce_scatter(src.tensor(), shard_of(src.tensor(), 0, 1), ReduceOp::avg);
    comm->all_gather(shard_of(src.tensor(), 0, 1), src.tensor());
    comm->synchronize();
    out = src.to_host();
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(out.get(i), input_value(0, i)) << "in place " << i;
  }
  const CommStats& s = comm->stats();
  EXPECT_EQ(s.call_count(CollectiveKind::all_reduce), 9u);
  EXPECT_EQ(s.call_count(CollectiveKind::reduce_scatter), 6u);
  EXPECT_EQ(s.call_count(CollectiveKind::all_gather), 6u);
  EXPECT_EQ(s.call_count(CollectiveKind::broadcast), 3u);
  EXPECT_EQ(s.call_count(CollectiveKind::barrier), 3u);
  EXPECT_EQ(s.total_bytes_sent(), 0u);  // one rank sends nothing
}

TEST(NcclCommunicator, Int32CountsSumAndMax) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  auto comm = single_rank();
  HostBuf h(DType::int32, 3);
  for (int i = 0; i < 3; ++i) h.set(i, 1000 * (i - 1));
  DeviceBuf d(h);
  comm->all_reduce(d.tensor(), ReduceOp::sum);
  comm->all_reduce(d.tensor(), ReduceOp::max);
  comm->synchronize();
  const HostBuf out = d.to_host();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out.get(i), 1000 * (i - 1));
}

// The collective waits for the compute stream's copy; compute_wait_for_comm orders the copy back.
TEST(NcclCommunicator, OrderedWithTheComputeStreamByEvents) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  auto comm = single_rank();
  cudaStream_t compute = nullptr;
  DSTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  comm->set_compute_stream(compute);
  const std::int64_t n = 1 << 22;  // 16 MiB: a copy long enough for a missing wait to show
  HostBuf in = inputs(0, DType::fp32, n);
  DeviceBuf d(HostBuf(DType::fp32, n));
  DeviceBuf gathered(HostBuf(DType::fp32, n));
  HostBuf out(DType::fp32, n);
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(d.ptr, in.mem.data(), d.bytes(), cudaMemcpyHostToDevice, compute));
  comm->all_gather(d.tensor(), gathered.tensor());  // must see the copy's data
  comm->compute_wait_for_comm();
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(out.mem.data(), gathered.ptr, gathered.bytes(), cudaMemcpyDeviceToHost, compute));
  DSTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute));
  for (std::int64_t i = 0; i < n; i += 4099) ASSERT_EQ(out.get(i), input_value(0, i)) << i;
  ASSERT_EQ(out.get(n - 1), input_value(0, n - 1));
  comm.reset();
  DSTRAIN_CUDA_CHECK(cudaStreamDestroy(compute));
}

TEST(NcclCommunicator, HostAndOtherDeviceTensorsAreRejected) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  auto comm = single_rank();
  HostBuf h(DType::fp32, 8);
  try {
    comm->all_reduce(h.tensor(), ReduceOp::sum);
    FAIL() << "host tensor accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_reduce #1 on rank 0: the buffer is fp32[8] on cpu but this NCCL communicator works on cuda:0"));
  }
  comm->barrier();  // a rejected argument does not break the communicator
}

// ncclCommSplit at world size 1: the child is an NCCL communicator on the same GPU with the same
// compute stream, counts its own collectives only, and works after its parent is destroyed.
TEST(NcclCommunicator, SplitAtWorldSizeOneIsAnIndependentCommunicator) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::unique_ptr<Communicator> child;
  {
    auto parent = single_rank();
    const std::uint64_t before = parent->sequence();
    child = parent->split(5, 3);
    EXPECT_EQ(parent->sequence(), before) << "ncclCommSplit is not one of the parent's collectives";
    auto* nccl = dynamic_cast<NcclCommunicator*>(child.get());
    ASSERT_NE(nccl, nullptr);
    EXPECT_EQ(nccl->device(), parent->device());
    EXPECT_EQ(nccl->compute_stream(), parent->compute_stream());
    EXPECT_NE(nccl->stream(), parent->stream());
  }
  EXPECT_EQ(child->rank(), 0);
  EXPECT_EQ(child->world_size(), 1);
  EXPECT_EQ(child->backend(), "nccl");
  DeviceBuf d(inputs(0, DType::fp32, 257));
  child->all_reduce(d.tensor(), ReduceOp::sum);
  child->barrier();
  const HostBuf out = d.to_host();
  for (std::int64_t i = 0; i < 257; ++i) ASSERT_EQ(out.get(i), input_value(0, i)) << i;
  EXPECT_EQ(child->stats().call_count(CollectiveKind::all_reduce), 1u);
  EXPECT_EQ(child->stats().call_count(CollectiveKind::barrier), 1u);
  EXPECT_THROW((void)child->split(-1, 0), Error);
}

// A peer that never joins: rank 0 of 2 alone must fail with the timeout, not hang.
TEST(NcclCommunicator, BootstrapTimesOutWhenAPeerNeverJoins) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  if (std::getenv("NCCL_COMM_ID") != nullptr) GTEST_SKIP() << "NCCL_COMM_ID is set in this environment";
  LaunchEnv env;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = 20000 + static_cast<int>(::getpid() % 20000);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    NcclCommunicator comm(env, NcclOptions{0, std::chrono::milliseconds(3'000)});
    ADD_FAILURE() << "initialised without rank 1";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0 of 2 timed out after 3000 ms"));
    EXPECT_THAT(e.what(), HasSubstr("bootstrap"));
  }
  ::unsetenv("NCCL_COMM_ID");  // set by the constructor from MASTER_ADDR:MASTER_PORT
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// ---- two processes, one GPU each ----

namespace {

// Runs this test binary as `world` ranks with the torchrun variables and `mode`; returns exit codes.
std::vector<int> launch_ranks(int world, const std::string& mode) {
  const int port = 20000 + static_cast<int>((::getpid() * 7) % 20000);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv(*e);
      if (kv.rfind("NCCL_COMM_ID=", 0) == 0 || kv.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) continue;
      env_strings.push_back(kv);
    }
    for (const std::string& kv :
         {fmt::format("RANK={}", r), fmt::format("WORLD_SIZE={}", world), fmt::format("LOCAL_RANK={}", r), std::string("MASTER_ADDR=127.0.0.1"),
          fmt::format("MASTER_PORT={}", port), "DSTRAIN_NCCL_WORKER=" + mode, std::string("DSTRAIN_COMM_TIMEOUT=20")})
      env_strings.push_back(kv);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    std::string filter = "--gtest_filter=NcclWorker.Run";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid = 0;
    EXPECT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

bool two_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n >= 2;
}

}  // namespace

TEST(NcclTwoGpus, CollectivesAcrossTwoProcesses) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  if (!two_gpus()) GTEST_SKIP() << "needs 2 GPUs (one process per GPU)";
  const std::vector<int> codes = launch_ranks(2, "collectives");
  EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "a rank failed; its gtest output is above";
}

TEST(NcclTwoGpus, PeerThatLeavesGivesAnErrorNotAHang) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  if (!two_gpus()) GTEST_SKIP() << "needs 2 GPUs (one process per GPU)";
  const std::vector<int> codes = launch_ranks(2, "skip");
  EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "rank 0 must have seen an Error (its test checks the text)";
}

// The body of one rank in the tests above; skipped when run directly.
TEST(NcclWorker, Run) {
  const char* mode_env = std::getenv("DSTRAIN_NCCL_WORKER");
  if (mode_env == nullptr) GTEST_SKIP() << "runs only as a rank launched by the NcclTwoGpus tests";
  const std::string mode = mode_env;
  const LaunchEnv env = detect_launch_env();
  NcclCommunicator comm(env);
  const int w = comm.world_size();
  const int r = comm.rank();
  const Device dev = Device::cuda(comm.device());
  if (mode == "skip") {
    if (r == 1) return;  // leaves without the all-reduce rank 0 issues
    DeviceBuf d(inputs(r, DType::fp32, 1024));
    try {
      comm.all_reduce(d.tensor(), ReduceOp::sum);
      comm.synchronize();
      FAIL() << "all_reduce completed without rank 1";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 0 of 2"));
      EXPECT_THAT(e.what(), HasSubstr("all_reduce #1"));
    }
    return;
  }
  ASSERT_EQ(dev.index, r);
  const std::int64_t n = 1003;
  for (const DType dt : kDtypes) {
    for (const ReduceOp op : kOps) {
      HostBuf h = inputs(r, dt, n);
      void* p = nullptr;
      DSTRAIN_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(n) * dtype_size(dt)));
      DSTRAIN_CUDA_CHECK(cudaMemcpy(p, h.mem.data(), static_cast<std::size_t>(n) * dtype_size(dt), cudaMemcpyHostToDevice));
      comm.all_reduce(Tensor(p, dt, Shape{n}, dev), op);
      comm.synchronize();
      DSTRAIN_CUDA_CHECK(cudaMemcpy(h.mem.data(), p, static_cast<std::size_t>(n) * dtype_size(dt), cudaMemcpyDeviceToHost));
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(h.bits(i), expected_bits(op, dt, w, i)) << dtype_name(dt) << " " << reduce_op_name(op) << " " << i;
      // Reduce-scatter in place over the first w·(n / w) elements, then all-gather it back.
      const std::int64_t m = (n / w) * w;
      const Tensor flat(p, dt, Shape{m}, dev);
      HostBuf fresh = inputs(r, dt, n);
      DSTRAIN_CUDA_CHECK(cudaMemcpy(p, fresh.mem.data(), static_cast<std::size_t>(n) * dtype_size(dt), cudaMemcpyHostToDevice));
      comm.reduce_scatter(flat, shard_of(flat, r, w), op);
      comm.all_gather(shard_of(flat, r, w), flat);
      comm.synchronize();
      DSTRAIN_CUDA_CHECK(cudaMemcpy(h.mem.data(), p, static_cast<std::size_t>(m) * dtype_size(dt), cudaMemcpyDeviceToHost));
      for (std::int64_t i = 0; i < m; ++i)
        ASSERT_EQ(h.bits(i), expected_bits(op, dt, w, i)) << "rs+ag " << dtype_name(dt) << " " << reduce_op_name(op) << " " << i;
      DSTRAIN_CUDA_CHECK(cudaFree(p));
    }
  }
  HostBuf b = inputs(r, DType::bf16, 77);
  DeviceBuf d(b);
  comm.broadcast(Tensor(d.ptr, DType::bf16, Shape{77}, dev), 1);
  comm.barrier();
  HostBuf out(DType::bf16, 77);
  DSTRAIN_CUDA_CHECK(cudaMemcpy(out.mem.data(), d.ptr, 77 * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 77; ++i) ASSERT_EQ(out.get(i), input_value(1, i)) << "broadcast " << i;
  // Bytes as defined in zero/communicator.h, written out for W = 2: all-reduce N, RS/AG N/2, bcast N at root.
  const CommStats& s = comm.stats();
  std::uint64_t all_reduce_bytes = 0, rs_bytes = 0;
  for (const DType dt : kDtypes) {
    all_reduce_bytes += 3 * static_cast<std::uint64_t>(n) * dtype_size(dt);
    rs_bytes += 3 * static_cast<std::uint64_t>((n / w) * w / 2) * dtype_size(dt);
  }
  EXPECT_EQ(s.bytes_sent(CollectiveKind::all_reduce), all_reduce_bytes);
  EXPECT_EQ(s.bytes_sent(CollectiveKind::reduce_scatter), rs_bytes);
  EXPECT_EQ(s.bytes_sent(CollectiveKind::all_gather), rs_bytes);
  EXPECT_EQ(s.bytes_sent(CollectiveKind::broadcast), r == 1 ? 77u * 2 : 0u);

  // ncclCommSplit across the two processes: one group whose keys reverse the ranks, then a group
  // per rank. The pair's sum is the two inputs' (expected_bits over W = 2), the singles' their own.
  std::unique_ptr<Communicator> reversed = comm.split(0, -r);
  std::unique_ptr<Communicator> alone = comm.split(r, 0);
  EXPECT_EQ(reversed->world_size(), 2);
  EXPECT_EQ(reversed->rank(), 1 - r);
  EXPECT_EQ(alone->world_size(), 1);
  DeviceBuf pair_buf(inputs(r, DType::fp32, n)), own_buf(inputs(r, DType::fp32, n));
  reversed->all_reduce(Tensor(pair_buf.ptr, DType::fp32, Shape{n}, dev), ReduceOp::sum);
  alone->all_reduce(Tensor(own_buf.ptr, DType::fp32, Shape{n}, dev), ReduceOp::sum);
  reversed->synchronize();
  alone->synchronize();
  HostBuf pair_out(DType::fp32, n), own_out(DType::fp32, n);
  DSTRAIN_CUDA_CHECK(cudaMemcpy(pair_out.mem.data(), pair_buf.ptr, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToHost));
  DSTRAIN_CUDA_CHECK(cudaMemcpy(own_out.mem.data(), own_buf.ptr, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToHost));
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(pair_out.bits(i), expected_bits(ReduceOp::sum, DType::fp32, 2, i)) << "split pair " << i;
    ASSERT_EQ(own_out.get(i), input_value(r, i)) << "split single " << i;
  }
  EXPECT_EQ(reversed->stats().bytes_sent(CollectiveKind::all_reduce), static_cast<std::uint64_t>(n) * 4);  // 2(W-1)/W N at W = 2
  EXPECT_EQ(alone->stats().bytes_sent(CollectiveKind::all_reduce), 0u);

  // Point-to-point (ncclSend / ncclRecv): rank 0 sends forward, rank 1 back, twice each way so
  // that the pair's order shows; the second message in the other dtype. On the world group and on
  // the reversed split (whose rank 0 is world rank 1).
  for (Communicator* c : {static_cast<Communicator*>(&comm), reversed.get()}) {
    const int me = c->rank(), peer = 1 - me;
    DeviceBuf first(inputs(r, DType::bf16, 129)), second(inputs(r + 2, DType::fp32, 65));
    DeviceBuf got_first(DType::bf16, 129), got_second(DType::fp32, 65);
    const CommStats before = c->stats();
    const std::uint64_t seq = c->sequence();
    if (me == 0) {
      c->send(Tensor(first.ptr, DType::bf16, Shape{129}, dev), peer);
      c->send(Tensor(second.ptr, DType::fp32, Shape{65}, dev), peer);
      c->recv(Tensor(got_first.ptr, DType::bf16, Shape{129}, dev), peer);
      c->recv(Tensor(got_second.ptr, DType::fp32, Shape{65}, dev), peer);
    } else {
      c->recv(Tensor(got_first.ptr, DType::bf16, Shape{129}, dev), peer);
      c->recv(Tensor(got_second.ptr, DType::fp32, Shape{65}, dev), peer);
      c->send(Tensor(first.ptr, DType::bf16, Shape{129}, dev), peer);
      c->send(Tensor(second.ptr, DType::fp32, Shape{65}, dev), peer);
    }
    c->synchronize();
    const HostBuf got_a = got_first.to_host(), got_b = got_second.to_host();
    const HostBuf want_a = inputs(1 - r, DType::bf16, 129), want_b = inputs(1 - r + 2, DType::fp32, 65);  // the peer's (world rank 1 − r)
    for (int i = 0; i < 129; ++i) ASSERT_EQ(got_a.bits(i), want_a.bits(i)) << "send/recv first " << i;
    for (int i = 0; i < 65; ++i) ASSERT_EQ(got_b.bits(i), want_b.bits(i)) << "send/recv second " << i;
    const CommStats delta = c->stats() - before;
    EXPECT_EQ(delta.bytes_sent(CollectiveKind::send), 129u * 2 + 65u * 4);
    EXPECT_EQ(delta.bytes_sent(CollectiveKind::recv), 0u);
    EXPECT_EQ(delta.call_count(CollectiveKind::recv), 2u);
    EXPECT_EQ(c->sequence(), seq) << "point-to-point calls are not collectives";
  }
}
