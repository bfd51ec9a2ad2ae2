// safetensors reading/writing, corrupt files, and GPT-2 weights in the Hugging Face layout.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_model.h"
#include "models/gpt2/gpt2_weights.h"
#include "formats/safetensors.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("dstrain_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& n) const { return path_ / n; }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// A safetensors file assembled by hand: 8-byte LE length, the header text as given, the data.
void write_raw(const fs::path& p, const std::string& header, const std::vector<unsigned char>& data, std::int64_t length_override = -1) {
  std::ofstream f(p, std::ios::binary);
  const std::uint64_t n = length_override >= 0 ? static_cast<std::uint64_t>(length_override) : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header;
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

std::vector<unsigned char> float_bytes(std::initializer_list<float> v) {
  std::vector<unsigned char> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  TempDir d;
  // b is stored first in the data section, a second; the header lists a first.
  auto data = float_bytes({5, 6, 1, 2, 3, 4, 0});
  data.resize(24 + 2);
  const std::uint16_t half_one = 0x3c00;  // fp16 1.0
  std::memcpy(data.data() + 24, &half_one, 2);
  write_raw(d / "x.safetensors",
            R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}, "b": {"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"( "h": {"dtype": "F16", "shape": [], "data_offsets": [24, 26]}, "__metadata__": {"format": "pt"}})",
            data);
  const SafetensorsFile f(d / "x.safetensors");
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].name, "b");  // data order
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(f.read_fp32(*a), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f.read_fp32(*f.find("b")), (std::vector<float>{5, 6}));
  EXPECT_EQ(f.read_fp32(*f.find("h")), (std::vector<float>{1.0f}));
  EXPECT_EQ(f.find("zz"), nullptr);
}

TEST(Safetensors, WriteThenReadRoundTrip) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  std::vector<fp16_t> b = {fp16_t(0.5f), fp16_t(-1.0f), fp16_t(65504.0f)};
  std::vector<bf16_t> c = {bf16_t(3.0f), bf16_t(-0.125f)};
  const std::vector<SafetensorsWriteItem> items = {
      {"layer.a", Tensor(a.data(), DType::fp32, Shape{2, 3}), {}},
      {"b", Tensor(b.data(), DType::fp16, Shape{3}), {3, 1}},
      {"c", Tensor(c.data(), DType::bf16, Shape{2}), {}},
  };
  write_safetensors(d / "y.safetensors", items, {{"format", "pt"}, {"step", "12"}});
  // No temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d.path())) ++files;
  EXPECT_EQ(files, 1);

  // Check the bytes with an independent parse: length, 8-byte alignment of the data, offsets.
  std::ifstream in(d / "y.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const auto h = nlohmann::json::parse(std::string(bytes.data() + 8, n));
  EXPECT_EQ(h["layer.a"]["dtype"], "F32");
  EXPECT_EQ(h["layer.a"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(h["b"]["dtype"], "F16");
  EXPECT_EQ(h["b"]["shape"], nlohmann::json::array({3, 1}));
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json::array({24, 30}));
  EXPECT_EQ(h["c"]["dtype"], "BF16");
  EXPECT_EQ(h["__metadata__"]["step"], "12");
  EXPECT_EQ(bytes.size(), 8 + n + 34);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, a.data(), 24), 0);

  const SafetensorsFile f(d / "y.safetensors");
  EXPECT_EQ(f.read_fp32(*f.find("layer.a")), a);
  EXPECT_EQ(f.read_fp32(*f.find("b")), (std::vector<float>{0.5f, -1.0f, 65504.0f}));
  EXPECT_EQ(f.read_fp32(*f.find("c")), (std::vector<float>{3.0f, -0.125f}));
  EXPECT_EQ(f.metadata().at("format"), "pt");

  // Overwriting is atomic too, and replaces the content.
  write_safetensors(d / "y.safetensors", std::span(items).subspan(2));
  EXPECT_EQ(SafetensorsFile(d / "y.safetensors").entries().size(), 1u);
  expect_error([&] { write_safetensors(d / "no_such_dir" / "z.safetensors", items); }, {"z.safetensors"});
}

