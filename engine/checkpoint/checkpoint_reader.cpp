// CheckpointReader (engine/checkpoint/checkpoint_files.h): a checkpoint's rank files opened, checked and read
// piece by piece, whole, or streamed into the state (docs/checkpoints.md "Loading").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <iterator>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/checkpoint/checkpoint_file_io.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manifest.h"
#include "engine/checkpoint/host_prefault.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "ops/log.h"
#include "formats/safetensors.h"
#include "formats/json_text.h"

namespace dstrain {
namespace fs = std::filesystem;
using config::Json;
using namespace checkpoint_io;

namespace {

// Reads a file through two aligned windows of kReadWindow bytes with O_DIRECT (buffered where the
// file system refuses it): a request is copied out of the current window, and the next window is
// read by a second thread meanwhile, so a front-to-back load keeps one large request at the disk
// at all times and never waits on the kernel's readahead (this disk serves 32 MiB requests several
// times faster than 1 MiB ones; docs/checkpoints.md "Measured").
// A load's unit of reading: one window of WindowedFileReader, one request of read_all (this disk
// serves 32 MiB requests several times faster than 1 MiB ones; docs/checkpoints.md "Measured").
constexpr std::size_t kReadWindow = std::size_t{32} << 20;

// Reads up to n bytes at `from` (n, from and dst whole blocks, as O_DIRECT wants them) into dst;
// returns how many there were (fewer only at the end of the file).
std::size_t read_blocks(int fd, const fs::path& path, std::byte* dst, std::size_t n, std::uint64_t from) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(from + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("reading checkpoint file {} failed at byte {}: {}; load another tag", q(path), from + got, std::strerror(errno));
    if (r == 0) break;  // end of file
    got += static_cast<std::size_t>(r);
    if (got % kBlock != 0) break;  // a short read ends at the end of the file
  }
  return got;
}

class WindowedFileReader {
 public:
  WindowedFileReader(fs::path path, std::uint64_t size) : path_(std::move(path)), size_(size) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ < 0 && errno == EINVAL) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open checkpoint file {}: {}", q(path_), std::strerror(errno));
    const std::size_t window = std::min<std::size_t>(kReadWindow, round_up(static_cast<std::size_t>(size_), kBlock));
    window_ = std::max(window, kBlock);
  }
  ~WindowedFileReader() {
    if (pending_.valid()) pending_.wait();
    if (fd_ >= 0) ::close(fd_);
  }
  WindowedFileReader(const WindowedFileReader&) = delete;
  WindowedFileReader& operator=(const WindowedFileReader&) = delete;
  // The file, opened with O_DIRECT where the file system takes it (CheckpointReader::read_all
  // reads spans of it straight into the caller's memory).
  int fd() const { return fd_; }

  // Copies bytes [at, at + n) of the file into out; Error naming the file when it ends early.
  void read(void* out, std::size_t n, std::uint64_t at) {
    auto* c = static_cast<std::byte*>(out);
    while (n > 0) {
      const Window& w = window_at(at);
      const std::size_t k = std::min<std::uint64_t>(n, w.end - at);
      std::memcpy(c, w.buf.get() + (at - w.begin), k);
      c += k;
      at += k;
      n -= k;
    }
  }

 private:
  struct Window {
    CheckpointMemory buf;
    std::uint64_t begin = 0, end = 0;  // the file bytes it holds
  };

  const Window& window_at(std::uint64_t at) {
    if (!windows_[0].buf) {  // allocated on first use: a load that reads spans straight (read_all) needs none
      for (Window& w : windows_) w.buf = allocate_checkpoint_memory(window_);
    }
    Window& cur = windows_[0];
    if (at >= cur.begin && at < cur.end) return cur;
    if (pending_.valid()) pending_.get();  // rethrows a failed read
    Window& next = windows_[1];
    if (at >= next.begin && at < next.end) {
      std::swap(cur, next);
    } else {
      fill(cur, at / kBlock * kBlock);
      if (at >= cur.end) {
        fail("reading checkpoint file {} failed at byte {}: the file ends at {} — it is truncated; load another tag", q(path_), at, cur.end);
      }
    }
    if (cur.end < size_) {
      Window* w = &windows_[1];
      const std::uint64_t from = cur.end;
      pending_ = std::async(std::launch::async, [this, w, from] { fill(*w, from); });
    }
    return cur;
  }

  // Reads one window at `from` (a multiple of kBlock).
  void fill(Window& w, std::uint64_t from) {
    w.begin = w.end = from;
    w.end = from + read_blocks(fd_, path_, w.buf.get(), window_, from);
  }

  fs::path path_;
  std::uint64_t size_ = 0;
  int fd_ = -1;
  std::size_t window_ = 0;
  Window windows_[2];
  std::future<void> pending_;
};

}  // namespace

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
    std::unique_ptr<SafetensorsFile> st;  // opened on first read: the header checked against the index
    std::unique_ptr<WindowedFileReader> data;
    std::uint64_t data_start = 0;  // file offset of the data section
  };
  // Opens f's data file on first use: its size against the index, its safetensors header, the reader.
  void open(File& f);
  // The saved piece that is exactly w (same offset and numel) and its entry in its file; nullptr
  // when there is none (w is then read through read(), which names what is wrong).
  std::pair<Saved*, const SafetensorsEntry*> exact(const Want& w);
  // The saved pieces that are, in the order wanted, exactly the wanted ones, lying back to back in
  // one file (a load at the saving layout); empty when they are not.
  using Run = std::vector<std::pair<Saved*, const SafetensorsEntry*>>;
  Run run_of(const std::vector<Want>& want);
  // The whole blocks [first, first + bytes) of its file that hold a run (as O_DIRECT reads them).
  struct Span {
    std::uint64_t first = 0;
    std::size_t bytes = 0;
  };
  Span span_of(const Run& run) const;
  // Reads a run's span of its file (see the body) into slot(k) for request k, checks each piece's
  // CRC-32C as it lands and, given `landed`, hands on bytes [from, to) of piece i (offsets within
  // the piece) at `data` once they are in. A failed checksum or short read is an Error after the
  // ranges before it were handed on.
  void read_run(const Run& run, const std::function<std::byte*(std::size_t)>& slot, std::size_t slots,
                const std::function<void(std::size_t, std::uint64_t, std::uint64_t, const std::byte*)>& landed);
  std::vector<std::byte> scratch;  // a saved piece only partly wanted (a reshard), read whole to check it
  std::vector<File> files;
  std::map<std::pair<std::string, std::string>, std::vector<Saved>> pieces;  // (buffer, param) -> sorted by offset
  std::map<std::string, DType> buffers;
};

