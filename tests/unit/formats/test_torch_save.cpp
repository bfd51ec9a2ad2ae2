// TorchSaveWriter (formats/torch_save.h): a tree of every kind of value — nested dicts with string,
// integer and tuple keys, lists (past pickle's batches of 1000), tuples of 0 to 4, integers of every
// width, reals, UTF-8 text, bytes, None, bools, tensors of ten dtypes (0-d, empty, a storage shared
// by two values and a view), DeepSpeed's three object spellings — written, then
//   read back by the project's own reader (TorchPickle): the same tree, the same tensor values, fp16
//     and bf16 rounded as a naive nearest-even search over all 65536 patterns rounds;
//   torch.load-ed by /usr/bin/python3 (tests/unit/formats/torch_save_check.py): the same Python
//     objects, storages shared in torch, and a zip laid out as torch.save's own;
// and refused: an unwritable path, a write cut short by the file size limit (the old file kept, no
// temporary left), wrong tensor bytes, a tensor of another writer or file, values torch cannot hold.
// (The fuzz seeds this writer makes: test_torch_save_seeds.cpp.)
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/torch_pickle.h"
#include "formats/torch_save.h"
#include "formats/torch_zip_writer.h"
#include "ops/error.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;
using W = TorchSaveWriter;
using K = TorchValue::Kind;

TorchValuePair kv(const char* k, TorchValue v) { return {W::string(k), std::move(v)}; }
TorchValuePair kv(std::int64_t k, TorchValue v) { return {W::integer(k), std::move(v)}; }

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- naive references: the value of a 16-bit pattern from its definition, and rounding to the
// nearest pattern by trying all of them (ties to the even pattern; past the largest finite value's
// half ulp, infinity) ----

double naive_16(std::uint16_t b, bool bf16) {
  const int mbits = bf16 ? 7 : 10, bias = bf16 ? 127 : 15, emax = bf16 ? 255 : 31;
  const int e = (b >> mbits) & emax;
  const int m = b & ((1 << mbits) - 1);
  const double sign = (b & 0x8000) != 0 ? -1 : 1;
  if (e == emax) return m == 0 ? sign * INFINITY : NAN;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mbits);
  return sign * std::ldexp((1 << mbits) + m, e - bias - mbits);
}

double naive_round(float x, bool bf16) {
  const double a = std::fabs(static_cast<double>(x));
  const std::uint16_t top = bf16 ? 0x7F7F : 0x7BFF;  // the largest finite pattern
  const double max = naive_16(top, bf16), next = bf16 ? std::ldexp(1.0, 128) : 65536.0;
  double best = 0;
  if (a >= (max + next) / 2) {
    best = INFINITY;
  } else {
    double best_d = INFINITY;
    for (std::uint32_t b = 0; b <= top; ++b) {
      const double v = naive_16(static_cast<std::uint16_t>(b), bf16), d = std::fabs(v - a);
      if (d < best_d || (d == best_d && (b & 1u) == 0)) best = v, best_d = d;
    }
  }
  return std::signbit(x) ? -best : best;
}

// ---- the tree, and what each tensor holds ----

struct Tree {
  W w;
  TorchValue root;
  std::map<std::string, std::string> bytes;        // writer storage key -> the bytes given
  std::map<std::string, std::vector<float>> fp32;  // writer storage key -> the fp32 sources of tensor_from_fp32

  TorchValue tensor(const std::string& dtype, std::vector<std::int64_t> shape, std::string b) {
    TorchValue v = w.tensor(dtype, std::move(shape), b);
    bytes[v.tensor.storage_key] = std::move(b);
    return v;
  }
  TorchValue from_fp32(const std::string& dtype, std::vector<std::int64_t> shape, std::vector<float> values) {
    TorchValue v = w.tensor_from_fp32(dtype, std::move(shape), values);
    fp32[v.tensor.storage_key] = std::move(values);
    return v;
  }

