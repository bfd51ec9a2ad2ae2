#include "offload/io_uring_engine.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "offload/io_error.h"
#include "offload/io_ring.h"
#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

struct IoFileState {
  std::shared_ptr<const std::string> path;
  int direct_fd = -1;    // O_DIRECT: every whole aligned block
  int buffered_fd = -1;  // the same file through the page cache: a request's last partial block
  unsigned index = 0;    // the file's pair of fixed-file slots: 2 * index, 2 * index + 1
  bool writable = false;
  std::uint64_t alignment = IoEngine::kMinAlignment;
  IoTracker requests;  // this file's unfinished requests, waited for by close
};

// What IoEngine and its IoFiles share: a file may outlive its engine (closing it then only closes
// the descriptors).
class IoEngineCore {
 public:
  IoOptions options;
  std::vector<std::unique_ptr<IoRing>> rings;
  IoTracker requests;

  std::mutex mutex;  // guards everything below
  std::vector<bool> file_index_used;
  struct Registered {
    std::size_t bytes;
    unsigned slot;
  };
  std::map<std::uintptr_t, Registered> buffers;  // by start address
  std::vector<bool> buffer_slot_used;
  std::optional<IoFault> fault;
  std::uint64_t pieces_counted[3] = {0, 0, 0};  // reads, writes, both: since the fault was armed
  std::uint64_t opens_counted = 0;
  unsigned next_ring = 0;
  bool registration_refusal_logged = false;

  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> bytes_written{0};
  std::atomic<std::uint64_t> pieces{0};
  // Nanoseconds callers spent blocked in IoHandle::wait (io_request.cpp); shared with the requests.
  std::shared_ptr<std::atomic<std::uint64_t>> waited_ns = std::make_shared<std::atomic<std::uint64_t>>(0);

  // Ends the rings (after every request); open files keep their descriptors until closed.
  void shut_down() {
    requests.wait_idle();
    std::lock_guard lock(mutex);
    rings.clear();
  }

  void close_file(IoFileState& f) {
    f.requests.wait_idle();
    std::lock_guard lock(mutex);
    for (auto& ring : rings) {
      ring->set_file(2 * f.index, -1);
      ring->set_file(2 * f.index + 1, -1);
    }
    if (f.index < file_index_used.size()) file_index_used[f.index] = false;
    const int a = ::close(f.direct_fd);
    const int a_errno = errno;
    ::close(f.buffered_fd);
    f.direct_fd = f.buffered_fd = -1;
    if (a != 0) fail("closing {} failed: {}; data written to it may be lost — check the drive and write it again", *f.path, std::strerror(a_errno));
  }
};

namespace {

std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

// tmpfs and ramfs: memory, not a drive. Linux before 6.6 refuses O_DIRECT there; later kernels
// accept the flag and go through the page cache anyway. Either way files there use the RAM that
// offloading is meant to free, so they are refused like a file system without O_DIRECT.
bool memory_file_system(int fd) {
  struct statfs s {};
  if (::fstatfs(fd, &s) != 0) return false;
  return s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC;
}

// The O_DIRECT alignment the kernel reports for the file (statx STATX_DIOALIGN, Linux 6.1+), at
// least kMinAlignment; 0 when the file system says it cannot do direct I/O on this file.
std::uint64_t direct_io_alignment(int fd) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0 || (sx.stx_mask & STATX_DIOALIGN) == 0)
    return IoEngine::kMinAlignment;  // an older kernel: the page size is what every file system accepts
  if (sx.stx_dio_offset_align == 0 || sx.stx_dio_mem_align == 0) return 0;
  return std::max<std::uint64_t>({IoEngine::kMinAlignment, sx.stx_dio_offset_align, sx.stx_dio_mem_align});
}

}  // namespace

// ---- IoFile ----

IoFile& IoFile::operator=(IoFile&& other) noexcept {
  if (this != &other) {
    if (state_) {
      try {
        close();
      } catch (const Error&) {
        // Destroying a handle cannot report; close() explicitly to see the error.
      }
    }
    core_ = std::move(other.core_);
    state_ = std::move(other.state_);
  }
  return *this;
}

IoFile::~IoFile() {
  if (!state_) return;
  try {
    close();
  } catch (const Error& e) {
    log_warning("{}", e.what());
  }
}

const std::string& IoFile::path() const {
  DSTRAIN_CHECK(state_, "IoFile::path on a closed file");
  return *state_->path;
}

std::uint64_t IoFile::alignment() const {
  DSTRAIN_CHECK(state_, "IoFile::alignment on a closed file");
  return state_->alignment;
}

