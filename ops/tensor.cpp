#include "ops/tensor.h"

#include <fmt/format.h>

namespace dstrain {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i > 0) s += ", ";
    s += fmt::format("{}", dims[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

Tensor Tensor::slice_rows(std::int64_t begin, std::int64_t end) const {
  DSTRAIN_CHECK(shape.rank >= 1, "slice_rows on a scalar tensor");
  DSTRAIN_CHECK(0 <= begin && begin <= end && end <= shape[0], "slice_rows [{}, {}) is outside the first dimension of {}", begin, end, shape.str());
  const std::int64_t row = shape[0] == 0 ? 0 : numel() / shape[0];
  Shape s = shape;
  s.dims[0] = end - begin;
  return Tensor(static_cast<char*>(data) + static_cast<std::size_t>(begin * row) * dtype_size(dtype), dtype, s, device);
}

std::string Tensor::str() const { return fmt::format("{}{} on {}", dtype_name(dtype), shape.str(), device.str()); }

}  // namespace dstrain
