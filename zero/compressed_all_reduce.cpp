// Communicator::compressed_all_reduce: DeepSpeed's 1-bit all-reduce with worker and server error
// feedback (deepspeed/runtime/comm/nccl.py, compressed.py), built once on the primitive collectives
// all_to_all and all_gather, so every backend has it. The contract is at the declaration
// (zero/communicator.h); the optimizers that use it are described in docs/optimizers_onebit.md.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"
#include "zero/communicator.h"

namespace dstrain {
namespace {

// The words one rank sends for one chunk of `chunk` elements: the packed sign bytes padded to whole
// int32 words, then one word holding the chunk's scale (fp32 bits).
std::int64_t slot_words(std::int64_t chunk) { return (chunk / 8 + 3) / 4 + 1; }

// sign(x) ≥ 0 → bit 1 (DeepSpeed: x.sign().add_(1).bool(); zero and −0 are "+"), 8 per byte, first
// element in the most significant bit (numpy / cupy packbits' order), bytes stored in order.
void pack_signs(const float* x, std::int64_t n, std::int32_t* words) {
  auto* bytes = reinterpret_cast<unsigned char*>(words);
  for (std::int64_t b = 0; b < n / 8; ++b) {
    unsigned v = 0;
    for (int k = 0; k < 8; ++k) v |= (x[b * 8 + k] < 0.0f ? 0u : 1u) << (7 - k);
    bytes[b] = static_cast<unsigned char>(v);
  }
  for (std::int64_t b = n / 8; b < (slot_words(n) - 1) * 4; ++b) bytes[b] = 0;  // padding to the word
}

float sign_of(const std::int32_t* words, std::int64_t i) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(words);
  return ((bytes[i / 8] >> (7 - i % 8)) & 1u) != 0 ? 1.0f : -1.0f;
}

float scale_word(const std::int32_t* slot, std::int64_t chunk) {
  float s = 0.0f;
  std::memcpy(&s, slot + slot_words(chunk) - 1, 4);
  return s;
}

void set_scale_word(std::int32_t* slot, std::int64_t chunk, float s) { std::memcpy(slot + slot_words(chunk) - 1, &s, 4); }

// ‖x‖ / √n as DeepSpeed computes it (torch.linalg.norm(x) / np.sqrt(numel)), the norm accumulated in
// double so the result does not depend on a summation order.
float rms_scale(const float* x, std::int64_t n) {
  double sq = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sq += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return static_cast<float>(static_cast<float>(std::sqrt(sq)) / std::sqrt(static_cast<double>(n)));
}

// error = x − s·sign(x), in place over `error`, then x's signs are the ones packed.
void compress_error(const float* x, float s, std::int64_t n, float* error) {
  for (std::int64_t i = 0; i < n; ++i) error[i] = x[i] - s * (x[i] < 0.0f ? -1.0f : 1.0f);
}

}  // namespace

std::int64_t Communicator::compressed_workspace_numel(std::int64_t n) const {
  return 2 * static_cast<std::int64_t>(world_size_) * slot_words(n / world_size_);
}

