// The files of a training checkpoint (docs/checkpoints.md): how a rank writes its pieces, how the
// checkpoint is committed atomically, and how a loading rank finds and verifies the pieces it
// needs. Nothing here knows the Engine: it moves named element ranges of named buffers
// ("master", "exp_avg", ..., "param") of named parameters, which is parameter space
// (docs/training_state.md §5), so any world size, ZeRO stage or bucket size reads what any other
// wrote.
//
//   <save_dir>/latest                        the newest tag, as DeepSpeed writes it (no newline)
//   <save_dir>/<tag>/checkpoint.json         the manifest: scalars, layout, config, rank indexes
//   <save_dir>/<tag>/rank_00000.safetensors  rank 0's pieces: tensor "<buffer>/<param>/<offset>", shape [numel]
//   <save_dir>/<tag>/rank_00000.json         its index: file size, and per tensor buffer, param, offset, numel, crc32c
//
// A save writes everything into "<save_dir>/<tag>.partial", fsyncs every file and the folder,
// writes checkpoint.json last, renames the folder to <tag> and only then rewrites `latest`
// (temporary + fsync + rename), so a crash at any moment leaves the previous checkpoint (and
// `latest` naming it) intact, and a half-written folder never carries a tag's name.
//
// Implemented in three files: checkpoint_files.cpp (names, host memory, commit, `latest`),
// checkpoint_writer.cpp (RankFileWriter) and checkpoint_reader.cpp (CheckpointReader).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config_schema/field_spec.h"
#include "models/model_family.h"
#include "offload/io_options.h"
#include "ops/dtype.h"

namespace dstrain {

inline constexpr const char* kCheckpointFormat = "dstrain-checkpoint";
inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointManifest = "checkpoint.json";
inline constexpr const char* kLatestFile = "latest";
// The test hook of the crash-safety tests: when set to N > 0, a save sleeps N milliseconds before
// each file it writes and before its renames, so a test can kill -9 the process between any two.
inline constexpr const char* kCheckpointPauseEnv = "DSTRAIN_TEST_CHECKPOINT_PAUSE_MS";
// The test hook of the fast writer's fallback: when set (to anything), opening a rank file with
// O_DIRECT is taken as refused, as tmpfs on older kernels refuses it.
inline constexpr const char* kCheckpointNoDirectEnv = "DSTRAIN_TEST_CHECKPOINT_NO_DIRECT";

// Elements [offset, offset + numel) of parameter `param` in buffer `buffer`.
struct CheckpointPiece {
  std::string buffer;
  std::string param;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  DType dtype = DType::fp32;
  std::string tensor_name() const;  // "<buffer>/<param>/<offset>"
};

// Bytes a checkpoint holds per parameter element (docs/checkpoints.md "What is saved"): the fp32
// master, each optimizer state in fp32 and, when the params are kept in 16 bits, that copy. A
// checkpoint's data is this times the stored parameters, split over the ranks' files.
inline std::size_t checkpoint_bytes_per_element(std::size_t optimizer_states, DType param_dtype) {
  return sizeof(float) * (1 + optimizer_states) + (param_dtype != DType::fp32 ? dtype_size(param_dtype) : 0);
}

// A tag must be usable as a folder name: Error naming it otherwise (empty, "." or "..", a '/',
// or ending in ".partial", the name of a folder being written).
void check_checkpoint_tag(const std::string& tag);
std::filesystem::path partial_checkpoint_dir(const std::filesystem::path& save_dir, const std::string& tag);
std::string rank_file_name(int rank, const char* ext);  // "rank_00003.safetensors" / ".json"

// Sleeps for the test hook (kCheckpointPauseEnv); no-op when unset.
void checkpoint_test_pause();

// Host memory for a checkpoint's staging buffers, snapshot and load copies: 2 MiB aligned (a
// kernel with transparent huge pages "always" may back it with huge pages). Only the decoupled
// save's snapshot asks for huge pages (HostPages::huge, MADV_HUGEPAGE): under the kernel's default
// defrag policy that advice makes every fault wait for memory compaction, which ran at 0.3-0.7 GB/s
// against 1.5-2.5 GB/s for 4 KiB pages on the CI VM — a cost a load would pay on its critical
// path, but the snapshot's memory is faulted in once, in the background, when the engine starts,
// and every save then copies into it at up to twice the rate (docs/checkpoints.md "Host memory").
// Large blocks are faulted in by a BackgroundPrefault (engine/checkpoint/host_prefault.h) ahead of their
// filling.
struct FreeCheckpointMemory {
  void operator()(std::byte* p) const { std::free(p); }
};
using CheckpointMemory = std::unique_ptr<std::byte[], FreeCheckpointMemory>;
enum class HostPages { base, huge };
// Uninitialised; Error naming the size when the host is out of memory.
CheckpointMemory allocate_checkpoint_memory(std::size_t bytes, HostPages pages = HostPages::base);
// Frees `memory` on a thread of its own: returning a load's gigabytes to the kernel (unmapping
// every page) took 0.3 s per 1.7 GB on the CI VM, time the caller need not wait for.
void free_in_background(CheckpointMemory memory);

// How a rank file reaches the disk (checkpoint.writer; docs/checkpoints.md "Writers"). Both ways
// stage the pieces in io_buffer_size bytes of 4096-aligned memory (two halves when double: one is
// filled and checksummed while a second thread writes the other), so the disk sees large
// sequential writes whatever the pieces' sizes.
struct RankFileWriterOptions {
  bool direct = true;  // O_DIRECT ("fast"): the tail padded to a block, the file then truncated to its size
  std::size_t io_buffer_size = 64u << 20;
  bool double_buffer = true;
  // Named in the warning when the file system refuses O_DIRECT (tmpfs) and buffered writes are
  // used instead; empty: fall back silently (the engine's own choice, not the config's).
  std::string direct_key = "checkpoint.writer.type";
  // With `direct`: the offload layer's io_uring engine (DeepSpeed's `aio` block: block_size pieces,
  // queue_depth of them in flight) writes the staging buffers. Without it, or where the kernel
  // refuses io_uring, one pwrite per buffer from the writing thread.
  std::optional<IoOptions> aio;
};

// Writes one rank's pieces as a safetensors file, streaming: the header first (the sizes are
// known), then each piece's bytes in order, each checksummed as it is staged. Error naming the
// file and the cause (disk full, permissions) on any failed write.
class RankFileWriter {
 public:
  // Fills `dst` with elements [first, first + count) of the piece being written.
  using PieceSource = std::function<void(std::int64_t first, std::int64_t count, void* dst)>;

