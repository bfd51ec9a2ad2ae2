#include "io_bench_command.h"

#include <unistd.h>

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <dstrain/dstrain.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_options.h"

namespace dstrain::cli {
namespace {

struct IoBenchArgs {
  std::string path;
  std::uint64_t size = std::uint64_t{1} << 30;
  std::vector<std::uint64_t> block_sizes;
  std::vector<std::uint64_t> queue_depths;
  std::optional<std::uint64_t> intra_op_parallelism;
  bool single_submit = false;
  bool no_overlap_events = false;
  std::uint64_t loops = 1;
  std::string config;
  bool json = false;
  bool keep = false;
  std::string pages = "huge";
  bool no_fixed_buffers = false;
};

// The transfer buffer. "huge": PinnedHostAllocator's, as the swappers' buffers (2 MiB-aligned,
// MADV_HUGEPAGE: a transfer's pages are few physically contiguous segments, so the block layer
// sends large requests). "base": 4 KiB pages (MADV_NOHUGEPAGE), as a program that mallocs its
// buffers — fio by default — gets: each request is limited to the device's max_segments pages.
class BenchBuffer {
 public:
  BenchBuffer(std::uint64_t bytes, bool huge) : bytes_(bytes), host_(/*lock=*/false) {
    if (huge) {
      data_ = static_cast<std::byte*>(host_.allocate(bytes, MemoryPurpose::buffers));
    } else {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) fail("io-bench: cannot map {} bytes for the transfer buffer; give a smaller --size", bytes);
      ::madvise(p, bytes, MADV_NOHUGEPAGE);
      data_ = static_cast<std::byte*>(p);
      mapped_ = true;
    }
    std::memset(data_, 0x5A, bytes);  // every page present before timing
  }
  ~BenchBuffer() {
    if (mapped_)
      ::munmap(data_, bytes_);
    else
      host_.deallocate(data_);
  }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;
  std::byte* data() const { return data_; }

 private:
  std::uint64_t bytes_;
  PinnedHostAllocator host_;
  std::byte* data_ = nullptr;
  bool mapped_ = false;
};

// --queue-depth: what one io_uring ring holds (the kernel's IORING_MAX_ENTRIES), so that a row
// reports the depth it measured.
CLI::Validator queue_depth_in_range() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        const unsigned long long v = digits ? std::strtoull(text.c_str(), &end, 10) : 0;
        if (digits && errno != ERANGE && v >= 1 && v <= IoOptions::kMaxQueueDepth) return std::string();
        return fmt::format("'{}' is not a queue depth an io_uring ring holds: give a whole number from 1 to {} (the kernel's IORING_MAX_ENTRIES)",
                           text, IoOptions::kMaxQueueDepth);
      },
      fmt::format("1..{}", IoOptions::kMaxQueueDepth));
}

// One transfer of --size is held in memory whole and written to a scratch file of that size: a
// size the machine cannot hold or the drive cannot take is refused before either is made, in
// io-bench's terms (an allocator's out-of-memory advice is about training).
void check_size_fits(std::uint64_t size, const std::string& path) {
  const double bytes = static_cast<double>(size);
  if (const std::optional<HostMemoryLimit> memory = host_memory_limit(); memory && bytes > memory->bytes) {
    fail(
        "io-bench --size {} ({}): the transfer buffer holds a whole transfer in memory, but this process may allocate only {} ({}); give a "
        "smaller --size",
        size, format_estimate_bytes(bytes), format_estimate_bytes(memory->bytes), memory->source);
  }
  std::error_code ec;
  const std::filesystem::space_info space = std::filesystem::space(path, ec);
  if (!ec && bytes > static_cast<double>(space.available)) {
    fail(
        "io-bench --size {} ({}): the scratch file is as large as a transfer, but {} has {} free; give a smaller --size, or a --path on a "
        "drive with more room",
        size, format_estimate_bytes(bytes), path, format_estimate_bytes(static_cast<double>(space.available)));
  }
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Measure {
  double seconds = 0;
  double cpu = 0;
};

// `loops` whole-file transfers of `bytes` as one request each, as ds_io does: the engine cuts it
// into block_size pieces and keeps queue_depth of them in flight per ring.
template <typename Transfer>
Measure time_transfers(std::uint64_t loops, Transfer&& transfer) {
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < loops; ++i) transfer().wait();
  Measure m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.cpu = cpu_seconds() - cpu0;
  return m;
}

