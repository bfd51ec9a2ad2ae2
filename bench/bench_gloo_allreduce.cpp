// bench_gloo_allreduce: the OSU-style all-reduce loop of bench_mpi_allreduce for the Gloo backend:
// Gloo's own ring all-reduce (gloo::allreduce, fp32 sum: what torch.distributed's gloo backend
// runs) against dstrain's GlooCommunicator::all_reduce (fp32 and bf16; the pairwise rank-order
// reduction of zero/pairwise_collectives.h, over the same Gloo transport). Prints, on rank 0, per
// size: µs per call (the slowest rank's mean), algorithm and bus bandwidth. Never asserts.
//
//   bash tests/unit/zero/run_ranks.sh 2 build/bench/bench_gloo_allreduce [max_bytes=67108864] [iterations=20]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "ops/dtype.h"
#include "ops/tensor.h"
#include "zero/gloo_communicator.h"
#include "zero/launch_env.h"
#include "zero/tcp_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using dstrain::Communicator;

// Gloo's Store over dstrain's TcpStore, for the peer's own context.
class Store final : public gloo::rendezvous::Store {
 public:
  explicit Store(dstrain::TcpStore& s) : s_(s) {}
  void set(const std::string& k, const std::vector<char>& v) override { s_.set(k, v); }
  std::vector<char> get(const std::string& k) override { return s_.get(k); }
  void wait(const std::vector<std::string>& k) override { s_.wait(k); }
  void wait(const std::vector<std::string>& k, const std::chrono::milliseconds& t) override { s_.wait(k, t); }

 private:
  dstrain::TcpStore& s_;
};

// Mean seconds per call over `iterations` after 2 warm-up calls, the slowest rank's.
template <typename Fn>
double time_calls(Communicator& comm, Fn fn, int iterations) {
  for (int i = 0; i < 2; ++i) fn();
  comm.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) fn();
  double t = std::chrono::duration<double>(Clock::now() - t0).count() / iterations;
  comm.all_reduce(dstrain::Tensor(&t, dstrain::DType::fp64, dstrain::Shape{1}), dstrain::ReduceOp::max);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const dstrain::LaunchEnv env = dstrain::detect_launch_env();
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (64u << 20);
  const int iterations_arg = argc > 2 ? std::atoi(argv[2]) : 20;
  const int w = env.world_size;
  const bool lead = env.rank == 0;
  dstrain::GlooCommunicator comm(env);
  // The peer: Gloo's own context, its store one port above dstrain's.
  dstrain::TcpStore tcp(env.master_addr.empty() ? "localhost" : env.master_addr, env.master_port + 1, lead, std::chrono::seconds(60));
  Store store(tcp);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(env.rank, w);
  context->connectFullMesh(store, device);
  if (lead) {
    std::printf("# bench_gloo_allreduce: %d processes (Gloo TCP transport on the loopback)\n", w);
    std::printf("# time = mean per call (slowest rank); algbw = bytes / time; busbw = algbw x 2(W-1)/W\n");
    std::printf("%12s | %-28s | %-28s | %-28s\n", "bytes", "gloo::allreduce fp32 (ring)", "GlooCommunicator fp32", "GlooCommunicator bf16");
    std::printf("%12s | %9s %8s %8s | %9s %8s %8s | %9s %8s %8s\n", "", "us", "algGB/s", "busGB/s", "us", "algGB/s", "busGB/s", "us", "algGB/s",
                "busGB/s");
  }
  const double bus = w > 1 ? 2.0 * (w - 1) / w : 1.0;
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / 4;
    const int iterations = bytes >= (16u << 20) ? std::max(5, iterations_arg / 4) : iterations_arg;
    std::vector<float> a(n, 1.0f + static_cast<float>(env.rank));
    const double t_gloo = time_calls(
        comm,
        [&] {
          gloo::AllreduceOptions opts(context);
          opts.setOutput(a.data(), n);
          opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          gloo::allreduce(opts);
        },
        iterations);
    const double t_ours = time_calls(
        comm, [&] { comm.all_reduce(dstrain::Tensor(a.data(), dstrain::DType::fp32, dstrain::Shape{static_cast<std::int64_t>(n)}), dstrain::ReduceOp::avg); },
        iterations);
    const double t_bf16 = time_calls(
        comm,
        [&] { comm.all_reduce(dstrain::Tensor(a.data(), dstrain::DType::bf16, dstrain::Shape{static_cast<std::int64_t>(2 * n)}), dstrain::ReduceOp::avg); },
        iterations);
    if (lead) {
      const auto alg = [&](double t) { return static_cast<double>(bytes) / t / 1e9; };
      std::printf("%12zu | %9.1f %8.2f %8.2f | %9.1f %8.2f %8.2f | %9.1f %8.2f %8.2f\n", bytes, t_gloo * 1e6, alg(t_gloo), alg(t_gloo) * bus,
                  t_ours * 1e6, alg(t_ours), alg(t_ours) * bus, t_bf16 * 1e6, alg(t_bf16), alg(t_bf16) * bus);
      std::fflush(stdout);
    }
  }
  return 0;
}
