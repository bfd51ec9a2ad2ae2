#include "zero/zeropp_collectives.h"

#include <initializer_list>
#include <vector>

#include "ops/buffer.h"
#include "ops/error.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/quantize.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

// Elements [offset, offset + count) of t viewed as a flat array.
Tensor flat(const Tensor& t, std::int64_t offset, std::int64_t count) { return t.view(Shape{t.numel()}).slice_rows(offset, offset + count); }

// The transient buffers of one call, carved from ONE allocation (64-byte aligned pieces): a chunk's
// collective asks the allocator once, not once per buffer.
class Scratch {
 public:
  struct Part {
    DType dtype;
    std::int64_t count;
  };
  Scratch(Allocator& a, std::initializer_list<Part> parts) {
    std::vector<std::size_t> offsets;
    std::size_t bytes = 0;
    for (const Part& p : parts) {
      offsets.push_back(bytes);
      bytes += (static_cast<std::size_t>(p.count) * dtype_size(p.dtype) + 63) / 64 * 64;
    }
    buffer_ = Buffer(a, bytes, MemoryPurpose::buffers);
    std::size_t i = 0;
    for (const Part& p : parts) tensors_.push_back(buffer_.tensor(p.dtype, Shape{p.count}, offsets[i++]));
  }
  const Tensor& operator[](std::size_t i) const { return tensors_[i]; }

 private:
  Buffer buffer_;
  std::vector<Tensor> tensors_;
};

}  // namespace

std::int64_t quantized_piece_bytes(std::int64_t n, int bits, std::int64_t block) { return 4 * quantize_packed_words(n, bits, block); }

NodeSplit split_by_node(Communicator& group, const char* what) {
  const int W = group.world_size();
  NodeSplit s;
  s.nodes = group.node_count();
  s.ranks_per_node = W / s.nodes;
  // Consecutive and even: rank r on the node of rank (r / L)·L. (Uniform blocks of L ranks with
  // N distinct nodes among them are N different nodes.)
  bool even = W % s.nodes == 0;
  for (int r = 0; even && r < W; ++r) even = group.node_of(r) == group.node_of(r - r % s.ranks_per_node);
  if (!even) {
    std::string layout;
    for (int r = 0; r < W; ++r) layout += (r > 0 ? " " : "") + std::to_string(group.node_of(r));
    fail(
        "{}: the {} data-parallel ranks lie on {} nodes as [{}] (the node of each rank); the hierarchical collectives need every node to "
        "hold the same number of consecutive ranks. Fix: launch the same number of ranks on every node (--ranks-per-node, or the "
        "launcher's LOCAL_WORLD_SIZE)",
        what, W, s.nodes, layout);
  }
  const int r = group.rank();
  s.local = group.split(r / s.ranks_per_node, r);
  s.cross = group.split(r % s.ranks_per_node, r);
  return s;
}

void quantized_all_gather(Communicator& group, const Tensor& send, const Tensor& recv, Allocator& scratch) {
  const int W = group.world_size();
  const std::int64_t n = send.numel();
  DSTRAIN_CHECK(recv.numel() == W * n, "quantized_all_gather: recv has {} elements for {} ranks of {}", recv.numel(), W, n);
  const std::int64_t block = deepspeed_weight_quant_block(n);
  const std::int64_t words = quantize_packed_words(n, 8, block);
  const Scratch s(scratch, {{DType::int32, W * words}});
  const Tensor& packed = s[0];
  quantize_blocks(flat(packed, group.rank() * words, words), send, 8, block);
  group.all_gather(flat(packed, group.rank() * words, words), packed);
  group.order_compute_after_collectives();  // the dequantization below reads what the gather wrote
  for (int r = 0; r < W; ++r) dequantize_blocks(flat(recv, r * n, n), flat(packed, r * words, words), 8, block);
}

void hierarchical_all_gather(const NodeSplit& nodes, const Tensor& send, const Tensor& recv, Allocator& scratch) {
  const int N = nodes.nodes, L = nodes.ranks_per_node;
  const std::int64_t n = send.numel();
  DSTRAIN_CHECK(recv.numel() == static_cast<std::int64_t>(N) * L * n, "hierarchical_all_gather: recv has {} elements for {} x {} ranks of {}",
                recv.numel(), N, L, n);
  // Across the nodes first: from the rank with this local index on every node, its piece (the
  // pieces a·L + l, a = 0..N-1); then within the node, every local rank's N pieces: [l'][a].
  const Scratch s(scratch, {{send.dtype, N * n}, {send.dtype, static_cast<std::int64_t>(L) * N * n}});
  const Tensor &across = s[0], &within = s[1];
  nodes.cross->all_gather(send, across);
  nodes.cross->order_compute_after_collectives();
  nodes.local->all_gather(across, within);
  nodes.local->order_compute_after_collectives();
  // Piece a·L + l' of recv is [l'][a] of `within`.
  for (int l = 0; l < L; ++l) copy_rows(recv, l * n, L * n, within, static_cast<std::int64_t>(l) * N * n, n, N, n);
}

void quantized_reduce_scatter(const NodeSplit& nodes, const Tensor& chunk, Allocator& scratch) {
  const int N = nodes.nodes, L = nodes.ranks_per_node;
  const std::int64_t W = static_cast<std::int64_t>(N) * L;
  DSTRAIN_CHECK(chunk.numel() % W == 0, "quantized_reduce_scatter: {} elements do not split over {} ranks", chunk.numel(), W);
  const std::int64_t n = chunk.numel() / W;
  const int l = nodes.local->rank(), a = nodes.cross->rank();
  constexpr int kBits = 4;
  const std::int64_t block = kGradientQuantBlock;
  // Within the node: local rank l' gets the N pieces a'·L + l' (what the ranks with its local index
  // reduce), quantized as one message in node order (DeepSpeed's swizzled quantization).
  const std::int64_t w1 = quantize_packed_words(N * n, kBits, block);
  const std::int64_t w2 = quantize_packed_words(n, kBits, block);
  const Scratch s(scratch, {{chunk.dtype, N * n},  // the pieces for one local peer, in node order
                            {DType::int32, L * w1},
                            {DType::int32, L * w1},
                            {DType::fp32, N * n},  // the node's partial sums
                            {DType::int32, N * w2},
                            {DType::int32, N * w2},
                            {DType::fp32, n}});  // this rank's piece, summed over the nodes
  const Tensor &gathered = s[0], &send1 = s[1], &recv1 = s[2], &partial = s[3], &send2 = s[4], &recv2 = s[5], &total = s[6];
  for (int peer = 0; peer < L; ++peer) {
    copy_rows(gathered, 0, n, chunk, static_cast<std::int64_t>(peer) * n, static_cast<std::int64_t>(L) * n, N, n);
    quantize_blocks(flat(send1, peer * w1, w1), gathered, kBits, block);
  }
  nodes.local->all_to_all(send1, recv1);
  nodes.local->order_compute_after_collectives();
  // The node's partial sums of pieces a'·L + l, a' = 0..N-1, in fp32.
  zero_tensor(partial);
  for (int peer = 0; peer < L; ++peer) dequantize_blocks(partial, flat(recv1, peer * w1, w1), kBits, block, /*accumulate=*/true);
  // Across the nodes: partial piece a'·L + l goes to node a' (requantized piece by piece).
  for (int node = 0; node < N; ++node) quantize_blocks(flat(send2, node * w2, w2), flat(partial, node * n, n), kBits, block);
  nodes.cross->all_to_all(send2, recv2);
  nodes.cross->order_compute_after_collectives();
  zero_tensor(total);
  for (int node = 0; node < N; ++node) dequantize_blocks(total, flat(recv2, node * w2, w2), kBits, block, /*accumulate=*/true);
  // The average over the W ranks: one fp32 multiply by 1/W (exact for a power of two), then the
  // one rounding into the storage dtype. (DeepSpeed's all_to_all_quant_reduce divides the sum by
  // the number of nodes only.)
  scale_grads(total, 1.0f / static_cast<float>(W));
  convert_tensor(flat(chunk, (static_cast<std::int64_t>(a) * L + l) * n, n), total);
}

}  // namespace dstrain
