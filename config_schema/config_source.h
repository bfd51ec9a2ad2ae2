// Where a ds_config comes from: a file, a JSON string, or base64 of one — as DeepSpeed accepts them.
//
// deepspeed.initialize(config=X) treats a string X as a path when os.path.exists(X) (parsed with
// hjson, duplicate keys rejected), and otherwise as URL-safe base64 of the config text (parsed
// with hjson, duplicate keys NOT checked) — the form DeepSpeed's launcher passes. We also accept
// the JSON text itself (anything starting with '{'), which is what users type on a command line;
// it is checked for duplicate keys like a file.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dstrain {

struct ConfigText {
  nlohmann::ordered_json tree;  // always a JSON object
  std::string origin;           // "file <path>" | "JSON string" | "base64 string"
  std::filesystem::path file;   // the file it was read from; empty for a string
};

// The largest config file read (DeepSpeed configs are a few KiB): a larger one, or a device that
// never ends such as /dev/zero, is an Error instead of a read without bound.
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{16} << 20;

// How long a named pipe (FIFO) given as the config file may stay silent. A pipe is a fair config
// source (`--deepspeed_config <(python make_config.py)`, `/dev/stdin` fed by a pipe), but a FIFO
// that no program writes to would block the open and the read forever.
inline constexpr std::chrono::milliseconds kConfigPipeWait{30000};

// Reads and parses a config file. Throws Error (naming the path and the fix) when the file is
// missing, a directory, unreadable, empty, larger than kMaxConfigFileBytes, not Hjson/JSON, has
// duplicate keys, or its top-level value is not an object; and when it is a FIFO that nothing
// writes to (or closes) within `pipe_wait`.
ConfigText load_config_file(const std::filesystem::path& path, std::chrono::milliseconds pipe_wait = kConfigPipeWait);

// Resolves a --deepspeed_config style argument: an existing path -> load_config_file; text
// starting with '{' (after whitespace) -> parsed as JSON/Hjson; otherwise base64 (URL-safe or
// standard, padding optional) of the config text. Anything else throws Error.
ConfigText load_config_argument(std::string_view arg);

}  // namespace dstrain
