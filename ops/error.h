// dstrain::Error: the one exception type the library throws.
//
// Every message names the cause (the key, file, value or call) and the fix. Library code never
// calls exit() or abort(); the CLI turns an Error into a message and a non-zero exit code.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace dstrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dstrain

// DSTRAIN_CHECK(cond, "fmt", args...): throws dstrain::Error when cond is false.
#define DSTRAIN_CHECK(cond, ...)               \
  do {                                         \
    if (!(cond)) ::dstrain::fail(__VA_ARGS__); \
  } while (0)
