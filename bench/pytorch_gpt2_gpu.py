#!/usr/bin/env python3
"""PyTorch GPU peer: GPT-2 training steps as a PyTorch user would write them, timed.

The model is bench/gpt2_torch.py's (dstrain's gpt2 architecture: tied head, vocab padded to 50304
with the loss over the real 50257, GELU tanh, LayerNorm eps 1e-5, no dropout) with flash attention
through F.scaled_dot_product_attention(is_causal=True); bf16 autocast over fp32 parameters, fused
AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1, as examples/ds_configs/gpt2_d12_bf16_gpu.json),
gradient clipping at 1.0, torch.compile (--no-compile: eager), optional activation checkpointing
per block (--checkpoint). Tokens: random (the default: a step's cost does not depend on them) or
windows of an llm.c token file (--data, the format `dstrain prepare-data` writes).

Prints one JSON line: tokens_per_s, ms_per_step (mean of the timed steps, CUDA events), the median
step, peak memory (torch.cuda.max_memory_allocated / max_memory_reserved over the whole run: model,
optimizer state, activations), MFU against --peak-tflops (llm.c's 6N + 6LCT flops per token) and
the versions. On out-of-memory it prints {"error": "out of memory", ...} and exits 3. If
torch.compile fails it says why on stderr and runs eagerly ("compiled": false).

    python3 bench/pytorch_gpt2_gpu.py --batch 16 --seq 1024 --steps 20 --warmup 5 [--checkpoint]
"""
import argparse
import json
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257, help="V: real vocabulary (targets are < V)")
    p.add_argument("--padded-vocab", type=int, default=50304, help="Vp >= V rows of the embedding table (0: V)")
    p.add_argument("--batch", type=int, default=8, help="B: sequences per step (micro-batch, one GPU)")
    p.add_argument("--seq", type=int, default=1024, help="T: tokens per sequence (also the position table)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation, allocator, cuBLAS heuristics; the first step is never timed)")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing: recompute every block in backward")
    p.add_argument("--no-compile", action="store_true", help="eager mode (no torch.compile)")
    p.add_argument("--compile-mode", default="default", help="torch.compile mode (default, max-autotune, ...)")
    p.add_argument("--data", default="", help="llm.c token file (dstrain prepare-data); default random tokens")
    p.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak for MFU (H100 SXM: 989.4)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    if args.padded_vocab == 0:
        args.padded_vocab = args.vocab
    if args.padded_vocab < args.vocab:
        p.error(f"--padded-vocab {args.padded_vocab} is smaller than --vocab {args.vocab}")
    if args.channels % args.heads != 0:
        p.error(f"--channels {args.channels} is not divisible by --heads {args.heads}")
    if min(args.layers, args.channels, args.heads, args.vocab, args.batch, args.seq, args.steps) < 1 or args.warmup < 0:
        p.error("shapes and --steps must be >= 1, --warmup >= 0")
    return args


ARGS = parse_args()

try:
    import torch
except ImportError:
    sys.exit(f"pytorch_gpt2_gpu.py: {sys.executable} has no torch; run it with the python that has PyTorch with CUDA")
from gpt2_torch import GPT, flops_per_token  # bench/gpt2_torch.py: the model shared with the CPU peer

TOKEN_MAGIC = 20240520  # data/token_file.h


def load_tokens(path, device, max_tokens=200_000_000):
    """The token ids of an llm.c token file (header: 256 int32, [0] magic, [1] version, [2] count)."""
    import numpy as np

    header = np.fromfile(path, dtype=np.int32, count=256)
    if header.size < 256 or header[0] != TOKEN_MAGIC:
        sys.exit(f"pytorch_gpt2_gpu.py: {path} is not an llm.c token file (magic {TOKEN_MAGIC}); make one with `dstrain prepare-data`")
    count = min(int(header[2]), max_tokens)
    tokens = np.fromfile(path, dtype=np.uint16, count=count, offset=1024)
    return torch.from_numpy(tokens.astype(np.int64)).to(device)


def result_base(a, params):
    return {
        "peer": "pytorch-gpu",
        "shape": {"L": a.layers, "C": a.channels, "NH": a.heads, "V": a.vocab, "Vp": a.padded_vocab, "B": a.batch, "T": a.seq},
        "checkpoint": a.checkpoint,
        "parameters": params,
        "flops_per_token": flops_per_token(params, a.layers, a.channels, a.seq),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "data": a.data or "random",
    }


