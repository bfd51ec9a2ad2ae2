// Times every CPU kernel, forward and backward, at GPT-2 small shapes (B=4, T=256, C=768, NH=12,
// V=50257 padded to Vp=50304) and prints ms per call and GFLOP/s. Never asserts.
//
// FLOP counts are the usual nominal ones (2 per multiply-add for GEMMs and attention; a small
// per-element count for the memory-bound kernels, stated in the table), so GFLOP/s compares runs,
// not instruction mixes.
// Attention runs at T = 256 and T = 1024, bf16 storage once per path (ops/cpu/attention_bf16.h).
// AdamW runs once per instruction set the CPU supports (scalar, AVX2, AVX-512), in GB/s.
// Usage: bench_kernels_cpu [fp32|fp16|bf16 ...] [--only NAME_SUBSTRING]   (default: fp32 bf16, all kernels)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/attention_bf16.h"
#include "ops/dtype.h"
#include "ops/kernels/adamw.h"
#include "ops/kernels/adadelta.h"
#include "ops/kernels/adagrad.h"
#include "ops/kernels/adamax.h"
#include "ops/kernels/asgd.h"
#include "ops/kernels/lion.h"
#include "ops/kernels/nadam.h"
#include "ops/kernels/optimizer_rule.h"
#include "ops/kernels/radam.h"
#include "ops/kernels/rmsprop.h"
#include "ops/kernels/rprop.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/cpu_isa.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/encoder.h"
#include "ops/kernels/gelu.h"
#include "ops/kernels/layernorm.h"
#include "ops/kernels/rmsnorm.h"
#include "ops/kernels/rope.h"
#include "ops/kernels/swiglu.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "ops/tensor.h"

using namespace dstrain;

namespace {

constexpr std::int64_t B = 4, T = 256, C = 768, NH = 12, V = 50257, Vp = 50304, maxT = 1024;
constexpr std::int64_t BT = B * T;

// A host buffer of bytes filled with small random values of the given dtype.
struct HostBuf {
  std::vector<unsigned char> bytes;
  DType dtype;
  std::int64_t n;
  HostBuf(DType t, std::int64_t count, std::mt19937& rng, float scale = 1.0f)
      : bytes(static_cast<std::size_t>(count) * dtype_size(t)), dtype(t), n(count) {
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<float> tmp(static_cast<std::size_t>(count));
    for (float& x : tmp) x = d(rng);
    if (t == DType::int32 || t == DType::uint16) return;
    convert(tmp.data(), DType::fp32, bytes.data(), t, static_cast<std::size_t>(count));
  }
  Tensor t(Shape s) { return Tensor(bytes.data(), dtype, s); }
};

double time_ms(const std::function<void()>& f) {
  f();  // warm-up (page faults, OpenBLAS thread start)
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    f();
    ++reps;
    elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < 300.0 && reps < 20);
  return elapsed / reps;
}

std::string g_only;  // --only SUBSTRING: run only kernels whose name contains it

void report(const char* kernel, const char* pass, DType dt, double flops, const std::function<void()>& f) {
  if (!g_only.empty() && std::string(kernel).find(g_only) == std::string::npos) return;
  const double ms = time_ms(f);
  std::printf("%-46s %-8s %-5s %10.3f ms %10.2f GFLOP/s\n", kernel, pass, std::string(dtype_name(dt)).c_str(), ms, flops / (ms * 1e6));
  std::fflush(stdout);
}

