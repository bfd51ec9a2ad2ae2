#!/usr/bin/env python3
"""The reference for tests/unit/engine/test_optimizer_rules.cpp: runs each case's optimizer steps
with PyTorch's own torch.optim class (Debian's python3-torch) and writes the parameters and the
per-element states (torch's state_dict names) after the last step.

Where the installed torch predates an option (NAdam / RAdam decoupled_weight_decay and maximize
arrived in torch 2.0) or a fix (NAdam's mu_product_next before 2.0), or the optimizer is DeepSpeed's own (Lion: FusedLion, a CUDA kernel),
the case runs an independent float64 implementation written here from the source it names.

Usage: torch_optimizer_reference.py CASES.json RESULT.json   (exit 77: no torch)"""
import inspect, json, sys

try:
    import torch
except ImportError:
    sys.exit(77)

cases = json.load(open(sys.argv[1]))
torch.set_default_dtype(torch.float32)


def lion_deepspeed(p, grads, params):
    # csrc/lion/multi_tensor_lion.cu (LionFunctor): c = b1 m + (1-b1) g; update = c > 0 ? -lr : lr;
    # p = p (1 - lr wd) + update; m = b2 m + (1-b2) g.
    lr = params.get("lr", 1e-3); b1, b2 = params.get("betas", [0.9, 0.999]); wd = params.get("weight_decay", 0.0)
    p = p.double(); m = torch.zeros_like(p)
    for g in grads:
        g = g.double()
        c = b1 * m + (1 - b1) * g
        p = p * (1 - lr * wd) + torch.where(c > 0, torch.full_like(p, -lr), torch.full_like(p, lr))
        m = b2 * m + (1 - b2) * g
    return p, {"exp_avg": m}


def nadam_torch2(p, grads, params):
    # torch 2.x torch/optim/nadam.py _single_tensor_nadam (decoupled_weight_decay, maximize).
    lr = params.get("lr", 2e-3); b1, b2 = params.get("betas", [0.9, 0.999]); eps = params.get("eps", 1e-8)
    wd = params.get("weight_decay", 0.0); psi = params.get("momentum_decay", 4e-3)
    dec = params.get("decoupled_weight_decay", False); maximize = params.get("maximize", False)
    p = p.double(); m = torch.zeros_like(p); v = torch.zeros_like(p); mu_product = 1.0
    for t, g in enumerate(grads, 1):
        g = g.double()
        if maximize: g = -g
        bc2 = 1 - b2 ** t
        if wd != 0:
            if dec: p = p * (1 - lr * wd)
            else: g = g + wd * p
        mu = b1 * (1. - 0.5 * (0.96 ** (t * psi)))
        mu_next = b1 * (1. - 0.5 * (0.96 ** ((t + 1) * psi)))
        mu_product *= mu
        m = m + (1 - b1) * (g - m)
        v = b2 * v + (1 - b2) * g * g
        denom = (v / bc2).sqrt() + eps
        p = p - lr * (1. - mu) / (1. - mu_product) * g / denom
        p = p - lr * mu_next / (1. - mu_product * mu_next) * m / denom
    return p, {"exp_avg": m, "exp_avg_sq": v}


def radam_torch2(p, grads, params):
    # torch 2.x torch/optim/radam.py _single_tensor_radam (decoupled_weight_decay, maximize).
    lr = params.get("lr", 1e-3); b1, b2 = params.get("betas", [0.9, 0.999]); eps = params.get("eps", 1e-8)
    wd = params.get("weight_decay", 0.0); dec = params.get("decoupled_weight_decay", False); maximize = params.get("maximize", False)
    p = p.double(); m = torch.zeros_like(p); v = torch.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.double()
        if maximize: g = -g
        if wd != 0:
            if dec: p = p * (1 - lr * wd)
            else: g = g + wd * p
        m = m + (1 - b1) * (g - m)
        v = b2 * v + (1 - b2) * g * g
        bc1 = 1 - b1 ** t; bc2 = 1 - b2 ** t
        mhat = m / bc1
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * t * (b2 ** t) / bc2
        if rho_t > 5.:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            p = p - mhat * lr * (bc2 ** 0.5) / (v.sqrt() + eps) * rect
        else:
            p = p - mhat * lr
    return p, {"exp_avg": m, "exp_avg_sq": v}


IMPLEMENTATIONS = {"Lion": lion_deepspeed}
TORCH_NAMES = {"adagrad": "Adagrad", "lion": "Lion"}
IMPL_ONLY = {"decoupled_weight_decay", "foreach", "fused", "capturable", "differentiable", "maximize"}

results = []
for case in cases:
    name = TORCH_NAMES.get(case["type"].lower(), case["type"])
    params = dict(case["params"])
    p0 = torch.tensor(case["p0"], dtype=torch.float32)
    grads = [torch.tensor(g, dtype=torch.float32) for g in case["grads"]]
    cls = getattr(torch.optim, name, None)
    accepted = set(inspect.signature(cls.__init__).parameters) if cls else set()
    # torch < 2.0's NAdam multiplied mu_product by mu twice in mu_product_next (fixed in 2.0, the
    # torch DeepSpeed 0.19 runs on): its fixed code is nadam_torch2.
    old_nadam = name == "NAdam" and int(torch.__version__.split(".")[0]) < 2
    own = name in IMPLEMENTATIONS or old_nadam or any(k not in accepted for k in params)
    if own:
        impl = IMPLEMENTATIONS.get(name) or {"NAdam": nadam_torch2, "RAdam": radam_torch2}[name]
        p, states = impl(p0, grads, params)
        out = {"params": p.tolist(), "states": {k: v.tolist() for k, v in states.items()}, "source": "independent"}
    else:
        p = p0.clone().requires_grad_(True)
        opt = cls([p], **params)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        st = opt.state_dict()["state"][0]
        states = {k: v.tolist() for k, v in st.items() if torch.is_tensor(v) and v.numel() == p.numel() and v.dim() > 0}
        out = {"params": p.detach().tolist(), "states": states, "source": "torch " + torch.__version__}
    results.append(out)
json.dump(results, open(sys.argv[2], "w"))
