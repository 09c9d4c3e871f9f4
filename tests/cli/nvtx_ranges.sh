#!/usr/bin/env bash
# The profiler ranges of a CUDA run (NVTX; on the CUDA emulator recorded in a log,
# STRATA_CUDA_EMU_NVTX_LOG): every step, micro-batch, phase and comm call opens a range named as
# the --trace timeline names it, on every rank, and every range opened is closed. A tensor-parallel
# run (all-reduces on the tp group) and a pipeline (sends and receives on the pp group).
#   nvtx_ranges.sh RUNNER_EMU SCRATCH_DIR
set -eu
runner=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
common=(--model tiny --layers 2 --micro-batch 2 --global-batch 4 --steps 2 --warmup 1 --quiet
        --device cuda --transport nccl --peak-tflops 0.01 --ranks-per-node 2 --out "$dir")
# range_check LOG NAME...: each NAME opened by both ranks (two process ids), every start ended.
range_check() {
  local log=$1
  shift
  for name in "$@"; do
    local pids
    pids=$(grep -E "^start [0-9]+:[0-9]+ ${name}\$" "$log" | cut -d' ' -f2 | cut -d: -f1 | sort -u |
             wc -l)
    [ "$pids" = 2 ] || fail "range '$name' opened by $pids ranks, not 2 ($log)"
  done
  local opened closed
  opened=$(grep -c '^start ' "$log")
  closed=$(grep '^end ' "$log" | cut -d' ' -f2 | sort -u | wc -l)
  [ "$opened" = "$closed" ] || fail "$opened ranges opened, $closed closed ($log)"
}
STRATA_CUDA_EMU_NVTX_LOG="$dir/tp.log" "$runner" --plugin tp --mesh tp=2 --run-id tp "${common[@]}" \
  > "$dir/tp.txt" 2>&1 || { cat "$dir/tp.txt"; fail "tp run"; }
range_check "$dir/tp.log" "step 0" "step 1" "micro_batch 0" "micro_batch 1" forward backward \
  optimizer "all_reduce tp"
STRATA_CUDA_EMU_NVTX_LOG="$dir/pp.log" "$runner" --plugin 1f1b --mesh pp=2 --run-id pp \
  "${common[@]}" > "$dir/pp.txt" 2>&1 || { cat "$dir/pp.txt"; fail "1f1b run"; }
range_check "$dir/pp.log" "step 0" "step 1" forward backward optimizer "send pp" "recv pp"
echo "nvtx ranges: tp $(grep -c '^start ' "$dir/tp.log"), 1f1b $(grep -c '^start ' "$dir/pp.log")"