// Causal attention at GPT-2 d12 shapes (B = 4, NH = 12, HS = 64) and sequence length T: bf16
// storage once per path (the AVX512-BF16 tile products where the CPU has them, and the generic
// fp32-tile path, switched by cpu::set_cpu_bf16_attention), other storage types once.
void bench_attention(DType dt, std::int64_t seq) {
  std::mt19937 rng(4321);
  const std::int64_t bt = B * seq;
  HostBuf qkv(dt, bt * 3 * C, rng), out(dt, bt * C, rng), dout(dt, bt * C, rng), dqkv(dt, bt * 3 * C, rng);
  std::vector<float> lse(static_cast<std::size_t>(B * NH * seq)), scratch(attention_backward_scratch_elems(B, seq, C, NH));
  Tensor tl(lse.data(), DType::fp32, Shape{B, NH, seq});
  Tensor ts(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())});
  const double pairs = static_cast<double>(B * NH) * static_cast<double>(seq * (seq + 1) / 2) * static_cast<double>(C / NH);
  const bool chosen = cpu::cpu_bf16_attention_enabled();  // DSTRAIN_CPU_BF16_ATTENTION's choice, restored below
  std::vector<bool> paths{false};
  if (dt == DType::bf16 && cpu::cpu_bf16_attention_supported()) paths = {false, true};
  for (const bool dot : paths) {
    if (dt == DType::bf16) cpu::set_cpu_bf16_attention(dot);
    const std::string tag = " T=" + std::to_string(seq) + (dt == DType::bf16 ? std::string(" ") + cpu::cpu_bf16_attention_path() : std::string());
    const std::string plain = "attention" + tag, dropped = "attention (dropout 0.1)" + tag;
    report(plain.c_str(), "forward", dt, 4.0 * pairs, [&] { attention_forward(out.t({B, seq, C}), tl, qkv.t({B, seq, 3 * C}), NH); });
    report(plain.c_str(), "backward", dt, 10.0 * pairs, [&] {
      attention_backward(dqkv.t({B, seq, 3 * C}), dout.t({B, seq, C}), qkv.t({B, seq, 3 * C}), out.t({B, seq, C}), tl, NH, ts);
    });
    const DropoutParams dp{0.1f, RngKey{1, 1, 1, 0, 0}};
    report(dropped.c_str(), "forward", dt, 4.0 * pairs, [&] { attention_forward(out.t({B, seq, C}), tl, qkv.t({B, seq, 3 * C}), NH, dp); });
    report(dropped.c_str(), "backward", dt, 10.0 * pairs, [&] {
      attention_backward(dqkv.t({B, seq, 3 * C}), dout.t({B, seq, C}), qkv.t({B, seq, 3 * C}), out.t({B, seq, C}), tl, NH, ts, dp);
    });
  }
  cpu::set_cpu_bf16_attention(chosen);
}