CheckpointReader::CheckpointReader(const fs::path& save_dir, const std::string& tag)
    : dir_(save_dir / tag), tag_(tag), impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) {
    std::string have;
    for (const std::string& t : list_checkpoint_tags(save_dir)) have += (have.empty() ? "" : ", ") + t;
    fail("checkpoint tag '{}' not found: {} is not a folder; the checkpoints under {} are: {}", tag, q(dir_), q(save_dir),
         have.empty() ? "none" : have);
  }
  const fs::path mpath = dir_ / kCheckpointManifest;
  if (!fs::exists(mpath, ec)) {
    fail("{} holds no {}: it is not a complete dstrain checkpoint (a save that did not finish never carries a tag's name); load another tag", q(dir_),
         kCheckpointManifest);
  }
  manifest_ = read_json_file(mpath, "manifest");
  // Every typed read below is inside the try: json's value()/get() throw its own type_error on a
  // field of the wrong type ("format": {}), which must become the malformed-manifest Error.
  try {
    if (!manifest_.is_object() || manifest_.value("format", std::string()) != kCheckpointFormat) {
      fail(
          "{} is not a dstrain checkpoint manifest (no \"format\": \"{}\"); a DeepSpeed torch checkpoint is converted with "
          "`dstrain train --init-from` of its weights instead",
          q(mpath), kCheckpointFormat);
    }
    if (manifest_.value("version", 0) != kCheckpointVersion) {
      fail("{}: checkpoint format version {} — this dstrain reads version {}", q(mpath), manifest_.value("version", 0), kCheckpointVersion);
    }
    // Every field of its type and in its range before any is used (docs/checkpoints.md "Loading").
    validate_checkpoint_manifest(manifest_, mpath);
    for (const Json& r : manifest_.at("ranks")) {
      const fs::path ipath = dir_ / r.at("index").get<std::string>();
      if (!fs::exists(ipath, ec)) fail("checkpoint index {} is missing; the checkpoint is incomplete — load another tag", q(ipath));
      const std::string text = read_text(ipath);
      if (text.size() != r.at("bytes").get<std::uint64_t>() || crc32c(text.data(), text.size()) != r.at("crc32c").get<std::uint32_t>()) {
        fail("checkpoint index {} does not match its checksum in {} ({} bytes, expected {}): the file is truncated or corrupt — load another tag",
             q(ipath), kCheckpointManifest, text.size(), r.at("bytes").get<std::uint64_t>());
      }
      const Json idx = parse_json_text(text, fmt::format("checkpoint index {}", q(ipath)));
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
        // An element range a model could have: what read() adds and multiplies stays far from overflow.
        constexpr std::int64_t kMaxElements = std::int64_t{1} << 48;
        if (s.offset < 0 || s.numel < 0 || s.offset > kMaxElements || s.numel > kMaxElements) {
          fail(
              "checkpoint index {} lists tensor '{}' of parameter '{}' at elements [{}, +{}), which no model has: the index is "
              "corrupt — load another tag",
              q(ipath), buffer, param, s.offset, s.numel);
        }
        s.dtype = parse_dtype(t.at("dtype").get<std::string>());
        s.crc = t.at("crc32c").get<std::uint32_t>();
        s.name = CheckpointPiece{buffer, param, s.offset, s.numel, s.dtype}.tensor_name();
        impl_->buffers.emplace(buffer, s.dtype);
        impl_->pieces[{buffer, param}].push_back(std::move(s));
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const Json::exception& e) {
    fail("checkpoint {} has a malformed manifest or rank index ({}); load another tag", q(dir_), json_error_text(e, ""));
  } catch (const std::exception& e) {
    fail("checkpoint {} has a malformed manifest or rank index ({}); load another tag", q(dir_), e.what());
  }
  for (auto& [key, v] : impl_->pieces) std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  // Every data file is there at the size its index says, whichever a rank reads: a file missing
  // from another pipeline stage's or rank's part is found on every rank before anything is read
  // (one stat each), not when its reader gets to it — after others may have loaded theirs.
  for (const Impl::File& f : impl_->files) {
    const auto size = fs::file_size(f.path, ec);
    if (ec) fail("checkpoint file {} is missing or unreadable ({}); the checkpoint is incomplete — load another tag", q(f.path), ec.message());
    if (size != f.bytes) {
      fail("checkpoint file {} has {} bytes but its index says {}: the file is truncated or was replaced — load another tag", q(f.path), size,
           f.bytes);
    }
  }
}

