// bench_mpi_allreduce: an OSU-style all-reduce loop (osu_allreduce's shape: sizes doubling, warm-up
// iterations, then the mean time per call, the slowest rank's) comparing MPI's own MPI_Allreduce
// (fp32, MPI_SUM) with dstrain's MpiCommunicator::all_reduce (fp32 and bf16, sum; the rank-order
// reduction, zero/mpi_communicator.h). Prints, on rank 0, per size: µs per call, the algorithm
// bandwidth (bytes of the buffer / time) and the bus bandwidth (× 2(W−1)/W, nccl-tests' convention:
// what each rank's link carries). Never asserts.
//
//   mpiexec -n 2 build/bench/bench_mpi_allreduce [max_bytes=67108864] [iterations=20]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <mpi.h>

#include "ops/dtype.h"
#include "ops/tensor.h"
#include "zero/mpi_communicator.h"
#include "zero/mpi_process.h"

namespace {

using Clock = std::chrono::steady_clock;

// Mean seconds per call of fn over `iterations` after `warmup` calls, the slowest rank's.
template <typename Fn>
double time_calls(Fn fn, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) fn();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) fn();
  double mine = std::chrono::duration<double>(Clock::now() - t0).count() / iterations;
  double slowest = mine;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  const dstrain::MpiWorld world = dstrain::init_mpi();
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (64u << 20);
  const int iterations_arg = argc > 2 ? std::atoi(argv[2]) : 20;
  const int w = world.world_size;
  const bool lead = world.rank == 0;
  {
    dstrain::MpiCommunicator comm;
    if (lead) {
      std::printf("# bench_mpi_allreduce: %d processes, %s, %s\n", w, world.library.c_str(), world.thread_level.c_str());
      std::printf("# time = mean per call (slowest rank); algbw = bytes / time; busbw = algbw x 2(W-1)/W\n");
      std::printf("%12s | %-28s | %-28s | %-28s\n", "bytes", "MPI_Allreduce fp32", "MpiCommunicator fp32", "MpiCommunicator bf16");
      std::printf("%12s | %9s %8s %8s | %9s %8s %8s | %9s %8s %8s\n", "", "us", "algGB/s", "busGB/s", "us", "algGB/s", "busGB/s", "us", "algGB/s",
                  "busGB/s");
    }
    const double bus = w > 1 ? 2.0 * (w - 1) / w : 1.0;
    for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
      const std::size_t n = bytes / 4;
      // A quarter of the iterations from 16 MiB on (at least 5): the large sizes dominate the run time.
      const int iterations = bytes >= (16u << 20) ? std::max(5, iterations_arg / 4) : iterations_arg;
      const int warmup = 2;
      std::vector<float> a(n, 1.0f + static_cast<float>(world.rank));
      std::vector<float> b(n);
      const double t_mpi =
          time_calls([&] { MPI_Allreduce(a.data(), b.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, warmup, iterations);
      const double t_ours = time_calls(
          [&] {
            comm.all_reduce(dstrain::Tensor(a.data(), dstrain::DType::fp32, dstrain::Shape{static_cast<std::int64_t>(n)}), dstrain::ReduceOp::avg);
          },
          warmup, iterations);
      // bf16: the same bytes as 2n half-width elements.
      const double t_bf16 = time_calls(
          [&] {
            comm.all_reduce(dstrain::Tensor(a.data(), dstrain::DType::bf16, dstrain::Shape{static_cast<std::int64_t>(2 * n)}),
                            dstrain::ReduceOp::avg);
          },
          warmup, iterations);
      if (lead) {
        const auto row = [&](double t) {
          const double alg = static_cast<double>(bytes) / t / 1e9;
          return std::make_pair(alg, alg * bus);
        };
        const auto [m1, m2] = row(t_mpi);
        const auto [o1, o2] = row(t_ours);
        const auto [f1, f2] = row(t_bf16);
        std::printf("%12zu | %9.1f %8.2f %8.2f | %9.1f %8.2f %8.2f | %9.1f %8.2f %8.2f\n", bytes, t_mpi * 1e6, m1, m2, t_ours * 1e6, o1, o2,
                    t_bf16 * 1e6, f1, f2);
        std::fflush(stdout);
      }
    }
  }
  dstrain::finalize_mpi();
  return 0;
}
