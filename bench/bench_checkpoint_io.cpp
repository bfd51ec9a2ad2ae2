// bench_checkpoint_io: CheckpointManager::save / load throughput (GB/s per rank) and the
// training stall of a decoupled save, on W local ranks. bench/checkpoint_io.sh runs it next to fio's
// sequential write / read of the same size on the same disk. Never asserts.
//
//   build/bench/bench_checkpoint_io --dir /tmp/ck --model gpt2:d12 --ranks 2 --stage 1 --dtype bf16 --repeat 2
//
// Figures per rank: the bytes it writes (its files), the synchronous save's time (streaming from
// the optimizer partition, write, fsync, commit), the load's (read, checksum, scatter into the
// store; the files are first dropped from the page cache, as fio's read drops its own file's),
// and with checkpoint.writer.decoupled the time save blocks (the snapshot into host
// memory) against the time until the background write is committed.
//
// The training stall (issue 13's goal: a decoupled save stalls training no longer than the copy
// into host memory): --steps rounds (default 1) of a training step (forward, backward, optimizer
// step of one micro-batch of 16 tokens) followed by a synchronous save, a step followed by a
// decoupled save, and the step after it while its files are written in the background; each
// save's time is the training stall it causes. Beside them, in the same round, the copy of the
// rank's bytes into host memory already faulted in: memcpy between two touched buffers (what a
// program's snapshot pays) and the engine's own copy_tensor between two buffers of the snapshot's
// kind of memory (the floor of the engine's snapshot).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "engine/engine.h"
#include "ops/kernels/tensor_ops.h"
#include "zero/local_communicator.h"
#include "models/gpt2/gpt2_family.h"
#include "models/model_registry.h"

namespace {

struct Args {
  std::string dir = "/tmp/dstrain_bench_ckpt", model = "gpt2:L6-C512-H8-T256", dtype = "bf16";
  std::string writer;  // checkpoint.writer.type; empty: no writer block (the engine's choice)
  long io_buffer_mib = 64;
  long ranks = 2, stage = 1, repeat = 2;
  long steps = 1;  // rounds of the training-stall measurement (0: none)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_checkpoint_io: %s\noptions: --dir DIR --model SPEC --ranks W --stage S --dtype fp32|bf16|fp16 --repeat N [--writer "
               "fast|python] [--io-buffer-mib N] [--steps N]\n",
               why.c_str());
  std::exit(2);
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Drops a checkpoint's files from the page cache (they are clean after the save's fsync), so the
// load reads the disk as fio's read does (fio invalidates its file's cache before reading).
void evict(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

std::uint64_t folder_bytes(const std::filesystem::path& p, const std::string& prefix) {
  std::uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(p))
    if (e.path().filename().string().starts_with(prefix)) n += e.file_size();
  return n;
}