void CheckpointReader::Impl::open(File& f) {
  if (f.st) return;
  std::error_code ec;
  const auto size = fs::file_size(f.path, ec);
  if (ec) fail("checkpoint file {} is missing or unreadable ({}); the checkpoint is incomplete — load another tag", q(f.path), ec.message());
  if (size != f.bytes) {
    fail("checkpoint file {} has {} bytes but its index says {}: the file is truncated or was replaced — load another tag", q(f.path), size, f.bytes);
  }
  auto st = std::make_unique<SafetensorsFile>(f.path);
  // The data section starts after the 8-byte header length and the header (SafetensorsFile
  // checked that the header fits in the file).
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  std::uint8_t len[8];
  const bool got = fd >= 0 && ::pread(fd, len, 8, 0) == 8;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!got) fail("cannot read checkpoint file {}: {}; load another tag", q(f.path), std::strerror(err));
  std::uint64_t hn = 0;
  for (int i = 7; i >= 0; --i) hn = (hn << 8) | len[i];
  f.data = std::make_unique<WindowedFileReader>(f.path, f.bytes);
  f.data_start = 8 + hn;
  f.st = std::move(st);
}

std::pair<CheckpointReader::Impl::Saved*, const SafetensorsEntry*> CheckpointReader::Impl::exact(const Want& w) {
  const auto it = pieces.find({w.buffer, w.param});
  if (it == pieces.end()) return {nullptr, nullptr};
  std::vector<Saved>& v = it->second;
  const auto s = std::lower_bound(v.begin(), v.end(), w.offset, [](const Saved& a, std::int64_t o) { return a.offset < o; });
  if (s == v.end() || s->offset != w.offset || s->numel != w.numel) return {nullptr, nullptr};
  File& f = files[s->file];
  open(f);
  const SafetensorsEntry* e = f.st->find(s->name);
  if (e == nullptr || e->numel() != s->numel || e->end - e->begin != static_cast<std::uint64_t>(s->numel) * dtype_size(s->dtype) ||
      f.data_start + e->end > f.bytes || (f.data_start + e->begin) % dtype_size(s->dtype) != 0) {  // read in place: aligned for its dtype
    return {nullptr, nullptr};
  }
  return {&*s, e};
}