def main():
    a = ARGS
    if not torch.cuda.is_available():
        sys.exit("pytorch_gpt2_gpu.py: torch.cuda.is_available() is False: no usable GPU (or a CPU-only torch)")
    device = torch.device(a.device)
    torch.cuda.set_device(device)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast (none in the step)
    torch.backends.cudnn.allow_tf32 = True
    torch.cuda.reset_peak_memory_stats()

    raw = GPT(a.layers, a.channels, a.heads, a.vocab, a.padded_vocab, a.seq, attention="sdpa", checkpoint=a.checkpoint).to(device)
    params = sum(p.numel() for p in raw.parameters())  # the tied wte counted once, with its pad rows (as dstrain's parameters_stored)
    base = result_base(a, params)
    try:
        optimizer = torch.optim.AdamW(raw.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay, fused=True)
        fused = True
    except (TypeError, RuntimeError):  # a torch without the fused kernel
        optimizer = torch.optim.AdamW(raw.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay)
        fused = False

    B, T = a.batch, a.seq
    if a.data:
        tokens = load_tokens(a.data, device)
        if tokens.numel() < B * T + 1:
            sys.exit(f"pytorch_gpt2_gpu.py: {a.data} has {tokens.numel()} tokens, fewer than one batch of {B}x{T}+1")
    else:
        g = torch.Generator(device=device).manual_seed(a.seed)
        tokens = torch.randint(0, a.vocab, (B * T + 1,), generator=g, device=device)
    position = [0]

    def next_batch():
        # Consecutive windows of B·T + 1 tokens, wrapping at the end (random tokens: the same one).
        if position[0] + B * T + 1 > tokens.numel():
            position[0] = 0
        chunk = tokens[position[0] : position[0] + B * T + 1]
        position[0] += B * T
        return chunk[:-1].view(B, T), chunk[1:].view(B, T)

    model = raw
    compiled = False
    if not a.no_compile:
        model = torch.compile(raw, mode=None if a.compile_mode == "default" else a.compile_mode)
        compiled = True

    def step(m):
        x, y = next_batch()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = m(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    try:
        t0 = time.perf_counter()
        try:
            loss = step(model)
            first_loss = loss.item()
        except oom:
            raise
        except Exception as e:  # torch.compile failed (no compiler, an unsupported op): measure eager instead
            if not compiled:
                raise
            print(f"pytorch_gpt2_gpu.py: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); running eagerly",
                  file=sys.stderr)
            torch._dynamo.reset()
            model, compiled = raw, False
            optimizer.zero_grad(set_to_none=True)
            loss = step(model)
            first_loss = loss.item()
        for _ in range(max(0, a.warmup - 1)):
            step(model)
        torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t0

        events = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        events[0].record()
        for i in range(a.steps):
            loss = step(model)
            events[i + 1].record()
        torch.cuda.synchronize()
        last_loss = loss.item()
    except oom as e:
        if "out of memory" not in str(e).lower():  # old torch: oom is RuntimeError, which covers more
            raise
        base.update({"error": "out of memory", "detail": str(e).splitlines()[0],
                     "peak_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
                     "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved()})
        print(json.dumps(base))
        sys.exit(3)

    step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(a.steps)]
    total_s = sum(step_ms) / 1000.0
    tokens_per_s = B * T * a.steps / total_s
    fpt = base["flops_per_token"]
    base.update({
        "tokens_per_s": round(tokens_per_s, 1),
        "ms_per_step": round(1000.0 * total_s / a.steps, 3),
        "ms_per_step_median": round(statistics.median(step_ms), 3),
        "mfu": round(fpt * tokens_per_s / (a.peak_tflops * 1e12), 4),
        "peak_tflops": a.peak_tflops,
        "achieved_tflops": round(fpt * tokens_per_s / 1e12, 1),
        "peak_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
        "compiled": compiled,
        "compile_mode": a.compile_mode if compiled else None,
        "adamw_fused": fused,
        "warmup_s": round(warmup_s, 2),
        "loss_first": round(first_loss, 4),
        "loss_last": round(last_loss, 4),
    })
    print(json.dumps(base))


if __name__ == "__main__":
    main()