TEST(Safetensors, CorruptFilesAreErrorsNamingFileAndTensor) {
  TempDir d;
  const auto p = d / "bad.safetensors";
  const std::string file = p.string();
  // Shorter than the length field.
  { std::ofstream(p, std::ios::binary) << "abc"; }
  expect_error([&] { SafetensorsFile f(p); }, {file, "truncated"});
  // Header length past the end of the file.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", float_bytes({1}), 1000);
  expect_error([&] { SafetensorsFile f(p); }, {file, "header length 1000"});
  // Not JSON.
  write_raw(p, R"({"a": {"dtype": "F32", )", float_bytes({1}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "JSON"});
  // Overlapping offsets.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            float_bytes({1, 2, 3}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "'a'", "'b'", "overlap"});
  // Byte count that does not match dtype and shape (wrong dtype size).
  write_raw(p, R"({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 8]}})", float_bytes({1, 2}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "'a'", "F16", "need 4"});
  // Unknown dtype.
  write_raw(p, R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", float_bytes({1, 2}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "'a'", "Q4"});
  // Truncated data: the range ends past the data section.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", float_bytes({1, 2}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "'a'", "outside the data section"});
  // Negative shape, bad offsets form.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", float_bytes({1}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "'a'", "non-negative"});
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", float_bytes({1}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "'a'", "data_offsets"});
  // A number no double holds: the JSON library's out_of_range once escaped as an internal error.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1e400]}})", float_bytes({1}));
  expect_error([&] { SafetensorsFile f(p); }, {file, "number out of range"});
  // Not JSON: where, in words, never the library's "[json.exception.parse_error.101]".
  write_raw(p, "{\"a\": {\"dtype\": \"F32\",\n  ]", float_bytes({1}));
  try {
    SafetensorsFile f(p);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 2, column 3"), std::string::npos) << e.what();
  }
  // A valid file with a dtype dstrain cannot load as weights: Error on reading that tensor.
  write_raw(p, R"({"i": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", float_bytes({1, 2}));
  const SafetensorsFile ok(p);
  expect_error([&] { ok.read_fp32(*ok.find("i")); }, {file, "'i'", "I64"});
  expect_error([&] { SafetensorsFile f(d / "missing.safetensors"); }, {"missing.safetensors"});
}

// ---- GPT-2 in the HF layout ----

// A distinct value for every element: 1000 * (tensor number) + element index, scaled.
float tag(int tensor, std::int64_t i) { return static_cast<float>(tensor * 1000 + i) * 0.001f; }

TEST(Gpt2Weights, ExportWritesTheHuggingFaceLayout) {
  TempDir d;
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");  // C 16, V 61 -> 128
  Gpt2Model m(cfg, DType::fp32, 1, 8);
  int k = 0;
  for (const auto& p : m.params()) {
    auto* v = p.value.as<float>();
    for (std::int64_t i = 0; i < p.value.numel(); ++i) v[i] = tag(k, i);
    ++k;
  }
  save_gpt2_weights(m, d / "model.safetensors");
  const SafetensorsFile f(d / "model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.entries().size(), 2u + 12u * 2 + 2u);
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);
  // c_attn: ours (3C, C) = (48, 16); the file (in, out) = (16, 48), file[i][o] == ours[o][i].
  const auto* e = f.find("h.1.attn.c_attn.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, "F32");
  EXPECT_EQ(e->shape, (std::vector<std::int64_t>{16, 48}));
  const auto file = f.read_fp32(*e);
  const auto* ours = m.param("h.1.attn.c_attn.weight").as<float>();
  for (std::int64_t i = 0; i < 16; ++i)
    for (std::int64_t o = 0; o < 48; ++o) ASSERT_EQ(file[i * 48 + o], ours[o * 16 + i]) << i << "," << o;
  // mlp.c_proj: ours (C, 4C) = (16, 64); the file (64, 16).
  const auto* mp = f.find("h.0.mlp.c_proj.weight");
  EXPECT_EQ(mp->shape, (std::vector<std::int64_t>{64, 16}));
  const auto mpf = f.read_fp32(*mp);
  const auto* mpo = m.param("h.0.mlp.c_proj.weight").as<float>();
  for (std::int64_t i = 0; i < 64; ++i)
    for (std::int64_t o = 0; o < 16; ++o) ASSERT_EQ(mpf[i * 16 + o], mpo[o * 64 + i]);
  // wte: only the real vocabulary; biases and LN weights as they are.
  EXPECT_EQ(f.find("wte.weight")->shape, (std::vector<std::int64_t>{61, 16}));
  EXPECT_EQ(f.read_fp32(*f.find("wte.weight"))[60 * 16 + 15], m.param("wte.weight").as<float>()[60 * 16 + 15]);
  EXPECT_EQ(f.find("h.0.attn.c_attn.bias")->shape, (std::vector<std::int64_t>{48}));
  EXPECT_EQ(f.read_fp32(*f.find("ln_f.bias"))[3], m.param("ln_f.bias").as<float>()[3]);
  // bf16 export stores BF16.
  save_gpt2_weights(m, d / "bf16.safetensors", DType::bf16);
  EXPECT_EQ(SafetensorsFile(d / "bf16.safetensors").find("wpe.weight")->dtype, "BF16");
}

// A file laid out by hand as transformers writes GPT2LMHeadModel: "transformer." prefix, Conv1D
// (in, out), mask buffers and the tied lm_head present.
TEST(Gpt2Weights, ImportReadsAHandPlacedHuggingFaceFile) {
  TempDir d;
  const Gpt2Config cfg = model_config_from_spec("gpt2:L1-C4-H2-V5-T3");  // Vp 128
  std::vector<SafetensorsWriteItem> items;
  std::vector<std::vector<float>> store;
  store.reserve(32);
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, int t) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    store.emplace_back(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) store.back()[static_cast<std::size_t>(i)] = tag(t, i);
    items.push_back({name, Tensor(store.back().data(), DType::fp32, Shape{n}), shape});
  };
  add("transformer.wte.weight", {5, 4}, 1);
  add("transformer.wpe.weight", {3, 4}, 2);
  add("transformer.h.0.ln_1.weight", {4}, 3);
  add("transformer.h.0.ln_1.bias", {4}, 4);
  add("transformer.h.0.attn.bias", {1, 1, 3, 3}, 5);  // mask buffer: ignored
  add("transformer.h.0.attn.masked_bias", {}, 6);     // ignored
  add("transformer.h.0.attn.c_attn.weight", {4, 12}, 7);
  add("transformer.h.0.attn.c_attn.bias", {12}, 8);
  add("transformer.h.0.attn.c_proj.weight", {4, 4}, 9);
  add("transformer.h.0.attn.c_proj.bias", {4}, 10);
  add("transformer.h.0.ln_2.weight", {4}, 11);
  add("transformer.h.0.ln_2.bias", {4}, 12);
  add("transformer.h.0.mlp.c_fc.weight", {4, 16}, 13);
  add("transformer.h.0.mlp.c_fc.bias", {16}, 14);
  add("transformer.h.0.mlp.c_proj.weight", {16, 4}, 15);
  add("transformer.h.0.mlp.c_proj.bias", {4}, 16);
  add("transformer.ln_f.weight", {4}, 17);
  add("transformer.ln_f.bias", {4}, 18);
  add("lm_head.weight", {5, 4}, 1);
  write_safetensors(d / "hf.safetensors", items, {{"format", "pt"}});

  Gpt2Model m(cfg, DType::fp32, 1, 3);
  auto* wte = m.param("wte.weight").as<float>();
  for (std::int64_t i = 0; i < 128 * 4; ++i) wte[i] = 9.0f;  // padded rows must come back zero
  load_gpt2_weights(m, d / "hf.safetensors");
  for (std::int64_t i = 0; i < 5 * 4; ++i) ASSERT_EQ(wte[i], tag(1, i));
  for (std::int64_t i = 5 * 4; i < 128 * 4; ++i) ASSERT_EQ(wte[i], 0.0f) << "padded element " << i;
  const auto* qkv = m.param("h.0.attn.c_attn.weight").as<float>();  // ours (12, 4)
  for (std::int64_t o = 0; o < 12; ++o)
    for (std::int64_t i = 0; i < 4; ++i) ASSERT_EQ(qkv[o * 4 + i], tag(7, i * 12 + o)) << o << "," << i;
  const auto* fc = m.param("h.0.mlp.c_fc.weight").as<float>();  // ours (16, 4), file (4, 16)
  EXPECT_EQ(fc[5 * 4 + 2], tag(13, 2 * 16 + 5));
  const auto* pr = m.param("h.0.mlp.c_proj.weight").as<float>();  // ours (4, 16), file (16, 4)
  EXPECT_EQ(pr[3 * 16 + 11], tag(15, 11 * 4 + 3));
  EXPECT_EQ(m.param("ln_f.bias").as<float>()[2], tag(18, 2));
  EXPECT_EQ(m.param("h.0.attn.c_attn.bias").as<float>()[11], tag(8, 11));

  // Export and import again into a bf16 model: the same values, rounded once.
  save_gpt2_weights(m, d / "again.safetensors");
  Gpt2Model h(cfg, DType::bf16, 1, 3);
  load_gpt2_weights(h, d / "again.safetensors");
  for (const auto& p : m.params()) {
    const auto a = test::to_doubles(p.value), b = test::to_doubles(h.param(p.spec.name));
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(b[i], static_cast<double>(static_cast<float>(bf16_t(static_cast<float>(a[i]))))) << p.spec.name << "[" << i << "]";
  }
}

