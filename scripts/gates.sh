#!/usr/bin/env bash
# dstrain's gates beyond the test suite: sanitizers and fuzzing. Each gate builds CPU only, without
# benchmarks, and fails (exit 1) on the first report. The ASan + UBSan suite and the libFuzzer
# targets share one clang build (build-asan/): the libraries are compiled once for both.
#
#   bash scripts/gates.sh asan [REGEX]   the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer
#                                        (build-asan/); REGEX: only the ctest tests it matches (with
#                                        DSTRAIN_GATES_TARGETS: a gtest filter)
#   bash scripts/gates.sh tsan           the communicator, comm queue, overlap and activation-transfer
#                                        tests under ThreadSanitizer (build-tsan/); DSTRAIN_GATES_TARGETS
#                                        narrows the test programs
#   bash scripts/gates.sh fuzz [SECONDS] every libFuzzer target (tests/fuzz) replays its regressions,
#                                        then runs SECONDS (default 60) from its seed corpus; a crash is
#                                        saved in build-asan/artifacts/
#   bash scripts/gates.sh fuzz-fixed [RUNS]  the same, but reproducible: every target runs exactly RUNS
#                                        inputs (default 60000; fuzz_checkpoint and fuzz_deepspeed_checkpoint
#                                        a quarter) from seed 1, starting from the committed corpus only. CI
#                                        runs this form, so a CI result is the result any machine gets; the
#                                        timed form is for hunting new bugs.
#
#   DSTRAIN_GATES_JOBS=N   build and test jobs (default: nproc)
#   DSTRAIN_GATES_TARGETS="test_a test_b"   asan: build and run only these test programs
# A crash the fuzzer finds is fixed and its input kept in tests/fuzz/regressions/<target>/, which every
# later run replays first.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${DSTRAIN_GATES_JOBS:-$(nproc 2>/dev/null || echo 2)}"
say() { printf '[gates] %s\n' "$*"; }

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1: the sanitizers' usual level, and a third of -O3's compile time on CI's 2 cores.
common=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DDSTRAIN_CUDA=OFF -DDSTRAIN_BUILD_BENCH=OFF "${launcher[@]}")

# Tests under TSan: the local communicator (collectives, failures, point-to-point), the comm queue, ZeRO's
# overlapped reductions through the engine, and the activation transfers of checkpointing.
asan_dir="$repo/build-asan"

tsan_targets=(test_zero_comm test_zero_parts test_zero_engine_comm test_zero_reduce_scatter_off test_engine test_pipeline test_expert_states test_zeropp)
tsan_filter='Pipeline.*:*LocalCollectives*:LocalCommunicator.*:LocalFailures.*:LocalPointToPoint.*:*LocalAllToAllV*:GradientReduction.*:ZeroCommQueue.*:ZeroParamCoordinator.*:*ZeroComm*:ZeroEngineComm.*:ZeroReduceScatterOff.*:GradientAllreduceOp.*:ActivationCheckpointing.*:*ExpertStates.*:*ZeroPlusPlusBytes*:ZeroPlusPlusTraining.Hpz*'

# configure_asan: build-asan/, clang with ASan + UBSan, the test suite and the libFuzzer targets.
configure_asan() {
  say_prefix=gates
  # shellcheck source=scripts/apt_install.sh
  source "$repo/scripts/apt_install.sh"
  # Debian's clang, its compiler-rt (libFuzzer, the sanitizer runtimes) and LLVM's OpenMP runtime,
  # which clang's -fopenmp links.
  apt_install_missing clang libclang-rt-14-dev libomp-dev
  cmake -S "$repo" -B "$asan_dir" "${common[@]}" -DCMAKE_CXX_COMPILER=clang++ -DDSTRAIN_SANITIZE=address,undefined -DDSTRAIN_FUZZ=ON >/dev/null
}

