#!/usr/bin/env bash
# Every bad input gets exactly one line on stderr, a non-zero exit, and no run file.
# usage: bad_input.sh RUNNER OUTDIR
set -u
runner=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
fails=0
check() {  # check "<expected text>" args...
  local want=$1; shift
  local err code
  local envs=(env)
  if [[ $1 == OMPI_COMM_WORLD_SIZE=* ]]; then envs+=("$1"); shift; fi
  err=$("${envs[@]}" "$runner" --out "$out" "$@" 2>&1 >/dev/null); code=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $code -eq 0 || $lines -ne 1 || $err != *"$want"* ]]; then
    echo "FAIL: runner $* -> exit $code, $lines stderr line(s): $err (wanted: $want)"; fails=$((fails+1))
  else
    echo "ok: runner $* -> $err"
  fi
}
check "--plugin nosuch: no such strategy (found: " --plugin nosuch
check "--plugin: required" --model tiny
check "--plugin-opt nosuch: strategy ddp has no such option (it has: bucket_mb)" --plugin ddp --plugin-opt nosuch=1
check "--plugin-opt bucket_mb=abc: must be a number" --plugin ddp --plugin-opt bucket_mb=abc
check "--plugin-opt bucket_mb=" --plugin ddp --plugin-opt bucket_mb=-1
check "dp x tp x pp must equal the world size" --plugin ddp --nodes 3 --mesh dp=2
# As if mpirun had started 4 ranks (checked before MPI starts, so no MPI is needed here).
check "--nodes 3: must divide the world size 4" OMPI_COMM_WORLD_SIZE=4 --plugin ddp --nodes 3
check "--heads 5: must divide --hidden 64" --plugin ddp --hidden 64 --heads 5
check "--steps 0: must be >= 1" --plugin ddp --steps 0
check "--model huge: must be one of tiny, small, gpt2-124m" --plugin ddp --model huge
check "--global-batch 12: must be a multiple of --micro-batch x dp = 8" --plugin ddp --global-batch 12
check "--transport infiniband: must be one of mpi" --plugin ddp --transport infiniband
check "--mesh: ddp is data parallel only" --plugin ddp --mesh dp=1,tp=2 --nodes 1 --ranks-per-node 2
check "unrecognised option '--bogus'" --plugin ddp --bogus
check "--data /nonexistent: cannot open the file" --plugin ddp --data /nonexistent
check "--recompute some: must be one of none, full, selective" --plugin ddp --recompute some
check "--memory-limit lots: expected a size such as 80GiB" --plugin ddp --dry-run --memory-limit lots
check "--peak-tflops: must be >= 0" --plugin ddp --peak-tflops -1
# Model-parallel meshes (checked by the strategy before any rank starts).
check "--mesh tp=3: must divide the model's heads (4)" --plugin tp --mesh tp=3 --nodes 1 --ranks-per-node 3
check "--mesh tp=2: must divide the model's vocabulary" --plugin tp --mesh tp=2 --nodes 1 --ranks-per-node 2 --vocab 255
check "--mesh pp=2: tp has no pipeline" --plugin tp --mesh tp=2,pp=2 --nodes 1 --ranks-per-node 4
check "--mesh pp=4: the model has 2 layers, fewer than the 4 pipeline chunks" --plugin 1f1b --mesh pp=4 --nodes 1 --ranks-per-node 4
check "interleaved: micro-batches per step (1 = --global-batch / (--micro-batch x dp)) must be a multiple of pp (2)" --plugin interleaved --mesh pp=2 --nodes 1 --ranks-per-node 2 --layers 4
check "--plugin-opt stage_layers: needs 2 entries" --plugin gpipe --mesh pp=2 --nodes 1 --ranks-per-node 2 --plugin-opt stage_layers=1,2,3
check "--plugin-opt microbatches=4: the batch gives 1" --plugin 1f1b --mesh pp=2 --nodes 1 --ranks-per-node 2 --plugin-opt microbatches=4
check "--recompute full: 1f1b supports only none" --plugin 1f1b --mesh pp=2 --nodes 1 --ranks-per-node 2 --recompute full
left=$(find "$out" -type f | wc -l)
if [[ $left -ne 0 ]]; then echo "FAIL: $left file(s) left in $out"; fails=$((fails+1)); fi
echo "$((18 - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
