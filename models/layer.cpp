#include "models/layer.h"

#include <vector>

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

std::int64_t count_targets(const Batch& batch) {
  if (batch.target_count >= 0) return batch.target_count;
  const Tensor& t = batch.targets;
  std::vector<std::int32_t> host;
  const std::int32_t* v = nullptr;
  if (t.device.is_cpu()) {
    v = t.as<std::int32_t>();
  } else {
    host.resize(static_cast<std::size_t>(t.numel()));
    copy_tensor(Tensor(host.data(), DType::int32, t.shape), t);
    v = host.data();
  }
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) n += v[i] >= 0 ? 1 : 0;
  return n;
}

void check_token_ids(const Tensor& tokens, std::int64_t vocab_size, std::string_view who) {
  if (tokens.dtype != DType::int32 || !tokens.device.is_cpu()) return;
  const auto* tok = tokens.as<std::int32_t>();
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    if (tok[i] < 0 || tok[i] >= vocab_size) {
      fail("{}: token id {} at flat position {} is outside the vocabulary [0, {}); check the data matches the model's tokenizer", who, tok[i], i,
           vocab_size);
    }
  }
}

}  // namespace dstrain
