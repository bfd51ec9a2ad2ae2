#include "engine/checkpoint/checkpoint_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "engine/checkpoint/checkpoint_file_io.h"
#include "models/model_registry.h"
#include "ops/atomic_file.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/quoted_excerpt.h"
#include "formats/json_text.h"

namespace dstrain {
namespace fs = std::filesystem;
using config::Json;
using namespace checkpoint_io;

namespace {

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

}  // namespace

namespace checkpoint_io {

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
  if (!in)
    fail("checkpoint {} {} is missing or unreadable: {}; the checkpoint is incomplete — load another tag", what, q(path), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    fail("checkpoint {} {} is not valid JSON ({}); the file is truncated or corrupt — load another tag", what, q(path), json_error_text(e, text));
  }
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace checkpoint_io

std::string CheckpointPiece::tensor_name() const { return buffer + "/" + param + "/" + std::to_string(offset); }

void check_checkpoint_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos || tag.find('\0') != std::string::npos ||
      tag.ends_with(".partial") || tag == kLatestFile) {
    fail(
        "checkpoint tag '{}' cannot name a checkpoint folder: use a non-empty name without '/', not \".\", \"..\", \"latest\" or one "
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

// ---- host memory ----

CheckpointMemory allocate_checkpoint_memory(std::size_t bytes, HostPages pages) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t rounded = round_up(std::max<std::size_t>(bytes, 1), kHuge);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kHuge, rounded));
  if (p == nullptr) fail("cannot allocate {} bytes of host memory for a checkpoint (its staging, snapshot or load copy)", bytes);
#if defined(MADV_HUGEPAGE)
  if (pages == HostPages::huge) (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: THP "never" refuses it
#endif
  return CheckpointMemory(p);
}

void free_in_background(CheckpointMemory memory) {
  if (!memory) return;
  try {
    std::thread([m = std::move(memory)]() mutable { m.reset(); }).detach();
  } catch (const std::system_error&) {  // no thread to be had: the caller frees it (the lambda's copy is gone with it)
  }
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
  // A tag is a folder name (at most 255 bytes): reading a little more than that tells a `latest`
  // that is something else (a link to /etc/passwd or /dev/zero) without reading all of it.
  constexpr std::size_t kMaxRead = 4096;
  std::ifstream in(latest, std::ios::binary);
  std::string tag(kMaxRead, '\0');
  in.read(tag.data(), static_cast<std::streamsize>(kMaxRead));
  tag.resize(static_cast<std::size_t>(in.gcount()));
  const bool more = in && in.peek() != std::ifstream::traits_type::eof();
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  if (tag.empty()) fail("{} is empty; it should name the newest checkpoint's tag — pass the tag explicitly (--load-tag)", q(latest));
  const bool control = std::any_of(tag.begin(), tag.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
  if (more || tag.size() > 255 || control || tag.find('/') != std::string::npos) {
    fail(
        "{} holds {}, not a checkpoint tag (one line naming a checkpoint folder in {}); it is damaged or not dstrain's — "
        "rewrite it with the newest tag or pass the tag explicitly (--load-tag)",
        q(latest), more ? fmt::format("more than {} bytes, starting {}", kMaxRead, quoted_excerpt(tag.substr(0, 80))) : quoted_excerpt(tag),
        q(save_dir));
  }
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

std::shared_ptr<const Architecture> manifest_architecture(const config::Json& m, const std::string& where) {
  if (const auto it = m.find("architecture"); it != m.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("family") || !it->at("family").is_string() || !it->contains("config") || !it->at("config").is_object()) {
      fail("checkpoint {}: its manifest's \"architecture\" is not {{\"family\": name, \"config\": {{...}}}}; load another tag", q(where));
    }
    const std::string family = it->at("family").get<std::string>();
    return model_family(family).from_config_json(it->at("config").dump(), where + " (manifest \"architecture\")");
  }
  for (const auto& f : model_families()) {
    if (const auto legacy = m.find(f->name()); legacy != m.end() && legacy->is_object()) {
      return f->from_config_json(legacy->dump(), fmt::format("{} (manifest \"{}\")", where, f->name()));
    }
  }
  fail(
      "checkpoint {}: its manifest records no model (no \"architecture\"); it was saved from a model without a family, whose weights "
      "have no file layout",
      q(where));
}

}  // namespace dstrain
