// How the backends name and match one point-to-point call (Communicator::send / recv), so that a
// mismatch reads the same on every backend and on both ranks of the pair.
//
// A send and a recv match when they are the same number of the same pair (send #k from a to b,
// recv #k from a on b: program order, zero/communicator.h) and agree on dtype and element count.
// The backend that sees both calls (local: the receiver, under the group's lock; mpi: both ranks,
// from the descriptions they exchange) calls point_to_point_mismatch with the two, and both ranks
// fail with its text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ops/dtype.h"

namespace dstrain {

struct PointToPointCall {
  bool is_send = true;
  int sender = 0;  // ranks of the communicator
  int receiver = 0;
  std::uint64_t number = 0;  // in the (sender, receiver) pair's order, from 1
  DType dtype = DType::fp32;
  std::int64_t count = 0;  // elements
};

// "send #2 from rank 0 to rank 1 (fp32, 1024 elements)", "recv #2 from rank 0 on rank 1 (...)".
std::string describe_point_to_point(const PointToPointCall& call);

// "" when `send` and `recv` match; otherwise the Error text naming both calls (both ranks, both
// sizes and dtypes) and the fix, prefixed by "<backend> communicator: ".
std::string point_to_point_mismatch(std::string_view backend, const PointToPointCall& send, const PointToPointCall& recv);

}  // namespace dstrain
