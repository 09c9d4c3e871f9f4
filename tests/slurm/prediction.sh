#!/usr/bin/env bash
# STRATA_PROFILE=calibrate and the held-out check, outside Slurm (bash slurm/scale.sbatch, as make
# run): the study calibrates one machine profile per node shape and micro-batch before its runs,
# every run records its predicted step time and error, summary.txt and report.html state the
# prediction's accuracy and figures/prediction.png draws it; then scripts/heldout.sh makes a
# profile from the ddp and zero2 runs alone and predicts zero3 from it. Timings on a shared
# machine: the errors are checked to be numbers, not to be small (that is the study's report).
# usage: prediction.sh SOURCE_DIR RUNNER WORK_DIR
set -u
src=$1 runner=$2 work=$3
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh" "$work"
cat > "$work/p.study" <<STUDY
STRATA_STUDY=prediction
STRATA_STRATEGIES=ddp,zero2,zero3,1f1b
STRATA_NODES=1x1,1x2
STRATA_MODEL=tiny
STRATA_STEPS=5
STRATA_MODE=strong
STRATA_GLOBAL_BATCH=8
STRATA_MICRO_BATCH=4
STRATA_MICROBATCHES=2
STRATA_PROFILE=calibrate
STRATA_RUNNER_ARGS=--warmup 1 --calibrate-comm
STUDY
run_study "$work/p.study"
out=$work/prediction
((code == 0)) && ok || fail "the study exited $code"
# One calibration per node shape and micro-batch: every run here has micro-batch 4 (1x2: dp 2 x
# 1 micro-batch of 4, or 1f1b's pp 2 x 2 micro-batches of 4).
for tag in tiny_n1x1_mb4_mpi tiny_n1x2_mb4_mpi; do
  [[ -f $out/profile.$tag.ok ]] && ok || fail "no calibration $tag ($(ls "$out" | grep '^profile' | tr '\n' ' '))"
done
[[ $(grep -c "scale: calibrate: " "$work/study.log") -eq 2 ]] && ok || fail "want 2 calibrations"
grep -- "launch: .*--profile $out/profile.h5" "$work/study.log" | wc -l | grep -qx 8 && ok \
  || fail "want 8 runs given --profile"
# Every run has a predicted step and an error (summary --csv), and the notes say how well.
csv=$(/usr/bin/python3 "$src/results/summary" --csv "$out")
rows=$(awk -F, 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
  $col["step_ms_predicted"] ~ /^[0-9.]+$/ && $col["predicted_error"] ~ /^-?[0-9.e-]+$/' <<< "$csv" | wc -l)
((rows == 8)) && ok || fail "$rows of 8 runs with a predicted step and its error: $csv"
grep -qE "^  all: 8 run\(s\), median \|error\| [0-9.]+%, [0-8] within 10%, largest" "$out/summary.txt" \
  && ok || fail "summary.txt: no accuracy line: $(tail -n 3 "$out/summary.txt")"
grep -q '<ul id="prediction"><li>all: 8 run(s)' "$out/figures/report.html" && ok \
  || fail "report.html: no accuracy block"
[[ -s $out/figures/prediction.png ]] && ok || fail "no figures/prediction.png"
# The profile is no run: summary reads the directory without a complaint about it.
/usr/bin/python3 "$src/results/summary" "$out" 2>&1 >/dev/null | grep -q "profile.h5" \
  && fail "summary complains about profile.h5" || ok

# The held-out check: ddp and zero2 make the profile, zero3 and 1f1b are predicted.
STRATA_RUNNER=$runner HELDOUT_LIMIT=1000 bash "$src/scripts/heldout.sh" "$out" > "$work/heldout.out" 2>&1
code=$?
cat "$work/heldout.out"
((code == 0)) && ok || fail "heldout.sh exited $code"
grep -q "a compute entry from its phase timers" "$out/heldout.log" && ok || fail "no compute entry from a run"
grep -q "new memory .* (fitted to its sharded runs' steps)" "$out/heldout.log" && ok \
  || fail "no new-buffer rate fitted: $(cat "$out/heldout.log")"
[[ $(grep -cE "^tiny_(zero3|1f1b)_n1x[12]_strong_r1 +[0-9.]+ +[0-9.]+ +[-+][0-9.]+%$" "$out/heldout.txt") -eq 4 ]] \
  && ok || fail "heldout.txt: want 4 predicted runs"
grep -qE "^held-out: 4 run\(s\) predicted, median \|error\| [0-9.]+%, 0 beyond 1000%$" "$out/heldout.txt" \
  && ok || fail "heldout.txt: no verdict"
# A study without the training runs is a usage error (exit 2), not a pass.
HELDOUT_TRAIN=fsdp STRATA_RUNNER=$runner bash "$src/scripts/heldout.sh" "$out" > /dev/null 2>&1
(($? == 2)) && ok || fail "no fsdp runs: want exit 2"
finish