  // Elements of the storage: the naive rounding of the sources, or the bytes decoded.
  std::vector<double> storage_values(const TorchTensorInfo& t) const {
    std::vector<double> out;
    if (const auto it = fp32.find(t.storage_key); it != fp32.end()) {
      for (const float f : it->second) out.push_back(t.dtype == "F32" ? f : naive_round(f, t.dtype == "BF16"));
      return out;
    }
    const std::string& b = bytes.at(t.storage_key);
    const auto get = [&](std::size_t at, auto x) {
      std::memcpy(&x, b.data() + at, sizeof x);
      return x;
    };
    const std::size_t es = t.dtype == "F64" || t.dtype == "I64" ? 8 : t.dtype == "F32" || t.dtype == "I32" ? 4 : t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "I16" ? 2 : 1;
    for (std::size_t at = 0; at < b.size(); at += es) {
      if (t.dtype == "F32") out.push_back(get(at, float{}));
      else if (t.dtype == "F64") out.push_back(get(at, double{}));
      else if (t.dtype == "I64") out.push_back(static_cast<double>(get(at, std::int64_t{})));
      else if (t.dtype == "I32") out.push_back(get(at, std::int32_t{}));
      else if (t.dtype == "I16") out.push_back(get(at, std::int16_t{}));
      else if (t.dtype == "I8") out.push_back(get(at, std::int8_t{}));
      else if (t.dtype == "F16" || t.dtype == "BF16") out.push_back(naive_16(get(at, std::uint16_t{}), t.dtype == "BF16"));
      else out.push_back(get(at, std::uint8_t{}));  // U8, BOOL
    }
    return out;
  }
  // The storage elements the tensor reaches, in row-major order, following its strides.
  static std::vector<std::size_t> elements(const TorchTensorInfo& t) {
    std::int64_t n = 1;
    for (const std::int64_t d : t.shape) n *= d;
    std::vector<std::size_t> out;
    std::vector<std::int64_t> idx(t.shape.size(), 0);
    for (std::int64_t k = 0; k < n; ++k) {
      std::int64_t e = t.storage_offset;
      for (std::size_t d = 0; d < idx.size(); ++d) e += idx[d] * t.stride[d];
      out.push_back(static_cast<std::size_t>(e));
      for (std::size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < t.shape[d]) break;
        idx[d] = 0;
      }
    }
    return out;
  }
  std::vector<double> values(const TorchTensorInfo& t) const {
    const std::vector<double> s = storage_values(t);
    std::vector<double> out;
    for (const std::size_t e : elements(t)) out.push_back(s.at(e));
    return out;
  }
  // An integer tensor's elements exactly (an I64 past 2^53 is not a double).
  std::vector<std::int64_t> int_values(const TorchTensorInfo& t) const {
    const std::string& b = bytes.at(t.storage_key);
    std::vector<std::int64_t> out;
    for (const std::size_t e : elements(t)) {
      if (t.dtype == "I64") {
        std::int64_t x;
        std::memcpy(&x, b.data() + 8 * e, 8);
        out.push_back(x);
      } else {
        out.push_back(static_cast<std::int64_t>(values(t).at(out.size())));  // I32, I16, I8, U8, BOOL: exact in a double
      }
    }
    return out;
  }
};

// fp32 values whose fp16 / bf16 rounding is interesting: ties both ways, subnormals, the overflow
// boundary, and random values over the whole exponent range.
std::vector<float> rounding_sources(bool bf16) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-5f, 6e-8f, 2.9802322e-8f, 1e-8f};
  if (bf16) {
    const float ties[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 0x1p-133f * 1.5f, 3.3895314e38f, 3.4e38f, -0x1p-126f};  // an even count: [n / 2, 2]
    v.insert(v.end(), std::begin(ties), std::end(ties));
  } else {
    const float ties[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f, 3 * 0x1p-25f, 0x1p-24f * 2.5f};
    v.insert(v.end(), std::begin(ties), std::end(ties));
  }
  std::mt19937 rng(bf16 ? 7 : 11);
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(bf16 ? -140 : -26, bf16 ? 127 : 15);
  for (int k = 0; k < 200; ++k) v.push_back((k % 2 != 0 ? -1.0f : 1.0f) * std::ldexp(m(rng), e(rng)));
  return v;
}