void bench_dtype(DType dt) {
  std::mt19937 rng(1234);
  // encoder
  {
    std::vector<std::int32_t> tok(static_cast<std::size_t>(BT));
    std::uniform_int_distribution<std::int32_t> d(0, V - 1);
    for (auto& x : tok) x = d(rng);
    Tensor tokens(tok.data(), DType::int32, Shape{B, T});
    HostBuf wte(dt, Vp * C, rng), wpe(dt, maxT * C, rng), out(dt, BT * C, rng), dwte(dt, Vp * C, rng), dwpe(dt, maxT * C, rng);
    std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, Vp));
    Tensor s(scratch.data(), DType::int32, Shape{static_cast<std::int64_t>(scratch.size())});
    report("encoder", "forward", dt, 1.0 * BT * C, [&] { encoder_forward(out.t({B, T, C}), tokens, wte.t({Vp, C}), wpe.t({maxT, C})); });
    report("encoder", "backward", dt, 2.0 * BT * C, [&] { encoder_backward(dwte.t({Vp, C}), dwpe.t({maxT, C}), out.t({B, T, C}), tokens, s); });
  }
  // layernorm and fused residual + layernorm
  {
    HostBuf x(dt, BT * C, rng), y(dt, BT * C, rng), a(dt, BT * C, rng), res(dt, BT * C, rng), w(dt, C, rng), b(dt, C, rng), dx(dt, BT * C, rng),
        dw(dt, C, rng), db(dt, C, rng);
    std::vector<float> mean(static_cast<std::size_t>(BT)), rstd(mean.size());
    Tensor tm(mean.data(), DType::fp32, Shape{B, T}), tr(rstd.data(), DType::fp32, Shape{B, T});
    report("layernorm", "forward", dt, 8.0 * BT * C, [&] { layernorm_forward(y.t({B, T, C}), tm, tr, x.t({B, T, C}), w.t({C}), b.t({C})); });
    report("fused_residual_layernorm", "forward", dt, 9.0 * BT * C, [&] {
      fused_residual_layernorm_forward(res.t({B, T, C}), y.t({B, T, C}), tm, tr, x.t({B, T, C}), a.t({B, T, C}), w.t({C}), b.t({C}));
    });
    report("layernorm", "backward", dt, 14.0 * BT * C, [&] {
      layernorm_backward(dx.t({B, T, C}), dw.t({C}), db.t({C}), y.t({B, T, C}), x.t({B, T, C}), w.t({C}), tm, tr);
    });
  }
  // matmuls of one block, and the tied LM head
  struct Mm {
    const char* name;
    std::int64_t in, out;
    bool bias;
  };
  for (const Mm& m : {Mm{"matmul qkv (C->3C)", C, 3 * C, true}, Mm{"matmul attproj (C->C)", C, C, true}, Mm{"matmul fc (C->4C)", C, 4 * C, true},
                      Mm{"matmul fcproj (4C->C)", 4 * C, C, true}, Mm{"matmul lm_head (C->Vp)", C, Vp, false}}) {
    HostBuf x(dt, BT * m.in, rng), w(dt, m.out * m.in, rng, 0.02f), b(dt, m.out, rng), y(dt, BT * m.out, rng), dx(dt, BT * m.in, rng),
        dw(dt, m.out * m.in, rng), db(dt, m.out, rng);
    std::vector<float> scratch(matmul_scratch_elems(dt, m.in));
    Tensor s(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())});
    Tensor bias = m.bias ? b.t({m.out}) : Tensor();
    Tensor dbias = m.bias ? db.t({m.out}) : Tensor();
    const double flops = 2.0 * BT * m.in * m.out;
    report(m.name, "forward", dt, flops, [&] { matmul_forward(y.t({BT, m.out}), x.t({BT, m.in}), w.t({m.out, m.in}), bias, s); });
    report(m.name, "backward", dt, 2 * flops, [&] {
      matmul_backward(dx.t({BT, m.in}), dw.t({m.out, m.in}), dbias, y.t({BT, m.out}), x.t({BT, m.in}), w.t({m.out, m.in}), s);
    });
  }
  // attention at T = 256 and 1024 (bench_attention)
  bench_attention(dt, T);
  bench_attention(dt, 1024);
  // gelu and dropout on the MLP activation (B, T, 4C)
  {
    const std::int64_t n = BT * 4 * C;
    HostBuf x(dt, n, rng), y(dt, n, rng), dx(dt, n, rng);
    report("gelu (B,T,4C)", "forward", dt, 8.0 * n, [&] { gelu_forward(y.t({n}), x.t({n})); });
    report("gelu (B,T,4C)", "backward", dt, 16.0 * n, [&] { gelu_backward(dx.t({n}), x.t({n}), y.t({n})); });
    const DropoutParams dp{0.1f, RngKey{7, 1, 2, 0, 0}};
    report("dropout p=0.1 (B,T,4C)", "forward", dt, 1.0 * n, [&] { dropout_forward(y.t({n}), x.t({n}), dp); });
    report("dropout p=0.1 (B,T,4C)", "backward", dt, 2.0 * n, [&] { dropout_backward(dx.t({n}), y.t({n}), dp); });
  }
  // Llama-family kernels at the same (B, T, C): RMSNorm, RoPE on q and k inside a fused q|k|v with
  // grouped KV heads (NH q + NH/4 k rotated, NH/4 v left untouched, in place; head size C/NH), and
  // SwiGLU on (B, T, I) with I = 8C/3 rounded to 64 (Llama's intermediate width rule).
  {
    HostBuf x(dt, BT * C, rng), y(dt, BT * C, rng), a(dt, BT * C, rng), res(dt, BT * C, rng), w(dt, C, rng), dx(dt, BT * C, rng), dw(dt, C, rng);
    std::vector<float> rstd(static_cast<std::size_t>(BT));
    Tensor tr(rstd.data(), DType::fp32, Shape{B, T});
    report("rmsnorm", "forward", dt, 4.0 * BT * C, [&] { rmsnorm_forward(y.t({B, T, C}), tr, x.t({B, T, C}), w.t({C})); });
    report("fused_residual_rmsnorm", "forward", dt, 5.0 * BT * C, [&] {
      fused_residual_rmsnorm_forward(res.t({B, T, C}), y.t({B, T, C}), tr, x.t({B, T, C}), a.t({B, T, C}), w.t({C}));
    });
    report("rmsnorm", "backward", dt, 9.0 * BT * C, [&] {
      rmsnorm_backward(dx.t({B, T, C}), dw.t({C}), y.t({B, T, C}), x.t({B, T, C}), w.t({C}), tr);
    });
    const std::int64_t HS = C / NH, NKV = NH / 4, H = NH + 2 * NKV;
    HostBuf qkv(dt, BT * H * HS, rng);
    std::vector<float> freq = rope_inv_freq(HS, 10000.0);
    Tensor tf(freq.data(), DType::fp32, Shape{HS / 2});
    const double rotated = static_cast<double>(BT) * static_cast<double>((NH + NKV) * HS);
    report("rope (q,k of GQA qkv, in place)", "forward", dt, 3.0 * rotated, [&] {
      rope_forward(qkv.t({B, T, H, HS}), qkv.t({B, T, H, HS}), tf, NH + NKV);
    });
    report("rope (q,k of GQA qkv, in place)", "backward", dt, 3.0 * rotated, [&] {
      rope_backward(qkv.t({B, T, H, HS}), qkv.t({B, T, H, HS}), tf, NH + NKV);
    });
    const std::int64_t n = BT * ((8 * C / 3 + 63) / 64 * 64);
    HostBuf g(dt, n, rng), u(dt, n, rng), o(dt, n, rng), dg(dt, n, rng), du(dt, n, rng);
    report("swiglu (B,T,I)", "forward", dt, 6.0 * n, [&] { swiglu_forward(o.t({n}), g.t({n}), u.t({n})); });
    report("swiglu (B,T,I)", "backward", dt, 12.0 * n, [&] { swiglu_backward(dg.t({n}), du.t({n}), o.t({n}), g.t({n}), u.t({n})); });
  }
  // softmax cross-entropy over the padded vocabulary
  {
    HostBuf logits(dt, BT * Vp, rng, 4.0f), dlogits(dt, BT * Vp, rng);
    std::vector<float> losses(static_cast<std::size_t>(BT)), lse(losses.size());
    std::vector<std::int32_t> tg(static_cast<std::size_t>(BT));
    std::uniform_int_distribution<std::int32_t> d(0, V - 1);
    for (auto& x : tg) x = d(rng);
    Tensor tl(losses.data(), DType::fp32, Shape{BT}), ts(lse.data(), DType::fp32, Shape{BT}), tt(tg.data(), DType::int32, Shape{BT});
    report("softmax_cross_entropy", "forward", dt, 4.0 * BT * V, [&] { softmax_cross_entropy_forward(tl, ts, logits.t({BT, Vp}), tt, V); });
    report("softmax_cross_entropy", "backward", dt, 4.0 * BT * V, [&] {
      softmax_cross_entropy_backward(dlogits.t({BT, Vp}), logits.t({BT, Vp}), ts, tt, 1.0f / BT, V);
    });
  }
}

