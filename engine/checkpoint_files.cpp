#include "engine/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "ops/atomic_file.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "ops/transformer/safetensors.h"

namespace dstrain {
namespace fs = std::filesystem;
using config::Json;

namespace {

std::string q(const fs::path& p) { return fmt::format("'{}'", p.string()); }

void write_all(int fd, const fs::path& path, const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fail("writing checkpoint file {} failed: {} (the previous checkpoint, if any, is untouched; the run's state is intact)", q(path),
           write_errno_text(w == 0 ? ENOSPC : errno));
    }
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_close(int fd, const fs::path& path) {
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  if (::close(fd) != 0 || !synced) {
    fail("flushing checkpoint file {} to disk failed: {} (the previous checkpoint, if any, is untouched)", q(path),
         write_errno_text(synced ? errno : sync_err));
  }
}

Json read_json_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("checkpoint {} {} is missing or unreadable: {}; the checkpoint is incomplete — load another tag", what, q(path), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const std::exception& e) {
    fail("checkpoint {} {} is not valid JSON ({}); the file is truncated or corrupt — load another tag", what, q(path), e.what());
  }
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string CheckpointPiece::tensor_name() const { return buffer + "/" + param + "/" + std::to_string(offset); }

void check_checkpoint_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos || tag.find('\0') != std::string::npos ||
      tag.ends_with(".partial") || tag == kLatestFile) {
    fail("checkpoint tag '{}' cannot name a checkpoint folder: use a non-empty name without '/', not \".\", \"..\", \"latest\" or one "
         "ending in \".partial\" (the default is global_step<N>)",
         tag);
  }
}

fs::path partial_checkpoint_dir(const fs::path& save_dir, const std::string& tag) { return save_dir / (tag + ".partial"); }

std::string rank_file_name(int rank, const char* ext) { return fmt::format("rank_{:05d}{}", rank, ext); }

void checkpoint_test_pause() {
  static const long ms = [] {
    const char* v = std::getenv(kCheckpointPauseEnv);
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---- writing ----

RankFileWriter::RankFileWriter(fs::path path, std::vector<CheckpointPiece> pieces) : path_(std::move(path)), pieces_(std::move(pieces)) {
  Json h = Json::object();
  h["__metadata__"] = {{"format", kCheckpointFormat}};
  std::uint64_t off = 0;
  for (const CheckpointPiece& p : pieces_) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(p.numel) * dtype_size(p.dtype);
    h[p.tensor_name()] = {{"dtype", std::string(safetensors_dtype_name(p.dtype))}, {"shape", {p.numel}}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  checkpoint_test_pause();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create checkpoint file {}: {}; check that the save folder is writable", q(path_), write_errno_text(errno));
  // The whole size is known: reserve it now, so a full disk fails here (before any time is spent
  // writing) and the file system lays the file out in large extents.
  if (const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(8 + header.size() + off)); rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    ::close(fd_);
    fd_ = -1;
    fail("cannot reserve {} bytes for checkpoint file {}: {} (the previous checkpoint, if any, is untouched; the run's state is intact)",
         8 + header.size() + off, q(path_), write_errno_text(rc));
  }
  std::uint8_t len[8];
  const std::uint64_t hn = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(hn >> (8 * i));
  put(len, 8);
  put(header.data(), header.size());
}

RankFileWriter::~RankFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void RankFileWriter::put(const void* bytes, std::size_t n) {
  write_all(fd_, path_, bytes, n);
  written_ += n;
}

void RankFileWriter::write(std::size_t i, const void* bytes) {
  DSTRAIN_CHECK(i == next_ && i < pieces_.size(), "RankFileWriter: piece {} written out of order (expected {})", i, next_);
  const std::size_t n = static_cast<std::size_t>(pieces_[i].numel) * dtype_size(pieces_[i].dtype);
  crcs_.push_back(crc32c(bytes, n));
  put(bytes, n);
  ++next_;
}

Json RankFileWriter::finish() {
  DSTRAIN_CHECK(next_ == pieces_.size(), "RankFileWriter: {} of {} pieces written", next_, pieces_.size());
  const int fd = fd_;
  fd_ = -1;
  fsync_close(fd, path_);
  Json tensors = Json::array();
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const CheckpointPiece& p = pieces_[i];
    tensors.push_back({{"buffer", p.buffer}, {"param", p.param}, {"offset", p.offset}, {"numel", p.numel}, {"dtype", std::string(dtype_name(p.dtype))},
                       {"crc32c", crcs_[i]}});
  }
  return Json{{"format", kCheckpointFormat}, {"file", path_.filename().string()}, {"bytes", written_}, {"tensors", std::move(tensors)}};
}

void write_checkpoint_text(const fs::path& path, const std::string& text) {
  checkpoint_test_pause();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create checkpoint file {}: {}; check that the save folder is writable", q(path), write_errno_text(errno));
  try {
    write_all(fd, path, text.data(), text.size());
  } catch (...) {
    ::close(fd);
    throw;
  }
  fsync_close(fd, path);
}

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open folder {} to flush it: {}", q(dir), std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok && err != EINVAL) fail("flushing folder {} to disk failed: {}", q(dir), write_errno_text(err));
}