CheckpointReader::Impl::Run CheckpointReader::Impl::run_of(const std::vector<Want>& want) {
  Run run;
  for (const Want& w : want) {
    const auto [s, e] = exact(w);
    if (s == nullptr || (!run.empty() && (s->file != run.front().first->file || e->begin != run.back().second->end))) return {};
    run.emplace_back(s, e);
  }
  return run;
}

CheckpointReader::Impl::Span CheckpointReader::Impl::span_of(const Run& run) const {
  const File& f = files[run.front().first->file];
  const std::uint64_t first = (f.data_start + run.front().second->begin) / kBlock * kBlock;
  return {first, round_up(static_cast<std::size_t>(f.data_start + run.back().second->end - first), kBlock)};
}

void CheckpointReader::Impl::read_run(const Run& run, const std::function<std::byte*(std::size_t)>& slot, std::size_t slots,
                                      const std::function<void(std::size_t, std::uint64_t, std::uint64_t, const std::byte*)>& landed) {
  File& f = files[run.front().first->file];
  const std::uint64_t begin = f.data_start + run.front().second->begin, end = f.data_start + run.back().second->end;
  const Span sp = span_of(run);  // named, not bound: clang 14 cannot capture a structured binding
  const std::uint64_t first = sp.first;
  const std::size_t span = sp.bytes;
  // Request k reads blocks [first + k * kReadWindow, ...) into slot(k), on its own thread; kInFlight
  // of them at a time, the oldest checked (and handed on) while the others are read. With `slots`
  // reused slots, request k + kInFlight is issued once request k has landed, into a slot that is
  // neither k's (being handed on) nor one still being read.
  constexpr std::size_t kInFlight = 2;
  DSTRAIN_CHECK(slots == 0 || slots > kInFlight, "CheckpointReader: {} reused slots for {} requests in flight", slots, kInFlight);
  const std::size_t requests = (span + kReadWindow - 1) / kReadWindow;
  const int fd = f.data->fd();
  const auto issue = [&](std::size_t k) {
    const std::size_t off = k * kReadWindow, n = std::min(kReadWindow, span - off);
    return std::async(std::launch::async, [fd, &f, p = slot(k), n, at = first + off] { return read_blocks(fd, f.path, p, n, at); });
  };
  std::vector<std::future<std::size_t>> flight;
  const auto drain = [&flight] {
    for (auto& r : flight)
      if (r.valid()) r.wait();
  };
  try {
    for (std::size_t k = 0; k < std::min(kInFlight, requests); ++k) flight.push_back(issue(k));
    std::size_t piece = 0;          // the piece being checked
    std::uint64_t checked = begin;  // file offset checked up to
    std::uint32_t crc = 0;
    for (std::size_t k = 0; k < requests; ++k) {
      const std::size_t got = flight[k].get();
      if (k + kInFlight < requests) flight.push_back(issue(k + kInFlight));
      const std::uint64_t lo = first + k * kReadWindow;
      const std::uint64_t landed_to = std::min<std::uint64_t>(end, lo + got);
      if (landed_to < std::min<std::uint64_t>(end, lo + kReadWindow)) {
        fail("reading checkpoint file {} failed at byte {}: the file ends there — it is truncated; load another tag", q(f.path), landed_to);
      }
      const std::byte* const data = slot(k);
      for (; piece < run.size(); ++piece) {
        const auto& [s, e] = run[piece];
        const std::uint64_t piece_end = f.data_start + e->end;
        const std::uint64_t upto = std::min(piece_end, landed_to);
        if (upto > checked) {
          crc = crc32c(data + (checked - lo), static_cast<std::size_t>(upto - checked), crc);
          if (landed) landed(piece, checked - (f.data_start + e->begin), upto - (f.data_start + e->begin), data + (checked - lo));
        }
        checked = upto;
        if (upto < piece_end) break;  // the rest of this piece is in the next request
        if (crc != s->crc) {
          fail("checkpoint file {}: tensor '{}' fails its checksum (crc32c): the file is corrupt — load another tag", q(f.path), s->name);
        }
        s->verified = true;
        crc = 0;
      }
    }
  } catch (...) {
    drain();  // no request may outlive the memory it reads into
    throw;
  }
}

