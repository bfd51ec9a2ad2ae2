#include "offload/io_fault_injection.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {

const char* io_op_name(IoOp op) { return op == IoOp::read ? "read" : "write"; }

IoFault IoFault::parse(std::string_view text) {
  const auto bad = [&]() -> IoFault {
    fail(
        "{}=\"{}\" is not a fault: write KIND[:OP]@N with KIND eio, enospc, short, odirect or slow, OP read or write, "
        "N the piece counted from 1 (e.g. \"eio:read@3\"); unset it for normal I/O",
        kEnvironmentVariable, text);
  };
  const std::size_t at = text.rfind('@');
  if (at == std::string_view::npos) return bad();
  std::string_view head = text.substr(0, at);
  const std::string_view count = text.substr(at + 1);
  IoFault f;
  const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), f.nth);
  if (ec != std::errc() || end != count.data() + count.size() || f.nth == 0) return bad();
  const std::size_t colon = head.find(':');
  if (colon != std::string_view::npos) {
    const std::string_view op = head.substr(colon + 1);
    if (op == "read")
      f.op = IoOp::read;
    else if (op == "write")
      f.op = IoOp::write;
    else
      return bad();
    head = head.substr(0, colon);
  }
  if (head == "eio") {
    f.kind = Kind::error;
    f.errno_value = EIO;
  } else if (head == "enospc") {
    f.kind = Kind::error;
    f.errno_value = ENOSPC;
  } else if (head == "short") {
    f.kind = Kind::short_transfer;
  } else if (head == "slow") {
    f.kind = Kind::slow;
  } else if (head == "odirect") {
    f.kind = Kind::open_refused;
    f.errno_value = EINVAL;
  } else {
    return bad();
  }
  return f;
}

std::optional<IoFault> IoFault::from_environment() {
  const char* v = std::getenv(kEnvironmentVariable);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return parse(v);
}

std::string IoFault::describe() const {
  const std::string which = op ? fmt::format(" {}", io_op_name(*op)) : std::string();
  switch (kind) {
    case Kind::error:
      return fmt::format("errno {} at{} piece {}", errno_value, which, nth);
    case Kind::short_transfer:
      return fmt::format("short transfer at{} piece {}", which, nth);
    case Kind::open_refused:
      return fmt::format("O_DIRECT refused at open {}", nth);
    case Kind::slow:
      return fmt::format("{} ms per{} piece from piece {} on", kSlowPieceDelayMs, which, nth);
  }
  return {};
}

}  // namespace dstrain