TEST(Gpt2Weights, MissingMisshapedAndForeignTensorsAreErrors) {
  TempDir d;
  const Gpt2Config cfg = model_config_from_spec("gpt2:L1-C4-H2-V5-T3");
  Gpt2Model m(cfg, DType::fp32, 1, 3);
  save_gpt2_weights(m, d / "ok.safetensors");
  const SafetensorsFile ok(d / "ok.safetensors");
  // Rewrite the file with one tensor changed.
  auto rewrite = [&](const std::string& drop, const std::string& reshape_name, std::vector<std::int64_t> new_shape, const std::string& extra) {
    std::vector<std::vector<float>> store;
    store.reserve(40);
    std::vector<SafetensorsWriteItem> items;
    for (const auto& e : ok.entries()) {
      if (e.name == drop) continue;
      store.push_back(ok.read_fp32(e));
      std::vector<std::int64_t> shape = e.shape;
      if (e.name == reshape_name) {
        shape = new_shape;
        std::int64_t n = 1;
        for (auto s : shape) n *= s;
        store.back().resize(static_cast<std::size_t>(n));
      }
      items.push_back({e.name, Tensor(store.back().data(), DType::fp32, Shape{static_cast<std::int64_t>(store.back().size())}), shape});
    }
    if (!extra.empty()) {
      store.push_back({1, 2, 3, 4});
      items.push_back({extra, Tensor(store.back().data(), DType::fp32, Shape{4}), {}});
    }
    write_safetensors(d / "bad.safetensors", items);
  };
  rewrite("h.0.mlp.c_fc.bias", "", {}, "");
  expect_error([&] { load_gpt2_weights(m, d / "bad.safetensors"); }, {"bad.safetensors", "h.0.mlp.c_fc.bias", "missing", "[16]"});
  rewrite("", "h.0.attn.c_proj.weight", {4, 5}, "");
  expect_error([&] { load_gpt2_weights(m, d / "bad.safetensors"); }, {"h.0.attn.c_proj.weight", "[4, 5]", "[4, 4]"});
  rewrite("", "wte.weight", {128, 4}, "");  // padded rows in the file: not HF's layout
  expect_error([&] { load_gpt2_weights(m, d / "bad.safetensors"); }, {"wte.weight", "[128, 4]", "[5, 4]"});
  rewrite("", "", {}, "h.1.ln_1.weight");  // a 2-layer file into a 1-layer config
  expect_error([&] { load_gpt2_weights(m, d / "bad.safetensors"); }, {"h.1.ln_1.weight", "n_layer = 1"});
}

}  // namespace
}  // namespace dstrain