void bench_adamw(DType grad_dt) {
  if (!g_only.empty() && std::string("adamw").find(g_only) == std::string::npos) return;
  std::mt19937 rng(99);
  const std::int64_t n = 124475904;  // GPT-2 124M with the padded vocabulary
  HostBuf p(DType::fp32, n, rng), g(grad_dt, n, rng), m(DType::fp32, n, rng, 0.01f), v(DType::fp32, n, rng, 0.0001f), low(DType::bf16, n, rng);
  for (std::size_t i = 0; i < v.bytes.size() / 4; ++i) reinterpret_cast<float*>(v.bytes.data())[i] = 1e-4f;
  AdamWConfig cfg{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f};
  // Every instruction set this CPU runs (ops/kernels/cpu_isa.h), side by side; the bytes each
  // element moves: θ, m, v read and written (24), the gradient read, the bf16 copy written (2).
  const double bytes = (24.0 + static_cast<double>(dtype_size(grad_dt)) + 2.0) * static_cast<double>(n);
  const CpuIsa chosen = cpu_isa();
  // In memory (124M elements: bandwidth-bound) and in cache (16K elements, one thread: the
  // arithmetic the vector width speeds up).
  const std::int64_t small = 16384;
  for (const CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa)) continue;
    set_cpu_isa(isa);
    for (const std::int64_t count : {n, small}) {
      const std::string name = std::string(count == n ? "adamw (124M, bf16 copy) " : "adamw (16K in cache)    ") + std::string(cpu_isa_name(isa));
      const double ms = time_ms([&] {
                          for (int r = 0; r < (count == n ? 1 : 1000); ++r) {
                            adamw_update(p.t({count}), g.t({count}), m.t({count}), v.t({count}), low.t({count}), cfg);
                            ++cfg.step;
                          }
                        }) /
                        (count == n ? 1.0 : 1000.0);
      const double b = bytes / static_cast<double>(n) * static_cast<double>(count);
      std::printf("%-40s %-5s %10.4f ms %10.2f GB/s %8.3f Gparam/s\n", name.c_str(), std::string(dtype_name(grad_dt)).c_str(), ms, b / (ms * 1e6),
                  static_cast<double>(count) / (ms * 1e6));
      std::fflush(stdout);
    }
  }
  set_cpu_isa(chosen);
}