void run_io_bench(const IoBenchArgs& args) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(args.path))
    fail("io-bench --path {}: not a folder; give an existing folder on the drive to measure (e.g. the nvme_path)", args.path);
  IoOptions base;  // DeepSpeed's aio defaults, or the config's aio block
  if (!args.config.empty()) {
    const ConfigText text = load_config_argument(args.config);
    config::ConfigOptions options;
    const config::DsConfig cfg = config::parse_ds_config(text.tree, options);
    for (const config::Warning& w : cfg.warnings)
      if (w.path.rfind("aio", 0) == 0) std::fprintf(stderr, "warning: %s: %s\n", w.path.c_str(), w.message.c_str());
    base = IoOptions::from_config(cfg.aio);
  }
  if (args.intra_op_parallelism) base.intra_op_parallelism = static_cast<unsigned>(*args.intra_op_parallelism);
  if (args.single_submit) base.single_submit = true;
  if (args.no_overlap_events) base.overlap_events = false;
  const std::vector<std::uint64_t> blocks = args.block_sizes.empty() ? std::vector<std::uint64_t>{base.block_size} : args.block_sizes;
  const std::vector<std::uint64_t> depths = args.queue_depths.empty() ? std::vector<std::uint64_t>{base.queue_depth} : args.queue_depths;
  if (args.size < IoEngine::kMinAlignment || args.size % IoEngine::kMinAlignment != 0)
    fail("io-bench --size {}: give a multiple of {} bytes (e.g. 1G)", args.size, IoEngine::kMinAlignment);

  // A scratch file of this process's own, created exclusively: a file of the user's by that name is
  // never truncated or removed.
  const std::string file = (fs::path(args.path) / fmt::format("dstrain_io_bench.{}.dat", ::getpid())).string();
  check_size_fits(args.size, args.path);
  BenchBuffer bench_buffer(args.size, args.pages == "huge");
  std::byte* buffer = bench_buffer.data();
  nlohmann::json rows = nlohmann::json::array();
  bool registered_any = false;
  bool created = false;  // the scratch file is ours to remove
  try {
    {
      // Laid out once, untimed, as fio lays out its file: reserved and then written whole, so every
      // measured write overwrites written blocks (a first write into fallocated blocks also pays for
      // converting unwritten extents, which would favour whoever writes second).
      IoEngine io(base);
      IoFile f = io.open(file, IoOpen::create_new);
      created = true;
      f.allocate(args.size);
      io.write(f, 0, buffer, args.size).wait();
    }
    if (!args.json)
      std::printf(
          "io-bench: %s, %s per transfer x %llu, %s pages, intra_op_parallelism %u, single_submit %s, "
          "overlap_events %s\n",
          file.c_str(), format_bytes(args.size).c_str(), static_cast<unsigned long long>(args.loops), args.pages.c_str(), base.intra_op_parallelism,
          base.single_submit ? "true" : "false", base.overlap_events ? "true" : "false");
    if (!args.json)
      std::printf("%12s %6s %10s %10s %12s %12s %8s\n", "block_size", "qd", "write GB/s", "read GB/s", "write cpu s/GB", "read cpu s/GB", "fixed");
    for (std::uint64_t block : blocks) {
      for (std::uint64_t depth : depths) {
        IoOptions o = base;
        o.block_size = block;
        o.queue_depth = static_cast<unsigned>(depth);  // 1 to kMaxQueueDepth (queue_depth_in_range)
        IoEngine io(o);
        const bool fixed = !args.no_fixed_buffers && io.register_buffer(buffer, args.size);
        registered_any = registered_any || fixed;
        IoFile f = io.open(file, IoOpen::read_write);
        const Measure w = time_transfers(args.loops, [&] { return io.write(f, 0, buffer, args.size); });
        const Measure r = time_transfers(args.loops, [&] { return io.read(f, 0, buffer, args.size); });
        f.close();
        if (fixed) io.unregister_buffer(buffer);
        const double gb = static_cast<double>(args.size) * static_cast<double>(args.loops) / 1e9;
        nlohmann::json row = {{"block_size", block},
                              {"queue_depth", depth},
                              {"bytes", args.size * args.loops},
                              {"write_gbps", gb / w.seconds},
                              {"read_gbps", gb / r.seconds},
                              {"write_cpu_s_per_gb", w.cpu / gb},
                              {"read_cpu_s_per_gb", r.cpu / gb},
                              {"write_seconds", w.seconds},
                              {"read_seconds", r.seconds},
                              {"fixed_buffers", fixed},
                              {"intra_op_parallelism", o.intra_op_parallelism},
                              {"pages", args.pages}};
        if (!args.json)
          std::printf("%12s %6llu %10.3f %10.3f %12.4f %12.4f %8s\n", format_bytes(block).c_str(), static_cast<unsigned long long>(depth),
                      gb / w.seconds, gb / r.seconds, w.cpu / gb, r.cpu / gb, fixed ? "yes" : "no");
        rows.push_back(std::move(row));
      }
    }
  } catch (...) {
    std::error_code ec;
    if (created && !args.keep) fs::remove(file, ec);
    throw;
  }
  if (!args.keep) fs::remove(file);
  if (args.json) {
    const std::string out = nlohmann::json{{"file", file}, {"rows", rows}}.dump(2);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  } else if (!registered_any && !args.no_fixed_buffers) {
    std::printf(
        "fixed: the buffer could not be registered with io_uring (locked-memory limit, ulimit -l); transfers "
        "went unregistered, as fio's do without fixedbufs\n");
  }
}

}  // namespace

