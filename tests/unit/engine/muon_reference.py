#!/usr/bin/env python3
"""The reference for tests/unit/engine/test_muon.cpp: DeepSpeed's Muon (MuonWithAuxAdam) written
out here from deepspeed/runtime/zero/muon/original_muon.py (muon_update,
zeropower_via_newtonschulz5, adam_update) and deepspeed/runtime/engine.py (the two param groups),
in float64 so that it is independent of the fp32 arithmetic under test. DeepSpeed runs the
Newton-Schulz iteration in bf16 on a GPU; the test compares with the exact iteration.

Input (CASES.json): a list of cases, each {"params": the resolved Muon params, "steps": [[grad of
tensor 0, grad of tensor 1, ...] per step], "tensors": [{"shape": [r, c], "muon": bool,
"scale_shape": [r, c] (the shape DeepSpeed sees), "decay": bool, "p0": [...]}]}.
Output (RESULT.json): per case, per tensor {"param": [...], "m": [...], "v": [...]} (m is the
momentum_buffer of a Muon matrix, exp_avg otherwise; v is exp_avg_sq, zero for Muon matrices).

Usage: muon_reference.py CASES.json RESULT.json   (exit 77: no torch)"""
import json, sys

try:
    import torch
except ImportError:
    sys.exit(77)


def zeropower_via_newtonschulz5(G, steps):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.clone()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def muon_update(grad, momentum, beta, scale_shape, ns_steps=5):
    # nesterov=True: DeepSpeed's callers never pass it.
    momentum.lerp_(grad, 1 - beta)
    update = grad.lerp(momentum, beta)
    update = zeropower_via_newtonschulz5(update, steps=ns_steps)
    update = update * max(1, scale_shape[0] / scale_shape[1]) ** 0.5
    return update


def adam_update(grad, buf1, buf2, step, betas, eps):
    buf1.lerp_(grad, 1 - betas[0])
    buf2.lerp_(grad.square(), 1 - betas[1])
    buf1c = buf1 / (1 - betas[0] ** step)
    buf2c = buf2 / (1 - betas[1] ** step)
    return buf1c / (buf2c.sqrt() + eps)


results = []
for case in json.load(open(sys.argv[1])):
    prm = case["params"]
    muon_lr, adam_lr = prm["muon_lr"], prm["adam_lr"]
    beta, wd = prm["momentum"], prm["weight_decay"]
    betas, eps = prm["betas"], prm["eps"]
    ts = case["tensors"]
    p = [torch.tensor(t["p0"], dtype=torch.float64).reshape(t["shape"]) for t in ts]
    m = [torch.zeros_like(x) for x in p]
    v = [torch.zeros_like(x) for x in p]
    for step, grads in enumerate(case["steps"], 1):
        for k, t in enumerate(ts):
            g = torch.tensor(grads[k], dtype=torch.float64).reshape(t["shape"])
            lam = wd if t["decay"] else 0.0
            if t["muon"]:
                u = muon_update(g, m[k], beta, t["scale_shape"])
                p[k].mul_(1 - muon_lr * lam)
                p[k].add_(u, alpha=-muon_lr)
            else:
                u = adam_update(g, m[k], v[k], step, betas, eps)
                p[k].mul_(1 - adam_lr * lam)
                p[k].add_(u, alpha=-adam_lr)
    results.append([{"param": p[k].flatten().tolist(), "m": m[k].flatten().tolist(), "v": v[k].flatten().tolist()} for k in range(len(ts))])
json.dump(results, open(sys.argv[2], "w"))
