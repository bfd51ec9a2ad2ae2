#!/usr/bin/python3
"""PyTorch CPU peer: Mixtral-shaped MoE training steps (forward + backward + gradient clipping + AdamW), fp32, timed.

Written from Hugging Face's Mixtral equations (transformers' MixtralForCausalLM): RMSNorm (eps 1e-5),
rotary embeddings with the rotate-half convention (theta 10000, as dstrain's `moe:` descriptor
fixes it), grouped-query causal attention (head h reads KV head h // (H / KV)), no biases; in place
of the MLP a sparse block as MixtralSparseMoeBlock: router logits = gate(h) (E × C, no bias),
softmax in fp32, top-k, the k weights renormalised to sum to 1 (`norm_topk_prob`, always on in
Mixtral), and for each expert e the tokens routed to it gathered (index_select), put through its
SwiGLU down(silu(w1 x) * w3 x), scaled by their routing weight and scattered back (index_add_).
A final RMSNorm and an LM head, untied by default (dstrain's `moe:` default; --tied to share the
embedding). No router jitter, no aux loss in the training loss (the `moe:` model without `-aux`).

The attention and the fast paths are bench/pytorch_llama_cpu.py's (fused q/k/v and, per expert,
fused w1/w3 GEMMs; GQA scores as one matmul per KV head; additive causal mask; foreach AdamW —
torch 1.13 has neither scaled_dot_product_attention nor fused AdamW). Gradient norm clipped to 1.0,
as bench/bench_moe_cpu.sh's ds_config does for dstrain.

Tokens: consecutive (B, T+1) windows of a dstrain / llm.c token file (--data; 256 int32 header,
uint16 tokens), or random tokens without --data. Every step, the first included (--warmup 0),
is timed unless --warmup says otherwise. --expert-report N also prints, to stderr, each layer's
tokens per expert (max/mean) every N steps: the load of a reference without the aux loss, next to
dstrain's progress lines (the counting is not free: leave it off when timing). Prints one JSON line:
    /usr/bin/python3 bench/pytorch_moe_cpu.py --layers 4 --channels 256 --heads 4 --kv-heads 4 \
        --experts 8 --top-k 2 --intermediate 256 --vocab 50304 --batch 4 --seq 128 --steps 20 --threads 1 \
        --data datasets/brown_train.bin
"""
import argparse
import json
import math
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=256, help="each expert's SwiGLU width")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--tied", action="store_true", help="LM head tied to the embedding (default: untied, as dstrain's moe:)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="token file (dstrain prepare-data / llm.c format); default random tokens")
    p.add_argument("--expert-report", type=int, default=0, metavar="N",
                   help="every N steps (and after step 1), print to stderr each layer's max/mean tokens per expert since the last report")
    a = p.parse_args()
    if a.channels % a.heads or a.heads % a.kv_heads:
        p.error("--channels must be a multiple of --heads, and --heads of --kv-heads")
    if not 1 <= a.top_k <= a.experts:
        p.error("--top-k must be in 1..--experts")
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


class Expert(nn.Module):
    """Mixtral's MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x), w1 and w3 as one GEMM."""

    def __init__(self, c, inter):
        super().__init__()
        self.w13 = nn.Linear(c, 2 * inter, bias=False)
        self.w2 = nn.Linear(inter, c, bias=False)

    def forward(self, x):
        g, u = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(g) * u)


class SparseMoe(nn.Module):
    """transformers' MixtralSparseMoeBlock (no jitter): softmax, top-k, renormalise, per-expert gather/scatter."""

    def __init__(self, c, inter, n_experts, top_k):
        super().__init__()
        self.top_k, self.n_experts = top_k, n_experts
        self.gate = nn.Linear(c, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(c, inter) for _ in range(n_experts))
        self.counts = None  # tokens per expert since the last report (--expert-report), else None

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(-1, C)
        router_logits = self.gate(h)  # (N, E)
        weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        weights, selected = torch.topk(weights, self.top_k, dim=-1)  # (N, K)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(h.dtype)
        if self.counts is not None:
            self.counts += torch.bincount(selected.flatten(), minlength=self.n_experts).double()
        out = torch.zeros_like(h)
        # (E, K, N): expert_mask[e, k, n] is 1 when token n's k-th choice is e.
        expert_mask = F.one_hot(selected, num_classes=self.n_experts).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            idx, top_x = torch.where(expert_mask[e])
            if top_x.numel() == 0:
                continue
            current = h.index_select(0, top_x)
            y = expert(current) * weights[top_x, idx, None]
            out.index_add_(0, top_x, y.to(h.dtype))
        return out.view(B, T, C), router_logits


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        c, nh, nkv = a.channels, a.heads, a.kv_heads
        self.nh, self.nkv, self.d = nh, nkv, c // nh
        self.attn_norm = RMSNorm(c)
        self.qkv = nn.Linear(c, (nh + 2 * nkv) * self.d, bias=False)
        self.o = nn.Linear(c, c, bias=False)
        self.moe_norm = RMSNorm(c)
        self.moe = SparseMoe(c, a.intermediate, a.experts, a.top_k)

    def attention(self, x, cos, sin, mask):
        B, T, C = x.shape
        nh, nkv, d = self.nh, self.nkv, self.d
        g = nh // nkv
        q, k, v = self.qkv(x).split([nh * d, nkv * d, nkv * d], dim=-1)
        q = q.view(B, T, nh, d).transpose(1, 2)
        k = k.view(B, T, nkv, d).transpose(1, 2)
        v = v.view(B, T, nkv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        q = q.reshape(B, nkv, g * T, d)
        att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d)) + mask
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).view(B, nh, T, d)
        return self.o(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attn_norm(x), cos, sin, mask)
        y, _ = self.moe(self.moe_norm(x))
        return x + y


