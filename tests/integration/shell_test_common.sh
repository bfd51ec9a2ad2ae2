# Sourced by the MPI shell tests (mpi_faults.sh, mpi_elastic_relaunch.sh) with their arguments:
#   <dstrain binary> <scratch folder> <mpiexec and its flags...>
# Sets dstrain, scratch and mpiexec (an array), defines fail(), and makes a fresh scratch folder
# holding a small English byte-token file ($scratch/t_train.bin, t_val.bin).
dstrain="$1"; scratch="$2"; shift 2
mpiexec=("$@")

fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$scratch"; mkdir -p "$scratch/text"
for d in 0 1 2; do
  for i in $(seq 1 80); do printf 'The quick brown fox %d jumps over the lazy dog %d times. ' "$d" "$i"; done > "$scratch/text/doc$d.txt"
done
"$dstrain" prepare-data --tokenizer bytes "$scratch/text" -o "$scratch/t.bin" --val-fraction 0.3 >/dev/null 2>&1 || fail "prepare-data"
