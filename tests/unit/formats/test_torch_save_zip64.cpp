// A torch.save file past 4 GiB (formats/torch_save.h, formats/torch_zip_writer.h): one storage of
// 2^32 + 64 bytes (its sizes saturate the zip's 32-bit fields) and one after it (its local header
// starts past 2^32), each with its zip64 extra field, 64-byte aligned after it; read back by the
// project's reader and by torch.load (torch_save_check.py --zip64, which also checks every CRC and
// the alignment). Opt-in: it writes 4.3 GB and the readers hold it in memory (about 13 GB at the
// peak) — DSTRAIN_TORCH_SAVE_4GIB=1 build/tests/unit/test_torch_save --gtest_filter='*Zip64*'.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "formats/torch_pickle.h"
#include "formats/torch_save.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;
using W = TorchSaveWriter;

TEST(TorchSaveZip64, AFileOver4GiBReadsBackInTheReaderAndInTorch) {
  if (std::getenv("DSTRAIN_TORCH_SAVE_4GIB") == nullptr) GTEST_SKIP() << "opt-in (4.3 GB of disk, ~13 GB of memory): set DSTRAIN_TORCH_SAVE_4GIB=1";
  const fs::path dir = fs::temp_directory_path() / fmt::format("dstrain_torch_save_zip64_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path p = dir / "big.pt";
  const std::int64_t n = (std::int64_t{1} << 32) + 64;
  {
    W w;
    std::string bytes(static_cast<std::size_t>(n), '\0');
    bytes[0] = 1;
    bytes[std::size_t{1} << 32] = 3;
    bytes[static_cast<std::size_t>(n - 1)] = 2;
    const TorchValue big = w.tensor("U8", {n}, std::move(bytes));
    TorchValue tail = big;  // the last 64 bytes, past 2^32
    tail.tensor.shape = {64};
    tail.tensor.storage_offset = std::int64_t{1} << 32;
    const float small[] = {1.5f, -2.0f};
    w.save(p, W::dict({{W::string("big"), big}, {W::string("tail"), tail},
                       {W::string("small"), w.tensor("F32", {2}, std::string(reinterpret_cast<const char*>(small), sizeof small))}}));
  }
  EXPECT_GT(fs::file_size(p), std::uintmax_t{1} << 32);
  {
    const TorchPickle back(p);
    EXPECT_EQ(back.root().at("big").as_tensor().shape, std::vector<std::int64_t>{n});
    const std::vector<double> tail = back.read_f64(back.root().at("tail"));
    ASSERT_EQ(tail.size(), 64u);
    EXPECT_EQ(tail[0], 3);
    EXPECT_EQ(tail[63], 2);
    EXPECT_EQ(back.read_fp32(back.root().at("small")), (std::vector<float>{1.5f, -2.0f}));
  }
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0) {
    const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/unit/formats/torch_save_check.py --zip64 '{}'", DSTRAIN_SOURCE_DIR, p.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dstrain