// One round of the training-stall measurement, in seconds.
struct Round {
  double step = 0, sync = 0, dec = 0, after = 0, memcpy = 0, engine_copy = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--dir")
      a.dir = v;
    else if (k == "--model")
      a.model = v;
    else if (k == "--dtype")
      a.dtype = v;
    else if (k == "--ranks")
      a.ranks = std::atol(v);
    else if (k == "--stage")
      a.stage = std::atol(v);
    else if (k == "--repeat")
      a.repeat = std::atol(v);
    else if (k == "--writer")
      a.writer = v;
    else if (k == "--io-buffer-mib")
      a.io_buffer_mib = std::atol(v);
    else if (k == "--steps")
      a.steps = std::atol(v);
    else
      usage("unknown option " + k);
  }
  using namespace dstrain;
  try {
    const std::string prec = a.dtype == "bf16" ? R"(, "bf16": {"enabled": true})" : a.dtype == "fp16" ? R"(, "fp16": {"enabled": true})" : "";
    const auto json = [&](bool decoupled) {
      const std::string writer = a.writer.empty() && !decoupled ? ""
                                 : a.writer.empty()
                                     ? R"(, "checkpoint": {"writer": {"decoupled": true}})"
                                     : fmt::format(R"(, "checkpoint": {{"writer": {{"type": "{}", "decoupled": {}, "io_buffer_size": {}}}}})",
                                                   a.writer, decoupled, a.io_buffer_mib << 20);
      return fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}, "zero_optimization": {{"stage": {}}}{}{}}})",
                         a.stage, writer, prec);
    };
    std::filesystem::remove_all(a.dir);
    std::mutex mu;
    double save_s = 0, load_s = 0, stall_s = 0, commit_s = 0;
    std::vector<Round> rounds;  // rank 0's
    std::uint64_t bytes = 0;
    run_local_ranks(static_cast<int>(a.ranks), [&](Communicator& comm) {
      config::ConfigOptions co;
      co.world_size = static_cast<int>(a.ranks);
      EngineOptions o;
      o.comm = &comm;
      o.sequence_length = 16;
      Engine sync = initialize(make_gpt2_model(a.model), config::parse_ds_config(config::Json::parse(json(false)), co), o);
      CheckpointManager sync_checkpoints(sync);
      double s = 1e30, l = 1e30;
      for (long r = 0; r < a.repeat; ++r) {
        comm.barrier();
        auto t = Clock::now();
        sync_checkpoints.save(a.dir, fmt::format("sync{}", r));
        comm.barrier();
        s = std::min(s, since(t));
        if (comm.rank() == 0) evict(std::filesystem::path(a.dir) / fmt::format("sync{}", r));
        comm.barrier();
        t = Clock::now();
        sync_checkpoints.load(a.dir, fmt::format("sync{}", r));
        comm.barrier();
        l = std::min(l, since(t));
      }
      Engine dec = initialize(make_gpt2_model(a.model), config::parse_ds_config(config::Json::parse(json(true)), co), o);
      CheckpointManager dec_checkpoints(dec);
      double st = 1e30, cm = 1e30;
      for (long r = 0; r < a.repeat; ++r) {
        comm.barrier();
        auto t = Clock::now();
        dec_checkpoints.save(a.dir, fmt::format("dec{}", r));
        const double stall = since(t);
        dec_checkpoints.wait();
        comm.barrier();
        st = std::min(st, stall);
        cm = std::min(cm, since(t));
      }
      // Training steps: one fixed micro-batch (a step's time does not depend on the tokens).
      const std::int64_t vocab = model_architecture(a.model)->vocab_size();
      std::vector<std::int32_t> tok(o.sequence_length + 1);
      std::uint32_t lcg = 1;
      for (auto& t : tok) {
        lcg = lcg * 1664525u + 1013904223u;
        t = static_cast<std::int32_t>((lcg >> 8) % static_cast<std::uint32_t>(vocab));
      }
      const Shape bt{1, o.sequence_length};
      const Batch batch{Tensor(tok.data(), DType::int32, bt), Tensor(tok.data() + 1, DType::int32, bt)};
      const auto step = [&batch](Engine& e) {
        e.forward(batch);
        e.backward();
        e.step();
      };
      // Times f on every rank together; the slowest rank's time.
      const auto timed = [&comm](auto&& f) {
        comm.barrier();
        const auto t = Clock::now();
        f();
        comm.barrier();
        return since(t);
      };
      // Rounds of: a step, a synchronous save; a step, a decoupled save; a step while that save's
      // files are written; then, with the files committed, the two reference copies of the rank's
      // bytes. The saves' own times are the stall (a step's time moves by more than a snapshot on
      // a shared machine, so stalls are not step-time differences), and each is set beside the
      // copies timed in the same round: this VM's memory bandwidth moves by 2x within minutes.
      const std::size_t rank_bytes = dec_checkpoints.rank_bytes();
      CheckpointMemory ref_from, ref_to;
      std::vector<std::byte> plain_from, plain_to;
      if (a.steps > 0 && rank_bytes > 0) {
        ref_from = allocate_checkpoint_memory(rank_bytes, HostPages::huge);  // the snapshot's kind of memory
        ref_to = allocate_checkpoint_memory(rank_bytes, HostPages::huge);
        std::memset(ref_from.get(), 1, rank_bytes);
        std::memset(ref_to.get(), 0, rank_bytes);
        plain_from.assign(rank_bytes, std::byte{1});  // what a program's malloc gets: 4 KiB pages
        plain_to.assign(rank_bytes, std::byte{0});
        step(sync);  // warm-up: the gradients' and activations' memory
        step(dec);
      }
      const auto bytes_of = [](std::byte* p, std::size_t n) { return Tensor(p, DType::uint16, Shape{static_cast<std::int64_t>(n / 2)}); };
      for (long r = 0; r < a.steps; ++r) {
        Round x;
        x.step = timed([&] { step(sync); });
        x.sync = timed([&] { sync_checkpoints.save(a.dir, fmt::format("step_sync{}", r)); });
        x.step = std::min(x.step, timed([&] { step(dec); }));
        x.dec = timed([&] { dec_checkpoints.save(a.dir, fmt::format("step_dec{}", r)); });
        x.after = timed([&] { step(dec); });  // while the files are written
        dec_checkpoints.wait();
        if (rank_bytes > 0) {
          // Each the faster of two copies back to back: the reference at its best.
          const auto plain = [&] { std::memcpy(plain_to.data(), plain_from.data(), rank_bytes); };
          const auto engine_copy = [&] { copy_tensor(bytes_of(ref_to.get(), rank_bytes), bytes_of(ref_from.get(), rank_bytes)); };
          x.memcpy = std::min(timed(plain), timed(plain));
          x.engine_copy = std::min(timed(engine_copy), timed(engine_copy));
        }
        if (comm.rank() == 0) rounds.push_back(x);
      }
      const std::lock_guard<std::mutex> lock(mu);
      if (comm.rank() == 0) {
        save_s = s;
        load_s = l;
        stall_s = st;
        commit_s = cm;
        bytes = folder_bytes(std::filesystem::path(a.dir) / "sync0", "rank_00000.");
      }
    });
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf("model %s, %s, ZeRO stage %ld on %ld rank(s), writer %s: %.3f GB per rank (rank 0's files)\n", a.model.c_str(), a.dtype.c_str(),
                a.stage, a.ranks, a.writer.empty() ? "(no writer block: the engine's choice)" : a.writer.c_str(), gb);
    std::printf("save (synchronous, fsync, commit): %.3f s  -> %.2f GB/s per rank, %.2f GB/s all ranks\n", save_s, gb / save_s,
                gb * a.ranks / save_s);
    std::printf("load (cold: read, crc32c, scatter): %.3f s  -> %.2f GB/s per rank, %.2f GB/s all ranks\n", load_s, gb / load_s,
                gb * a.ranks / load_s);
    std::printf("decoupled save, no step before it: save returns after %.3f s (the snapshot), committed after %.3f s; synchronous %.3f s\n", stall_s,
                commit_s, save_s);
    if (!rounds.empty()) {
      std::printf(
          "in training, ms per round (the slowest rank's; memcpy: the rank's bytes between two 4 KiB-page buffers on one thread; "
          "engine copy: copy_tensor between two snapshot-memory buffers):\n");
      std::printf("  %5s %8s %12s %14s %16s %8s %11s %14s %17s\n", "round", "step", "sync stall", "decoupled stall", "next step (bg write)", "memcpy",
                  "engine copy", "stall/memcpy", "stall/engine copy");
      std::vector<double> by_memcpy, by_engine;
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        const Round& x = rounds[r];
        by_memcpy.push_back(x.dec / x.memcpy);
        by_engine.push_back(x.dec / x.engine_copy);
        std::printf("  %5zu %8.1f %12.1f %15.1f %20.1f %8.1f %11.1f %14.2f %17.2f\n", r, x.step * 1e3, x.sync * 1e3, x.dec * 1e3, x.after * 1e3,
                    x.memcpy * 1e3, x.engine_copy * 1e3, by_memcpy.back(), by_engine.back());
      }
      std::printf("decoupled stall / memcpy of the same bytes: median %.2f over %zu rounds (goal: <= 1); / the engine's own copy: median %.2f\n",
                  median(by_memcpy), rounds.size(), median(by_engine));
    }
    std::filesystem::remove_all(a.dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint_io: %s\n", e.what());
    return 1;
  }
  return 0;
}
