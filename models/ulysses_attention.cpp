#include "models/ulysses_attention.h"

#include "ops/kernels/tensor_ops.h"

namespace dstrain {

AttentionHeads UlyssesAttention::local_heads() const {
  const std::int64_t sp = group != nullptr ? group->size() : 1;
  return AttentionHeads{heads.q / sp, heads.kv / sp};
}

void UlyssesAttention::forward(const Tensor& atty, const Tensor& lse, const Tensor& qkv, const Tensor& qkv_heads, const Tensor& atty_heads) const {
  if (group == nullptr) {
    attention_forward(atty, lse, qkv, heads, dropout, window);
    return;
  }
  sequence_to_heads(*group, qkv, qkv_heads, parts, send, recv);
  attention_forward(atty_heads, lse, qkv_heads, local_heads(), dropout, window);
  const std::vector<std::int64_t> q_part{parts.front()};
  heads_to_sequence(*group, atty_heads, atty, q_part, send, recv);
}

void UlyssesAttention::backward(const Tensor& dqkv, const Tensor& datty, const Tensor& qkv, const Tensor& atty, const Tensor& qkv_heads,
                                const Tensor& atty_heads, const Tensor& lse, const Tensor& attention_scratch, const Tensor& datty_heads,
                                const Tensor& dqkv_heads) const {
  if (group == nullptr) {
    zero_tensor(dqkv);
    attention_backward(dqkv, datty, qkv, atty, lse, heads, attention_scratch, dropout, window);
    return;
  }
  const std::vector<std::int64_t> q_part{parts.front()};
  sequence_to_heads(*group, datty, datty_heads, q_part, send, recv);
  zero_tensor(dqkv_heads);
  attention_backward(dqkv_heads, datty_heads, qkv_heads, atty_heads, lse, local_heads(), attention_scratch, dropout, window);
  heads_to_sequence(*group, dqkv_heads, dqkv, parts, send, recv);
}

}  // namespace dstrain