std::uint64_t IoFile::size() const {
  DSTRAIN_CHECK(state_, "IoFile::size on a closed file");
  struct stat st {};
  if (::fstat(state_->direct_fd, &st) != 0) fail("fstat of {} failed: {}", *state_->path, std::strerror(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

void IoFile::allocate(std::uint64_t bytes) {
  DSTRAIN_CHECK(state_, "IoFile::allocate on a closed file");
  DSTRAIN_CHECK(state_->writable, "IoFile::allocate: {} is open for reading only; open it with IoOpen::create or read_write", *state_->path);
  const std::string folder = std::filesystem::path(*state_->path).parent_path().string();
  const std::uint64_t have = size();
  const std::int64_t available = io_available_bytes(folder.empty() ? "." : folder);
  if (bytes > have && available >= 0 && bytes - have > static_cast<std::uint64_t>(available))
    fail(
        "{} needs {} bytes but the file system holding {} has {} bytes available: free {} bytes there, or point "
        "nvme_path at a larger drive",
        *state_->path, bytes, folder, available, bytes - have - static_cast<std::uint64_t>(available));
  int r = ::fallocate(state_->direct_fd, 0, 0, static_cast<off_t>(bytes));
  if (r != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) r = ::posix_fallocate(state_->direct_fd, 0, static_cast<off_t>(bytes)) == 0 ? 0 : -1;
  if (r != 0) {
    const int e = errno;
    fail("reserving {} bytes for {} failed: {}; {}", bytes, *state_->path, std::strerror(e),
         e == ENOSPC ? fmt::format("the file system has {} bytes available: free space or point nvme_path at a larger drive",
                                   io_available_bytes(folder.empty() ? "." : folder))
                     : std::string("choose a folder on a local disk (ext4, xfs)"));
  }
}

void IoFile::sync() {
  DSTRAIN_CHECK(state_, "IoFile::sync on a closed file");
  state_->requests.wait_idle();
  if (::fdatasync(state_->direct_fd) != 0)
    fail("fdatasync of {} failed: {}; the bytes written may not be on the drive — check it (dmesg) and write again", *state_->path,
         std::strerror(errno));
}

void IoFile::close() {
  if (!state_) return;
  std::shared_ptr<IoFileState> s = std::move(state_);
  std::shared_ptr<IoEngineCore> c = std::move(core_);
  c->close_file(*s);
}

// ---- IoEngine ----

IoEngine::IoEngine(const IoOptions& options) : core_(std::make_shared<IoEngineCore>()) {
  options.validate();
  core_->options = options;
  core_->file_index_used.assign(options.max_open_files, false);
  core_->buffer_slot_used.assign(options.max_registered_buffers, false);
  core_->fault = IoFault::from_environment();
  for (unsigned i = 0; i < options.intra_op_parallelism; ++i)
    core_->rings.push_back(std::make_unique<IoRing>(options.queue_depth, options.single_submit, options.overlap_events, 2 * options.max_open_files,
                                                    options.max_registered_buffers));
}

IoEngine::~IoEngine() { core_->shut_down(); }

const IoOptions& IoEngine::options() const { return core_->options; }

IoEngine::Totals IoEngine::totals() const {
  return {core_->bytes_read.load(), core_->bytes_written.load(), core_->pieces.load(), static_cast<double>(core_->waited_ns->load()) * 1e-9};
}

void IoEngine::inject_fault(std::optional<IoFault> fault) {
  std::lock_guard lock(core_->mutex);
  core_->fault = fault;
  core_->pieces_counted[0] = core_->pieces_counted[1] = core_->pieces_counted[2] = 0;
  core_->opens_counted = 0;
}

IoFile IoEngine::open(const std::string& path, IoOpen mode) {
  IoEngineCore& c = *core_;
  const bool writing = mode != IoOpen::read;
  {
    std::lock_guard lock(c.mutex);
    ++c.opens_counted;
    if (c.fault && c.fault->kind == IoFault::Kind::open_refused && c.opens_counted == c.fault->nth)
      throw Error(io_open_message(path, writing, EINVAL));
  }
  int flags = (writing ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  if (mode == IoOpen::create) flags |= O_CREAT | O_TRUNC;
  if (mode == IoOpen::create_new) flags |= O_CREAT | O_EXCL;
  auto state = std::make_shared<IoFileState>();
  state->path = std::make_shared<const std::string>(path);
  state->writable = writing;
  state->direct_fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
  if (state->direct_fd < 0) throw Error(io_open_message(path, writing, errno));
  const auto close_both = [&] {
    ::close(state->direct_fd);
    if (state->buffered_fd >= 0) ::close(state->buffered_fd);
  };
  state->alignment = direct_io_alignment(state->direct_fd);
  if (state->alignment == 0 || memory_file_system(state->direct_fd)) {
    const bool memory = state->alignment != 0;
    if (mode == IoOpen::create || mode == IoOpen::create_new) ::unlink(path.c_str());
    close_both();
    throw Error(memory ? io_memory_file_system_message(path) : io_open_message(path, writing, EINVAL));
  }
  state->buffered_fd = ::open(path.c_str(), (flags & ~(O_CREAT | O_TRUNC | O_EXCL)), 0600);
  if (state->buffered_fd < 0) {
    const int e = errno;
    close_both();
    fail("cannot open {} a second time (without O_DIRECT, for partial blocks): {}", path, std::strerror(e));
  }

  std::lock_guard lock(c.mutex);
  DSTRAIN_CHECK(!c.rings.empty(), "IoEngine::open after the engine ended");
  const auto free_index = std::find(c.file_index_used.begin(), c.file_index_used.end(), false);
  if (free_index == c.file_index_used.end()) {
    close_both();
    fail(
        "cannot open {}: the I/O engine already has {} files open (IoOptions::max_open_files); close files first or "
        "raise the limit",
        path, c.options.max_open_files);
  }
  state->index = static_cast<unsigned>(free_index - c.file_index_used.begin());
  for (auto& ring : c.rings) {
    int e = ring->set_file(2 * state->index, state->direct_fd);
    if (e == 0) e = ring->set_file(2 * state->index + 1, state->buffered_fd);
    if (e != 0) {
      for (auto& r : c.rings) {
        r->set_file(2 * state->index, -1);
        r->set_file(2 * state->index + 1, -1);
      }
      close_both();
      fail("cannot register {} with io_uring: {}; raise the open-files limit (ulimit -n)", path, std::strerror(e));
    }
  }
  *free_index = true;
  IoFile f;
  f.core_ = core_;
  f.state_ = std::move(state);
  return f;
}

IoHandle IoEngine::read(IoFile& file, std::uint64_t offset, void* data, std::uint64_t bytes) {
  return submit(IoOp::read, file, offset, static_cast<std::byte*>(data), bytes);
}

IoHandle IoEngine::write(IoFile& file, std::uint64_t offset, const void* data, std::uint64_t bytes) {
  // The kernel only reads the buffer of a write; the piece type is shared with reads.
  return submit(IoOp::write, file, offset, static_cast<std::byte*>(const_cast<void*>(data)), bytes);
}

IoHandle IoEngine::submit(IoOp op, IoFile& file, std::uint64_t offset, std::byte* data, std::uint64_t bytes) {
  DSTRAIN_CHECK(file.state_ != nullptr, "I/O engine: {} on a closed file", io_op_name(op));
  DSTRAIN_CHECK(file.core_ == core_, "I/O engine: {} is open in another IoEngine", *file.state_->path);
  IoFileState& f = *file.state_;
  if (op == IoOp::write && !f.writable)
    fail("cannot write to {}: it was opened for reading; open it with IoOpen::read_write or IoOpen::create", *f.path);
  if (bytes == 0) return IoHandle();
  const std::uint64_t align = f.alignment;
  if (reinterpret_cast<std::uintptr_t>(data) % align != 0)
    fail(
        "{} of {} bytes at offset {} of {}: the buffer at {} is not aligned to {} bytes, which O_DIRECT needs; "
        "allocate it with PinnedHostAllocator (page-aligned) or std::aligned_alloc({}, ...)",
        io_op_name(op), bytes, offset, *f.path, static_cast<const void*>(data), align, align);
  if (offset % align != 0)
    fail(
        "{} of {} bytes at offset {} of {}: the offset is not a multiple of {} bytes, which O_DIRECT needs; place "
        "what the file holds at multiples of {} (pad each piece; docs/offload.md §1.4)",
        io_op_name(op), bytes, offset, *f.path, align, align);

  IoEngineCore& c = *core_;
  const std::uint64_t block = c.options.effective_block_size(align);
  const std::uint64_t direct = round_down(bytes, align);
  const std::uint64_t tail = bytes - direct;
  const std::size_t n = static_cast<std::size_t>((direct + block - 1) / block + (tail > 0 ? 1 : 0));
  auto request = std::make_shared<IoRequestState>(n, &c.requests, &f.requests, c.waited_ns);

  std::vector<IoPiece> pieces(n);
  std::unique_lock lock(c.mutex);
  if (c.rings.empty()) {
    lock.unlock();
    const std::string why = "I/O engine: a request after the engine ended";
    for (std::size_t i = 0; i < n; ++i) request->piece_done(&why);
    fail("{}", why);
  }
  int buffer_slot = -1;
  if (auto it = c.buffers.upper_bound(reinterpret_cast<std::uintptr_t>(data)); it != c.buffers.begin()) {
    --it;
    if (reinterpret_cast<std::uintptr_t>(data) + bytes <= it->first + it->second.bytes) buffer_slot = static_cast<int>(it->second.slot);
  }
  for (std::size_t i = 0; i < n; ++i) {
    IoPiece& p = pieces[i];
    const bool is_tail = tail > 0 && i + 1 == n;
    const std::uint64_t start = is_tail ? direct : i * block;
    p.op = op;
    p.file_slot = 2 * f.index + (is_tail ? 1 : 0);
    p.buffer_slot = buffer_slot;
    p.data = data + start;
    p.bytes = static_cast<std::uint32_t>(is_tail ? tail : std::min(block, direct - start));
    p.offset = offset + start;
    p.path = f.path;
    p.request = request;
    if (c.fault && c.fault->kind != IoFault::Kind::open_refused) {
      const std::uint64_t count = c.fault->op ? ++c.pieces_counted[static_cast<int>(op)] : ++c.pieces_counted[2];
      // A slow drive is slow from its Nth piece on; a failure is one piece.
      const bool hit = c.fault->kind == IoFault::Kind::slow ? count >= c.fault->nth : count == c.fault->nth;
      if ((!c.fault->op || *c.fault->op == op) && hit) {
        p.faulted = true;
        p.fault = *c.fault;
      }
    }
  }
  // Contiguous runs, one per ring, starting at the next ring in turn: each ring reads or writes a
  // sequential stretch, and small requests spread over the rings.
  const std::size_t rings = c.rings.size();
  const std::size_t first = c.next_ring;
  c.next_ring = static_cast<unsigned>((first + 1) % rings);
  for (std::size_t g = 0; g < rings; ++g) {
    const std::size_t begin = g * n / rings, end = (g + 1) * n / rings;
    if (begin == end) continue;
    std::vector<IoPiece> run(std::make_move_iterator(pieces.begin() + static_cast<std::ptrdiff_t>(begin)),
                             std::make_move_iterator(pieces.begin() + static_cast<std::ptrdiff_t>(end)));
    c.rings[(first + g) % rings]->submit(std::move(run));
  }
  lock.unlock();
  (op == IoOp::read ? c.bytes_read : c.bytes_written) += bytes;
  c.pieces += n;
  return IoHandle(std::move(request));
}

void IoEngine::wait_all() { core_->requests.wait_all(); }

bool IoEngine::register_buffer(void* data, std::size_t bytes) {
  DSTRAIN_CHECK(data != nullptr && bytes > 0, "IoEngine::register_buffer: an empty buffer");
  IoEngineCore& c = *core_;
  std::lock_guard lock(c.mutex);
  const auto free_slot = std::find(c.buffer_slot_used.begin(), c.buffer_slot_used.end(), false);
  if (free_slot == c.buffer_slot_used.end()) return false;
  const auto slot = static_cast<unsigned>(free_slot - c.buffer_slot_used.begin());
  for (std::size_t i = 0; i < c.rings.size(); ++i) {
    const int e = c.rings[i]->set_buffer(slot, data, bytes);
    if (e != 0) {
      for (std::size_t j = 0; j < i; ++j) c.rings[j]->set_buffer(slot, nullptr, 0);
      if (!c.registration_refusal_logged) {
        c.registration_refusal_logged = true;
        log_info(
            "io_uring did not register a {}-byte buffer ({}): transfers from it are not fixed-buffer ones, which "
            "costs a little CPU per transfer; raise the locked-memory limit (ulimit -l) to register it",
            bytes, std::strerror(e));
      }
      return false;
    }
  }
  *free_slot = true;
  c.buffers[reinterpret_cast<std::uintptr_t>(data)] = {bytes, slot};
  return true;
}

void IoEngine::unregister_buffer(void* data) {
  IoEngineCore& c = *core_;
  c.requests.wait_idle();
  std::lock_guard lock(c.mutex);
  const auto it = c.buffers.find(reinterpret_cast<std::uintptr_t>(data));
  if (it == c.buffers.end()) return;
  for (auto& ring : c.rings) ring->set_buffer(it->second.slot, nullptr, 0);
  c.buffer_slot_used[it->second.slot] = false;
  c.buffers.erase(it);
}

}  // namespace dstrain
