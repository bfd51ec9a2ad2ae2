// The memory_breakdown text against lines written by hand in DeepSpeed's see_memory_usage format.
#include <sys/sysinfo.h>

#include <cstdint>

#include <gtest/gtest.h>

#include "train/monitor/memory_breakdown.h"

namespace dstrain {
namespace {

constexpr std::size_t GiB = 1024ull * 1024 * 1024;
constexpr std::size_t MiB = 1024ull * 1024;

TEST(MemoryBreakdown, DeepSpeedLinesPlusPerPurpose) {
  MemoryStats s;
  s.on_allocate(GiB / 2, MemoryPurpose::params);             // 0.5 GiB
  s.on_allocate(GiB / 2, MemoryPurpose::grads);              // 0.5 GiB
  s.on_allocate(GiB + GiB / 2, MemoryPurpose::activations);  // 1.5 GiB -> total peak 2.5 GiB
  s.on_free(GiB + GiB / 2, MemoryPurpose::activations);
  s.on_allocate(10 * MiB, MemoryPurpose::buffers);  // 10/1024 = 0.009765... -> 0.01
  // current = 1.0 GiB + 10 MiB = 1.0098 -> 1.01; peak 2.5 GiB; Max_CA round(2.5) = 2 (half to even).
  const HostMemory host{.total = 16 * GiB, .available = 12 * GiB};  // used 4 GB, 25.0%
  EXPECT_EQ(format_memory_breakdown("Engine after step", s, host),
            "Engine after step\n"
            "MA 1.01 GB         Max_MA 2.5 GB         CA 1.01 GB         Max_CA 2 GB \n"
            "MA by purpose: params 0.5 GB Max_MA 0.5 GB | grads 0.5 GB Max_MA 0.5 GB | optimizer 0.0 GB Max_MA 0.0 GB"
            " | activations 0.0 GB Max_MA 1.5 GB | buffers 0.01 GB Max_MA 0.01 GB\n"
            "CPU Virtual Memory:  used = 4.0 GB, percent = 25.0%");
  EXPECT_EQ(format_memory_breakdown("x", MemoryStats{}, std::nullopt),
            "x\nMA 0.0 GB         Max_MA 0.0 GB         CA 0.0 GB         Max_CA 0 GB \n"
            "MA by purpose: params 0.0 GB Max_MA 0.0 GB | grads 0.0 GB Max_MA 0.0 GB | optimizer 0.0 GB Max_MA 0.0 GB"
            " | activations 0.0 GB Max_MA 0.0 GB | buffers 0.0 GB Max_MA 0.0 GB");
}

// The figures against the kernel's own counters read another way: sysinfo(2) gives the total RAM
// in units of mem_unit bytes, the figure /proc/meminfo's MemTotal shows in KiB (rounded down), so
// total = totalram · mem_unit to within the KiB rounding. MemAvailable has no sysinfo twin; it
// lies between freeram (the strictly free pages, which it includes) and the total.
TEST(MemoryBreakdown, ReadsHostMemoryOnLinux) {
  struct sysinfo si {};
  const auto host = read_host_memory();
  ASSERT_EQ(::sysinfo(&si), 0);
  ASSERT_TRUE(host.has_value());  // CI and developers run Linux
  const std::uint64_t total = static_cast<std::uint64_t>(si.totalram) * si.mem_unit;
  EXPECT_LE(host->total, total);
  EXPECT_GT(host->total + 1024, total);
  EXPECT_EQ(host->total % 1024, 0u);  // KiB in /proc/meminfo, times 1024
  EXPECT_LE(host->available, host->total);
  // freeram moves between the two reads; a slack of 1/8 of RAM still catches a unit error (KiB vs B).
  EXPECT_GE(host->available + total / 8, static_cast<std::uint64_t>(si.freeram) * si.mem_unit);
}

}  // namespace
}  // namespace dstrain
