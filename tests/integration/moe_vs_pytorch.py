"""Mixture-of-experts decoders against an independent PyTorch implementation.

Reads from DIR what dstrain wrote for one model: config.json (its Hugging Face config), weights.safetensors
(its Hugging Face export), grads.safetensors (its gradients, same names, none for the buffer
e_score_correction_bias), outputs.safetensors (tokens, targets, logits, loss and, optionally, aux_loss: the
unscaled load-balancing loss) and, for training, train.json {lr, beta1, beta2, eps, weight_decay, losses[]}
with trained.safetensors. Builds the model here in float64 from the Hugging Face transformers equations of
Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (with DeepSeek-V3's routing options), not from dstrain's code:
  RMSNorm      x / sqrt(mean(x^2) + eps) * w                          (Zhang & Sennrich 2019)
  RoPE         rotate-half pairs (j, j + D/2) by p * theta^(-2j/D); no rope_scaling
  attention    causal softmax(q k^T / sqrt(D)) v, KV head h // (NH / NKV) for query head h (GQA);
               mixtral: no biases, sliding_window W: query i sees keys i - W < j <= i only;
               qwen2_moe: q/k/v biases; qwen3_moe: RMSNorm of each q and k head before RoPE;
               olmoe: RMSNorm over the whole q and the whole k projection before the heads, attention_bias
               adds q/k/v/o biases
  router       logits = h gate^T over the N = B T tokens; scores softmax (or sigmoid: scoring_func);
               choice = scores (+ e_score_correction_bias: topk_method noaux_tc); n_group > 1: group score
               = sum of its top-2 choices (noaux_tc) or its max, the topk_group best groups kept, the others'
               choices 0 (noaux_tc) or -inf; top_k = num_experts_per_tok choices; weights = the selected
               scores, / their sum (+ 1e-20 for sigmoid) when norm_topk_prob (mixtral: always),
               * routed_scaling_factor
  capacity     capacity_factor > 0 (DeepSpeed MoE): C = max(min_capacity, ceil(top_k N factor / E)); the
               assignments in (choice rank, token) order, each expert's beyond its first C dropped,
               weights not renormalised
  experts      down(silu(gate(h)) * up(h)) (SwiGLU, Shazeer 2020), out = sum of weight * expert(h);
               qwen2_moe shared expert: + sigmoid(h shared_expert_gate^T) * shared_expert(h);
               n_shared_experts: + shared_experts(h) of width n_shared_experts * moe_intermediate_size;
               dense layers (mlp_only_layers, decoder_sparse_step, first_k_dense_replace): the SwiGLU MLP
  aux loss     load_balancing_loss_func over all sparse layers' router logits: p = softmax, f = mean one-hot
               of top_k(p) (top_k x E), P = mean p; aux = E sum f P
  head         final RMSNorm, logits = x lm_head^T (embed_tokens when tied), mean cross-entropy over
               targets != -1, + router_aux_loss_coef * aux when output_router_logits
runs forward and backward, and, when asked, AdamW steps with torch.optim.AdamW (decay on matrices and
embeddings, none on norms and biases; e_score_correction_bias is a buffer, not trained).

Tolerance (dstrain computes in fp32): logits |a - b| <= 1e-4 + 1e-4 |b|; the loss and aux_loss to 1e-5
relative; every gradient tensor max |a - b| <= 1e-4 * max |b| + 1e-7; after training, each step's loss to
1e-5 relative and every weight max |a - b| <= 1e-4 * max |b| + 1e-6. The expert choices are discrete: the
summary prints the smallest gap between a token's last chosen and first unchosen choice score, so that a
mismatch from an fp32 near-tie shows as such. Exit 0 on agreement, 1 listing every mismatch (or naming the
unsupported config). Only the standard library and torch (Debian's python3-torch 1.13).
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

DTYPES = {"F32": torch.float32, "F64": torch.float64}
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
AUX_COEF_DEFAULT = {"mixtral": 0.001, "qwen2_moe": 0.001, "qwen3_moe": 0.001, "olmoe": 0.01}


class Unsupported(Exception):
    pass


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


class Model:
    """The config read once, with the families' defaults and the parameter names and shapes they imply."""

    def __init__(self, cfg):
        mt = cfg.get("model_type")
        if mt not in FAMILIES:
            raise Unsupported(f"model_type {mt!r} (expected one of {FAMILIES})")
        self.mt = mt
        self.L, self.C = cfg["num_hidden_layers"], cfg["hidden_size"]
        self.NH, self.NKV = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        self.V = cfg["vocab_size"]
        if mt == "qwen3_moe":
            self.D = cfg["head_dim"]
        else:
            self.D = cfg.get("head_dim") or self.C // self.NH
            if mt != "mixtral" and self.D != self.C // self.NH:
                raise Unsupported(f"{mt} with head_dim {self.D} != hidden_size / num_attention_heads")
        self.eps, self.theta = cfg["rms_norm_eps"], cfg["rope_theta"]
        if cfg.get("rope_scaling"):
            raise Unsupported(f"rope_scaling {cfg['rope_scaling']}")
        self.window = cfg.get("sliding_window") if mt == "mixtral" else None
        if mt in ("qwen2_moe", "qwen3_moe") and cfg.get("use_sliding_window"):
            raise Unsupported("use_sliding_window")
        if mt == "olmoe" and cfg.get("clip_qkv") is not None:
            raise Unsupported(f"clip_qkv {cfg['clip_qkv']}")
        if mt == "mixtral" and cfg.get("router_jitter_noise", 0.0):
            raise Unsupported(f"router_jitter_noise {cfg['router_jitter_noise']} (must be 0)")
        if mt == "qwen3_moe" and cfg.get("attention_bias"):
            raise Unsupported("qwen3_moe with attention_bias")
        self.qkv_bias = mt == "qwen2_moe" or (mt == "olmoe" and bool(cfg.get("attention_bias", False)))
        self.o_bias = mt == "olmoe" and bool(cfg.get("attention_bias", False))
        self.head_qk_norm = mt == "qwen3_moe"
        self.whole_qk_norm = mt == "olmoe"
        self.tied = bool(cfg.get("tie_word_embeddings", False))

        self.E = cfg["num_local_experts"] if mt == "mixtral" else cfg["num_experts"]
        self.K = cfg["num_experts_per_tok"]
        self.I = cfg["intermediate_size"] if mt in ("mixtral", "olmoe") else cfg["moe_intermediate_size"]
        self.dense_I = cfg.get("intermediate_size")
        self.sigmoid = cfg.get("scoring_func", "softmax") == "sigmoid"
        if cfg.get("scoring_func", "softmax") not in ("softmax", "sigmoid"):
            raise Unsupported(f"scoring_func {cfg['scoring_func']}")
        self.norm = True if mt == "mixtral" else bool(cfg.get("norm_topk_prob", False))
        self.scale = float(cfg.get("routed_scaling_factor", 1.0) or 1.0)
        self.n_group = cfg.get("n_group") or 1
        self.topk_group = cfg.get("topk_group") or self.n_group
        self.noaux = cfg.get("topk_method") == "noaux_tc"
        if self.n_group > 1:
            if self.E % self.n_group:
                raise Unsupported(f"{self.E} experts in {self.n_group} groups")
            if self.noaux and self.E // self.n_group < 2:
                raise Unsupported("noaux_tc group scores need 2 experts a group")
            if self.K > self.topk_group * (self.E // self.n_group):
                raise Unsupported("top_k larger than the kept groups' experts")
        self.capacity_factor = float(cfg.get("capacity_factor") or 0.0)
        self.min_capacity = int(cfg.get("min_capacity", 4))
        self.shared_I = (cfg.get("shared_expert_intermediate_size") or 0) if mt == "qwen2_moe" else 0
        n_shared = cfg.get("n_shared_experts") or 0
        self.ds_shared_I = n_shared * self.I if n_shared > 0 else 0
        self.output_router_logits = bool(cfg.get("output_router_logits", False))
        self.aux_coef = cfg.get("router_aux_loss_coef", AUX_COEF_DEFAULT[mt])
        if mt in ("qwen2_moe", "qwen3_moe"):
            only, step, first_dense = cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step", 1) or 1, cfg.get("first_k_dense_replace") or 0
            self.sparse = [i for i in range(self.L) if i not in only and self.E > 0 and (i + 1) % step == 0 and i >= first_dense]
        else:
            self.sparse = list(range(self.L))
        self.buffers = {f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in self.sparse} if self.noaux else set()

    def shapes(self):
        C, D, NH, NKV, I = self.C, self.D, self.NH, self.NKV, self.I
        s = {"model.embed_tokens.weight": (self.V, C), "model.norm.weight": (C,)}
        if not self.tied:
            s["lm_head.weight"] = (self.V, C)
        for i in range(self.L):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = (C,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            for n, rows in (("q", NH * D), ("k", NKV * D), ("v", NKV * D)):
                s[p + f"self_attn.{n}_proj.weight"] = (rows, C)
                if self.qkv_bias:
                    s[p + f"self_attn.{n}_proj.bias"] = (rows,)
            s[p + "self_attn.o_proj.weight"] = (C, NH * D)
            if self.o_bias:
                s[p + "self_attn.o_proj.bias"] = (C,)
            if self.head_qk_norm:
                s[p + "self_attn.q_norm.weight"] = s[p + "self_attn.k_norm.weight"] = (D,)
            if self.whole_qk_norm:
                s[p + "self_attn.q_norm.weight"], s[p + "self_attn.k_norm.weight"] = (NH * D,), (NKV * D,)

            def swiglu(prefix, width, names=("gate_proj", "up_proj", "down_proj")):
                s[f"{prefix}.{names[0]}.weight"] = s[f"{prefix}.{names[1]}.weight"] = (width, C)
                s[f"{prefix}.{names[2]}.weight"] = (C, width)

            if i not in self.sparse:
                swiglu(p + "mlp", self.dense_I)
            elif self.mt == "mixtral":
                s[p + "block_sparse_moe.gate.weight"] = (self.E, C)
                for e in range(self.E):
                    swiglu(p + f"block_sparse_moe.experts.{e}", I, ("w1", "w3", "w2"))
            else:
                s[p + "mlp.gate.weight"] = (self.E, C)
                if self.noaux:
                    s[p + "mlp.gate.e_score_correction_bias"] = (self.E,)
                for e in range(self.E):
                    swiglu(p + f"mlp.experts.{e}", I)
                if self.shared_I > 0:
                    swiglu(p + "mlp.shared_expert", self.shared_I)
                    s[p + "mlp.shared_expert_gate.weight"] = (1, C)
                if self.ds_shared_I > 0:
                    swiglu(p + "mlp.shared_experts", self.ds_shared_I)
        return s


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):  # x (B, H, T, D)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


def lin(w, h, name):
    y = h @ w[name + ".weight"].t()
    return y + w[name + ".bias"] if name + ".bias" in w else y


def swiglu(w, h, prefix, names=("gate_proj", "up_proj", "down_proj")):
    g, u, d = (f"{prefix}.{n}" for n in names)
    return lin(w, F.silu(lin(w, h, g)) * lin(w, h, u), d)


def route(m, logits, bias):
    """The experts each token chooses (N, K, best first) and their weights (N, K); the smallest gap between the
    last kept and the first dropped group or expert choice score."""
    scores = torch.sigmoid(logits) if m.sigmoid else F.softmax(logits, dim=-1)
    choice = scores.detach()
    if bias is not None:
        choice = choice + bias.detach()
    N = choice.shape[0]
    gap = float("inf")
    if m.n_group > 1:
        g = choice.view(N, m.n_group, m.E // m.n_group)
        group_score = g.topk(2, dim=-1).values.sum(-1) if m.noaux else g.max(dim=-1).values
        ranked = group_score.topk(min(m.topk_group + 1, m.n_group), dim=-1)
        if m.topk_group < m.n_group:
            gap = (ranked.values[:, m.topk_group - 1] - ranked.values[:, m.topk_group]).min().item()
        keep = torch.zeros(N, m.n_group, dtype=torch.bool)
        keep.scatter_(1, ranked.indices[:, : m.topk_group], True)
        keep = keep.repeat_interleave(m.E // m.n_group, dim=1)
        choice = choice.masked_fill(~keep, 0.0 if m.noaux else float("-inf"))
    ranked = choice.topk(min(m.K + 1, m.E), dim=-1)
    idx = ranked.indices[:, : m.K]
    if m.K < m.E:
        gap = min(gap, (ranked.values[:, m.K - 1] - ranked.values[:, m.K]).min().item())
    weights = scores.gather(1, idx)
    if m.norm:
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if m.sigmoid else 0.0))
    return idx, weights * m.scale, gap


def capacity_keep(m, idx):
    """DeepSpeed's capacity: which of the (N, K) assignments survive."""
    N = idx.shape[0]
    keep = torch.ones_like(idx, dtype=torch.bool)
    if m.capacity_factor <= 0:
        return keep, 0
    cap = max(m.min_capacity, math.ceil(m.K * N * m.capacity_factor / m.E))
    order = idx.t().reshape(-1)  # (choice rank, token): every token's first choice before any second
    position = torch.cumsum(F.one_hot(order, m.E), dim=0).gather(1, order[:, None])[:, 0]  # 1-based slot in its expert
    keep = (position <= cap).view(m.K, N).t()
    return keep, int((~keep).sum())


def moe(w, m, p, h, stats):
    """One sparse feed-forward over h (N, C); returns its output and the router logits."""
    base = p + ("block_sparse_moe." if m.mt == "mixtral" else "mlp.")
    logits = h @ w[base + "gate.weight"].t()
    idx, weights, gap = route(m, logits, w.get(base + "gate.e_score_correction_bias") if m.noaux else None)
    keep, dropped = capacity_keep(m, idx)
    stats["gap"] = min(stats["gap"], gap)
    stats["dropped"] += dropped
    stats["choices"].append(idx)
    out = torch.zeros_like(h)
    names = ("w1", "w3", "w2") if m.mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for e in range(m.E):
        tok, slot = ((idx == e) & keep).nonzero(as_tuple=True)
        y = swiglu(w, h[tok], f"{base}experts.{e}", names)  # also for no token, so that the gradient is 0, not None
        out = out.index_add(0, tok, y * weights[tok, slot][:, None])
    if m.shared_I > 0:
        out = out + torch.sigmoid(h @ w[base + "shared_expert_gate.weight"].t()) * swiglu(w, h, base + "shared_expert")
    if m.ds_shared_I > 0:
        out = out + swiglu(w, h, base + "shared_experts")
    return out, logits


def load_balancing(m, router_logits):
    p = F.softmax(torch.cat(router_logits, dim=0), dim=-1)
    selected = p.topk(m.K, dim=-1).indices
    f = F.one_hot(selected, m.E).to(p.dtype).mean(0)  # (K, E)
    P = p.mean(0)  # (E,)
    return m.E * (f * P[None, :]).sum()


def forward(w, m, tokens, targets, stats=None):
    stats = stats if stats is not None else {}
    stats.update(gap=float("inf"), dropped=0, choices=[])
    L, NH, NKV, D, eps = m.L, m.NH, m.NKV, m.D, m.eps
    B, T = tokens.shape
    G = NH // NKV
    inv_freq = torch.tensor([m.theta ** (-(2.0 * j) / D) for j in range(D // 2)])
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos(), ang.sin()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))  # key j visible to query i: j <= i
    if m.window is not None:  # and j > i - window
        mask &= torch.arange(T)[None, :] > torch.arange(T)[:, None] - m.window
    x = w["model.embed_tokens.weight"][tokens]
    router_logits = []
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = (lin(w, h, p + f"self_attn.{n}_proj") for n in ("q", "k", "v"))
        if m.whole_qk_norm:  # OLMoE: over the whole projection, before the heads
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.view(B, T, NH, D), k.view(B, T, NKV, D), v.view(B, T, NKV, D)
        if m.head_qk_norm:  # Qwen3: each head
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k[:, [hh // G for hh in range(NH)]]  # the KV head of each query head
        v = v[:, [hh // G for hh in range(NH)]]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * D)
        x = x + lin(w, y, p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if i in m.sparse:
            out, logits = moe(w, m, p, h.reshape(B * T, -1), stats)
            router_logits.append(logits)
            x = x + out.view(B, T, -1)
        else:
            x = x + swiglu(w, h, p + "mlp")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if m.tied else w["lm_head.weight"]
    logits = x @ head.t()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
    aux = load_balancing(m, router_logits) if router_logits else None
    if m.output_router_logits and aux is not None:
        loss = loss + m.aux_coef * aux
    return loss, logits, aux


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
    try:
        m = Model(cfg)
    except (Unsupported, KeyError) as e:
        print(f"moe_vs_pytorch: unsupported config: {e}")
        print(f"MISMATCH unsupported config: {e}")
        return 1
    w = {k: v.requires_grad_(k not in m.buffers) for k, v in read_safetensors(f"{folder}/weights.safetensors").items()}
    # A model without a score-correction bias (dstrain has none) routes as with a zero one.
    for b in m.buffers:
        if b not in w:
            w[b] = torch.zeros(m.E)
    ours_grads = read_safetensors(f"{folder}/grads.safetensors")
    out = read_safetensors(f"{folder}/outputs.safetensors")
    bad = []
    shapes = m.shapes()
    if set(shapes) != set(w):
        bad.append(f"weight names differ from the config's: missing {sorted(set(shapes) - set(w))}, unexpected {sorted(set(w) - set(shapes))}")
    for name in set(shapes) & set(w):
        if tuple(w[name].shape) != tuple(shapes[name]):
            bad.append(f"{name}: weight shape {tuple(w[name].shape)}, the config says {tuple(shapes[name])}")
    if bad:
        for b in bad:
            print("MISMATCH", b)
        return 1
    tokens = out["tokens"].round().long()
    targets = out["targets"].round().long()
    stats = {}
    loss, logits, aux = forward(w, m, tokens, targets, stats)
    loss.backward()
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
    if "aux_loss" in out:
        if aux is None:
            bad.append("aux_loss given, but the model has no sparse layer")
        elif abs(out["aux_loss"].item() - aux.item()) > 1e-5 * abs(aux.item()):
            bad.append(f"aux_loss: dstrain {out['aux_loss'].item():.9g} vs torch {aux.item():.9g}")
    trainable = set(w) - m.buffers
    if set(ours_grads) != trainable:
        bad.append(f"gradient names differ: missing {sorted(trainable - set(ours_grads))}, unexpected {sorted(set(ours_grads) - trainable)}")
    for name, g in ours_grads.items():
        if name not in trainable:
            continue
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
        # The weights again, trained with torch.optim.AdamW: decay on the matrices and embeddings, none on
        # norms and biases (dstrain's ParamSpec::weight_decay); the buffer e_score_correction_bias stays.
        w = {k: v.detach().clone().requires_grad_(k not in m.buffers) for k, v in read_safetensors(f"{folder}/weights.safetensors").items()}
        params = {k: v for k, v in w.items() if k not in m.buffers}
        decay = [v for k, v in params.items() if k.endswith(".weight") and "norm" not in k]
        no_decay = [v for k, v in params.items() if not (k.endswith(".weight") and "norm" not in k)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": train["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"])
        losses = []
        for _ in train["losses"]:
            opt.zero_grad()
            l, _, _ = forward(w, m, tokens, targets)
            losses.append(l.item())
            l.backward()
            opt.step()
            steps += 1
        # A loss's fp32 rounding is relative to the size of its terms (about the first step's loss), not to
        # a loss that training has brought near 0 (as llama_vs_pytorch.py).
        scale = max(abs(losses[0]), 1.0)
        for i, (a, b) in enumerate(zip(train["losses"], losses)):
            if abs(a - b) > 1e-5 * max(abs(b), scale):
                bad.append(f"training step {i + 1}: loss dstrain {a:.9g} vs torch {b:.9g}")
        trained = read_safetensors(f"{folder}/trained.safetensors")
        for name, t in trained.items():
            if name not in w:
                bad.append(f"trained {name}: not a weight")
                continue
            compare(f"trained {name}", t, w[name].detach(), 1e-4, 1e-6, bad)
    logit_diff = f"{(got_logits - logits.detach()).abs().max():.2e}" if got_logits.shape == logits.shape else "(shape differs)"
    aux_text = f"aux dstrain {out['aux_loss'].item():.7f} torch {aux.item():.7f}" if "aux_loss" in out and aux is not None else \
        f"aux torch {aux.item():.7f}" if aux is not None else "no aux"
    print(f"moe_vs_pytorch: {m.mt} L={m.L} C={m.C} H={m.NH} KV={m.NKV} D={m.D} E={m.E} top_k={m.K} I={m.I} sparse={m.sparse} "
          f"{'sigmoid' if m.sigmoid else 'softmax'} groups={m.n_group}/{m.topk_group}{' noaux_tc' if m.noaux else ''} "
          f"norm={m.norm} scale={m.scale} shared={m.shared_I or m.ds_shared_I} capacity_factor={m.capacity_factor} "
          f"dropped={stats['dropped']} tied={m.tied} B,T={tuple(tokens.shape)} loss dstrain {out['loss'].item():.7f} "
          f"torch {loss.item():.7f}; {aux_text}; max |logit diff| {logit_diff}; "
          f"smallest choice gap {stats['gap']:.2e}{' (a tie decided a choice: arbitrary)' if stats['gap'] <= 0 else ''}; {len(ours_grads)} gradient tensors; {steps} AdamW steps")
    for b in bad:
        print("MISMATCH", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