// The element-wise optimizer rules (ops/kernels/optimizer_rule.h) on every ISA: 16M elements in
// memory (bandwidth-bound: θ and each state read and written, the gradient read, the bf16 copy
// written) and 16K in cache, one thread (the arithmetic, divisions and square roots).
void bench_optimizer_rules(DType grad_dt) {
  if (!g_only.empty() && std::string("optimizer_rule").find(g_only) == std::string::npos) return;
  std::mt19937 rng(98);
  const std::int64_t n = 16 * 1024 * 1024, small = 16384;
  const std::pair<const char*, RuleStep> rules[] = {
      {"adagrad", adagrad_step({.weight_decay = 0.1}, 3, 1.0f)},
      {"lion", lion_step({.weight_decay = 0.1}, 1.0f)},
      {"rmsprop (momentum, centered)", rmsprop_step({.weight_decay = 0.1, .momentum = 0.9, .centered = true}, 1.0f)},
      {"adamax", adamax_step({.weight_decay = 0.1}, 3, 1.0f)},
      {"nadam", nadam_step({.weight_decay = 0.1}, 3, 1.0f)},
      {"radam", radam_step({.weight_decay = 0.1}, 8, 1.0f)},
      {"adadelta", adadelta_step({.weight_decay = 0.1}, 1.0f)},
      {"asgd", asgd_step({.weight_decay = 0.1}, 3, 1.0f)},
      {"rprop", rprop_step({}, 3, 1.0f)},
  };
  HostBuf p(DType::fp32, n, rng), g(grad_dt, n, rng), low(DType::bf16, n, rng);
  std::vector<HostBuf> states;
  for (int j = 0; j < 3; ++j) states.emplace_back(DType::fp32, n, rng, 0.01f);
  const CpuIsa chosen = cpu_isa();
  for (const auto& [rule, step] : rules) {
    // Fresh states per rule (what one rule leaves would be another's input otherwise): a sum of
    // squares above any running mean squared, so no sqrt of a negative.
    for (int j = 0; j < 3; ++j) {
      auto* f = reinterpret_cast<float*>(states[static_cast<std::size_t>(j)].bytes.data());
      for (std::int64_t i = 0; i < n; ++i) f[i] = j == 0 ? 1e-2f : 1e-3f;
    }
    auto* pf = reinterpret_cast<float*>(p.bytes.data());
    for (std::int64_t i = 0; i < n; ++i) pf[i] = 0.5f;
    const double bytes = (8.0 * (1 + step.states) + static_cast<double>(dtype_size(grad_dt)) + 2.0) * static_cast<double>(n);
    for (const CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_isa_supported(isa)) continue;
      set_cpu_isa(isa);
      for (const std::int64_t count : {n, small}) {
        std::vector<Tensor> st;
        for (int j = 0; j < step.states; ++j) st.push_back(states[static_cast<std::size_t>(j)].t({count}));
        const std::string name = std::string(rule) + (count == n ? " (16M) " : " (16K in cache) ") + std::string(cpu_isa_name(isa));
        const int reps = count == n ? 1 : 1000;
        const double ms = time_ms([&] {
                            for (int r = 0; r < reps; ++r) optimizer_rule_update(step, p.t({count}), g.t({count}), st, low.t({count}));
                          }) /
                          reps;
        const double b = bytes / static_cast<double>(n) * static_cast<double>(count);
        std::printf("%-48s %-5s %10.4f ms %10.2f GB/s %8.3f Gparam/s\n", name.c_str(), std::string(dtype_name(grad_dt)).c_str(), ms, b / (ms * 1e6),
                    static_cast<double>(count) / (ms * 1e6));
        std::fflush(stdout);
      }
    }
  }
  set_cpu_isa(chosen);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<DType> dtypes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" && i + 1 < argc) {
      g_only = argv[++i];
    } else {
      dtypes.push_back(parse_dtype(a));
    }
  }
  if (dtypes.empty()) dtypes = {DType::fp32, DType::bf16};
  std::printf("dstrain CPU kernels, GPT-2 small shapes: B=%lld T=%lld C=%lld NH=%lld V=%lld Vp=%lld\n", static_cast<long long>(B),
              static_cast<long long>(T), static_cast<long long>(C), static_cast<long long>(NH), static_cast<long long>(V),
              static_cast<long long>(Vp));
  for (DType dt : dtypes) {
    bench_dtype(dt);
    bench_adamw(dt);
    bench_optimizer_rules(dt);
  }
  return 0;
}
