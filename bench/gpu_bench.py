#!/usr/bin/env python3
"""Helpers of bench/gpu_gpt2.sh and bench/gpu_zero.sh (standard library only; no torch needed): the
tables from the files their runs left, the per-run ds_config, and a random token file.

dstrain's figures come from its --summary-json: step_seconds (each optimizer step's time, taken after
a device synchronise), peak memory, parameters, the ZeRO report. Steps after the warm-up are timed;
tokens/s = tokens / the sum of their times. The summary's own
tokens_per_s covers every step including the warm-up (first-step allocations, cuBLASLt heuristics)
and is kept as tokens_per_s_all_steps.

    gpu_bench.py gpt2-table DIR --batches "8 16 32 64" --ckpt "off on" --warmup 5 [--gemm DIR/gemm_peak.json]
    gpu_bench.py zero-table DIR --warmup 3
    gpu_bench.py ds-config BASE.json OUT.json --micro-batch B --stage S
    gpu_bench.py random-tokens OUT.bin N VOCAB
"""
import argparse
import array
import json
import os
import statistics
import struct
import sys

H100_SXM_BF16_PEAK = 989.4e12  # dense bf16 tensor FLOP/s, NVIDIA H100 SXM datasheet (1,978.9 TFLOPS is with 2:4 sparsity)
LLMC = ("llm.c (published, not run here): about 471K tokens/s per H100 at d12, B=64, T=1024, on 8 GPUs "
        "(139 ms/step median for 524,288 tokens per step; modded-nanogpt record 2024-10-13), 38% MFU")
GIB = 1024.0 ** 3


