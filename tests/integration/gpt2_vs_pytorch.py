"""GPT-2 against an independent PyTorch implementation (tests/integration/test_gpt2_vs_pytorch.cpp).

Reads from DIR what dstrain wrote: weights.safetensors (dstrain's Hugging Face export of its
parameters), grads.safetensors (its gradients, same layout), outputs.safetensors (tokens, targets,
logits, loss), and the model size from config.json. Builds GPT-2 here, in float64, from
Hugging Face's GPT2LMHeadModel definition written out by hand (Conv1D weights (in, out), pre-LN
blocks, GELU tanh, causal softmax attention scaled by 1/sqrt(head size), final LayerNorm, LM head
tied to wte; mean cross-entropy over the targets != -1), runs forward and backward, and compares.

Tolerance (dstrain computes in fp32): logits |a - b| <= 1e-4 + 1e-4 |b|; the loss to 1e-5 relative;
every gradient tensor max |a - b| <= 1e-4 * max |b| + 1e-7. Exit 0 on agreement, 1 listing every
mismatch. Only the standard library and torch (Debian's python3-torch).
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8)}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[e["dtype"]]
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtype).clone() if end > b else torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def gpt2_loss_and_logits(w, cfg, tokens, targets):
    L, C, NH = cfg["n_layer"], cfg["n_embd"], cfg["n_head"]
    B, T = tokens.shape
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T][None, :, :]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        p = lambda s: w[f"h.{i}.{s}"]
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps)
        q, k, v = (h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")).split(C, dim=2)
        hs = C // NH
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps)
        h = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    logits = x @ w["wte.weight"].t()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
    return loss, logits


def main(folder):
    with open(f"{folder}/config.json") as f:
        cfg = json.load(f)
    w = {k: v.requires_grad_(True) for k, v in read_safetensors(f"{folder}/weights.safetensors").items()}
    ours_grads = read_safetensors(f"{folder}/grads.safetensors")
    out = read_safetensors(f"{folder}/outputs.safetensors")
    tokens = out["tokens"].round().long()
    targets = out["targets"].round().long()
    loss, logits = gpt2_loss_and_logits(w, cfg, tokens, targets)
    loss.backward()
    bad = []
    got_logits = out["logits"]
    if got_logits.shape != logits.shape:
        bad.append(f"logits: shape {tuple(got_logits.shape)} vs {tuple(logits.shape)}")
    else:
        err = (got_logits - logits.detach()).abs() - (1e-4 + 1e-4 * logits.detach().abs())
        if err.max() > 0:
            bad.append(f"logits: {int((err > 0).sum())} of {err.numel()} beyond 1e-4 + 1e-4|b|, worst |a-b| = "
                       f"{(got_logits - logits.detach()).abs().max():.3e}")
    if abs(out["loss"].item() - loss.item()) > 1e-5 * abs(loss.item()):
        bad.append(f"loss: dstrain {out['loss'].item():.9g} vs torch {loss.item():.9g}")
    if set(ours_grads) != set(w):
        bad.append(f"gradient names differ: {sorted(set(ours_grads) ^ set(w))}")
    for name, g in ours_grads.items():
        ref = w[name].grad
        if ref is None or ref.shape != g.shape:
            bad.append(f"{name}: no torch gradient of shape {tuple(g.shape)}")
            continue
        scale = ref.abs().max().item()
        diff = (g - ref).abs().max().item()
        if diff > 1e-4 * scale + 1e-7:
            bad.append(f"{name}: max |a-b| {diff:.3e} > 1e-4 * max|b| ({scale:.3e}) + 1e-7")
    print(f"gpt2_vs_pytorch: L={cfg['n_layer']} C={cfg['n_embd']} H={cfg['n_head']} V={cfg['vocab_size']} "
          f"B,T={tuple(tokens.shape)} loss dstrain {out['loss'].item():.7f} torch {loss.item():.7f}; "
          f"max |logit diff| {(got_logits - logits.detach()).abs().max():.2e}; {len(ours_grads)} gradient tensors")
    for b in bad:
        print("MISMATCH", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
