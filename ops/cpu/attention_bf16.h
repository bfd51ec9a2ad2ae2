// The bf16-storage attention kernels built on AVX512-BF16 dot products (vdpbf16ps), and the
// switch that picks them; private to ops/cpu (ops/cpu/attention.cpp calls them, tests and
// benchmarks flip the switch). ops/kernels/attention.h states what the path rounds.
#pragma once

#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/dtype.h"
#include "ops/kernels/dropout.h"

namespace dstrain::cpu {

// C = NH·HS is the output width; W = (NH + 2·NKV)·HS the qkv row; k of KV head g starts at column
// koff + g·HS, v at voff + g·HS; query head h reads KV head h / G.
// Query i sees keys max(0, i - win + 1) .. i: win = the sliding window, or T (plain causal).
struct AttShape {
  std::int64_t B, T, C, NH, HS, NKV, G, W, koff, voff, win;
};

// out[k] = dropout scale (0 or 1/(1-p)) of elements e0 .. e0+n-1: one Philox call per group of 4.
inline void attention_dropout_scales(const RngKey& rng, std::uint64_t e0, std::int64_t n, float p, float keep_scale, float* out) {
  std::int64_t k = 0;
  while (k < n) {
    const std::uint64_t e = e0 + static_cast<std::uint64_t>(k);
    const PhiloxCounter r = rng.group_bits(e >> 2);
    for (std::uint64_t lane = e & 3u; lane < 4 && k < n; ++lane, ++k) out[k] = dropout_keep(r.v[lane], p) ? keep_scale : 0.0f;
  }
}

// Whether this build has the AVX512-BF16 kernels (x86-64 with GCC >= 10 or Clang) and this CPU
// and its OS can run them (avx512f, avx512bw, avx512vl, avx512_bf16).
bool cpu_bf16_attention_supported();
// Whether bf16-storage attention uses them: supported, unless the environment variable
// DSTRAIN_CPU_BF16_ATTENTION=0 (read once) or set_cpu_bf16_attention(false) says otherwise.
bool cpu_bf16_attention_enabled();
// Tests and benchmarks: true = the bf16 dot-product path where supported (else the fp32 one
// still runs), false = the generic fp32-widening path. Overrides the environment variable.
void set_cpu_bf16_attention(bool enabled);
// The path bf16-storage attention takes now: "avx512_bf16" (vdpbf16ps tile products) or
// "fp32" (the tiles widened to fp32, the path fp32 and fp16 storage always take).
const char* cpu_bf16_attention_path();

namespace avx512bf16 {
// The kernels (ops/cpu/attention_bf16.cpp); call only when cpu_bf16_attention_supported().
void attention_forward(bf16_t* out, float* lse, const bf16_t* qkv, const AttShape& s, const DropoutParams& dp);
void attention_backward(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const bf16_t* out, const float* lse, float* scratch, const AttShape& s,
                        const DropoutParams& dp);
}  // namespace avx512bf16

}  // namespace dstrain::cpu