void Communicator::compressed_all_reduce(Tensor buf, Tensor worker_error, Tensor server_error, Tensor workspace) {
  const int w = world_size_;
  const std::int64_t n = buf.numel();
  const auto call = fmt::format("compressed_all_reduce on rank {} (after collective #{})", rank_, sequence_);
  DSTRAIN_CHECK(buf.dtype == DType::fp32 && worker_error.dtype == DType::fp32 && server_error.dtype == DType::fp32,
                "{}: buf ({}), worker_error ({}) and server_error ({}) must be fp32", call, buf.str(), worker_error.str(), server_error.str());
  DSTRAIN_CHECK(n > 0 && n % (8 * static_cast<std::int64_t>(w)) == 0,
                "{}: {} elements is not a positive multiple of 8·W = {}. Fix: pad the buffer (and its errors) to a multiple of W·lcm(W, 8), "
                "as DeepSpeed's corrected_tensor_size does",
                call, n, 8 * w);
  DSTRAIN_CHECK(worker_error.numel() == n && server_error.numel() == n / w,
                "{}: worker_error must have the buffer's {} elements and server_error {} / W = {}; got {} and {}", call, n, n, n / w,
                worker_error.numel(), server_error.numel());
  DSTRAIN_CHECK(worker_error.device == buf.device && server_error.device == buf.device, "{}: the errors must be on the buffer's device ({})", call,
                buf.device.str());
  const bool on_host = buf.device.is_cpu();
  const std::int64_t chunk = n / w;
  const std::int64_t sw = slot_words(chunk);
  const bool via_workspace = !workspace.empty();
  if (via_workspace) {
    DSTRAIN_CHECK(workspace.dtype == DType::int32 && workspace.numel() >= compressed_workspace_numel(n),
                  "{}: the workspace must be int32 with compressed_workspace_numel({}) = {} elements; got {}", call, n, compressed_workspace_numel(n),
                  workspace.str());
  }
  // The arithmetic reads and writes host memory: the buffers themselves, or host copies of them.
  std::vector<float> x_copy, we_copy, se_copy;
  float* x = static_cast<float*>(buf.data);
  float* we = static_cast<float*>(worker_error.data);
  float* se = static_cast<float*>(server_error.data);
  if (!on_host) {
    x_copy.resize(static_cast<std::size_t>(n));
    we_copy.resize(static_cast<std::size_t>(n));
    se_copy.resize(static_cast<std::size_t>(chunk));
    copy_tensor(Tensor(x_copy.data(), DType::fp32, Shape{n}), buf);
    copy_tensor(Tensor(we_copy.data(), DType::fp32, Shape{n}), worker_error);
    copy_tensor(Tensor(se_copy.data(), DType::fp32, Shape{chunk}), server_error);
    x = x_copy.data();
    we = we_copy.data();
    se = se_copy.data();
  }

  // Worker: compensate, compress, keep the error; W slots, slot j = chunk j's signs + the scale.
  for (std::int64_t i = 0; i < n; ++i) x[i] += we[i];
  const float worker_scale = rms_scale(x, n);
  compress_error(x, worker_scale, n, we);
  std::vector<std::int32_t> host(static_cast<std::size_t>(2 * w * sw));
  std::int32_t* send = host.data();
  std::int32_t* recv = host.data() + w * sw;
  for (int j = 0; j < w; ++j) {
    pack_signs(x + j * chunk, chunk, send + j * sw);
    set_scale_word(send + j * sw, chunk, worker_scale);
  }
  const Shape all_slots{w * sw};
  auto exchange = [&](auto&& collective, std::int32_t* host_in, std::int32_t* host_out, std::int64_t in_words) {
    if (!via_workspace) {
      collective(Tensor(host_in, DType::int32, Shape{in_words}), Tensor(host_out, DType::int32, all_slots));
      return;
    }
    // Through the workspace (a device backend's memory): first half in, second half out.
    auto* dev = static_cast<std::int32_t*>(workspace.data);
    const Tensor din(dev, DType::int32, Shape{in_words}, workspace.device);
    const Tensor dout(dev + w * sw, DType::int32, all_slots, workspace.device);
    copy_tensor(din, Tensor(host_in, DType::int32, Shape{in_words}));
    collective(din, dout);
    synchronize();
    copy_tensor(Tensor(host_out, DType::int32, all_slots), dout);
  };
  if (w > 1) {
    exchange([&](Tensor a, Tensor b) { all_to_all(a, b); }, send, recv, w * sw);
  } else {
    std::memcpy(recv, send, static_cast<std::size_t>(sw) * 4);
  }

  // Server for chunk `rank`: average the W decompressed contributions in rank order, compensate with
  // the server error, compress again. DeepSpeed multiplies each sign by scale_i·(1/W) in fp32.
  std::vector<float> y(static_cast<std::size_t>(chunk), 0.0f);
  for (int i = 0; i < w; ++i) {
    const std::int32_t* slot = recv + i * sw;
    const float s = scale_word(slot, chunk) * (1.0f / static_cast<float>(w));
    for (std::int64_t k = 0; k < chunk; ++k) y[static_cast<std::size_t>(k)] += sign_of(slot, k) * s;
  }
  for (std::int64_t k = 0; k < chunk; ++k) y[static_cast<std::size_t>(k)] += se[k];
  const float server_scale = rms_scale(y.data(), chunk);
  compress_error(y.data(), server_scale, chunk, se);
  // All ranks' server slots, gathered in place into `send` (slot r = this rank's).
  std::int32_t* mine = send + rank_ * sw;
  pack_signs(y.data(), chunk, mine);
  set_scale_word(mine, chunk, server_scale);
  if (w > 1) {
    exchange([&](Tensor a, Tensor b) { all_gather(a, b); }, mine, recv, sw);
  } else {
    std::memcpy(recv, mine, static_cast<std::size_t>(sw) * 4);
  }

  // Result: chunk j = t_j · sign(y_j).
  for (int j = 0; j < w; ++j) {
    const std::int32_t* slot = recv + j * sw;
    const float t = scale_word(slot, chunk);
    for (std::int64_t k = 0; k < chunk; ++k) x[j * chunk + k] = t * sign_of(slot, k);
  }
  if (!on_host) {
    copy_tensor(buf, Tensor(x, DType::fp32, Shape{n}));
    copy_tensor(worker_error, Tensor(we, DType::fp32, Shape{n}));
    copy_tensor(server_error, Tensor(se, DType::fp32, Shape{chunk}));
  }
}

}  // namespace dstrain