// Every kind of value. Tensors are made in another order than the tree reaches them (the file's
// keys follow the tree), one is made and never used (not written), and there are 15 storages (keys
// "10" and up sort before "2", as torch writes them).
void build(Tree& t) {
  const TorchValue unused = t.tensor("F32", {1}, raw(std::vector<float>{9}));
  const TorchValue late = t.tensor("I16", {3}, raw(std::vector<std::int16_t>{-32768, 0, 32767}));
  std::vector<TorchValue> ints;
  for (const std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{256}, std::int64_t{65535}, std::int64_t{65536},
                               std::int64_t{-1}, std::int64_t{-5}, std::int64_t{-256}, std::int64_t{INT32_MIN}, std::int64_t{INT32_MAX},
                               std::int64_t{1} << 31, -(std::int64_t{1} << 31) - 1, std::int64_t{1} << 40, -(std::int64_t{1} << 40),
                               -(std::int64_t{1} << 39), std::int64_t{1} << 62, std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::min()})
    ints.push_back(W::integer(i));
  std::vector<TorchValue> reals;
  for (const double f : {0.0, -0.0, 1.5, -2.25e-300, 3.141592653589793, 1e300, 5e-324}) reals.push_back(W::real(f));
  std::vector<TorchValue> many;
  for (int k = 0; k < 2001; ++k) many.push_back(W::integer(k * 7 - 3000));  // batches 1000, 1000, then a lone APPEND
  std::vector<TorchValuePair> wide;
  for (int k = 0; k < 1001; ++k) wide.push_back(kv(fmt::format("k{}", k).c_str(), W::integer(k)));

  const TorchValue shared = t.tensor("F32", {6}, raw(std::vector<float>{0, 1, 2, 3, 4, 5}));
  TorchValue view = shared;  // rows (1, 2) and (3, 4) of the same storage
  view.tensor.shape = {2, 2};
  view.tensor.stride = {2, 1};
  view.tensor.storage_offset = 1;

  std::vector<TorchValuePair> tensors;
  tensors.push_back(kv("f32", t.tensor("F32", {2, 3}, raw(std::vector<float>{1.5f, -2, 3.25f, 0, -0.0f, 1e-40f}))));
  tensors.push_back(kv("f16", t.from_fp32("F16", {static_cast<std::int64_t>(rounding_sources(false).size())}, rounding_sources(false))));
  const std::vector<float> bsrc = rounding_sources(true);
  tensors.push_back(kv("bf16", t.from_fp32("BF16", {static_cast<std::int64_t>(bsrc.size() / 2), 2}, bsrc)));
  tensors.push_back(kv("f64", t.tensor("F64", {2}, raw(std::vector<double>{1e300, -1.0 / 3}))));
  tensors.push_back(kv("i64", t.tensor("I64", {3}, raw(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), -1,
                                                                                 std::numeric_limits<std::int64_t>::max()}))));
  tensors.push_back(kv("i32", t.tensor("I32", {2, 1}, raw(std::vector<std::int32_t>{-7, 123456}))));
  tensors.push_back(kv("i8", t.tensor("I8", {2}, raw(std::vector<std::int8_t>{-128, 127}))));
  tensors.push_back(kv("u8", t.tensor("U8", {3}, raw(std::vector<std::uint8_t>{0, 128, 255}))));
  tensors.push_back(kv("bool", t.tensor("BOOL", {2}, raw(std::vector<std::uint8_t>{1, 0}))));
  tensors.push_back(kv("scalar", t.tensor("F32", {}, raw(std::vector<float>{42.5f}))));
  tensors.push_back(kv("empty", t.tensor("F32", {0, 3}, "")));
  tensors.push_back(kv("empty_i64", t.tensor("I64", {0}, "")));
  tensors.push_back(kv("flat_fp32", t.from_fp32("F32", {4}, {0.25f, -1e30f, 7, 1e-45f})));

  const TorchValue f16_dtype = W::object("torch.float16", {}, std::nullopt);
  const TorchValue scaler = W::object("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", {},
                                      W::dict({kv("cur_scale", W::real(65536.0)), kv("dynamic", W::boolean(true)), kv("cur_iter", W::integer(10)),
                                               kv("last_overflow_iter", W::integer(-1)), kv("scale_factor", W::real(2.0)),
                                               kv("scale_window", W::integer(1000)), kv("min_scale", W::integer(1)), kv("delayed_shift", W::integer(2)),
                                               kv("cur_hysteresis", W::integer(2)), kv("consecutive_hysteresis", W::boolean(false)),
                                               kv("raise_error_at_min_scale", W::boolean(true)), kv("dtype", f16_dtype)}));

  t.root = W::dict({
      kv("ints", W::list(ints)),
      kv("reals", W::list(reals)),
      kv("text", W::string("h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93 \xf0\x9f\x99\x82 \xe6\x97\xa5\xe6\x9c\xac")),
      kv("bytes", W::bytes(std::string("\x00\x01\x7f\x80\xff abc", 9))),
      kv("empty_bytes", W::bytes("")),
      kv("none", W::none()),
      kv("yes", W::boolean(true)),
      kv("no", W::boolean(false)),
      kv("nested", W::dict({kv(1, W::dict({kv("a", W::tuple({W::integer(1), W::string("x"), W::none()}))})), kv(-7, W::list({})),
                            kv("t0", W::tuple({})), kv("t1", W::tuple({W::integer(1)})),
                            kv("t4", W::tuple({W::integer(1), W::integer(2), W::integer(3), W::integer(4)})), kv("empty", W::dict({})),
                            TorchValuePair(W::tuple({W::integer(1), W::string("a")}), W::integer(3))})),
      kv("many", W::list(many)),
      kv("wide", W::dict(wide)),
      kv("tensors", W::dict(tensors)),
      kv("shared", W::list({shared, shared, view})),
      kv("zero_stage", W::object("deepspeed.runtime.zero.config.ZeroStageEnum", {W::integer(2)}, std::nullopt)),
      kv("loss_scaler", scaler),
      kv("dtype", W::object("torch.bfloat16", {}, std::nullopt)),
      kv("fragment", W::object("deepspeed.utils.tensor_fragment.fragment_address", {}, W::dict({kv("numel", W::integer(6)), kv("start", W::integer(0))}))),
      kv("late", late),
  });
}