CheckpointReader::Loaded CheckpointReader::read_all(const std::vector<Want>& want) {
  Loaded out;
  const Impl::Run run = impl_->run_of(want);  // one file's pieces, back to back in it, in the order wanted?
  if (run.empty()) {
    std::size_t total = 0;
    std::vector<std::size_t> bytes;
    for (const Want& w : want) {
      const std::optional<DType> dt = buffer_dtype(w.buffer);
      bytes.push_back(static_cast<std::size_t>(w.numel) * (dt ? dtype_size(*dt) : 0));  // absent: read() says so
      total += bytes.back();
    }
    out.memory = allocate_checkpoint_memory(total);
    BackgroundPrefault prefault(out.memory.get(), total);
    std::byte* at = out.memory.get();
    for (std::size_t i = 0; i < want.size(); ++i) {
      out.at.push_back(at);
      read(want[i].buffer, want[i].param, want[i].offset, want[i].numel, at);
      at += bytes[i];
    }
    return out;
  }
  // Straight from the file into one block of memory, each piece at its file offset's place within
  // a block (as O_DIRECT requires); the checksums hide behind the reads.
  const Impl::File& f = impl_->files[run.front().first->file];
  const auto [first, span] = impl_->span_of(run);
  out.memory = allocate_checkpoint_memory(span);
  std::byte* const base = out.memory.get();
  for (const auto& [s, e] : run) out.at.push_back(base + (f.data_start + e->begin - first));
  BackgroundPrefault prefault(base, span);
  impl_->read_run(
      run, [base](std::size_t k) { return base + k * kReadWindow; }, 0, nullptr);
  return out;
}

