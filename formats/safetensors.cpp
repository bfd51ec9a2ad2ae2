#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/json_text.h"
#include "ops/atomic_file.h"
#include "ops/error.h"

namespace dstrain {
namespace {

// Header sizes above this are rejected before parsing (the reference implementation's limit).
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

std::size_t dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

std::string quoted(const std::filesystem::path& p) { return fmt::format("'{}'", p.string()); }

}  // namespace

std::int64_t SafetensorsEntry::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

DType safetensors_dtype(std::string_view dtype, std::string_view file, std::string_view tensor) {
  if (dtype == "F32") return DType::fp32;
  if (dtype == "F16") return DType::fp16;
  if (dtype == "BF16") return DType::bf16;
  fail("safetensors file '{}': tensor '{}' has dtype {}, but only F32, F16 and BF16 weights can be loaded; convert the file", file, tensor, dtype);
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return "F32";
    case DType::fp16:
      return "F16";
    case DType::bf16:
      return "BF16";
    default:
      break;
  }
  fail("safetensors: dtype {} cannot be written as weights; use fp32, fp16 or bf16", dtype_name(dtype));
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open safetensors file {}: {}; check the path and its permissions", quoted(path), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat safetensors file {}: {}", quoted(path), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("safetensors path {} is not a regular file; give the .safetensors file itself", quoted(path));
  }
  map_size_ = static_cast<std::size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail("safetensors file {} is {} bytes, shorter than its 8-byte header length: the file is truncated or not safetensors", quoted(path), map_size_);
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("cannot map safetensors file {}: {}", quoted(path), std::strerror(map_err));
  }
  try {
    const auto* base = static_cast<const std::byte*>(map_);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(base[i]);
    if (n > kMaxHeaderBytes || n > map_size_ - 8) {
      fail(
          "safetensors file {}: header length {} does not fit in the file of {} bytes (at most {} bytes of header are accepted): the file is "
          "truncated or not safetensors",
          quoted(path), n, map_size_, std::min<std::uint64_t>(kMaxHeaderBytes, map_size_ - 8));
    }
    const std::string_view text(reinterpret_cast<const char*>(base + 8), static_cast<std::size_t>(n));
    data_ = base + 8 + n;
    const std::uint64_t data_size = map_size_ - 8 - n;
    const nlohmann::json h = parse_json_text(text, fmt::format("safetensors file {}: its header (the file is corrupt)", quoted(path)));
    if (!h.is_object()) fail("safetensors file {}: the header must be a JSON object of tensors", quoted(path));
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const auto& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail("safetensors file {}: __metadata__ must be an object of strings", quoted(path));
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            fail("safetensors file {}: __metadata__ value of '{}' must be a string, got {}", quoted(path), m.key(), m.value().dump());
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& what) { fail("safetensors file {}: tensor '{}': {}; the file is corrupt", quoted(path), name, what); };
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
        bad("the entry must be an object with dtype, shape and data_offsets");
      }
      SafetensorsEntry e;
      e.name = name;
      if (!v["dtype"].is_string()) bad("dtype must be a string");
      e.dtype = v["dtype"].get<std::string>();
      const std::size_t esize = dtype_bytes(e.dtype);
      if (esize == 0) bad(fmt::format("unknown dtype \"{}\"", e.dtype));
      if (!v["shape"].is_array()) bad("shape must be an array");
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) bad(fmt::format("shape {} must hold non-negative integers", v["shape"].dump()));
        e.shape.push_back(d.get<std::int64_t>());
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
        bad("data_offsets must be [begin, end] with non-negative integers");
      }
      e.begin = off[0].get<std::uint64_t>();
      e.end = off[1].get<std::uint64_t>();
      if (e.begin > e.end || e.end > data_size) {
        bad(fmt::format("data_offsets [{}, {}] lie outside the data section of {} bytes (the file is truncated?)", e.begin, e.end, data_size));
      }
      // numel * size, guarding against overflow from absurd shapes.
      std::uint64_t bytes = esize;
      bool overflow = false;
      for (std::int64_t d : e.shape) overflow = overflow || __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes);
      if (overflow || bytes != e.end - e.begin) {
        bad(fmt::format("data_offsets [{}, {}] hold {} bytes, but dtype {} and shape {} need {}", e.begin, e.end, e.end - e.begin, e.dtype,
                        v["shape"].dump(), overflow ? std::string("more than 2^64") : std::to_string(bytes)));
      }
      entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    for (std::size_t i = 1; i < entries_.size(); ++i) {
      const auto& a = entries_[i - 1];
      const auto& b = entries_[i];
      if (b.begin < a.end) {
        fail("safetensors file {}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap; the file is corrupt", quoted(path), a.name, a.begin, a.end,
             b.name, b.begin, b.end);
      }
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_size_(o.map_size_),
      data_(o.data_),
      entries_(std::move(o.entries_)),
      metadata_(std::move(o.metadata_)) {
  o.map_ = nullptr;
  o.data_ = nullptr;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsEntry& e) const {
  return {data_ + e.begin, static_cast<std::size_t>(e.end - e.begin)};
}

std::vector<float> SafetensorsFile::read_fp32(const SafetensorsEntry& e) const {
  const DType t = safetensors_dtype(e.dtype, path_.string(), e.name);
  std::vector<float> out(static_cast<std::size_t>(e.numel()));
  // The data section need not be aligned for the element type: copy out, then convert.
  const auto raw = bytes(e);
  if (t == DType::fp32) {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    std::vector<std::uint16_t> tmp(out.size());
    std::memcpy(tmp.data(), raw.data(), raw.size());
    convert(tmp.data(), t, out.data(), DType::fp32, out.size());
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsWriteItem> items,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t off = 0;
  for (const auto& it : items) {
    const Tensor& t = it.tensor;
    if (!t.device.is_cpu()) fail("write_safetensors {}: tensor '{}' is on {}; copy it to the cpu first", quoted(path), it.name, t.device.str());
    std::vector<std::int64_t> shape = it.shape;
    if (shape.empty() && t.shape.rank > 0) {
      for (int i = 0; i < t.shape.rank; ++i) shape.push_back(t.shape[i]);
    }
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    if (n != t.numel())
      fail("write_safetensors {}: tensor '{}' has {} elements but shape of {} elements was given", quoted(path), it.name, t.numel(), n);
    if (it.name == "__metadata__" || h.contains(it.name))
      fail("write_safetensors {}: tensor name '{}' is reserved or used twice", quoted(path), it.name);
    nlohmann::ordered_json e;
    e["dtype"] = std::string(safetensors_dtype_name(t.dtype));
    e["shape"] = shape;
    e["data_offsets"] = {off, off + t.nbytes()};
    h[it.name] = e;
    off += t.nbytes();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  // Temporaries of earlier writes whose process died go first (ops/atomic_file.h).
  check_replaceable(path, "the safetensors file");
  remove_stale_temp_files(path);
  const std::filesystem::path tmp = temp_path_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create {}: {}; check that the folder exists and is writable", quoted(tmp), write_errno_text(errno));
  auto write_all = [&](const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        fail("writing {} failed: {} (the previous file, if any, is untouched)", quoted(path), write_errno_text(err));
      }
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  };
  std::uint8_t len[8];
  const std::uint64_t hn = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(hn >> (8 * i));
  write_all(len, 8);
  write_all(header.data(), header.size());
  for (const auto& it : items) write_all(it.tensor.data, it.tensor.nbytes());
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  if (::close(fd) != 0 || !synced) {
    const int err = synced ? errno : sync_err;
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    fail("flushing {} to disk failed: {}", quoted(tmp), write_errno_text(err));
  }
  std::error_code ec;
  try {
    check_replaceable(path, "the safetensors file");  // what may have appeared there while writing
  } catch (const Error&) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    fail("cannot rename {} to {}: {}", quoted(tmp), quoted(path), why);
  }
  // Make the rename itself durable: flush the folder's entry (best effort; some filesystems refuse).
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace dstrain