def load_json(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    # The peer prints one JSON line; a log may precede it in the same file.
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    try:
        return json.loads(text)
    except ValueError:
        return None


def flops_per_token(params, layers, channels, seq):
    return 6 * params + 6 * layers * channels * seq


def dstrain_point(log_path, summary_path, warmup, layers=12, channels=768):
    """The timed figures of one dstrain run, or {"error": ...}."""
    summary = load_json(summary_path)
    if summary is None:
        tail = ""
        try:
            with open(log_path, errors="replace") as f:
                lines = [l.rstrip() for l in f if l.strip()]
            tail = lines[-1] if lines else ""
        except OSError:
            tail = "(no log)"
        oom = "out of memory" in tail.lower() or "cudaerrormemoryallocation" in tail.lower()
        return {"error": "out of memory" if oom else "failed (see log)", "detail": tail[:300]}
    T = summary["sequence_length"]
    tokens_per_step = summary["train_batch_size"] * T
    times = [t for t in summary.get("step_seconds", [])[warmup:] if t > 0]
    r = {"tokens_per_s_all_steps": summary.get("tokens_per_s"), "steps": summary.get("steps"), "timed_steps": len(times)}
    if times:
        r["tokens_per_s"] = tokens_per_step * len(times) / sum(times)
        r["ms_per_step"] = 1000.0 * sum(times) / len(times)
        r["ms_per_step_median"] = 1000.0 * statistics.median(times)
    else:  # no step after the warm-up: the summary's whole-run figure (warm-up included)
        r["tokens_per_s"] = summary.get("tokens_per_s") or 0.0
        r["ms_per_step"] = 1000.0 * tokens_per_step / r["tokens_per_s"] if r["tokens_per_s"] else None
        r["note"] = "warm-up included (no step after the warm-up)"
    params = summary.get("parameters_stored") or summary.get("parameters")
    r["parameters"] = params
    r["flops_per_token"] = flops_per_token(params, layers, channels, T)
    peak = summary.get("peak_memory_bytes", {})
    r["peak_memory_bytes"] = peak.get("total")
    r["peak_memory_by_purpose"] = peak
    zero = summary.get("zero") or {}
    ranks = zero.get("ranks") or []
    if ranks:
        r["zero_stage"] = zero.get("stage")
        r["world_size"] = zero.get("world_size")
        r["rank_peak_bytes"] = [x.get("peak_bytes") for x in ranks]
        r["step_comm_bytes"] = ((ranks[0].get("step_comm") or {}).get("total") or {}).get("bytes")
    r["final_train_loss"] = summary.get("final_train_loss")
    return r


def fmt_num(v, spec="{:,.0f}", missing="–"):
    return missing if v is None else spec.format(v)


def gib(v):
    return fmt_num(None if v is None else v / GIB, "{:.2f}")


def report_gpt2(a):
    d = a.dir
    gemm = load_json(a.gemm) if a.gemm else None
    measured_peak = gemm.get("best_tflops") * 1e12 if gemm and gemm.get("best_tflops") else None
    rows, results = [], []
    for ck in a.ckpt.split():
        for B in a.batches.split():
            tag = f"B{B}_ckpt{ck}"
            ours = dstrain_point(os.path.join(d, f"ours_{tag}.log"), os.path.join(d, f"ours_{tag}.json"), a.warmup) \
                if os.path.exists(os.path.join(d, f"ours_{tag}.log")) else None
            torch_r = load_json(os.path.join(d, f"torch_{tag}.json"))
            if torch_r is None and os.path.exists(os.path.join(d, f"torch_{tag}.log")):
                torch_r = {"error": "no result (see log)"}
            results.append({"B": int(B), "checkpointing": ck, "dstrain": ours, "pytorch": torch_r})
            o_tps = ours.get("tokens_per_s") if ours and "error" not in ours else None
            t_tps = torch_r.get("tokens_per_s") if torch_r and "error" not in torch_r else None
            o_mfu = o_tps * ours["flops_per_token"] / H100_SXM_BF16_PEAK if o_tps else None
            o_mfu_meas = o_tps * ours["flops_per_token"] / measured_peak if o_tps and measured_peak else None
            t_mfu = torch_r.get("mfu") if t_tps else None
            ours_cell = fmt_num(o_tps) if o_tps else ("not run" if ours is None else ours.get("error", "failed"))
            torch_cell = fmt_num(t_tps) if t_tps else ("not run" if torch_r is None else torch_r.get("error", "failed"))
            rows.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                B, ck, ours_cell,
                fmt_num(None if o_mfu is None else 100 * o_mfu, "{:.1f}%"),
                fmt_num(None if o_mfu_meas is None else 100 * o_mfu_meas, "{:.1f}%"),
                gib(ours.get("peak_memory_bytes") if ours and "error" not in ours else None),
                torch_cell,
                fmt_num(None if t_mfu is None else 100 * t_mfu, "{:.1f}%"),
                gib(torch_r.get("peak_memory_allocated_bytes") if torch_r else None),
                fmt_num(o_tps / t_tps if o_tps and t_tps else None, "{:.2f}x")))
            if ours and o_tps:
                ours["mfu"] = o_mfu
                ours["mfu_vs_measured_gemm_peak"] = o_mfu_meas
    peak_text = f"{measured_peak / 1e12:.1f} TFLOP/s measured (bench_gemm_peak, best shape)" if measured_peak else "not measured"
    n_params = next((p[k].get("parameters") for p in results for k in ("dstrain", "pytorch") if p[k] and p[k].get("parameters")), None)
    lines = [
        "## GPT-2 124M (gpt2:d12), T=1024, bf16, one GPU",
        "",
        f"GPU: {gemm.get('device') if gemm else 'see gpu.txt'}; dense bf16 peak: 989.4 TFLOP/s (H100 SXM datasheet); "
        f"large bf16 GEMM: {peak_text}. MFU = (6N + 6LCT) x tokens/s / peak, N = {fmt_num(n_params)} "
        "(parameters with the vocabulary padding rows, as llm.c counts them); MFU (GEMM) is against the measured GEMM peak.",
        f"Timed: the steps after {a.warmup} warm-up steps. dstrain peak = its allocator's peak (params + grads + optimizer + "
        "activations + buffers); PyTorch peak = torch.cuda.max_memory_allocated.",
        "",
        "| B | ckpt | dstrain tok/s | MFU (989) | MFU (GEMM) | peak GiB | PyTorch tok/s | PyTorch MFU | PyTorch peak GiB | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{LLMC}.",
        "PyTorch: bench/pytorch_gpt2_gpu.py (bf16 autocast, fused AdamW, SDPA flash attention, torch.compile unless noted in its JSON).",
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(d, "table_gpt2.md"), "w") as f:
        f.write(text)
    with open(os.path.join(d, "results_gpt2.json"), "w") as f:
        json.dump({"gemm": gemm, "points": results, "llm_c": LLMC}, f, indent=2)
    sys.stdout.write(text)


