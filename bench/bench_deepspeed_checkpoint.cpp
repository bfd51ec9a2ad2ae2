// bench_deepspeed_checkpoint: the time to save and load a DeepSpeed checkpoint folder — DeepSpeed's
// save_checkpoint layout (formats/deepspeed_checkpoint_writer.h, read back by
// formats/deepspeed_checkpoint.h) and the universal one — from and to a dstrain checkpoint's whole
// state, as `dstrain export` / `train --save-format deepspeed` and `train --resume-deepspeed` pay
// them. bench/deepspeed_checkpoint.sh runs it beside dstrain's own format (bench_checkpoint_io)
// and fio on the same disk. Never asserts.
//
//   build/bench/bench_deepspeed_checkpoint --from CKDIR --dir /tmp/ds --stage 2 --dp 2 --dtype bf16 --repeat 2
//
// Per round: the dstrain checkpoint read whole and mapped to Hugging Face names
// (deepspeed_state_of_checkpoint: its pieces read, checksums verified, transposes and cuts); the
// DeepSpeed folder written (torch.save zips of the partitions, each fsynced); its files dropped from
// the page cache and read back whole (read_deepspeed_checkpoint); the universal folder the same.
// Each with the bytes on disk and GB/s.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/checkpoint/deepspeed_export.h"
#include "formats/deepspeed_checkpoint.h"
#include "formats/deepspeed_checkpoint_writer.h"
#include "ops/error.h"

using namespace dstrain;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string from, dir = "/tmp/dstrain_bench_ds";
  DeepSpeedSaveLayout layout{2, 2, "bf16"};
  int repeat = 2;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_deepspeed_checkpoint: %s\nusage: bench_deepspeed_checkpoint --from CKDIR [--dir DIR] [--stage S] [--dp W] [--dtype D] [--repeat N]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing the value of " + k);
    const std::string v = argv[++i];
    if (k == "--from") a.from = v;
    else if (k == "--dir") a.dir = v;
    else if (k == "--stage") a.layout.zero_stage = std::atoi(v.c_str());
    else if (k == "--dp") a.layout.dp_world_size = std::atoi(v.c_str());
    else if (k == "--dtype") a.layout.dtype = v;
    else if (k == "--repeat") a.repeat = std::max(1, std::atoi(v.c_str()));
    else usage("unknown option " + k);
  }
  if (a.from.empty()) usage("--from CKDIR (a dstrain --save-dir) is required");
  return a;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every file under `dir`: its bytes in all, after dropping it from the page cache (clean after the
// writer's fsync), so that a load reads the disk as fio's read does.
std::uint64_t evict_and_count(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    n += e.file_size();
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  return n;
}

void line(const char* what, double seconds, std::uint64_t bytes) {
  std::printf("%-44s %8.3f s  %8.3f GB  -> %6.2f GB/s\n", what, seconds, static_cast<double>(bytes) / 1e9,
              seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    for (int r = 1; r <= a.repeat; ++r) {
      std::printf("== round %d of %d: DeepSpeed ZeRO stage %d on %d ranks, %s\n", r, a.repeat, a.layout.zero_stage, a.layout.dp_world_size,
                  a.layout.dtype.c_str());
      fs::remove_all(a.dir);
      auto t = Clock::now();
      const DeepSpeedTrainingState s = deepspeed_state_of_checkpoint(a.from, "");
      const double t_map = since(t);
      std::uint64_t state_bytes = 0;
      for (const auto& [n, v] : s.master) state_bytes += v.size() * 4;
      for (const auto& [k, m] : s.optimizer_states)
        for (const auto& [n, v] : m) state_bytes += v.size() * 4;
      line("dstrain checkpoint read whole + mapped", t_map, state_bytes);

      const fs::path ds = fs::path(a.dir) / "deepspeed";
      t = Clock::now();
      write_deepspeed_checkpoint(ds, s, a.layout);
      const double t_save = since(t);
      const std::uint64_t ds_bytes = evict_and_count(ds);
      line("save  DeepSpeed layout (write + fsync)", t_save, ds_bytes);
      t = Clock::now();
      const DeepSpeedTrainingState back = read_deepspeed_checkpoint(ds);
      line("load  DeepSpeed layout (cold, read whole)", since(t), ds_bytes);
      if (back.master.size() != s.master.size()) std::printf("  (read %zu masters of %zu)\n", back.master.size(), s.master.size());

      const fs::path uni = fs::path(a.dir) / "universal";
      t = Clock::now();
      write_universal_checkpoint(uni, s);
      const double t_usave = since(t);
      const std::uint64_t u_bytes = evict_and_count(uni);
      line("save  universal (write + fsync)", t_usave, u_bytes);
      t = Clock::now();
      (void)read_deepspeed_checkpoint(uni);
      line("load  universal (cold, read whole)", since(t), u_bytes);
    }
    fs::remove_all(a.dir);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_deepspeed_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