  RankFileWriter(std::filesystem::path path, std::vector<CheckpointPiece> pieces, RankFileWriterOptions options = {});
  ~RankFileWriter();
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;
  // Piece i, read from `source` straight into the staging buffer in chunks; pieces are written in
  // the order given.
  void write(std::size_t i, const PieceSource& source);
  // Piece i's bytes (numel * dtype size) from memory.
  void write(std::size_t i, const void* bytes);
  // Flushes the file to disk (fsync) and returns its index: {"file", "bytes", "tensors": [...]}.
  config::Json finish();
  // Whether the file is written with O_DIRECT (false after a fallback).
  bool direct() const { return direct_; }
  // Whether the io_uring engine writes it.
  bool io_uring() const { return uring_; }

 private:
  void stage(const void* bytes, std::size_t n);  // copies into the staging buffers, flushing full ones
  void flush_fill_buffer(bool last);             // hands the filled buffer to the disk
  void wait_in_flight();                         // the other buffer's write has finished (rethrows its error)
  void write_at(const std::byte* p, std::size_t n, std::uint64_t at);
  config::Json index_json() const;
  std::filesystem::path path_;
  std::vector<CheckpointPiece> pieces_;
  std::vector<std::uint32_t> crcs_;
  std::size_t next_ = 0;
  std::uint64_t size_ = 0;     // the file's size: header + data
  std::uint64_t written_ = 0;  // bytes staged so far (the file offset of fill_pos_)
  std::uint64_t flushed_ = 0;  // file offset of the fill buffer's start
  int fd_ = -1;
  bool direct_ = false;
  bool uring_ = false;
  struct Staging;
  std::unique_ptr<Staging> staging_;
};

// Writes `text` to `path` and fsyncs it (inside the partial folder; no rename needed).
void write_checkpoint_text(const std::filesystem::path& path, const std::string& text);
// fsync of a folder (the names in it are durable).
void sync_dir(const std::filesystem::path& dir);
// Renames the partial folder to <tag> (replacing an older <tag>), fsyncs save_dir, then writes
// `latest` atomically.
void commit_checkpoint(const std::filesystem::path& save_dir, const std::string& tag);
// The tag `latest` names; nullopt when there is no `latest` file. Error when it is unreadable or
// names no folder holding a manifest.
std::optional<std::string> read_latest_tag(const std::filesystem::path& save_dir);
// The committed tags under save_dir (folders with a manifest), oldest first by global_steps then name.
std::vector<std::string> list_checkpoint_tags(const std::filesystem::path& save_dir);

// The model a checkpoint's manifest records: "architecture" {"family", "config"}, read by that
// family (models/model_registry.h) — or, in checkpoints saved before that key, a top-level key
// named after a family ("gpt2", "llama") that holds its config. Error naming `where` when there
// is neither, or the family is unknown.
std::shared_ptr<const Architecture> manifest_architecture(const config::Json& manifest, const std::string& where);

// A committed checkpoint opened for loading: the manifest and every rank's index read and
// checked (format, version, each index's size and checksum as the manifest records them). The
// data files are opened when first read; each piece's checksum is verified the first time it is
// read. Every Error names the file and, where there is one, the tensor.
class CheckpointReader {
 public:
  CheckpointReader(const std::filesystem::path& save_dir, const std::string& tag);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& tag() const { return tag_; }
  const config::Json& manifest() const { return manifest_; }
  // The saved dtype of `buffer` (nullopt: the checkpoint does not hold it).
  std::optional<DType> buffer_dtype(const std::string& buffer) const;
  // Copies elements [offset, offset + numel) of `param`'s `buffer` into `out` (numel values of the
  // saved dtype). Error naming the parameter and the elements when the saved pieces do not cover
  // them, and naming file and tensor when a piece is truncated or fails its checksum.
  void read(const std::string& buffer, const std::string& param, std::int64_t offset, std::int64_t numel, void* out);