def report_zero(a):
    d = a.dir
    rows, results = [], []
    for backend in ("nccl", "local"):
        base_ms = None
        for stage in range(4):
            tag = f"zero_{backend}_s{stage}"
            if not os.path.exists(os.path.join(d, tag + ".log")):
                continue
            r = dstrain_point(os.path.join(d, tag + ".log"), os.path.join(d, tag + ".json"), a.warmup)
            r.update({"backend": backend, "stage": stage})
            results.append(r)
            ms = r.get("ms_per_step") if "error" not in r else None
            if stage == 0:
                base_ms = ms
            world = r.get("world_size") or ("1" if backend == "nccl" else "?")
            rank_peaks = r.get("rank_peak_bytes") or []
            rows.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
                backend, world, stage,
                fmt_num(ms, "{:.1f}") if ms else r.get("error", "failed"),
                fmt_num(ms / base_ms if ms and base_ms else None, "{:.2f}x"),
                fmt_num(r.get("tokens_per_s") if ms else None),
                " / ".join(gib(p) for p in rank_peaks) if rank_peaks else gib(r.get("peak_memory_bytes")),
                fmt_num(None if r.get("step_comm_bytes") is None else r["step_comm_bytes"] / 1e6, "{:,.1f}")))
    lines = [
        "## ZeRO stages 0-3 on the GPU",
        "",
        f"Step time: mean of the steps after {a.warmup} warm-up steps; x stage 0 of the same backend. nccl: one process, world size 1; "
        "local: --num-ranks 2, two ranks (threads) sharing the GPU. Peak: each rank's ZeRO-report peak.",
        "",
        "| backend | world | stage | ms/step | vs stage 0 | tokens/s | peak GiB per rank | MB sent per step (rank 0) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(d, "table_zero.md"), "w") as f:
        f.write(text)
    with open(os.path.join(d, "results_zero.json"), "w") as f:
        json.dump(results, f, indent=2)
    sys.stdout.write(text)


def ds_config(a):
    """BASE with the micro-batch and ZeRO stage of one run, progress printed every step (the log shows
    each step), gradient accumulation 1 and train_batch_size left to follow (micro x world)."""
    with open(a.base) as f:
        cfg = json.load(f)
    cfg["train_micro_batch_size_per_gpu"] = a.micro_batch
    cfg["gradient_accumulation_steps"] = 1
    cfg.pop("train_batch_size", None)
    cfg["steps_per_print"] = 1
    cfg.setdefault("zero_optimization", {})["stage"] = a.stage
    with open(a.out, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def random_tokens(a):
    """An llm.c token file (data/token_file.h) of N uniform-ish random ids below VOCAB."""
    raw = array.array("H", os.urandom(2 * a.n))
    ids = array.array("H", (x % a.vocab for x in raw))
    if sys.byteorder != "little":
        ids.byteswap()
    header = struct.pack("<256i", *([20240520, 1, a.n] + [0] * 253))
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        ids.tofile(f)
    os.replace(tmp, a.out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("ds-config")
    c.add_argument("base")
    c.add_argument("out")
    c.add_argument("--micro-batch", type=int, required=True)
    c.add_argument("--stage", type=int, default=0, choices=[0, 1, 2, 3])
    r = sub.add_parser("random-tokens")
    r.add_argument("out")
    r.add_argument("n", type=int)
    r.add_argument("vocab", type=int)
    g = sub.add_parser("gpt2-table")
    g.add_argument("dir")
    g.add_argument("--batches", default="8 16 32 64")
    g.add_argument("--ckpt", default="off on")
    g.add_argument("--warmup", type=int, default=5)
    g.add_argument("--gemm", default="")
    z = sub.add_parser("zero-table")
    z.add_argument("dir")
    z.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    {"gpt2-table": report_gpt2, "zero-table": report_zero, "ds-config": ds_config, "random-tokens": random_tokens}[a.cmd](a)


if __name__ == "__main__":
    main()