void commit_checkpoint(const fs::path& save_dir, const std::string& tag) {
  const fs::path partial = partial_checkpoint_dir(save_dir, tag);
  const fs::path final_dir = save_dir / tag;
  sync_dir(partial);
  checkpoint_test_pause();
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // Saving a tag again: the old folder moves aside first (a crash here leaves `latest` naming a
    // missing folder only if it named this very tag; the load then says so and names the others).
    const fs::path old = save_dir / (tag + ".old.partial");
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) fail("cannot replace the existing checkpoint {}: {}", q(final_dir), ec.message());
    fs::rename(partial, final_dir, ec);
    if (ec) fail("cannot rename {} to {}: {}", q(partial), q(final_dir), ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(partial, final_dir, ec);
    if (ec) fail("cannot rename {} to {}: {}", q(partial), q(final_dir), ec.message());
  }
  sync_dir(save_dir);
  checkpoint_test_pause();
  write_file_atomically(save_dir / kLatestFile, tag);
}

std::optional<std::string> read_latest_tag(const fs::path& save_dir) {
  const fs::path latest = save_dir / kLatestFile;
  std::error_code ec;
  if (!fs::exists(latest, ec)) return std::nullopt;
  std::string tag = read_text(latest);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  if (tag.empty()) fail("{} is empty; it should name the newest checkpoint's tag — pass the tag explicitly (--load-tag)", q(latest));
  return tag;
}

std::vector<std::string> list_checkpoint_tags(const fs::path& save_dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.ends_with(".partial") || !fs::exists(e.path() / kCheckpointManifest)) continue;
    std::int64_t steps = -1;
    try {
      steps = read_json_file(e.path() / kCheckpointManifest, "manifest").at("engine").at("global_steps").get<std::int64_t>();
    } catch (const std::exception&) {
    }
    found.emplace_back(steps, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> tags;
  for (auto& [s, n] : found) tags.push_back(std::move(n));
  return tags;
}

// ---- reading ----

struct CheckpointReader::Impl {
  struct Saved {
    std::size_t file = 0;  // index into files
    std::string name;      // tensor name in the data file
    std::int64_t offset = 0, numel = 0;
    DType dtype = DType::fp32;
    std::uint32_t crc = 0;
    bool verified = false;
  };
  struct File {
    fs::path path;
    std::uint64_t bytes = 0;
    std::unique_ptr<SafetensorsFile> st;  // opened on first read
  };
  std::vector<File> files;
  std::map<std::pair<std::string, std::string>, std::vector<Saved>> pieces;  // (buffer, param) -> sorted by offset
  std::map<std::string, DType> buffers;
};

