#!/usr/bin/env bash
# CPU training in fp32 and bf16, dstrain against PyTorch (fp32, and bf16 autocast), on the same
# threads, with MFU against the measured peak of each path (docs/monitoring.md §1):
#   1. the machine's peak: bench_gemm_peak_cpu (fp32 sgemm, bf16 GEMM, at large squares and d12's
#      shapes, on the thread count given);
#   2. tokens/s and MFU of GPT-2 d12 (B 4, T 256 and T 1024) and of SmolLM-135M's shape (B 4,
#      T 256): dstrain fp32 / bf16 (bench_train_cpu, the Engine's step: forward + backward + AdamW),
#      PyTorch 1.13 fp32 / bf16 autocast (bench/pytorch_gpt2_cpu.py, pytorch_llama_cpu.py).
# MFU = tokens/s x (6N + 6LCT) / the peak of the path (dstrain bf16 against the bf16 GEMM peak,
# fp32 and PyTorch fp32 against sgemm's; PyTorch's bf16 autocast against the bf16 peak). Never
# asserts; timings mean something only on a quiet machine (the load average is printed).
#
#   bash bench/cpu_bf16.sh [--threads 2] [--steps 2] [--only d12_256|d12_1024|smollm]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2; steps=2; only=""
while (($#)); do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "cpu_bf16.sh: unknown option $1 (--threads N, --steps N, --only NAME)" >&2; exit 2 ;;
  esac
done
for b in bench_train_cpu bench_gemm_peak_cpu; do
  [ -x "build/bench/$b" ] || { echo "cpu_bf16.sh: build/bench/$b is missing: cmake --build build --target $b" >&2; exit 1; }
done
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive
py=/usr/bin/python3
field() { "$py" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

echo "== 1. the peak on $threads thread(s) (load $(cut -d' ' -f1 /proc/loadavg))"
peaks=$(build/bench/bench_gemm_peak_cpu --threads "$threads" | tee /dev/stderr | tail -1)
fp32_peak=$(field "$peaks" fp32_gflops); bf16_peak=$(field "$peaks" bf16_gflops)
echo "peak: fp32 sgemm $fp32_peak GFLOP/s, bf16 GEMM $bf16_peak GFLOP/s"

echo "== 2. training steps ($steps timed after 1 warm-up; $threads thread(s))"
printf '%-10s %-22s %12s %10s %8s  %s\n' shape run tokens/s ms/step MFU "load"
row() {  # name run json peak
  local t m f
  t=$(field "$3" tokens_per_s); m=$(field "$3" ms_per_step)
  f=$(field "$3" flops_per_token 2>/dev/null || echo "$5")
  printf '%-10s %-22s %12.1f %10.1f %7.1f%%  %s\n' "$1" "$2" "$t" "$m" "$("$py" -c "print(100*$t*$f/($4*1e9))")" "$(cut -d' ' -f1 /proc/loadavg)"
}
gpt2() {  # name B T
  [ -z "$only" ] || [ "$only" = "$1" ] || return 0
  local shape=(--layers 12 --channels 768 --heads 12 --vocab 50257 --batch "$2" --seq "$3" --steps "$steps" --warmup 1)
  local d32 d16 p32 p16 fpt
  d32=$(build/bench/bench_train_cpu "${shape[@]}" --precision fp32 2>/dev/null)
  d16=$(build/bench/bench_train_cpu "${shape[@]}" --precision bf16 2>/dev/null)
  fpt=$(field "$d32" flops_per_token)
  p32=$("$py" bench/pytorch_gpt2_cpu.py "${shape[@]}" --padded-vocab 50304 --threads "$threads" --precision fp32)
  p16=$("$py" bench/pytorch_gpt2_cpu.py "${shape[@]}" --padded-vocab 50304 --threads "$threads" --precision bf16)
  row "$1" "dstrain fp32" "$d32" "$fp32_peak"
  row "$1" "dstrain bf16" "$d16" "$bf16_peak"
  row "$1" "pytorch fp32" "$p32" "$fp32_peak" "$fpt"
  row "$1" "pytorch bf16 autocast" "$p16" "$bf16_peak" "$fpt"
  echo "  dstrain bf16 path: $(field "$d16" gemm_path); bf16 / fp32: $("$py" -c "print(round($(field "$d16" tokens_per_s)/$(field "$d32" tokens_per_s),2))")x; bf16 / PyTorch's best: $("$py" -c "print(round($(field "$d16" tokens_per_s)/max($(field "$p32" tokens_per_s),$(field "$p16" tokens_per_s)),2))")x"
}
smollm() {
  [ -z "$only" ] || [ "$only" = smollm ] || return 0
  local model=llama:L30-C576-H9-KV3-I1536-V49152-tied
  local d32 d16 p32 p16 fpt
  d32=$(build/bench/bench_train_cpu --model "$model" --batch 4 --seq 256 --steps "$steps" --warmup 1 --precision fp32 2>/dev/null)
  d16=$(build/bench/bench_train_cpu --model "$model" --batch 4 --seq 256 --steps "$steps" --warmup 1 --precision bf16 2>/dev/null)
  fpt=$(field "$d32" flops_per_token)
  local peer=(--layers 30 --channels 576 --heads 9 --kv-heads 3 --intermediate 1536 --vocab 49152 --batch 4 --seq 256 --steps "$steps" --warmup 1 --threads "$threads")
  p32=$("$py" bench/pytorch_llama_cpu.py "${peer[@]}" --precision fp32)
  p16=$("$py" bench/pytorch_llama_cpu.py "${peer[@]}" --precision bf16)
  row smollm "dstrain fp32" "$d32" "$fp32_peak"
  row smollm "dstrain bf16" "$d16" "$bf16_peak"
  row smollm "pytorch fp32" "$p32" "$fp32_peak" "$fpt"
  row smollm "pytorch bf16 autocast" "$p16" "$bf16_peak" "$fpt"
}
gpt2 d12_256 4 256
gpt2 d12_1024 4 1024
smollm
