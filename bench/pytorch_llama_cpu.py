#!/usr/bin/python3
"""PyTorch CPU peer: one Llama training step (forward + backward + gradient clipping + AdamW), fp32, timed.

The Llama architecture written here from its published equations (Touvron et al. 2023, and
Hugging Face's LlamaForCausalLM for the conventions): RMSNorm (eps 1e-5), rotary embeddings with
the rotate-half convention (theta 10000), grouped-query attention (head h reads KV head
h // (H / KV)), a SwiGLU MLP down(silu(gate(x)) * up(x)), no biases, a final RMSNorm and an LM head
tied to the token embedding (--untied for a separate one). No dropout.

Written for speed with what torch 1.13 has (no scaled_dot_product_attention, no fused AdamW):
q/k/v as one Linear and gate/up as one Linear (one GEMM each instead of three and two); the GQA
scores as one batched matmul per (batch, KV head) with the group's G query heads stacked along the
rows — (G·T × D) @ (D × T) — so K and V are never repeated; an additive causal mask built once;
AdamW's multi-tensor (foreach) path. The gradient norm is clipped to 1.0 before the step, as
bench_train_cpu's ds_config does (gradient_clipping 1.0): both peers do the same work.

Prints one JSON line, as bench/pytorch_gpt2_cpu.py does (bench/compare_pytorch_llama_cpu.sh reads it):
    /usr/bin/python3 bench/pytorch_llama_cpu.py --layers 30 --channels 576 --heads 9 --kv-heads 3 \
        --intermediate 1536 --vocab 49152 --batch 4 --seq 256 --steps 3 --threads 2
"""
import argparse
import json
import math
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=172)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--untied", action="store_true", help="a separate LM head (default: tied to the embedding)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward and the loss under torch.autocast('cpu', torch.bfloat16) (fp32 weights and AdamW)")
    a = p.parse_args()
    if a.channels % a.heads or a.heads % a.kv_heads:
        p.error("--channels must be a multiple of --heads, and --heads of --kv-heads")
    return a


ARGS = parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(ARGS.threads))
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(f"{sys.executable} has no torch: run bench/setup_peer.sh, and use /usr/bin/python3 (Debian's python3-torch)")


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, c, nh, nkv, inter):
        super().__init__()
        self.nh, self.nkv, self.d = nh, nkv, c // nh
        self.attn_norm = RMSNorm(c)
        self.qkv = nn.Linear(c, (nh + 2 * nkv) * self.d, bias=False)
        self.o = nn.Linear(c, c, bias=False)
        self.mlp_norm = RMSNorm(c)
        self.gate_up = nn.Linear(c, 2 * inter, bias=False)
        self.down = nn.Linear(inter, c, bias=False)

    def attention(self, x, cos, sin, mask):
        B, T, C = x.shape
        nh, nkv, d = self.nh, self.nkv, self.d
        g = nh // nkv
        q, k, v = self.qkv(x).split([nh * d, nkv * d, nkv * d], dim=-1)
        q = q.view(B, T, nh, d).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, nkv, d).transpose(1, 2)  # (B, KV, T, D)
        v = v.view(B, T, nkv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # The G query heads of a KV head stacked along the rows: (B, KV, G·T, D).
        q = q.reshape(B, nkv, g * T, d)
        att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d)) + mask  # (B, KV, G·T, T)
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).view(B, nh, T, d)
        return self.o(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attn_norm(x), cos, sin, mask)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.channels)
        self.blocks = nn.ModuleList(Block(a.channels, a.heads, a.kv_heads, a.intermediate) for _ in range(a.layers))
        self.norm = RMSNorm(a.channels)
        self.head = nn.Linear(a.channels, a.vocab, bias=False)
        if not a.untied:
            self.head.weight = self.embed.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        d, T, g = a.channels // a.heads, a.seq, a.heads // a.kv_heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        causal = torch.full((T, T), float("-inf")).triu(1)
        self.register_buffer("mask", causal.repeat(g, 1), persistent=False)  # (G·T, T)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    a = ARGS
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    model = Llama(a)
    params = sum(p.numel() for p in model.parameters())
    kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), fused=True, **kw)
        adamw = "fused"
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True, **kw)
        adamw = "foreach"
    g = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # bench_train_cpu: gradient_clipping 1.0
        optimizer.step()
        return loss.item()

    first = None
    for _ in range(a.warmup):
        loss = step()
        first = loss if first is None else first
    start, cpu0 = time.perf_counter(), time.process_time()  # process_time: CPU seconds of all threads
    for _ in range(a.steps):
        loss = step()
        first = loss if first is None else first
    elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    print(json.dumps({
        "peer": "pytorch-cpu-llama",
        "precision": a.precision,
        "tokens_per_s": round(a.batch * a.seq * a.steps / elapsed, 2),
        "ms_per_step": round(1000.0 * elapsed / a.steps, 2),
        "cpu_s_per_step": round(cpu_s / a.steps, 3),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "adamw": adamw,
        "shape": {"L": a.layers, "C": a.channels, "H": a.heads, "KV": a.kv_heads, "I": a.intermediate, "V": a.vocab,
                  "tied": not a.untied, "B": a.batch, "T": a.seq},
        "parameters": params,
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "loss_first": round(first, 4),
        "loss_last": round(loss, 4),
    }))


if __name__ == "__main__":
    main()
