#include "zero/point_to_point.h"

#include <fmt/format.h>

namespace dstrain {

std::string describe_point_to_point(const PointToPointCall& c) {
  if (c.is_send) {
    return fmt::format("send #{} from rank {} to rank {} ({}, {} elements)", c.number, c.sender, c.receiver, dtype_name(c.dtype), c.count);
  }
  return fmt::format("recv #{} from rank {} on rank {} ({}, {} elements)", c.number, c.sender, c.receiver, dtype_name(c.dtype), c.count);
}

std::string point_to_point_mismatch(std::string_view backend, const PointToPointCall& send, const PointToPointCall& recv) {
  if (send.number == recv.number && send.dtype == recv.dtype && send.count == recv.count) return {};
  // Different numbers cannot come from two healthy ranks (each counts its own calls per pair and
  // every call completes or fails the group); name them all the same.
  return fmt::format(
      "{} communicator: point-to-point mismatch: rank {} called {} but rank {} called {}. A send and the recv that matches it "
      "(the k-th send from one rank to another meets the k-th recv of that pair) must have the same dtype and element count. "
      "Fix: give the recv a buffer of the sent dtype and size (or send what the receiver expects), and look for a rank-dependent "
      "size or a send and recv that pair up in another order than intended",
      backend, send.sender, describe_point_to_point(send), recv.receiver, describe_point_to_point(recv));
}

}  // namespace dstrain