gate_asan() {
  local regex="${1:-}" dir="$asan_dir" t exe
  say "ASan+UBSan: configuring and building in $dir (clang; the test programs and the libFuzzer targets)"
  configure_asan
  local targets=()
  [ -n "${DSTRAIN_GATES_TARGETS:-}" ] && read -r -a targets <<<"$DSTRAIN_GATES_TARGETS"
  # halt_on_error: the first report fails the test. Leak checking is on (DSTRAIN_GATES_LEAKS=0 where
  # ptrace-restricted containers stop LeakSanitizer). allocator_may_return_null: an allocation larger
  # than ASan's limit returns null, as malloc does, instead of aborting — the allocator tests ask for
  # 2^62 bytes to check the out-of-memory error dstrain makes of that null.
  export ASAN_OPTIONS="detect_leaks=${DSTRAIN_GATES_LEAKS:-1}:allocator_may_return_null=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # Open MPI's own allocations at MPI_Init live until exit (tests/sanitizers/lsan.supp).
  export LSAN_OPTIONS="suppressions=$repo/tests/sanitizers/lsan.supp:print_suppressions=0"
  if ((${#targets[@]})); then
    # A subset (what CI runs): these test programs, each run whole.
    cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
    for t in "${targets[@]}"; do
      exe="$(find "$dir/tests" -type f -name "$t" -perm -u+x | head -n 1)"
      [ -n "$exe" ] || { say "error: $t was not built in $dir"; return 1; }
      say "ASan+UBSan: $t"
      (cd "$(dirname "$exe")" && "$exe" --gtest_brief=1 ${regex:+--gtest_filter="$regex"})
    done
    return 0
  fi
  cmake --build "$dir" -j "$jobs"
  say "ASan+UBSan: running the CPU suite${regex:+ (tests matching $regex)}"
  # The install test builds an outside project against the installed (sanitized) libraries without
  # the sanitizer runtime: it checks packaging, not memory, and runs in the plain suite.
  if [ -n "$regex" ]; then
    (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 1200 -LE gpu -E '^install_and_find_package$' -R "$regex")
    return
  fi
  # The whole suite: each GoogleTest program run whole, $jobs at a time, not one process per test
  # as ctest runs them — an ASan process takes ~0.25 s to start, and the suite has ~1350 tests
  # (measured 2026-12-01: ctest's way took 612 s of the 2 cores; see scripts/test.sh). Then the
  # script tests (names without a dot: the MPI collectives under mpiexec, the Gloo ones under
  # run_ranks.sh, mpi_faults, the torchrun and MPI relaunches, the full disk)
  # through ctest. Tests that run Open MPI processes (names with Mpi / mpi: the MPI collectives,
  # the MPI CLI tests, the launcher detection that initialises MPI) run without leak checking: Open
  # MPI dlcloses its plug-ins at MPI_Finalize, so what they keep until exit has no module left to
  # suppress by (lsan.supp), only "<unknown module>"; and a communicator whose group failed leaves
  # its buffers to the process's end on purpose (MPI may still write them). Memory errors and
  # undefined behaviour are still checked there; every other test runs with leak checking.
  local programs=() failed=0
  # The longest first, so that the two cores stay busy to the end.
  mapfile -t programs < <(cd "$dir/tests" && find . -type f -perm -u+x -name 'test_*' ! -name test_mpi_collectives ! -name test_gloo_collectives -printf '%s %p\n' | sort -rn | cut -d' ' -f2-)
  ((${#programs[@]})) || { say "error: no test programs in $dir/tests"; return 1; }
  say "ASan+UBSan: ${#programs[@]} test programs, $jobs at a time"
  printf '%s\n' "${programs[@]}" | DIR="$dir/tests" xargs -P "$jobs" -I{} bash -c '
    exe="$DIR/{}"; log="$(mktemp)"
    if (cd "$(dirname "$exe")" && timeout 1800 "$exe" --gtest_brief=1 --gtest_filter="-*Mpi*:*mpi*" &&
        ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" timeout 1800 "$exe" --gtest_brief=1 --gtest_filter="*Mpi*:*mpi*") >"$log" 2>&1; then
      printf "[gates] ASan+UBSan: %s passed\n" "$(basename "$exe")"; rm -f "$log"
    else
      cat "$log"; printf "[gates] ASan+UBSan: %s FAILED\n" "$(basename "$exe")"; rm -f "$log"; exit 1
    fi' || failed=1
  (cd "$dir" && ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" \
     ctest --output-on-failure -j "$jobs" --timeout 1200 -LE gpu -E '\.|^install_and_find_package$' -R mpi) || failed=1
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 1200 -LE gpu -E '\.|^install_and_find_package$|mpi') || failed=1
  return "$failed"
}

gate_tsan() {
  local dir="$repo/build-tsan" t exe
  local targets=("${tsan_targets[@]}")
  [ -n "${DSTRAIN_GATES_TARGETS:-}" ] && read -r -a targets <<<"$DSTRAIN_GATES_TARGETS"
  say "TSan: configuring and building ${targets[*]} in $dir"
  cmake -S "$repo" -B "$dir" "${common[@]}" -DDSTRAIN_SANITIZE=thread >/dev/null
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  # OpenMP's and OpenBLAS's own threads are not instrumented (Debian's libgomp/libopenblas): one
  # thread each, so what TSan sees is dstrain's threads (ranks, comm queue, transfers) only.
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  for t in "${targets[@]}"; do
    exe="$(find "$dir/tests" -type f -name "$t" -perm -u+x | head -n 1)"
    [ -n "$exe" ] || { say "error: $t was not built in $dir"; return 1; }
    say "TSan: $t ($tsan_filter)"
    (cd "$(dirname "$exe")" && "$exe" --gtest_brief=1 --gtest_filter="$tsan_filter")
  done
  # The Gloo backend's threads (Gloo's own, the send posters) across 2 processes, as run_ranks.sh
  # starts them (the whole program: the failures too). Only where Gloo is built and no subset was asked.
  if [ -z "${DSTRAIN_GATES_TARGETS:-}" ] && grep -q '^DSTRAIN_GLOO:BOOL=ON' "$dir/CMakeCache.txt"; then
    cmake --build "$dir" -j "$jobs" --target test_gloo_collectives
    say "TSan: test_gloo_collectives on 2 processes"
    (cd "$dir" && bash "$repo/tests/unit/zero/run_ranks.sh" 2 tests/unit/zero/test_gloo_collectives --gtest_brief=1)
  fi
}

# gate_fuzz timed SECONDS | gate_fuzz fixed RUNS
gate_fuzz() {
  local mode="$1" amount="$2" dir="$asan_dir" t failed=0
  # Timed: random inputs for SECONDS. Fixed (below, per target): a seed and a number of runs instead
  # of a time, so the inputs tried do not depend on the machine's speed; its cap on time is a safety
  # net far above what the runs take.
  local budget=(-max_total_time="$amount")
  local targets=(fuzz_ds_config fuzz_hf_config fuzz_token_file fuzz_safetensors fuzz_jsonl fuzz_hf_tokenizer fuzz_torch_state_dict
                 fuzz_checkpoint fuzz_deepspeed_checkpoint)
  say "fuzz: configuring and building the libFuzzer targets in $dir (clang; nothing to do after the asan gate)"
  configure_asan
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  mkdir -p "$dir/artifacts"
  local bin="$dir/tests/fuzz"
  for t in "${targets[@]}"; do
    local name="${t#fuzz_}" corpus="$repo/tests/fuzz/corpus/${t#fuzz_}" regress="$repo/tests/fuzz/regressions/${t#fuzz_}"
    local cases=()
    mapfile -t cases < <(find "$regress" -type f ! -name .keep | sort)
    if ((${#cases[@]})); then
      say "fuzz: $t replays ${#cases[@]} regression case(s)"
      "$bin/$t" -rss_limit_mb=2048 -timeout=20 "${cases[@]}" || { failed=1; continue; }
    fi
    # New inputs go to a scratch corpus: the committed seed corpus stays as it is.
    # A fixed run starts from an empty scratch corpus: what earlier runs found would change its inputs.
    local work="$dir/corpus/$name"
    if [ "$mode" = fixed ]; then
      rm -rf "$work"
      # fuzz_checkpoint and fuzz_deepspeed_checkpoint write and read a checkpoint folder per input
      # (~6 ms each, ~10x the others), so a quarter of the runs keeps them near their time (~100 s
      # on CI's 2 cores).
      local runs="$amount"
      case "$t" in fuzz_checkpoint | fuzz_deepspeed_checkpoint) runs=$((amount / 4)) ;; esac
      budget=(-seed=1 -runs="$runs" -max_total_time=900)
    fi
    mkdir -p "$work"
    say "fuzz: $t, ${budget[*]}, on $corpus"
    if ! "$bin/$t" "${budget[@]}" -timeout=20 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
         -artifact_prefix="$dir/artifacts/$name-" "$work" "$corpus" 2>"$dir/$t.log"; then
      tail -n 60 "$dir/$t.log"
      say "fuzz: $t FAILED; the input is in $dir/artifacts/ — fix the bug and add the input to tests/fuzz/regressions/$name/"
      failed=1
    else
      grep -E '^stat::number_of_executed_units|^Done' "$dir/$t.log" | tr '\n' ' '
      echo
    fi
  done
  return "$failed"
}

case "${1:-}" in
  asan) shift; gate_asan "$@" ;;
  tsan) shift; gate_tsan "$@" ;;
  fuzz) gate_fuzz timed "${2:-60}" ;;
  fuzz-fixed) gate_fuzz fixed "${2:-60000}" ;;
  *) echo "usage: bash scripts/gates.sh asan [REGEX] | tsan | fuzz [SECONDS] | fuzz-fixed [RUNS]" >&2; exit 2 ;;
esac