// The reader's tree against the written one; tensors by their metadata and values, and storages
// shared exactly where the written tree shares them (one file key per writer key).
void expect_same(const Tree& t, const TorchPickle& p, const TorchValue& want, const TorchValue& got, const std::string& where,
                 std::map<std::string, std::string>& keys) {
  ASSERT_EQ(static_cast<int>(got.kind), static_cast<int>(want.kind)) << where << ": " << got.kind_name() << " instead of " << want.kind_name();
  switch (want.kind) {
    case K::none: break;
    case K::boolean: EXPECT_EQ(got.b, want.b) << where; break;
    case K::integer: EXPECT_EQ(got.i, want.i) << where; break;
    case K::real:
      EXPECT_EQ(std::bit_cast<std::uint64_t>(got.f), std::bit_cast<std::uint64_t>(want.f)) << where << " " << got.f << " vs " << want.f;
      break;
    case K::string:
    case K::bytes: EXPECT_EQ(got.s, want.s) << where; break;
    case K::list:
    case K::tuple:
      ASSERT_EQ(got.items.size(), want.items.size()) << where;
      for (std::size_t k = 0; k < want.items.size(); ++k) expect_same(t, p, want.items[k], got.items[k], where + "." + std::to_string(k), keys);
      break;
    case K::dict:
      ASSERT_EQ(got.pairs.size(), want.pairs.size()) << where;
      for (std::size_t k = 0; k < want.pairs.size(); ++k) {
        expect_same(t, p, want.pairs[k].first, got.pairs[k].first, where + ".<key>", keys);
        expect_same(t, p, want.pairs[k].second, got.pairs[k].second, where + "." + std::to_string(k), keys);
      }
      break;
    case K::tensor: {
      const TorchTensorInfo &w = want.tensor, &g = got.tensor;
      EXPECT_EQ(g.dtype, w.dtype) << where;
      EXPECT_EQ(g.shape, w.shape) << where;
      EXPECT_EQ(g.stride, w.stride) << where;
      EXPECT_EQ(g.storage_offset, w.storage_offset) << where;
      const auto [it, added] = keys.emplace(w.storage_key, g.storage_key);
      EXPECT_EQ(it->second, g.storage_key) << where << ": a storage the writer shared is not shared in the file";
      const std::vector<double> got_values = p.read_f64(got), want_values = t.values(w);
      ASSERT_EQ(got_values.size(), want_values.size()) << where;
      for (std::size_t k = 0; k < want_values.size(); ++k) {
        EXPECT_EQ(std::bit_cast<std::uint64_t>(got_values[k]), std::bit_cast<std::uint64_t>(want_values[k]))
            << where << "[" << k << "] " << got_values[k] << " vs " << want_values[k];
      }
      break;
    }
    case K::object:
      EXPECT_EQ(got.s, want.s) << where;
      ASSERT_EQ(got.items.size(), want.items.size()) << where;
      for (std::size_t k = 0; k < want.items.size(); ++k) expect_same(t, p, want.items[k], got.items[k], where + ".<arg>", keys);
      ASSERT_EQ(got.state != nullptr, want.state != nullptr) << where;
      if (want.state) expect_same(t, p, *want.state, *got.state, where + ".<state>", keys);
      break;
  }
}

