#!/usr/bin/env bash
# Threads per rank follow the process's affinity mask and SLURM_CPUS_PER_TASK (issue 17): the
# thread count each run records in /provenance/blas_threads, under taskset, under an unbound
# mpirun (ranks sharing one mask split it), with SLURM_CPUS_PER_TASK, and as given; and the
# rank's peak for MFU from the same mask.
# usage: threads.sh RUNNER OUTDIR
set -u
runner=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
unset OPENBLAS_NUM_THREADS SLURM_CPUS_PER_TASK
fails=0 cases=0
prov() {  # prov RUN_ID KEY: the /provenance attribute of a run file
  /usr/bin/python3 -c 'import h5py, sys
v = h5py.File(sys.argv[1], "r")["provenance"].attrs[sys.argv[2]]
print(v.decode() if isinstance(v, bytes) else v)' "$out/$1.h5" "$2" 2>/dev/null
}
expect() {  # expect RUN_ID THREADS WHAT: the run recorded THREADS BLAS threads
  local got origin; got=$(prov "$1" blas_threads) origin=$(prov "$1" blas_threads_origin)
  cases=$((cases + 1))
  if [[ $got != "$2" ]]; then
    echo "FAIL: $3: blas_threads '$got' (origin '$origin'), expected $2"; fails=$((fails + 1))
  else
    echo "ok: $3: $got thread(s) ($origin)"
  fi
}
run() {  # run RUN_ID [launcher words...] -- [runner args...]
  local id=$1 pre=(); shift
  while [[ $1 != -- ]]; do pre+=("$1"); shift; done; shift
  "${pre[@]}" "$runner" --plugin ddp --model tiny --steps 2 --peak-tflops 1 --quiet --out "$out" \
    --run-id "$id" "$@" > "$out/$id.log" 2>&1 || { echo "FAIL: run $id: $(tail -n 2 "$out/$id.log")"; fails=$((fails + 1)); }
}
cpus=$(nproc)  # this process's mask, as the runner reads it
first=$(taskset -pc $$ | sed 's/.*: //; s/[-,].*//')
run taskset taskset -c "$first" -- && expect taskset 1 "taskset -c $first (one CPU)"
run alone env -- && expect alone "$cpus" "one rank on the whole mask ($cpus CPU(s))"
run slurm env SLURM_CPUS_PER_TASK=1 -- && expect slurm 1 "SLURM_CPUS_PER_TASK=1"
run given taskset -c "$first" -- --blas-threads 3 && expect given 3 "--blas-threads 3 under taskset"
run openblas env OPENBLAS_NUM_THREADS=2 -- && expect openblas 2 "OPENBLAS_NUM_THREADS=2"
# Two ranks of an unbound mpirun share one mask: each gets half of it (at least one).
mpirun=(mpirun -np 2 --bind-to none --oversubscribe --mca pml_ucx_tls any --mca pml_ucx_devices any)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
half=$((cpus / 2 > 0 ? cpus / 2 : 1))
run shared "${mpirun[@]}" -- && expect shared "$half" "mpirun -np 2 --bind-to none ($cpus CPU(s) shared)"
# The runner's own relaunch on 2 ranks under taskset -c FIRST: one CPU for both, one thread each.
run relaunch taskset -c "$first" -- --nodes 1 --ranks-per-node 2 && expect relaunch 1 "taskset -c $first, relaunched on 2 ranks"
# The rank's peak follows its mask too (issue 27): under taskset -c FIRST one CPU's share of the
# node's measured peak, on the whole mask all of it; MFU at most 1 either way.
peak() {  # peak RUN_ID CPUS WHAT: peak_flops_per_rank = node peak x CPUS / node CPUs, MFU <= 1
  cases=$((cases + 1))
  if /usr/bin/python3 - "$out/$1.h5" "$2" <<'PY'; then echo "ok: $3"; else echo "FAIL: $3"; fails=$((fails + 1)); fi
import re, sys
import h5py
f = h5py.File(sys.argv[1], "r")
s, p = f["summary"].attrs, f["provenance"].attrs
detail = p["peak_flops_detail"]
detail = detail.decode() if isinstance(detail, bytes) else detail
m = re.search(r"node SGEMM ([0-9.]+) GFLOP/s on ([0-9]+) CPU\(s\)", detail)
node, node_cpus = float(m.group(1)) * 1e9, int(m.group(2))
want = node * int(sys.argv[2]) / node_cpus
assert abs(s["peak_flops_per_rank"] - want) <= 1e-3 * want, (s["peak_flops_per_rank"], want, detail)
assert 0 < s["mfu"] <= 1, s["mfu"]
print("  peak %.1f GFLOP/s per rank (node %.1f on %d CPUs), MFU %.1f%%"
      % (s["peak_flops_per_rank"] / 1e9, node / 1e9, node_cpus, 100 * s["mfu"]))
PY
}
for id in peak_one peak_all; do
  pre=(env) && [[ $id == peak_one ]] && pre=(taskset -c "$first")
  STRATA_PEAK_CACHE=$out/peak.tsv "${pre[@]}" "$runner" --plugin ddp --model tiny --steps 4 --quiet \
    --out "$out" --run-id "$id" > "$out/$id.log" 2>&1 || { echo "FAIL: run $id: $(tail -n 2 "$out/$id.log")"; fails=$((fails + 1)); }
done
peak peak_one 1 "taskset -c $first: one CPU's share of the node's peak"
peak peak_all "$cpus" "the whole mask ($cpus CPU(s)): the node's peak"
echo "$((cases - fails)) of $cases passed"
[[ $fails -eq 0 && $cases -eq 9 ]]
