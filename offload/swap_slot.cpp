#include "offload/swap_slot.h"

namespace dstrain {

void settle_slot(SwapSlot& s, const std::string& context) {
  std::vector<IoHandle> pending = std::move(s.pending);
  s.pending.clear();
  std::string first_error;
  for (const IoHandle& h : pending) {
    try {
      h.wait();
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) {
    s.key = -1;
    s.state = SwapSlot::State::empty;
    throw Error(context.empty() ? first_error : context + ": " + first_error);
  }
  if (s.state == SwapSlot::State::reading || s.state == SwapSlot::State::writing) s.state = SwapSlot::State::ready;
}

}  // namespace dstrain