class Mixtral(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.channels)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.channels)
        self.head = nn.Linear(a.channels, a.vocab, bias=False)
        if a.tied:
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
        self.register_buffer("mask", causal.repeat(g, 1), persistent=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def batches(a):
    """Yields (inputs, targets): consecutive windows of --data, or random tokens."""
    n = a.batch * (a.seq + 1)
    if a.data is None:
        g = torch.Generator().manual_seed(a.seed)
        while True:
            t = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
            yield t[:, :-1].contiguous(), t[:, 1:].contiguous()
    import numpy as np
    header = np.fromfile(a.data, dtype=np.int32, count=256)
    if header[0] != 20240520:
        sys.exit(f"{a.data}: not a dstrain / llm.c token file (magic {header[0]})")
    tokens = np.fromfile(a.data, dtype=np.uint16, offset=1024)[: int(header[2])].astype(np.int64)
    pos = 0
    while True:
        if pos + n > len(tokens):
            pos = 0
        t = torch.from_numpy(tokens[pos:pos + n]).view(a.batch, a.seq + 1)
        pos += n
        yield t[:, :-1].contiguous(), t[:, 1:].contiguous()


def main():
    a = ARGS
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    model = Mixtral(a)
    params = sum(p.numel() for p in model.parameters())
    per_expert = 3 * a.channels * a.intermediate
    active = params - a.layers * (a.experts - a.top_k) * per_expert
    kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), fused=True, **kw)
        adamw = "fused"
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True, **kw)
        adamw = "foreach"
    data = batches(a)
    moes = [b.moe for b in model.blocks]
    if a.expert_report:
        for m in moes:
            m.counts = torch.zeros(a.experts, dtype=torch.float64)
    n_step = [0]

    def report():
        n_step[0] += 1
        s = n_step[0]
        if a.expert_report and (s == 1 or s % a.expert_report == 0):
            ratios = [float(m.counts.max() / m.counts.mean()) for m in moes]
            lo, hi = min(float(m.counts.min()) for m in moes), max(float(m.counts.max()) for m in moes)
            print(f"step {s}: tokens per (layer, expert) {lo:.0f}-{hi:.0f}; max/mean per layer "
                  + " ".join(f"{r:.2f}x" for r in ratios), file=sys.stderr, flush=True)
            for m in moes:
                m.counts.zero_()

    def step():
        inputs, targets = next(data)
        optimizer.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        report()
        return loss.item()

    first = None
    for _ in range(a.warmup):
        loss = step()
        first = loss if first is None else first
    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        loss = step()
        first = loss if first is None else first
    elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    print(json.dumps({
        "peer": "pytorch-cpu-mixtral",
        "tokens_per_s": round(a.batch * a.seq * a.steps / elapsed, 2),
        "ms_per_step": round(1000.0 * elapsed / a.steps, 2),
        "cpu_s_per_step": round(cpu_s / a.steps, 3),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "adamw": adamw,
        "shape": {"L": a.layers, "C": a.channels, "H": a.heads, "KV": a.kv_heads, "E": a.experts, "K": a.top_k,
                  "I": a.intermediate, "V": a.vocab, "tied": a.tied, "B": a.batch, "T": a.seq},
        "parameters": params,
        "active_parameters": active,
        "data": a.data or "random",
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "loss_first": round(first, 4),
        "loss_last": round(loss, 4),
    }))


if __name__ == "__main__":
    main()
