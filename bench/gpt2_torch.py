"""The PyTorch GPT-2 of dstrain's peers (bench/pytorch_gpt2_cpu.py, bench/pytorch_gpt2_gpu.py).

The same architecture as dstrain's GPT model (and llm.c's): learned token and position embeddings,
pre-LayerNorm blocks (LN -> causal self-attention -> residual, LN -> MLP 4C with GELU tanh ->
residual), a final LayerNorm (eps 1e-5, as GPT-2 and dstrain's Gpt2Config), and an LM head tied to
the token embedding. Biases everywhere, no dropout. With Vp > V the embedding table has Vp rows (as
llm.c and dstrain pad 50257 to 50304 for faster GEMMs) and the loss is taken over the first V logits
only, so the pad rows never win.

Attention: "explicit" (masked softmax, as llm.c's CPU reference; torch 1.13 has no
scaled_dot_product_attention) or "sdpa" (F.scaled_dot_product_attention(is_causal=True): flash
attention on the GPU). Import torch before this module only after setting any thread-count
environment variables (the CPU peer does).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


def flops_per_token(params, layers, channels, seq):
    """llm.c's (and dstrain's train/monitor/flops.h) model flops per trained token: 6N + 6·L·C·T."""
    return 6 * params + 6 * layers * channels * seq


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH, T, attention="explicit"):
        super().__init__()
        if attention not in ("explicit", "sdpa"):
            raise ValueError(f"attention must be 'explicit' or 'sdpa', not {attention!r}")
        self.NH = NH
        self.attention = attention
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        if attention == "explicit":
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # [B, NH, T, HS]
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, C, NH, T, attention="explicit"):
        super().__init__()
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = CausalSelfAttention(C, NH, T, attention)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """checkpoint=True recomputes each block in backward (torch.utils.checkpoint, non-reentrant):
    only the blocks' inputs are kept, as dstrain's --checkpoint-activations does."""

    def __init__(self, L, C, NH, V, Vp, T, attention="explicit", checkpoint=False):
        super().__init__()
        self.V = V
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH, T, attention) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        # GPT-2's initialisation; residual projections scaled by 1/sqrt(2L).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            if self.checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head: [B, T, Vp]
        logits = logits[..., : self.V]  # the pad rows are not part of the softmax
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