void add_io_bench_command(CLI::App& app) {
  auto args = std::make_shared<IoBenchArgs>();
  CLI::App* cmd =
      app.add_subcommand("io-bench", "Measure read/write GB/s and CPU time per GB of the io_uring engine (NVMe offload) on a folder's drive");
  cmd->add_option("--path", args->path, "Folder on the drive to measure (a scratch file dstrain_io_bench.<pid>.dat of its own is written there)")
      ->required();
  // CLI11 runs the transforms, last added first, before the checks: unsigned_size() sees the text
  // before AsSizeValue turns it into a number.
  cmd->add_option("--size", args->size, "Bytes per transfer (K/M/G/T suffixes are powers of 1024; default 1G)")
      ->transform(CLI::AsSizeValue(false))
      ->transform(unsigned_size());
  cmd->add_option("--block-size", args->block_sizes, "aio.block_size values to measure, comma-separated (e.g. 128K,1M,8M)")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->transform(unsigned_size());
  cmd->add_option("--queue-depth", args->queue_depths, "aio.queue_depth values to measure, comma-separated (e.g. 8,32,128)")
      ->delimiter(',')
      ->check(queue_depth_in_range());
  cmd->add_option("--intra-op-parallelism", args->intra_op_parallelism, "aio.intra_op_parallelism (rings, one thread each)")
      ->check(cli::whole_number_in(1, std::int64_t{1} << 20));
  cmd->add_flag("--single-submit", args->single_submit, "aio.single_submit: true");
  cmd->add_flag("--no-overlap-events", args->no_overlap_events, "aio.overlap_events: false");
  cmd->add_option("--loops", args->loops, "Transfers of --size per measurement (default 1)")->check(cli::whole_number_in(1, 1000));
  cmd->add_option("--deepspeed_config,--config", args->config, "Take the aio block's settings from this ds_config");
  cmd->add_option("--pages", args->pages,
                  "Transfer buffer pages: huge (2 MiB transparent huge pages, as the swappers' buffers; default) or base "
                  "(4 KiB, as fio's malloc'ed buffers)")
      ->check(CLI::IsMember({"huge", "base"}));
  cmd->add_flag("--no-fixed-buffers", args->no_fixed_buffers, "Do not register the buffer with io_uring (as fio without fixedbufs)");
  cmd->add_flag("--json", args->json, "Print the figures as JSON on stdout");
  cmd->add_flag("--keep", args->keep, "Keep the scratch file (its path is --json's \"file\"; bench/io_bench.sh runs fio on it)");
  cmd->callback([args] { run_io_bench(*args); });
}

}  // namespace dstrain::cli