bool CheckpointReader::stream(const std::vector<Want>& want, const Sink& sink) {
  const Impl::Run run = impl_->run_of(want);
  if (run.empty()) return false;
  // Three request-sized slots, reused: two being read while the third is checked and handed on.
  constexpr std::size_t kSlots = 3;
  const std::size_t span = impl_->span_of(run).bytes;
  const std::size_t slot_bytes = std::min(kReadWindow, span);
  const std::size_t slots = std::min(kSlots, (span + kReadWindow - 1) / kReadWindow);
  CheckpointMemory ring = allocate_checkpoint_memory(slot_bytes * slots);
  BackgroundPrefault prefault(ring.get(), slot_bytes * slots);
  std::byte* const base = ring.get();
  impl_->read_run(
      run, [base, slot_bytes](std::size_t k) { return base + (k % kSlots) * slot_bytes; }, kSlots,
      [&](std::size_t i, std::uint64_t from, std::uint64_t to, const std::byte* data) {
        const std::size_t es = dtype_size(run[i].first->dtype);
        sink(i, static_cast<std::int64_t>(from / es), static_cast<std::int64_t>((to - from) / es), data);
      });
  return true;
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
    fail(
        "checkpoint {} holds no '{}' of parameter '{}': it was saved from another model (or without that state); check the model, or "
        "load without that state",
        q(dir_), buffer, param);
  }
  std::int64_t at = offset;  // the next element to fill
  const std::int64_t end = offset + numel;
  // Start at the last saved piece that begins at or before `offset` (they are sorted by offset): a
  // parameter saved as many pieces (a column-split piece under tensor parallelism is one per row)
  // is not scanned from its start for every range a load asks for.
  std::vector<Impl::Saved>& saved = it->second;
  auto from = std::upper_bound(saved.begin(), saved.end(), offset, [](std::int64_t o, const Impl::Saved& a) { return o < a.offset; });
  if (from != saved.begin()) --from;
  while (from != saved.begin() && std::prev(from)->offset == from->offset) --from;  // an empty piece beside it
  for (auto si = from; si != saved.end(); ++si) {
    Impl::Saved& s = *si;
    if (s.offset + s.numel <= at || s.offset >= end) continue;
    if (s.offset > at) break;  // a gap
    Impl::File& f = impl_->files[s.file];
    impl_->open(f);
    const SafetensorsEntry* e = f.st->find(s.name);
    const std::size_t esize = dtype_size(s.dtype);
    if (e == nullptr || e->numel() != s.numel || e->end - e->begin != static_cast<std::uint64_t>(s.numel) * esize) {
      fail("checkpoint file {} has no tensor '{}' of {} elements as its index says; the file is corrupt — load another tag", q(f.path), s.name,
           s.numel);
    }
    const std::int64_t lo = std::max(at, s.offset), to = std::min(end, s.offset + s.numel);
    std::byte* dst = static_cast<std::byte*>(out) + static_cast<std::size_t>(lo - offset) * esize;
    const std::size_t want = static_cast<std::size_t>(to - lo) * esize;
    const std::uint64_t piece_at = f.data_start + e->begin;
    if (s.verified) {
      f.data->read(dst, want, piece_at + static_cast<std::uint64_t>(lo - s.offset) * esize);
    } else {
      // The checksum covers the whole saved piece: read it whole, into the caller's memory when
      // that is exactly what is wanted (a load at the saving layout), else through the scratch.
      const std::size_t whole = static_cast<std::size_t>(s.numel) * esize;
      std::byte* into = dst;
      if (want != whole) {
        impl_->scratch.resize(whole);
        into = impl_->scratch.data();
      }
      f.data->read(into, whole, piece_at);
      if (crc32c(into, whole) != s.crc) {
        fail("checkpoint file {}: tensor '{}' fails its checksum (crc32c): the file is corrupt — load another tag", q(f.path), s.name);
      }
      s.verified = true;
      if (into != dst) std::memcpy(dst, into + static_cast<std::size_t>(lo - s.offset) * esize, want);
    }
    at = to;
    if (at >= end) break;
  }
  if (at < end) {
    fail(
        "checkpoint {} does not hold elements [{}, {}) of '{}' of parameter '{}': a rank's file or index is missing pieces — the "
        "checkpoint is incomplete or from another model",
        q(dir_), at, end, buffer, param);
  }
}

}  // namespace dstrain