// The written tree as torch_save_check.py reads it: ["tag", ...] with exact integers and hex floats.
nlohmann::json to_json(const Tree& t, const TorchValue& v) {
  using nlohmann::json;
  const auto hex = [](double d) { return fmt::format("{:a}", d); };
  switch (v.kind) {
    case K::none: return json::array({"none"});
    case K::boolean: return json::array({"bool", v.b});
    case K::integer: return json::array({"int", std::to_string(v.i)});
    case K::real: return json::array({"float", hex(v.f)});
    case K::string: return json::array({"str", v.s});
    case K::bytes: {
      std::string h;
      for (const char c : v.s) h += fmt::format("{:02x}", static_cast<unsigned char>(c));
      return json::array({"bytes", h});
    }
    case K::list:
    case K::tuple: {
      json items = json::array();
      for (const TorchValue& x : v.items) items.push_back(to_json(t, x));
      return json::array({v.kind == K::list ? "list" : "tuple", items});
    }
    case K::dict: {
      json items = json::array();
      for (const auto& [k, x] : v.pairs) items.push_back(json::array({to_json(t, k), to_json(t, x)}));
      return json::array({"dict", items});
    }
    case K::tensor: {
      const TorchTensorInfo& w = v.tensor;
      json values = json::array();
      if (w.dtype == "F32" || w.dtype == "F16" || w.dtype == "BF16" || w.dtype == "F64") {
        for (const double d : t.values(w)) values.push_back(hex(d));
      } else {
        values = t.int_values(w);
      }
      json j = {{"dtype", w.dtype}, {"shape", w.shape}, {"stride", w.stride}, {"offset", w.storage_offset}, {"values", values},
                {"storage", w.storage_key}, {"numel_storage", t.storage_values(w).size()}};
      if (const auto it = t.fp32.find(w.storage_key); it != t.fp32.end() && w.dtype != "F32") {
        json src = json::array();
        for (const float f : it->second) src.push_back(hex(f));
        j["from_fp32"] = src;
      }
      return json::array({"tensor", j});
    }
    case K::object: {
      json args = json::array();
      for (const TorchValue& x : v.items) args.push_back(to_json(t, x));
      return json::array({"object", v.s, args, v.state ? to_json(t, *v.state) : json()});
    }
  }
  return {};
}

class TorchSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("dstrain_torch_save_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Files beside `p` whose name starts with its name and ".tmp" (the writer's temporaries).
  static std::vector<std::string> temporaries(const fs::path& p) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(p.parent_path()))
      if (e.path().filename().string().starts_with(p.filename().string() + ".tmp")) out.push_back(e.path().filename().string());
    return out;
  }
  template <typename F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(TorchSaveTest, ZipCrc32IsZipsCrc) {
  EXPECT_EQ(zip_crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(zip_crc32("", 0), 0u);
  std::string s(1000, '\0');
  for (std::size_t k = 0; k < s.size(); ++k) s[k] = static_cast<char>(k * 31 + 7);
  EXPECT_EQ(zip_crc32(s.data() + 3, 997, zip_crc32(s.data(), 3)), zip_crc32(s.data(), 1000));  // in pieces, across the 8-byte loop
}

TEST_F(TorchSaveTest, EveryKindOfValueReadsBackThroughTheProjectsReader) {
  Tree t;
  build(t);
  const fs::path p = dir_ / "every_kind.pt";
  t.w.save(p, t.root);
  EXPECT_TRUE(temporaries(p).empty());
  const TorchPickle back(p);
  std::map<std::string, std::string> keys;
  expect_same(t, back, t.root, back.root(), "", keys);
  EXPECT_EQ(keys.size(), 15u);  // 16 storages made, one never used
  // The shared storage is one storage in the file; the view reads its rows (1, 2), (3, 4).
  const TorchValue& shared = back.root().at("shared");
  EXPECT_EQ(shared[0].as_tensor().storage_key, shared[1].as_tensor().storage_key);
  EXPECT_EQ(shared[0].as_tensor().storage_key, shared[2].as_tensor().storage_key);
  EXPECT_EQ(back.read_fp32(shared[2]), (std::vector<float>{1, 2, 3, 4}));
  // Keys follow the tree, not the order tensor() was called in: "ints" .. "tensors.f32" is the first
  // storage reached, the I16 made second is reached last.
  EXPECT_EQ(back.root().at("tensors").at("f32").as_tensor().storage_key, "0");
  EXPECT_EQ(back.root().at("late").as_tensor().storage_key, "14");
  EXPECT_EQ(back.root().at("zero_stage").object_name(), "deepspeed.runtime.zero.config.ZeroStageEnum");
  EXPECT_EQ(back.root().at("loss_scaler").state->at("dtype").object_name(), "torch.float16");
  // The archive is named after the file, the version is "3\n", and every CRC is right.
  const std::string z = slurp(p);
  EXPECT_NE(z.find("every_kind/data.pkl"), std::string::npos);
  EXPECT_NE(z.find("every_kind/byteorder"), std::string::npos);
  EXPECT_EQ(z.find("every_kind/data/15"), std::string::npos);
}

TEST_F(TorchSaveTest, Fp16AndBf16AreRoundedToNearestEven) {
  // The naive search itself, on cases with a known answer.
  EXPECT_EQ(naive_round(1.0f + 0x1p-11f, false), 1.0);              // a tie: to the even 1.0
  EXPECT_EQ(naive_round(1.0f + 3 * 0x1p-11f, false), 1.0 + 0x1p-9);  // a tie: to the even 1 + 2^-9
  EXPECT_EQ(naive_round(65520.0f, false), INFINITY);
  EXPECT_EQ(naive_round(65519.99f, false), 65504.0);
  EXPECT_EQ(naive_round(1.0f + 0x1p-8f, true), 1.0);
  for (const bool bf16 : {false, true}) {
    W w;
    const std::vector<float> src = rounding_sources(bf16);
    const TorchValue v = w.tensor_from_fp32(bf16 ? "BF16" : "F16", {static_cast<std::int64_t>(src.size())}, src);
    const fs::path p = dir_ / (bf16 ? "bf16.pt" : "f16.pt");
    w.save(p, W::dict({kv("w", v)}));
    const TorchPickle back(p);
    const std::vector<float> got = back.read_fp32(back.root().at("w"));
    ASSERT_EQ(got.size(), src.size());
    for (std::size_t k = 0; k < src.size(); ++k) EXPECT_EQ(static_cast<double>(got[k]), naive_round(src[k], bf16)) << (bf16 ? "bf16 " : "fp16 ") << src[k];
  }
}

TEST_F(TorchSaveTest, TorchLoadsItAsTheSameObjectsFromAZipLaidOutAsItsOwn) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) GTEST_SKIP() << "/usr/bin/python3 with torch is not installed (scripts/setup.sh)";
  Tree t;
  build(t);
  const fs::path p = dir_ / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
  t.w.save(p, t.root);
  std::ofstream(dir_ / "expected.json") << to_json(t, t.root).dump();
  const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/unit/formats/torch_save_check.py '{}' '{}' '{}'", DSTRAIN_SOURCE_DIR, p.string(),
                                      (dir_ / "expected.json").string(), (dir_ / "ref").string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST_F(TorchSaveTest, AnUnwritablePathIsAnErrorNamingItAndLeavesNoTemporary) {
  W w;
  const TorchValue root = W::dict({kv("w", w.tensor("F32", {2}, raw(std::vector<float>{1, 2})))});
  const fs::path missing = dir_ / "no_such_folder" / "x.pt";
  std::string e = error_of([&] { w.save(missing, root); });
  EXPECT_NE(e.find(missing.string()), std::string::npos) << e;
  std::ofstream(dir_ / "a_file") << "x";
  const fs::path under_file = dir_ / "a_file" / "x.pt";
  e = error_of([&] { w.save(under_file, root); });
  EXPECT_NE(e.find(under_file.string()), std::string::npos) << e;
  fs::create_directories(dir_ / "a_folder.pt");
  e = error_of([&] { w.save(dir_ / "a_folder.pt", root); });
  EXPECT_NE(e.find((dir_ / "a_folder.pt").string()), std::string::npos) << e;
  EXPECT_TRUE(temporaries(dir_ / "a_folder.pt").empty());
}