  // One piece a load wants: elements [offset, offset + numel) of `param`'s `buffer`.
  struct Want {
    std::string buffer, param;
    std::int64_t offset = 0, numel = 0;
  };
  // Every wanted piece, in the saved dtype, in one block of host memory; at[i] is where piece i starts.
  struct Loaded {
    CheckpointMemory memory;
    std::vector<std::byte*> at;
  };
  // Reads and verifies every wanted piece (the Errors of read()). When the pieces are, in the
  // order given, saved pieces of one file lying back to back in it (a load at the saving layout:
  // a rank's own file, front to back), that span of the file is read straight into the memory
  // (O_DIRECT where the file system takes it; two 32 MiB requests in flight) and each piece's
  // checksum is computed on the requests already landed while the next ones are read; otherwise
  // piece by piece through read(). Either way a BackgroundPrefault faults the memory in ahead of
  // the reads (docs/checkpoints.md "Loading").
  Loaded read_all(const std::vector<Want>& want);
  // Elements [first, first + count) of wanted piece i, in the saved dtype, at `data` (valid during
  // the call only).
  using Sink = std::function<void(std::size_t i, std::int64_t first, std::int64_t count, const std::byte* data)>;
  // A load at the saving layout without a copy of the checkpoint in memory: when the wanted pieces
  // are such a run as read_all reads in place, reads its span through three reused 32 MiB slots
  // (two requests in flight while the third is checked) and hands every range to `sink` in file
  // order as it lands, checking each piece's CRC-32C when its last range is in. Returns false,
  // having read nothing, when they are not such a run (read_all then). A failed checksum or a
  // short read is an Error thrown after the ranges before it were handed on: the caller must be
  // able to undo them (CheckpointManager::load: docs/checkpoints.md "Loading").
  bool stream(const std::vector<Want>& want, const Sink& sink);

 private:
  struct Impl;
  std::filesystem::path dir_;
  std::string tag_;
  config::Json manifest_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain
