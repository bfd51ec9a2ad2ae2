"""Checks moe_vs_pytorch.py without dstrain: python3 tests/integration/moe_reference_selftest.py

For tiny random models of each kind moe_vs_pytorch.py reads (mixtral; qwen2_moe with a shared expert,
decoder_sparse_step 2 and an mlp_only layer; qwen3_moe; olmoe with attention biases; a DeepSeek-routed
qwen3_moe: sigmoid scores, 4 groups keeping 2, noaux_tc correction bias, routed_scaling_factor 2.5, a shared
expert and a first dense layer, trained 2 AdamW steps; a qwen3_moe with DeepSpeed capacity 1.0 that drops
assignments and group-limited greedy routing) this script writes the folder a C++ test would write, with the
logits, losses, gradients and trained weights of a second implementation written here in another form
(per-position rotation matrices for RoPE, attention head by head, routing, capacity and the auxiliary loss
token by token in Python, a hand-written AdamW), all float64 from weights rounded to float32. It then checks
that moe_vs_pytorch.py accepts each folder (exit 0) and rejects perturbed copies (a gradient, a logit, the
aux loss, a trained weight, a gradient for the e_score_correction_bias buffer, router_jitter_noise) with
exit 1, that the reference's router gradients agree with central finite differences (eps small enough
that no expert choice changes), and that its routing agrees with a token-by-token one on 1000 random tokens
a rule, with correction biases that reach noaux_tc's zeroed groups. Exit 0 when every check passes. Only
the standard library and torch.
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "moe_vs_pytorch.py")

# ---------------------------------------------------------------------------------------------- configs

BASE = {"vocab_size": 32, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "num_experts_per_tok": 2, "tie_word_embeddings": False}

CASES = {
    "mixtral": dict(BASE, model_type="mixtral", num_hidden_layers=2, head_dim=8, num_local_experts=6, intermediate_size=12,
                    sliding_window=4, rms_norm_eps=1e-5, output_router_logits=True, router_aux_loss_coef=0.02,
                    router_jitter_noise=0.0),
    "qwen2_moe": dict(BASE, model_type="qwen2_moe", num_hidden_layers=6, num_experts=8, moe_intermediate_size=8,
                      intermediate_size=24, shared_expert_intermediate_size=12, decoder_sparse_step=2, mlp_only_layers=[3],
                      norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.05, tie_word_embeddings=True),
    "qwen3_moe": dict(BASE, model_type="qwen3_moe", num_hidden_layers=2, head_dim=8, num_experts=8, moe_intermediate_size=8,
                      intermediate_size=24, norm_topk_prob=True, output_router_logits=False),
    "olmoe": dict(BASE, model_type="olmoe", num_hidden_layers=2, num_experts=8, intermediate_size=8, attention_bias=True,
                  clip_qkv=None, rms_norm_eps=1e-5, norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.01),
    "deepseek": dict(BASE, model_type="qwen3_moe", num_hidden_layers=3, head_dim=4, num_experts=8, moe_intermediate_size=8,
                     intermediate_size=20, num_experts_per_tok=3, scoring_func="sigmoid", n_group=4, topk_group=2,
                     topk_method="noaux_tc", routed_scaling_factor=2.5, n_shared_experts=1, first_k_dense_replace=1,
                     norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.01),
    "capacity": dict(BASE, model_type="qwen3_moe", num_hidden_layers=2, head_dim=4, num_experts=8, moe_intermediate_size=8,
                     intermediate_size=20, capacity_factor=1.0, min_capacity=2, n_group=2, topk_group=1,
                     topk_method="group_limited_greedy", norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.001),
}
TRAIN = {"deepseek": {"lr": 0.01, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "steps": 2}}
B, T = 2, 6


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def sparse_layers(cfg):
    L = cfg["num_hidden_layers"]
    if cfg["model_type"] in ("mixtral", "olmoe"):
        return list(range(L))
    step, only, first = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers", []), cfg.get("first_k_dense_replace", 0)
    return [i for i in range(L) if (i + 1) % step == 0 and i not in only and i >= first]


def make_weights(cfg, gen):
    """Random weights (float32 values held in float64), with the Hugging Face names of cfg."""
    mt, C, V, L = cfg["model_type"], cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    NH, NKV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    I = cfg["intermediate_size"] if mt in ("mixtral", "olmoe") else cfg["moe_intermediate_size"]
    w = {}

    def mat(name, rows, cols, scale=1.0):
        w[name] = torch.randn(rows, cols, generator=gen) * scale / math.sqrt(cols)

    def vec(name, n, mean=0.0, scale=0.1):
        w[name] = mean + scale * torch.randn(n, generator=gen)

    def mlp(prefix, width, names=("gate_proj", "up_proj", "down_proj")):
        mat(f"{prefix}.{names[0]}.weight", width, C)
        mat(f"{prefix}.{names[1]}.weight", width, C)
        mat(f"{prefix}.{names[2]}.weight", C, width)

    w["model.embed_tokens.weight"] = torch.randn(V, C, generator=gen)
    vec("model.norm.weight", C, 1.0)
    if not cfg.get("tie_word_embeddings"):
        mat("lm_head.weight", V, C)
    sparse = sparse_layers(cfg)
    for i in range(L):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", C, 1.0)
        vec(p + "post_attention_layernorm.weight", C, 1.0)
        mat(p + "self_attn.q_proj.weight", NH * D, C)
        mat(p + "self_attn.k_proj.weight", NKV * D, C)
        mat(p + "self_attn.v_proj.weight", NKV * D, C)
        mat(p + "self_attn.o_proj.weight", C, NH * D)
        if mt == "qwen2_moe" or (mt == "olmoe" and cfg.get("attention_bias")):
            vec(p + "self_attn.q_proj.bias", NH * D)
            vec(p + "self_attn.k_proj.bias", NKV * D)
            vec(p + "self_attn.v_proj.bias", NKV * D)
        if mt == "olmoe" and cfg.get("attention_bias"):
            vec(p + "self_attn.o_proj.bias", C)
        if mt == "qwen3_moe":
            vec(p + "self_attn.q_norm.weight", D, 1.0)
            vec(p + "self_attn.k_norm.weight", D, 1.0)
        if mt == "olmoe":
            vec(p + "self_attn.q_norm.weight", NH * D, 1.0)
            vec(p + "self_attn.k_norm.weight", NKV * D, 1.0)
        if i not in sparse:
            mlp(p + "mlp", cfg["intermediate_size"])
            continue
        moe = p + ("block_sparse_moe" if mt == "mixtral" else "mlp")
        mat(moe + ".gate.weight", E, C, 2.0)  # routing scores spread out, far from ties
        for e in range(E):
            mlp(f"{moe}.experts.{e}", I, ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj"))
        if cfg.get("topk_method") == "noaux_tc":
            vec(moe + ".gate.e_score_correction_bias", E, 0.0, 0.2)
        if mt == "qwen2_moe" and cfg.get("shared_expert_intermediate_size", 0) > 0:
            mlp(moe + ".shared_expert", cfg["shared_expert_intermediate_size"])
            mat(moe + ".shared_expert_gate.weight", 1, C)
        if cfg.get("n_shared_experts", 0) > 0:
            mlp(moe + ".shared_experts", cfg["n_shared_experts"] * I)
    return {k: v.float().double() for k, v in w.items()}


# ------------------------------------------------------------------ the second implementation, in another form


def norm(x, wt, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wt


def rotations(T, D, theta):
    """R[t] (D, D): rotates the pair (j, j + D/2) by the angle t theta^(-2j/D)."""
    R = torch.zeros(T, D, D)
    half = D // 2
    for t in range(T):
        for j in range(half):
            a = t * theta ** (-2.0 * j / D)
            c, s = math.cos(a), math.sin(a)
            R[t, j, j], R[t, j, j + half], R[t, j + half, j], R[t, j + half, j + half] = c, -s, s, c
    return R


def silu_mlp(w, x, prefix, names):
    g, u, d = (w[f"{prefix}.{n}.weight"] for n in names)
    a = x @ g.t()
    return (a * torch.sigmoid(a) * (x @ u.t())) @ d.t()


def route_token(cfg, scores, bias):
    """One token's chosen experts (best first) from its scores (a list of floats), DeepSeek-V3's rules in
    Python, and the choice scores they were chosen by (those of dropped groups 0 or -inf)."""
    E, K = len(scores), cfg["num_experts_per_tok"]
    noaux = cfg.get("topk_method") == "noaux_tc"
    choice = [s + (bias[e] if bias is not None else 0.0) for e, s in enumerate(scores)]
    groups = cfg.get("n_group") or 1
    if groups > 1:
        size = E // groups
        gscore = []
        for g in range(groups):
            members = sorted(choice[g * size : (g + 1) * size], reverse=True)
            gscore.append(members[0] + members[1] if noaux else members[0])
        kept = sorted(range(groups), key=lambda g: -gscore[g])[: cfg["topk_group"]]
        choice = [c if e // size in kept else (0.0 if noaux else -math.inf) for e, c in enumerate(choice)]
    return sorted(range(E), key=lambda e: -choice[e])[:K], choice


def moe_layer(cfg, w, prefix, h, info):
    mt, E, K = cfg["model_type"], cfg.get("num_local_experts", cfg.get("num_experts")), cfg["num_experts_per_tok"]
    N = h.shape[0]
    logits = h @ w[prefix + ".gate.weight"].t()
    sigmoid = cfg.get("scoring_func") == "sigmoid"
    scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    bias = w[prefix + ".gate.e_score_correction_bias"].tolist() if cfg.get("topk_method") == "noaux_tc" else None
    chosen = [route_token(cfg, scores[n].tolist(), bias)[0] for n in range(N)]
    keep = [[True] * K for _ in range(N)]
    if cfg.get("capacity_factor", 0) > 0:
        cap = max(cfg.get("min_capacity", 4), math.ceil(K * N * cfg["capacity_factor"] / E))
        used = [0] * E
        for r in range(K):
            for n in range(N):
                used[chosen[n][r]] += 1
                keep[n][r] = used[chosen[n][r]] <= cap
    info["dropped"] += sum(not k for row in keep for k in row)
    info["choices"].append(chosen)
    names = ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    rows = []
    for n in range(N):
        wts = [scores[n, e] for e in chosen[n]]
        if mt == "mixtral" or cfg.get("norm_topk_prob"):
            total = sum(wts) + (1e-20 if sigmoid else 0.0)
            wts = [x / total for x in wts]
        y = torch.zeros(h.shape[1])
        for r, e in enumerate(chosen[n]):
            if keep[n][r]:
                y = y + wts[r] * cfg.get("routed_scaling_factor", 1.0) * silu_mlp(w, h[n], f"{prefix}.experts.{e}", names)
        rows.append(y)
    out = torch.stack(rows)
    if mt == "qwen2_moe" and cfg.get("shared_expert_intermediate_size", 0) > 0:
        gate = torch.sigmoid(h @ w[prefix + ".shared_expert_gate.weight"][0])
        out = out + gate[:, None] * silu_mlp(w, h, prefix + ".shared_expert", ("gate_proj", "up_proj", "down_proj"))
    if cfg.get("n_shared_experts", 0) > 0:
        out = out + silu_mlp(w, h, prefix + ".shared_experts", ("gate_proj", "up_proj", "down_proj"))
    return out, logits


def aux_loss(cfg, all_logits):
    E, K = all_logits[0].shape[1], cfg["num_experts_per_tok"]
    p = torch.softmax(torch.cat(all_logits), dim=-1)
    rows = p.shape[0]
    counts = [[0] * E for _ in range(K)]
    for n in range(rows):
        for r, e in enumerate(sorted(range(E), key=lambda e: -p[n, e].item())[:K]):
            counts[r][e] += 1
    total = 0.0
    for e in range(E):
        f_e = sum(counts[r][e] for r in range(K)) / rows  # sum over ranks of the mean one-hot
        total = total + f_e * p[:, e].mean()
    return E * total


def model(cfg, w, tokens, targets, info=None):
    info = info if info is not None else {}
    info.update(dropped=0, choices=[])
    mt, L, C = cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"]
    NH, NKV, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg), cfg["rms_norm_eps"]
    Bn, Tn = tokens.shape
    R = rotations(Tn, D, cfg["rope_theta"])
    W = cfg.get("sliding_window") if mt == "mixtral" else None
    allowed = torch.tensor([[j <= i and (W is None or j > i - W) for j in range(Tn)] for i in range(Tn)])
    additive = torch.zeros(Tn, Tn).masked_fill(~allowed, -math.inf)
    sparse = sparse_layers(cfg)
    x = torch.stack([w["model.embed_tokens.weight"][tokens[b]] for b in range(Bn)])
    router = []

    def proj(h, name):
        y = h @ w[name + ".weight"].t()
        return y + w[name + ".bias"] if name + ".bias" in w else y

    for i in range(L):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = proj(h, p + "self_attn.q_proj"), proj(h, p + "self_attn.k_proj"), proj(h, p + "self_attn.v_proj")
        if mt == "olmoe":
            q, k = norm(q, w[p + "self_attn.q_norm.weight"], eps), norm(k, w[p + "self_attn.k_norm.weight"], eps)
        heads = []
        for hd in range(NH):
            kv = hd * NKV // NH
            qh, kh, vh = q[..., hd * D : (hd + 1) * D], k[..., kv * D : (kv + 1) * D], v[..., kv * D : (kv + 1) * D]
            if mt == "qwen3_moe":
                qh, kh = norm(qh, w[p + "self_attn.q_norm.weight"], eps), norm(kh, w[p + "self_attn.k_norm.weight"], eps)
            qh, kh = torch.einsum("tij,btj->bti", R, qh), torch.einsum("tij,btj->bti", R, kh)
            a = torch.softmax(torch.einsum("bid,bjd->bij", qh, kh) / math.sqrt(D) + additive, dim=-1)
            heads.append(torch.einsum("bij,bjd->bid", a, vh))
        x = x + proj(torch.cat(heads, dim=-1), p + "self_attn.o_proj")
        h = norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if i in sparse:
            out, lg = moe_layer(cfg, w, p + ("block_sparse_moe" if mt == "mixtral" else "mlp"), h.reshape(Bn * Tn, C), info)
            router.append(lg)
            x = x + out.reshape(Bn, Tn, C)
        else:
            x = x + silu_mlp(w, h, p + "mlp", ("gate_proj", "up_proj", "down_proj"))
    x = norm(x, w["model.norm.weight"], eps)
    logits = x @ (w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]).t()
    flat, tgt = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    terms = [torch.logsumexp(flat[n], 0) - flat[n, tgt[n]] for n in range(tgt.numel()) if tgt[n] != -1]
    loss = sum(terms) / len(terms)
    aux = aux_loss(cfg, router)
    if cfg.get("output_router_logits"):
        loss = loss + cfg["router_aux_loss_coef"] * aux
    return loss, logits, aux


# ------------------------------------------------------------------------------------------ the folders


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        values = t.detach().reshape(-1).tolist()
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def is_buffer(name):
    return name.endswith("e_score_correction_bias")


def decays(name):
    return name.endswith(".weight") and "norm" not in name


def write_case(folder, name, cfg, gen):
    os.makedirs(folder, exist_ok=True)
    weights = make_weights(cfg, gen)
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[0, -1] = targets[1, 2] = -1
    w = {k: v.clone().requires_grad_(not is_buffer(k)) for k, v in weights.items()}
    info = {}
    loss, logits, aux = model(cfg, w, tokens, targets, info)
    loss.backward()
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in w.items() if not is_buffer(k)}
    with open(f"{folder}/config.json", "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(f"{folder}/weights.safetensors", weights)
    write_safetensors(f"{folder}/grads.safetensors", grads)
    write_safetensors(f"{folder}/outputs.safetensors", {"tokens": tokens.double(), "targets": targets.double(), "logits": logits,
                                                         "loss": loss.reshape(1), "aux_loss": aux.reshape(1)})
    if name in TRAIN:  # AdamW by hand: decoupled decay, bias-corrected moments
        tr = TRAIN[name]
        w = {k: v.clone().requires_grad_(not is_buffer(k)) for k, v in weights.items()}
        m1 = {k: torch.zeros_like(v) for k, v in w.items()}
        m2 = {k: torch.zeros_like(v) for k, v in w.items()}
        losses = []
        for step in range(1, tr["steps"] + 1):
            l, _, _ = model(cfg, w, tokens, targets)
            losses.append(l.item())
            for v in w.values():
                v.grad = None
            l.backward()
            with torch.no_grad():
                for k, v in w.items():
                    if is_buffer(k):
                        continue
                    g = v.grad if v.grad is not None else torch.zeros_like(v)
                    if decays(k):
                        v.mul_(1 - tr["lr"] * tr["weight_decay"])
                    m1[k] = tr["beta1"] * m1[k] + (1 - tr["beta1"]) * g
                    m2[k] = tr["beta2"] * m2[k] + (1 - tr["beta2"]) * g * g
                    mhat, vhat = m1[k] / (1 - tr["beta1"] ** step), m2[k] / (1 - tr["beta2"] ** step)
                    v.sub_(tr["lr"] * mhat / (vhat.sqrt() + tr["eps"]))
        with open(f"{folder}/train.json", "w") as f:
            json.dump({k: tr[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay")} | {"losses": losses}, f)
        write_safetensors(f"{folder}/trained.safetensors", {k: v.detach() for k, v in w.items()})
    return info


# ------------------------------------------------------------------------------------------ the checks


def load_reference():
    spec = importlib.util.spec_from_file_location("moe_vs_pytorch", REFERENCE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def finite_differences(ref, folder, failures):
    """The reference's router gradients (every entry of every layer's gate) against central differences."""
    with open(f"{folder}/config.json") as f:
        cfg = json.load(f)
    m = ref.Model(cfg)
    base = ref.read_safetensors(f"{folder}/weights.safetensors")
    out = ref.read_safetensors(f"{folder}/outputs.safetensors")
    tokens, targets = out["tokens"].round().long(), out["targets"].round().long()
    gates = [k for k in base if k.endswith(".gate.weight")]
    w = {k: v.clone().requires_grad_(k in gates) for k, v in base.items()}
    stats = {}
    loss, _, _ = ref.forward(w, m, tokens, targets, stats)
    loss.backward()
    choices = [c.clone() for c in stats["choices"]]
    eps, worst = 1e-6, 0.0
    with torch.no_grad():
        for name in gates:
            ag = w[name].grad
            fd = torch.zeros_like(ag)
            for idx in range(ag.numel()):
                vals = []
                for sign in (1, -1):
                    wp = dict(base)
                    wp[name] = base[name].clone()
                    wp[name].view(-1)[idx] += sign * eps
                    s = {}
                    l, _, _ = ref.forward(wp, m, tokens, targets, s)
                    if any(not torch.equal(a, b) for a, b in zip(s["choices"], choices)):
                        failures.append(f"finite differences {name}[{idx}]: eps {eps} changed an expert choice")
                    vals.append(l.item())
                fd.view(-1)[idx] = (vals[0] - vals[1]) / (2 * eps)
            err = (fd - ag).abs().max().item()
            worst = max(worst, err / ag.abs().max().item())
            if err > 1e-6 * ag.abs().max().item() + 1e-10:
                failures.append(f"finite differences {folder}: {name} max |fd - autograd| {err:.3e}, max |autograd| {ag.abs().max():.3e}")
    return worst


def routing_cross_check(ref, failures):
    """The reference's route() against route_token() on many random tokens, with correction biases large
    enough that kept groups hold negative choice scores: noaux_tc then picks experts of dropped groups (whose
    choices are 0, not -inf), which the model cases above do not reach. Those picks tie (every expert of a
    dropped group scores 0) and either side may break the tie its own way: the chosen choice scores must
    agree, and the weights must be those of the experts the reference chose."""
    gen = torch.Generator().manual_seed(99)
    for extra in ({"scoring_func": "sigmoid", "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "num_experts_per_tok": 3,
                   "norm_topk_prob": True, "routed_scaling_factor": 2.5},
                  {"n_group": 2, "topk_group": 1, "topk_method": "group_limited_greedy", "norm_topk_prob": False},
                  {"num_experts_per_tok": 3, "norm_topk_prob": True}):
        cfg = dict(CASES["qwen3_moe"], **extra)
        m = ref.Model(cfg)
        logits = 2 * torch.randn(1000, 8, generator=gen)
        bias = (0.5 * torch.randn(8, generator=gen) - 0.5) if m.noaux else None
        idx, weights, _ = ref.route(m, logits, bias)
        sigmoid = cfg.get("scoring_func") == "sigmoid"
        scores = (torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)).tolist()
        idx, weights = idx.tolist(), weights.tolist()
        bias = bias.tolist() if bias is not None else None
        from_dropped = 0
        for n in range(len(scores)):
            chosen, choice = route_token(cfg, scores[n], bias)
            picked = idx[n]
            wts = [scores[n][e] for e in picked]
            if cfg.get("norm_topk_prob"):
                total = sum(wts) + (1e-20 if sigmoid else 0.0)
                wts = [x / total for x in wts]
            wts = [x * cfg.get("routed_scaling_factor", 1.0) for x in wts]
            if [choice[e] for e in picked] != [choice[e] for e in chosen] or max(abs(a - b) for a, b in zip(weights[n], wts)) > 1e-12:
                failures.append(f"routing {extra}: token {n}: reference {picked} {weights[n]}, here {chosen} {wts} (choices {choice})")
                break
            from_dropped += any(choice[e] == 0.0 for e in chosen) if m.noaux else 0
        if m.noaux and from_dropped == 0:
            failures.append("routing: no token chose an expert of a dropped group; the noaux_tc masking is untested")
        print(f"routing {cfg.get('topk_method', 'plain')}: {len(scores)} tokens agree"
              + (f", {from_dropped} of them chose experts of a dropped group (choice 0)" if m.noaux else ""))


def run_reference(folder):
    return subprocess.Popen([sys.executable, REFERENCE, folder], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def perturb(src, dst, file, edit):
    shutil.copytree(src, dst)
    if file == "config.json":
        with open(f"{dst}/config.json") as f:
            cfg = json.load(f)
        edit(cfg)
        with open(f"{dst}/config.json", "w") as f:
            json.dump(cfg, f)
        return
    ref = load_reference.cached
    tensors = ref.read_safetensors(f"{dst}/{file}")
    edit(tensors)
    write_safetensors(f"{dst}/{file}", tensors)


def bump_max(tensors, name, rel):
    t = tensors[name]
    t.view(-1)[int(t.abs().argmax())] += rel * t.abs().max()


def main():
    torch.set_num_threads(1)
    load_reference.cached = load_reference()
    root = tempfile.mkdtemp(prefix="moe_reference_selftest.")
    failures = []
    try:
        gen = torch.Generator().manual_seed(1234)
        dropped = {}
        for name, cfg in CASES.items():
            info = write_case(f"{root}/{name}", name, cfg, gen)
            dropped[name] = info["dropped"]
        if dropped["capacity"] == 0:
            failures.append("the capacity case dropped no assignment: it tests nothing")
        if any(v for k, v in dropped.items() if k != "capacity"):
            failures.append(f"assignments dropped without capacity_factor: {dropped}")

        router_of = {"mixtral": "model.layers.1.block_sparse_moe.gate.weight", "deepseek": "model.layers.2.mlp.gate.weight"}
        rejects = {}
        for case, router in router_of.items():
            rejects[f"{case}-grad"] = ("grads.safetensors", lambda t, r=router: bump_max(t, r, 1e-3))
            rejects[f"{case}-expert-grad"] = ("grads.safetensors", lambda t: bump_max(t, "model.layers.1.mlp.experts.3.up_proj.weight" if "model.layers.1.mlp.experts.3.up_proj.weight" in t
                                                                              else "model.layers.0.block_sparse_moe.experts.3.w3.weight", 1e-3))
            rejects[f"{case}-logits"] = ("outputs.safetensors", lambda t: t["logits"].view(-1).__setitem__(7, t["logits"].view(-1)[7] + 2e-3))
            rejects[f"{case}-aux"] = ("outputs.safetensors", lambda t: t["aux_loss"].mul_(1 + 1e-4))
        rejects["deepseek-trained"] = ("trained.safetensors", lambda t: bump_max(t, "model.layers.2.mlp.gate.weight", 1e-3))
        rejects["deepseek-buffer-grad"] = ("grads.safetensors", lambda t: t.__setitem__("model.layers.1.mlp.gate.e_score_correction_bias", torch.zeros(8)))
        rejects["mixtral-jitter"] = ("config.json", lambda c: c.__setitem__("router_jitter_noise", 0.01))
        # The accepted folders through the command line, two at a time, as a C++ test runs it; the rejected
        # ones through its main() in this process (a torch import each would cost seconds), but for one.
        runs = [(name, f"{root}/{name}", 0) for name in CASES]
        for name, (file, edit) in rejects.items():
            dst = f"{root}/reject-{name}"
            perturb(f"{root}/{name.split('-')[0]}", dst, file, edit)
            runs.append((name, dst, 1))
        subprocess_runs = [r for r in runs if r[2] == 0 or r[0] == "mixtral-logits"]
        active = [(name, folder, want, run_reference(folder)) for name, folder, want in subprocess_runs[:2]]
        pending = subprocess_runs[2:]
        for case in ("mixtral", "deepseek", "capacity"):
            try:
                worst = finite_differences(load_reference.cached, f"{root}/{case}", failures)
                print(f"finite differences {case}: router gradients within {worst:.1e} (relative to the largest)")
            except Exception as e:  # a broken reference: report it with the rest
                failures.append(f"finite differences {case}: {type(e).__name__}: {e}")
        try:
            routing_cross_check(load_reference.cached, failures)
        except Exception as e:
            failures.append(f"routing: {type(e).__name__}: {e}")
        results = []
        for name, folder, want in runs:
            if (name, folder, want) not in subprocess_runs:
                text = io.StringIO()
                with contextlib.redirect_stdout(text):
                    try:
                        got = load_reference.cached.main(folder)
                    except Exception as e:
                        got = f"{type(e).__name__}: {e}"
                results.append((name, want, got, text.getvalue(), "main()"))
        while active:
            name, folder, want, proc = active.pop(0)
            output, _ = proc.communicate()
            results.append((name, want, proc.returncode, output, "command line"))
            if pending:
                name, folder, want = pending.pop(0)
                active.append((name, folder, want, run_reference(folder)))
        for name, want, got, output, how in sorted(results, key=lambda r: (r[1], r[0])):
            summary = [line for line in output.splitlines() if line.startswith(("moe_vs_pytorch:", "MISMATCH"))]
            print(f"[{'accept' if want == 0 else 'reject'}] {name} ({how}): exit {got}" + "".join("\n    " + s for s in summary[:3]))
            if got != want:
                failures.append(f"{name}: moe_vs_pytorch.py exit {got}, expected {want}\n{output}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for f in failures:
        print("FAIL", f)
    print("moe_reference_selftest:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
