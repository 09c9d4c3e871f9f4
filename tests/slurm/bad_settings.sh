#!/usr/bin/env bash
# Every study setting (environment or study file) is checked before any run: one line on stderr
# naming the setting, exit 2, nothing created. The local cluster refuses a --dir that is not a
# plain path (it ends up in slurm.conf and in daemons' command lines).
# usage: bad_settings.sh SOURCE_DIR RUNNER WORK_DIR
set -u
src=$1 runner=$2 work=$3
rm -rf "$work" && mkdir -p "$work/results"
fails=0 cases=0
check() {  # check KEY VALUE: STRATA_KEY=VALUE is refused
  local key=$1 value=$2 err code lines
  cases=$((cases + 1))
  err=$(env STRATA_RESULTS="$work/results" STRATA_RUNNER="$runner" "STRATA_$key=$value" \
    bash "$src/slurm/scale.sbatch" 2>&1 >/dev/null)
  code=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $code -ne 2 || $lines -ne 1 || $err != *"STRATA_$key"* ]]; then
    echo "FAIL: STRATA_$key='$value' -> exit $code, $lines line(s): $err"; fails=$((fails + 1))
  fi
}
for v in 0 -1 abc "" 1.5 99999999999999999999; do
  for k in RANKS_PER_NODE STEPS MICRO_BATCH GLOBAL_BATCH MICROBATCHES REPEATS; do check "$k" "$v"; done
done
for v in abc -5 "" 1e3; do check RESERVE_S "$v"; done
for v in ../x "a b" "" /abs .; do check STUDY "$v"; done
for v in strongest "" WEAK; do check MODE "$v"; done
for v in /nonexistent "" /etc/hostname; do check RUNNER "$v"; done
for v in infiniband "" "mpi,,ucx"; do check TRANSPORTS "$v"; done
for v in 0 2y "1,,2" "" x2 "2x0" 999999999999999999999; do check NODES "$v"; done
for v in nosuch "" "ddp,,zero1" ",ddp"; do check STRATEGIES "$v"; done
for v in huge "" "tiny,"; do check MODEL "$v"; done
for v in nosuch; do check TRACE "$v"; done
for v in random "" LISTED; do check ORDER "$v"; done
for v in abc -1 "" 1.5 9999999999; do check ORDER_SEED "$v"; done
for v in 3 "" "1,,2" 1x2; do check REPEAT_NODES "$v"; done
# A study file: an unknown key, a malformed line.
for line in "STRATA_STEPZ=3" "STEPS=3" "STRATA_STEPS 3" "STRATA_STEPS=0"; do
  cases=$((cases + 1))
  printf '%s\n' "$line" > "$work/bad.study"
  err=$(env STRATA_RESULTS="$work/results" STRATA_RUNNER="$runner" bash "$src/slurm/scale.sbatch" \
    "$work/bad.study" 2>&1 >/dev/null)
  code=$?
  if [[ $code -ne 2 || $(printf '%s\n' "$err" | grep -c .) -ne 1 || $err != *"bad.study"* && $err != *STRATA_STEPS* ]]; then
    echo "FAIL: study file line '$line' -> exit $code: $err"; fails=$((fails + 1))
  fi
done
left=$(find "$work/results" -mindepth 1 | wc -l)
cases=$((cases + 1))
if ((left)); then echo "FAIL: $left file(s) created in STRATA_RESULTS"; fails=$((fails + 1)); fi
cases=$((cases + 1))
err=$(bash "$src/slurm/local-cluster" status --dir "$work/x'; touch $work/pwned; '" 2>&1)
if [[ -e $work/pwned || $err != *"--dir"* ]]; then echo "FAIL: local-cluster --dir: $err"; fails=$((fails + 1)); fi
echo "$((cases - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
