// TorchStateDict (formats/torch_state_dict.h) against files written by PyTorch's own
// torch.save (/usr/bin/python3 with Debian's python3-torch): the values PyTorch wrote, through
// views (transposed, offset), fp16 / bf16 / fp64 storages, parameters, a module's state_dict with
// its _metadata, nested dicts with plain scalars, sets and torch.Size; and a pickle that asks to
// run code (os.system through __reduce__) refused before it runs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ops/error.h"
#include "formats/torch_state_dict.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

const char* kScript = R"PY(
import collections, os, sys, torch
out = sys.argv[1]
a = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5
sd = collections.OrderedDict()
sd['a'] = a
sd['t'] = a.t()
sd['row'] = a[1]
sd['h'] = (torch.arange(6, dtype=torch.float32) / 8).to(torch.float16)
sd['b'] = (torch.arange(6, dtype=torch.float32) / 8).to(torch.bfloat16)
sd['d'] = torch.tensor([1.5, -2.25], dtype=torch.float64)
sd['p'] = torch.nn.Parameter(torch.full((2, 2), 3.0))
sd['i'] = torch.arange(3)
torch.save({'module': sd, 'step': 7, 'name': 'x', 'shapes': [torch.Size([3, 4])], 'names': {'a', 'b'}, 'lr': 0.1, 'flag': True,
            'none': None, 'big': 2**40, 'neg': -5, 'nested': {'inner': {'w': torch.ones(2)}}}, os.path.join(out, 'plain.pt'))
m = torch.nn.Linear(3, 2)
with torch.no_grad():
    m.weight.copy_(torch.arange(6.).reshape(2, 3))
    m.bias.copy_(torch.tensor([7., 8.]))
torch.save(m.state_dict(), os.path.join(out, 'linear.pt'))
class Evil:
    def __reduce__(self):
        return (os.system, ('touch ' + os.path.join(out, 'pwned'),))
torch.save({'w': torch.ones(1), 'x': Evil()}, os.path.join(out, 'evil.pt'))
)PY";

class TorchStateDictTest : public ::testing::Test {
 protected:
  // One python3 run (importing torch takes seconds) writes every file the tests read.
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("dstrain_torch_sd_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "make.py") << kScript;
    have_torch_ = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (have_torch_) made_ = std::system(("/usr/bin/python3 " + (dir_ / "make.py").string() + " " + dir_.string()).c_str()) == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!have_torch_) GTEST_SKIP() << "/usr/bin/python3 with torch is not installed";
    ASSERT_TRUE(made_) << "the python script writing the torch files failed";
  }
  static fs::path dir_;
  static bool have_torch_, made_;
};
fs::path TorchStateDictTest::dir_;
bool TorchStateDictTest::have_torch_ = false, TorchStateDictTest::made_ = false;

TEST_F(TorchStateDictTest, ReadsWhatTorchSaveWrote) {
  ASSERT_TRUE(TorchStateDict::looks_like(dir_ / "plain.pt"));
  const TorchStateDict sd(dir_ / "plain.pt");
  std::vector<float> a;
  for (int k = 0; k < 12; ++k) a.push_back(0.5f * static_cast<float>(k));
  EXPECT_EQ(sd.read_fp32("module.a"), a);
  EXPECT_EQ(sd.tensors().at("module.a").shape, (std::vector<std::int64_t>{3, 4}));
  // a.t(): shape (4, 3), strides (1, 4) over the same storage.
  std::vector<float> t;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 3; ++i) t.push_back(a[static_cast<std::size_t>(i * 4 + j)]);
  EXPECT_EQ(sd.read_fp32("module.t"), t);
  EXPECT_EQ(sd.read_fp32("module.row"), (std::vector<float>{2.0f, 2.5f, 3.0f, 3.5f}));
  EXPECT_EQ(sd.tensors().at("module.row").storage_offset, 4);
  const std::vector<float> eighths{0.0f, 0.125f, 0.25f, 0.375f, 0.5f, 0.625f};  // exact in fp16 and bf16
  EXPECT_EQ(sd.read_fp32("module.h"), eighths);
  EXPECT_EQ(sd.tensors().at("module.h").dtype, "F16");
  EXPECT_EQ(sd.read_fp32("module.b"), eighths);
  EXPECT_EQ(sd.tensors().at("module.b").dtype, "BF16");
  EXPECT_EQ(sd.read_fp32("module.d"), (std::vector<float>{1.5f, -2.25f}));
  EXPECT_EQ(sd.read_fp32("module.p"), (std::vector<float>(4, 3.0f)));
  EXPECT_EQ(sd.read_fp32("nested.inner.w"), (std::vector<float>(2, 1.0f)));
  EXPECT_EQ(sd.tensors().at("module.i").dtype, "I64");
  EXPECT_THROW(sd.read_fp32("module.i"), Error);  // integers are not weights
  EXPECT_EQ(sd.tensors().size(), 9u);
}

TEST_F(TorchStateDictTest, ReadsAModuleStateDict) {
  const TorchStateDict sd(dir_ / "linear.pt");
  EXPECT_EQ(sd.read_fp32("weight"), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(sd.read_fp32("bias"), (std::vector<float>{7, 8}));
  EXPECT_EQ(sd.tensors().size(), 2u);
}

TEST_F(TorchStateDictTest, RefusesCodeBeforeItRuns) {
  try {
    TorchStateDict sd(dir_ / "evil.pt");
    FAIL() << "a pickle calling os.system was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("system"), std::string::npos) << m;  // posix.system
    EXPECT_NE(m.find("refuses"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir_ / "pwned"));
}

TEST_F(TorchStateDictTest, TruncatedOrForeignFilesAreErrors) {
  std::ifstream in(dir_ / "plain.pt", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir_ / "cut.pt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_THROW(TorchStateDict(dir_ / "cut.pt"), Error);
  std::ofstream(dir_ / "text.pt", std::ios::binary) << "not a zip at all, just some text that is long enough";
  EXPECT_FALSE(TorchStateDict::looks_like(dir_ / "text.pt"));
  EXPECT_THROW(TorchStateDict(dir_ / "text.pt"), Error);
}

// Crafted files (tests/fuzz/make_crafted_inputs.py, kept in tests/fuzz/regressions/torch_state_dict/):
// a pickle nesting 100,000 lists or dicts overflowed the stack in the chain of destructors, and
// strides whose extent wraps past 2^63 passed the bounds check and read outside the storage. Each
// is an Error now, and the process lives on. No PyTorch needed.
TEST(TorchStateDictCrafted, DeepNestingAndWrappingStridesAreErrors) {
  const fs::path dir = fs::path(DSTRAIN_SOURCE_DIR) / "tests/fuzz/regressions/torch_state_dict";
  const auto error_of = [](const fs::path& p) {
    try {
      const TorchStateDict sd(p);
      for (const auto& [name, t] : sd.tensors()) (void)sd.read_fp32(name);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of(dir / "nested_lists_100k.pt").find("not a dict"), std::string::npos);
  EXPECT_NE(error_of(dir / "nested_dicts_100k.pt").find("no tensors"), std::string::npos);
  EXPECT_NE(error_of(dir / "stride_2_62.pt").find("overflows 64 bits"), std::string::npos) << error_of(dir / "stride_2_62.pt");
  EXPECT_NE(error_of(dir / "stride_2_63_minus_1.pt").find("overflows 64 bits"), std::string::npos);
}

}  // namespace
}  // namespace dstrain
