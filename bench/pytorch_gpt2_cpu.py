#!/usr/bin/python3
"""PyTorch CPU peer: one GPT-2 training step (forward + backward + AdamW), fp32, timed.

The same architecture as dstrain's GPT model (and llm.c's), defined in bench/gpt2_torch.py (shared
with the GPU peer): learned token and position embeddings, pre-LayerNorm blocks, GELU tanh, a tied
LM head; no dropout. With --padded-vocab Vp > V the embedding table has Vp rows (as llm.c pads 50257
to 50304 for faster GEMMs) and the loss is taken over the first V logits only. Attention is the
explicit masked softmax (torch 1.13 has no scaled_dot_product_attention).

Prints one JSON line: tokens_per_s, ms_per_step, the torch version, the threads, and which BLAS the
process really loaded (Debian's torch is built against the generic libblas.so.3, which resolves to
OpenBLAS only when libopenblas0-pthread or -openmp is installed; otherwise to the slow reference BLAS).

Run with Debian's python (bench/setup_peer.sh installs python3-torch):
    /usr/bin/python3 bench/pytorch_gpt2_cpu.py --layers 12 --channels 768 --heads 12 \
        --vocab 50257 --padded-vocab 50304 --batch 4 --seq 256 --steps 3 --threads 2
"""
import argparse
import json
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256, help="V: real vocabulary (targets are < V)")
    p.add_argument("--padded-vocab", type=int, default=0, help="Vp >= V rows of the embedding table (0: V)")
    p.add_argument("--batch", type=int, default=4, help="B: sequences per step")
    p.add_argument("--seq", type=int, default=64, help="T: tokens per sequence (also the position table)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (allocations, BLAS start-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward and the loss under torch.autocast('cpu', torch.bfloat16) (fp32 weights and AdamW)")
    args = p.parse_args()
    if args.padded_vocab == 0:
        args.padded_vocab = args.vocab
    if args.padded_vocab < args.vocab:
        p.error(f"--padded-vocab {args.padded_vocab} is smaller than --vocab {args.vocab}")
    if args.channels % args.heads != 0:
        p.error(f"--channels {args.channels} is not divisible by --heads {args.heads}")
    if min(args.layers, args.channels, args.heads, args.vocab, args.batch, args.seq, args.steps, args.threads) < 1:
        p.error("shapes, --steps and --threads must be >= 1")
    return args


ARGS = parse_args()
# OpenBLAS and OpenMP size their thread pools when the library loads, so the limits must be in the
# environment before torch is imported; torch.set_num_threads below covers torch's own kernels.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(ARGS.threads))

try:
    import torch
except ImportError:
    sys.exit(f"{sys.executable} has no torch: run bench/setup_peer.sh, and use /usr/bin/python3 (Debian's python3-torch)")
from gpt2_torch import GPT  # bench/gpt2_torch.py: the model shared with the GPU peer


def loaded_blas():
    """The BLAS shared libraries mapped into this process, resolved through Debian's alternatives."""
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = os.path.basename(path)
                if any(key in name for key in ("blas", "mkl_rt", "libmkl", "blis")):
                    found.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(found)


def main():
    a = ARGS
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    model = GPT(a.layers, a.channels, a.heads, a.vocab, a.padded_vocab, a.seq)
    params = sum(p.numel() for p in model.parameters())
    opt_kwargs = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True, **opt_kwargs)
        foreach = True
    except TypeError:  # a torch without the multi-tensor path
        optimizer = torch.optim.AdamW(model.parameters(), **opt_kwargs)
        foreach = False
    g = torch.Generator().manual_seed(a.seed)
    # Tokens of one fixed batch: the step's cost does not depend on which tokens they are.
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    first_loss = None
    warm_start = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
        first_loss = loss if first_loss is None else first_loss
    warmup_s = time.perf_counter() - warm_start
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
        first_loss = loss if first_loss is None else first_loss
    elapsed = time.perf_counter() - start

    config = torch.__config__.show()
    blas = loaded_blas()
    print(json.dumps({
        "peer": "pytorch-cpu",
        "precision": a.precision,
        "tokens_per_s": round(a.batch * a.seq * a.steps / elapsed, 2),
        "ms_per_step": round(1000.0 * elapsed / a.steps, 2),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas_libraries": blas,
        "blas_is_openblas": any("openblas" in path for path in blas),
        "torch_config_mentions_openblas": "openblas" in config.lower(),
        "adamw_foreach": foreach,
        "shape": {"L": a.layers, "C": a.channels, "NH": a.heads, "V": a.vocab, "Vp": a.padded_vocab,
                  "B": a.batch, "T": a.seq},
        "parameters": params,
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "warmup_s": round(warmup_s, 3),
        "loss_first": round(first_loss, 4),
        "loss_last": round(loss, 4),
    }))


if __name__ == "__main__":
    main()