CheckpointReader::CheckpointReader(const fs::path& save_dir, const std::string& tag) : dir_(save_dir / tag), tag_(tag), impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) {
    std::string have;
    for (const std::string& t : list_checkpoint_tags(save_dir)) have += (have.empty() ? "" : ", ") + t;
    fail("checkpoint tag '{}' not found: {} is not a folder; the checkpoints under {} are: {}", tag, q(dir_), q(save_dir),
         have.empty() ? "none" : have);
  }
  const fs::path mpath = dir_ / kCheckpointManifest;
  if (!fs::exists(mpath, ec)) {
    fail("{} holds no {}: it is not a complete dstrain checkpoint (a save that did not finish never carries a tag's name); load another tag",
         q(dir_), kCheckpointManifest);
  }
  manifest_ = read_json_file(mpath, "manifest");
  if (!manifest_.is_object() || manifest_.value("format", std::string()) != kCheckpointFormat) {
    fail("{} is not a dstrain checkpoint manifest (no \"format\": \"{}\"); a DeepSpeed torch checkpoint is converted with "
         "`dstrain train --init-from` of its weights instead",
         q(mpath), kCheckpointFormat);
  }
  if (manifest_.value("version", 0) != kCheckpointVersion) {
    fail("{}: checkpoint format version {} — this dstrain reads version {}", q(mpath), manifest_.value("version", 0), kCheckpointVersion);
  }
  try {
    for (const Json& r : manifest_.at("ranks")) {
      const fs::path ipath = dir_ / r.at("index").get<std::string>();
      if (!fs::exists(ipath, ec)) fail("checkpoint index {} is missing; the checkpoint is incomplete — load another tag", q(ipath));
      const std::string text = read_text(ipath);
      if (text.size() != r.at("bytes").get<std::uint64_t>() || crc32c(text.data(), text.size()) != r.at("crc32c").get<std::uint32_t>()) {
        fail("checkpoint index {} does not match its checksum in {} ({} bytes, expected {}): the file is truncated or corrupt — load another tag",
             q(ipath), kCheckpointManifest, text.size(), r.at("bytes").get<std::uint64_t>());
      }
      const Json idx = Json::parse(text);
      Impl::File f;
      f.path = dir_ / idx.at("file").get<std::string>();
      f.bytes = idx.at("bytes").get<std::uint64_t>();
      const std::size_t fi = impl_->files.size();
      impl_->files.push_back(std::move(f));
      for (const Json& t : idx.at("tensors")) {
        Impl::Saved s;
        s.file = fi;
        const std::string buffer = t.at("buffer").get<std::string>();
        const std::string param = t.at("param").get<std::string>();
        s.offset = t.at("offset").get<std::int64_t>();
        s.numel = t.at("numel").get<std::int64_t>();
        s.dtype = parse_dtype(t.at("dtype").get<std::string>());
        s.crc = t.at("crc32c").get<std::uint32_t>();
        s.name = CheckpointPiece{buffer, param, s.offset, s.numel, s.dtype}.tensor_name();
        impl_->buffers.emplace(buffer, s.dtype);
        impl_->pieces[{buffer, param}].push_back(std::move(s));
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("checkpoint {} has a malformed manifest or rank index ({}); load another tag", q(dir_), e.what());
  }
  for (auto& [key, v] : impl_->pieces) std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;

std::optional<DType> CheckpointReader::buffer_dtype(const std::string& buffer) const {
  const auto it = impl_->buffers.find(buffer);
  if (it == impl_->buffers.end()) return std::nullopt;
  return it->second;
}

void CheckpointReader::read(const std::string& buffer, const std::string& param, std::int64_t offset, std::int64_t numel, void* out) {
  const auto it = impl_->pieces.find({buffer, param});
  if (it == impl_->pieces.end()) {
    fail("checkpoint {} holds no '{}' of parameter '{}': it was saved from another model (or without that state); check the model, or "
         "load without that state",
         q(dir_), buffer, param);
  }
  std::int64_t at = offset;  // the next element to fill
  const std::int64_t end = offset + numel;
  for (Impl::Saved& s : it->second) {
    if (s.offset + s.numel <= at || s.offset >= end) continue;
    if (s.offset > at) break;  // a gap
    Impl::File& f = impl_->files[s.file];
    if (!f.st) {
      std::error_code ec;
      const auto size = fs::file_size(f.path, ec);
      if (ec) fail("checkpoint file {} is missing or unreadable ({}); the checkpoint is incomplete — load another tag", q(f.path), ec.message());
      if (size != f.bytes) {
        fail("checkpoint file {} has {} bytes but its index says {}: the file is truncated or was replaced — load another tag", q(f.path), size,
             f.bytes);
      }
      f.st = std::make_unique<SafetensorsFile>(f.path);
    }
    const SafetensorsEntry* e = f.st->find(s.name);
    const std::size_t esize = dtype_size(s.dtype);
    if (e == nullptr || e->numel() != s.numel || e->end - e->begin != static_cast<std::uint64_t>(s.numel) * esize) {
      fail("checkpoint file {} has no tensor '{}' of {} elements as its index says; the file is corrupt — load another tag", q(f.path), s.name, s.numel);
    }
    const std::span<const std::byte> bytes = f.st->bytes(*e);
    if (!s.verified) {
      if (crc32c(bytes.data(), bytes.size()) != s.crc) {
        fail("checkpoint file {}: tensor '{}' fails its checksum (crc32c): the file is corrupt — load another tag", q(f.path), s.name);
      }
      s.verified = true;
    }
    const std::int64_t from = std::max(at, s.offset), to = std::min(end, s.offset + s.numel);
    std::memcpy(static_cast<std::byte*>(out) + static_cast<std::size_t>(from - offset) * esize,
                bytes.data() + static_cast<std::size_t>(from - s.offset) * esize, static_cast<std::size_t>(to - from) * esize);
    at = to;
    if (at >= end) break;
  }
  if (at < end) {
    fail("checkpoint {} does not hold elements [{}, {}) of '{}' of parameter '{}': a rank's file or index is missing pieces — the "
         "checkpoint is incomplete or from another model",
         q(dir_), at, end, buffer, param);
  }
}

}  // namespace dstrain
