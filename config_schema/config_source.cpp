#include "config_schema/config_source.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "config_schema/base64.h"
#include "config_schema/hjson_reader.h"
#include "ops/error.h"

namespace dstrain {
namespace {

constexpr std::string_view kExpected = "expected a path to an existing DeepSpeed config file, a JSON string, or base64 of one";

// Long arguments (a whole base64 config) are cut so that the message stays readable.
std::string shorten(std::string_view text) {
  constexpr size_t kMax = 80;
  if (text.size() <= kMax) return std::string(text);
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // keep UTF-8 whole
  return fmt::format("{}... ({} characters)", text.substr(0, cut), text.size());
}

const char* type_name(const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::array:
      return "an array";
    case nlohmann::ordered_json::value_t::string:
      return "a string";
    case nlohmann::ordered_json::value_t::boolean:
      return "a boolean";
    case nlohmann::ordered_json::value_t::null:
      return "null";
    default:
      return "a number";
  }
}

void require_object(const nlohmann::ordered_json& tree, const std::string& origin) {
  if (!tree.is_object()) {
    fail(
        "{}: the top-level value of a DeepSpeed config must be a JSON object {{...}}, but it is {}; "
        "wrap the settings in {{ }}",
        origin, type_name(tree));
  }
}

bool starts_with_brace(std::string_view arg) {
  const size_t first = arg.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && arg[first] == '{';
}

// DeepSpeed opens the file in Python's text mode, which turns "\r\n" and a lone '\r' into '\n'
// before hjson sees the text; a file with old Mac line endings then still has lines.
std::string universal_newlines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r') {
      out += text[i];
    } else {
      out += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    }
  }
  return out;
}

// Closes the file it holds when it goes out of scope (an Error included).
struct FileDescriptor {
  int fd;
  ~FileDescriptor() { ::close(fd); }
};

// Waits until a program writes to (or closes) the FIFO opened without blocking as `fd`, for at most
// `wait`, and leaves it blocking for the read. A FIFO with no writer is an Error after `wait`.
void wait_for_writer(int fd, const std::string& name, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (ready > 0) break;
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) fail("cannot wait for DeepSpeed config file '{}' (a named pipe): {}", name, std::strerror(errno));
    fail(
        "DeepSpeed config file '{}' is a named pipe (FIFO) and nothing was written to it within {} s: is the program that writes the "
        "config running? Pass a regular file, the JSON text itself, or start the writer first",
        name, static_cast<double>(wait.count()) / 1000.0);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

bool is_blank(std::string_view text) { return text.find_first_not_of(" \t\r\n") == std::string_view::npos; }

}  // namespace

ConfigText load_config_file(const std::filesystem::path& path, std::chrono::milliseconds pipe_wait) {
  const std::string name = path.string();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    fail(
        "DeepSpeed config file '{}' not found (looked in '{}'); check the path passed to "
        "--deepspeed_config",
        name, std::filesystem::absolute(path, ec).string());
  }
  if (std::filesystem::is_directory(status)) {
    fail(
        "'{}' is a directory, not a DeepSpeed config file; pass the path of the JSON file inside "
        "it (for example {}/ds_config.json)",
        name, name);
  }
  const bool fifo = std::filesystem::is_fifo(status);
  // A FIFO is opened without blocking (an open for reading otherwise waits for a writer) and then
  // waited on for at most `pipe_wait`; any other file is read as it is.
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fd < 0) {
    fail("cannot open DeepSpeed config file '{}': {}; check that it is readable", name, std::strerror(errno));
  }
  const FileDescriptor file{fd};
  if (fifo) wait_for_writer(fd, name, pipe_wait);
  // Read at most one byte more than the cap, so that /dev/zero or a data file given by mistake is
  // an error after 16 MiB instead of a read without end.
  std::string raw;
  std::array<char, 65536> chunk{};
  while (raw.size() <= kMaxConfigFileBytes) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("error while reading DeepSpeed config file '{}': {}; check the file and the disk", name, std::strerror(errno));
    if (n == 0) break;
    raw.append(chunk.data(), static_cast<std::size_t>(n));
  }
  if (raw.size() > kMaxConfigFileBytes) {
    fail(
        "'{}' holds more than {} MiB, far more than any DeepSpeed config (a few KiB): it is not a config file; check the path passed "
        "as the config",
        name, kMaxConfigFileBytes >> 20);
  }
  const std::string text = universal_newlines(raw);
  if (is_blank(text)) {
    fail(
        "DeepSpeed config file '{}' is empty; it must hold a JSON object such as "
        "{{\"train_batch_size\": 8}}",
        name);
  }
  HjsonOptions opts;
  opts.source_name = name;
  opts.reject_duplicate_keys = true;  // DeepSpeed's object_pairs_hook for file paths
  ConfigText result{parse_hjson(text, opts), "file " + name, path};
  require_object(result.tree, result.origin);
  return result;
}

ConfigText load_config_argument(std::string_view arg) {
  if (arg.empty()) fail("{}; got an empty string", kExpected);

  // DeepSpeed checks os.path.exists first, so a file wins over any other reading of the text.
  std::error_code ec;
  const std::filesystem::path as_path{std::string(arg)};
  if (arg.find('\0') == std::string_view::npos && std::filesystem::exists(as_path, ec)) {
    return load_config_file(as_path);
  }

  if (starts_with_brace(arg)) {
    HjsonOptions opts;
    opts.source_name = "<JSON string>";
    opts.reject_duplicate_keys = true;
    ConfigText result{parse_hjson(arg, opts), "JSON string", {}};
    require_object(result.tree, result.origin);
    return result;
  }

  // Base64, as DeepSpeed's launcher passes it. Duplicate keys are not checked: DeepSpeed parses
  // the decoded text with hjson.loads and no object_pairs_hook, so the last value wins.
  const std::optional<std::string> decoded = decode_base64(arg);
  if (!decoded || is_blank(*decoded)) {
    fail("{}; got '{}' (no file by that name exists, and it is not base64)", kExpected, shorten(arg));
  }
  HjsonOptions opts;
  opts.source_name = "<base64 config>";
  opts.reject_duplicate_keys = false;
  nlohmann::ordered_json tree;
  try {
    tree = parse_hjson(*decoded, opts);
  } catch (const Error& e) {
    // A mistyped file name can be valid base64 by accident; say both things that went wrong.
    fail("{}; got '{}' (no file by that name exists, and its base64 decoding is not a config: {})", kExpected, shorten(arg), e.what());
  }
  if (!tree.is_object()) {
    fail(
        "{}; got '{}' (no file by that name exists, and its base64 decoding is {}, not a JSON "
        "object)",
        kExpected, shorten(arg), type_name(tree));
  }
  return ConfigText{std::move(tree), "base64 string", {}};
}

}  // namespace dstrain
