"""The Llama family against an independent PyTorch implementation (test_llama_vs_pytorch.cpp).

Reads from DIR what dstrain wrote for one model: config.json (dstrain's Hugging Face config of
it), weights.safetensors (its Hugging Face export: q_proj / k_proj / v_proj, embed_tokens with the
real vocabulary, ...), grads.safetensors (its gradients, same names), outputs.safetensors (tokens,
targets, logits, loss) and, for training, trained.safetensors and train_losses. Builds the model
here in float64 from the published equations, not from dstrain's code:
  RMSNorm      x / sqrt(mean(x^2) + eps) * w                          (Zhang & Sennrich 2019)
  RoPE         rotate-half pairs (j, j + D/2) by p * inv_freq[j]; inv_freq = theta^(-2j/D), then
               "linear" (/ factor) or "llama3" (Meta's wavelength bands) scaling
  attention    causal softmax(q k^T / sqrt(D)) v, KV head h // (NH / NKV) for query head h (GQA);
               Mistral's sliding_window W: query i sees keys i - W < j <= i only
  MLP          down(silu(gate(x)) * up(x))                            (SwiGLU, Shazeer 2020)
  optional     q/k/v (and o, MLP) biases; q/k RMSNorm per head before RoPE (Qwen3)
  head         final RMSNorm, logits = x lm_head^T (embed_tokens when tied), mean cross-entropy
               over targets != -1
runs forward and backward, and, when asked, AdamW steps with torch.optim.AdamW.

Tolerance (dstrain computes in fp32): logits |a - b| <= 1e-4 + 1e-4 |b|; the loss to 1e-5 relative;
every gradient tensor max |a - b| <= 1e-4 * max |b| + 1e-7; after training, each step's loss to
1e-5 relative and every weight max |a - b| <= 1e-4 * max |b| + 1e-6. Exit 0 on agreement, 1 listing
every mismatch. Only the standard library and torch (Debian's python3-torch 1.13).
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

DTYPES = {"F32": torch.float32, "F64": torch.float64}


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
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]]).clone() if end > b else torch.zeros(0)
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def inv_freq(cfg):
    D = cfg["head_dim"]
    theta = cfg["rope_theta"]
    f = [theta ** (-(2.0 * j) / D) for j in range(D // 2)]
    rs = cfg.get("rope_scaling")
    if rs and rs["rope_type"] == "linear":
        f = [x / rs["factor"] for x in f]
    elif rs and rs["rope_type"] == "llama3":
        factor, lo, hi, orig = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = orig / lo, orig / hi
        out = []
        for x in f:
            wavelen = 2 * math.pi / x
            if wavelen < high_wavelen:
                out.append(x)  # high frequencies: unchanged
            elif wavelen > low_wavelen:
                out.append(x / factor)  # low frequencies: interpolated
            else:
                s = (orig / wavelen - lo) / (hi - lo)
                out.append((1 - s) * x / factor + s * x)
        f = out
    return torch.tensor(f)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):  # x (B, H, T, D)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


def forward(w, cfg, tokens, targets):
    L, NH, NKV, D = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    B, T = tokens.shape
    G = NH // NKV
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg)[None, :]  # (T, D/2)
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos(), ang.sin()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))  # key j visible to query i: j <= i
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    if window is not None:  # Mistral's sliding window: and j > i - window (the query and the window - 1 keys before it)
        i_idx, j_idx = torch.arange(T)[:, None], torch.arange(T)[None, :]
        mask &= j_idx > i_idx - window
    qk_norm = cfg["model_type"] == "qwen3"
    x = w["model.embed_tokens.weight"][tokens]

    def lin(h, name):
        y = h @ w[name + ".weight"].t()
        return y + w[name + ".bias"] if name + ".bias" in w else y

    for i in range(L):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj").view(B, T, NH, D)
        k = lin(h, p + "self_attn.k_proj").view(B, T, NKV, D)
        v = lin(h, p + "self_attn.v_proj").view(B, T, NKV, D)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k[:, [hh // G for hh in range(NH)]]  # the KV head of each query head
        v = v[:, [hh // G for hh in range(NH)]]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * D)
        x = x + lin(y, p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(F.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.t()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
    return loss, logits


def compare(name, got, ref, rtol_of_max, atol, bad):
    if got.shape != ref.shape:
        bad.append(f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}")
        return
    scale = ref.abs().max().item() if ref.numel() else 0.0
    diff = (got - ref).abs().max().item() if ref.numel() else 0.0
    if diff > rtol_of_max * scale + atol:
        bad.append(f"{name}: max |a-b| {diff:.3e} > {rtol_of_max} * max|b| ({scale:.3e}) + {atol}")


def main(folder):
    with open(f"{folder}/config.json") as f:
        cfg = json.load(f)
    w = {k: v.requires_grad_(True) for k, v in read_safetensors(f"{folder}/weights.safetensors").items()}
    ours_grads = read_safetensors(f"{folder}/grads.safetensors")
    out = read_safetensors(f"{folder}/outputs.safetensors")
    tokens = out["tokens"].round().long()
    targets = out["targets"].round().long()
    loss, logits = forward(w, cfg, tokens, targets)
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
        if ref is None:
            bad.append(f"{name}: no torch gradient")
            continue
        compare(name, g, ref, 1e-4, 1e-7, bad)

    steps = 0
    try:
        with open(f"{folder}/train.json") as f:
            train = json.load(f)
    except FileNotFoundError:
        train = None
    if train is not None:
        # The weights again, trained with torch.optim.AdamW: decay on the matrices and embeddings,
        # none on norms and biases (dstrain's ParamSpec::weight_decay).
        w = {k: v.detach().clone().requires_grad_(True) for k, v in read_safetensors(f"{folder}/weights.safetensors").items()}
        decay = [v for k, v in w.items() if k.endswith(".weight") and "norm" not in k]
        no_decay = [v for k, v in w.items() if not (k.endswith(".weight") and "norm" not in k)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": train["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"])
        losses = []
        for _ in train["losses"]:
            opt.zero_grad()
            l, _ = forward(w, cfg, tokens, targets)
            losses.append(l.item())
            l.backward()
            opt.step()
            steps += 1
        # A loss is a log-sum-exp minus the target's logit: its float32 rounding is relative to the
        # size of those terms (about the first step's loss), not to a loss that training has brought
        # near 0. (In the ASan build, libraries at -O1, step 5 of qwen3 differed from torch by 2.7e-7:
        # 1.2e-5 of its loss 0.0226, 2e-8 of the first loss 12.3.)
        scale = max(abs(losses[0]), 1.0)
        for i, (a, b) in enumerate(zip(train["losses"], losses)):
            if abs(a - b) > 1e-5 * max(abs(b), scale):
                bad.append(f"training step {i + 1}: loss dstrain {a:.9g} vs torch {b:.9g}")
        trained = read_safetensors(f"{folder}/trained.safetensors")
        for name, t in trained.items():
            compare(f"trained {name}", t, w[name].detach(), 1e-4, 1e-6, bad)
    print(f"llama_vs_pytorch: {cfg['model_type']} L={cfg['num_hidden_layers']} C={cfg['hidden_size']} H={cfg['num_attention_heads']} "
          f"KV={cfg['num_key_value_heads']} D={cfg['head_dim']} tied={cfg['tie_word_embeddings']} rope_scaling={cfg.get('rope_scaling')} "
          f"B,T={tuple(tokens.shape)} loss dstrain {out['loss'].item():.7f} torch {loss.item():.7f}; "
          f"max |logit diff| {(got_logits - logits.detach()).abs().max():.2e}; {len(ours_grads)} gradient tensors; {steps} AdamW steps")
    for b in bad:
        print("MISMATCH", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
