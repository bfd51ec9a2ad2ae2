// `dstrain io-bench`: read and write GB/s, and CPU time per GB, of the io_uring engine that NVMe
// offload uses, over block sizes and queue depths (DeepSpeed's ds_io in spirit; docs/offload.md §3).
#pragma once

#include <CLI/CLI.hpp>

namespace dstrain::cli {

void add_io_bench_command(CLI::App& app);

}  // namespace dstrain::cli