TEST_F(TorchSaveTest, AWriteCutShortKeepsTheOldFileAndLeavesNoTemporary) {
  const fs::path p = dir_ / "model.pt";
  std::ofstream(p) << "the old file";
  W w;
  const TorchValue root = W::dict({kv("w", w.tensor("U8", {1 << 16}, std::string(1 << 16, 'x')))});
  // The file size limit (as a full disk): write() fails with EFBIG part way through the storage.
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string e = error_of([&] { w.save(p, root); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(e.find(p.string()), std::string::npos) << e;
  EXPECT_NE(e.find("file size limit"), std::string::npos) << e;
  EXPECT_EQ(slurp(p), "the old file");
  EXPECT_TRUE(temporaries(p).empty());
  w.save(p, root);  // and with the limit lifted, it writes
  EXPECT_EQ(TorchPickle(p).read_f64(TorchPickle(p).root().at("w")).size(), std::size_t{1} << 16);
}

TEST_F(TorchSaveTest, TensorBytesOfTheWrongSizeAreRefused) {
  W w;
  std::string e = error_of([&] { (void)w.tensor("F32", {2, 3}, std::string(23, '\0')); });
  EXPECT_NE(e.find("needs 6 x 4 bytes; 23 bytes"), std::string::npos) << e;
  e = error_of([&] { (void)w.tensor("F16", {4}, std::string(4, '\0')); });
  EXPECT_NE(e.find("needs 4 x 2 bytes; 4 bytes"), std::string::npos) << e;
  e = error_of([&] { (void)w.tensor("F32", {-1}, ""); });
  EXPECT_NE(e.find("negative"), std::string::npos) << e;
  e = error_of([&] { (void)w.tensor("C64", {1}, std::string(8, '\0')); });
  EXPECT_NE(e.find("'C64'"), std::string::npos) << e;
  e = error_of([&] { (void)w.tensor_from_fp32("F16", {3}, {1, 2}); });
  EXPECT_NE(e.find("needs 3 x 2 bytes; 4 bytes"), std::string::npos) << e;
}

// A copy holds the storages made before it; what either makes afterwards is its own, never mistaken
// for the other's storage of the same number.
TEST_F(TorchSaveTest, ACopiedWriterKeepsItsLaterStoragesApart) {
  W w;
  const TorchValue before = w.tensor("F32", {1}, raw(std::vector<float>{1}));
  W copy = w;
  const TorchValue in_w = w.tensor("F32", {1}, raw(std::vector<float>{2}));
  const TorchValue in_copy = copy.tensor("F32", {1}, raw(std::vector<float>{3}));
  copy.save(dir_ / "copy.pt", W::list({before, in_copy}));
  const TorchPickle back(dir_ / "copy.pt");
  EXPECT_EQ(back.read_fp32(back.root()[0]), std::vector<float>{1});
  EXPECT_EQ(back.read_fp32(back.root()[1]), std::vector<float>{3});
  const std::string e = error_of([&] { copy.save(dir_ / "mixed.pt", W::list({in_w})); });
  EXPECT_NE(e.find("did not make"), std::string::npos) << e;
}

TEST_F(TorchSaveTest, ValuesTheWriterCannotSpellAreRefusedBeforeAnyFileExists) {
  W w, other;
  const fs::path p = dir_ / "x.pt";
  const auto refused = [&](const TorchValue& root, const std::string& what, const std::string& where) {
    const std::string e = error_of([&] { w.save(p, root); });
    EXPECT_NE(e.find(p.string()), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_NE(e.find("'" + where + "'"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(p));
    EXPECT_TRUE(temporaries(p).empty());
  };
  (void)w.tensor("F32", {1}, raw(std::vector<float>{1}));
  const TorchValue theirs = other.tensor("F32", {1}, raw(std::vector<float>{2}));
  refused(W::dict({kv("a", W::dict({kv("b", theirs)}))}), "did not make", "a.b");
  // A tensor read back from a file (this writer's own output, even).
  const fs::path q = dir_ / "mine.pt";
  const TorchValue mine = w.tensor("F32", {1}, raw(std::vector<float>{3}));
  w.save(q, W::dict({kv("m", mine)}));
  refused(W::list({TorchPickle(q).root().at("m")}), "did not make", "0");
  TorchValue outside = mine;
  outside.tensor.storage_offset = 1;
  refused(W::dict({kv("v", outside)}), "reaches past its storage", "v");
  TorchValue retyped = mine;
  retyped.tensor.dtype = "I32";
  refused(W::dict({kv("v", retyped)}), "is a I32 tensor of a F32 storage", "v");
  refused(W::dict({kv("d", W::dict({TorchValuePair(W::real(1.5), W::none())}))}), "key that is a float", "d");
  refused(W::dict({kv("d", W::dict({TorchValuePair(W::tuple({W::integer(1), W::tuple({W::none()})}), W::none())}))}), "key that is a tuple", "d");
  refused(W::dict({kv("s", W::string("\xff\xfe"))}), "not UTF-8", "s");
  refused(W::dict({kv("o", W::object("os.system\nbuiltins.eval", {}, std::nullopt))}), "not a global's", "o");
  refused(W::dict({kv("o", W::object("nodots", {}, std::nullopt))}), "not a global's", "o");
}

}  // namespace
}  // namespace dstrain
