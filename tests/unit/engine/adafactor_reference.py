#!/usr/bin/env python3
"""The reference for tests/unit/engine/test_adafactor.cpp: torch.optim.Adafactor's
_single_tensor_adafactor (torch >= 2.5, torch/optim/_adafactor.py) written out here in float64,
since the installed torch predates it. The HF orientation of a tensor does not matter (the
factored estimate is the same for a matrix and its transpose), so each tensor runs as given.

Input (CASES.json): a list of cases, each {"params": resolved Adafactor params, "steps": [[grad of
tensor 0, ...] per step], "tensors": [{"shape": [...], "decay": bool, "p0": [...]}]}.
Output (RESULT.json): per case, per tensor {"param": [...], "row_var": [...], "col_var": [...],
"variance": [...]} (the factors of a matrix, the variance of a vector; absent ones empty).

Usage: adafactor_reference.py CASES.json RESULT.json   (exit 77: no torch)"""
import json, sys

try:
    import torch
except ImportError:
    sys.exit(77)

FP32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps: the masters DeepSpeed steps are fp32

results = []
for case in json.load(open(sys.argv[1])):
    prm = case["params"]
    lr, beta2_decay, d, wd = prm["lr"], prm["beta2_decay"], prm["d"], prm["weight_decay"]
    eps1 = prm["eps"][0] if prm["eps"][0] is not None else FP32_EPS
    eps2 = prm["eps"][1]
    maximize = prm.get("maximize", False)
    out = []
    ts = case["tensors"]
    params = [torch.tensor(t["p0"], dtype=torch.float64).reshape(t["shape"]) for t in ts]
    row_vars = [p.new_zeros(list(p.shape[:-1]) + [1]) if p.dim() > 1 else None for p in params]
    col_vars = [p.new_zeros(list(p.shape[:-2]) + [1, p.shape[-1]]) if p.dim() > 1 else None for p in params]
    variances = [torch.zeros_like(p) if p.dim() <= 1 else None for p in params]
    for step, grads in enumerate(case["steps"], 1):
        for k, t in enumerate(ts):
            param = params[k]
            grad = torch.tensor(grads[k], dtype=torch.float64).reshape(t["shape"])
            if maximize:
                grad = -grad
            lam = wd if t["decay"] else 0.0
            one_minus_beta2_t = float(step) ** beta2_decay
            rho_t = min(lr, 1 / (float(step) ** 0.5))
            alpha = max(eps2, param.norm(2).item() / (param.numel() ** 0.5)) * rho_t
            if lam != 0:
                param.mul_(1 - lr * lam)
            if grad.dim() > 1:
                row_mean = torch.linalg.vector_norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1))
                row_vars[k].lerp_(row_mean, one_minus_beta2_t)
                col_mean = torch.linalg.vector_norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2))
                col_vars[k].lerp_(col_mean, one_minus_beta2_t)
                var_estimate = row_vars[k] @ col_vars[k]
                var_estimate.div_(row_vars[k].mean(dim=-2, keepdim=True).clamp_(min=eps1))
            else:
                variances[k].lerp_(grad * grad, one_minus_beta2_t)
                var_estimate = variances[k].clone()
            update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
            update.mul_(grad)
            denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
            param.add_(update, alpha=-alpha / denom)
    for k in range(len(ts)):
        out.append({"param": params[k].flatten().tolist(),
                    "row_var": row_vars[k].flatten().tolist() if row_vars[k] is not None else [],
                    "col_var": col_vars[k].flatten().tolist() if col_vars[k] is not None else [],
                    "variance": variances[k].flatten().tolist() if variances[k] is not None else []})
    results.append(out)
json.dump(results, open(sys.argv[2], "w"))
