#!/usr/bin/env bash
# STRATA_PROFILE=calibrate and the held-out checks, outside Slurm (bash slurm/scale.sbatch, as make
# run): the study calibrates one machine profile per node shape and micro-batch before its runs
# (and again at its end), runs each configuration three times, every run records its predicted
# step time and error, summary.txt and report.html state the prediction's accuracy and
# figures/prediction.png draws it; then scripts/heldout.sh makes a profile from each pair of ddp,
# zero1 and zero2 and predicts the other strategies from it. The accuracy has real bounds, loose
# enough for tiny's 4-7 ms steps on a shared 2-core machine (where one configuration's repeats
# spread by up to 40%, and 2-rank steps came out 25-50% off in one study of 2026-11-27) and tight
# enough that a predictor off by a quarter overall, or twice off on one configuration, fails:
#   against the repeats' median p50: median |error| <= 20%, every configuration within 75% (from
#   the start's calibration, or from the end's where the study says the machine moved between)
#   each held-out pair: median |error| <= 25% plus the median CV (step_cv_pct) of the pair's runs
#   the profile is fitted to (their noise is the profile's; the CI of 2026-11-30 saw 16% and
#   errors of 30%), every configuration within 100% (HELDOUT_LIMIT)
# The small model's study (make run) is where the accuracy figures are measured (CHANGELOG.md).
# usage: prediction.sh SOURCE_DIR RUNNER WORK_DIR
set -u
src=$1 runner=$2 work=$3
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh" "$work"
cat > "$work/p.study" <<STUDY
STRATA_STUDY=prediction
STRATA_STRATEGIES=ddp,zero1,zero2,zero3,1f1b
STRATA_NODES=1x1,1x2
STRATA_MODEL=tiny
STRATA_STEPS=8
STRATA_MODE=strong
STRATA_GLOBAL_BATCH=8
STRATA_MICRO_BATCH=4
STRATA_MICROBATCHES=2
STRATA_REPEATS=3
STRATA_PROFILE=calibrate
STRATA_RUNNER_ARGS=--warmup 2 --calibrate-comm
STUDY
run_study "$work/p.study"
out=$work/prediction
((code == 0)) && ok || fail "the study exited $code"
# One calibration per node shape and micro-batch: every run here has micro-batch 4 (1x2: dp 2 x
# 1 micro-batch of 4, or 1f1b's pp 2 x 2 micro-batches of 4).
for tag in tiny_n1x1_mb4_mpi tiny_n1x2_mb4_mpi; do
  [[ -f $out/profile.$tag.ok ]] && ok || fail "no calibration $tag ($(ls "$out" | grep '^profile' | tr '\n' ' '))"
done
# Two at the start into profile.h5, the same two again at the end into profile.end.h5.
[[ $(grep -c "scale: calibrate: .*--profile $out/profile.h5 " "$work/study.log") -eq 2 &&
  $(grep -c "scale: calibrate: .*--profile $out/profile.end.h5 " "$work/study.log") -eq 2 ]] && ok \
  || fail "want 2 calibrations at the start and 2 at the end"
grep -- "launch: .*--profile $out/profile.h5" "$work/study.log" | wc -l | grep -qx 30 && ok \
  || fail "want 30 runs given --profile"
# Every run has a predicted step and an error (summary --csv), and the notes say how well.
csv=$(/usr/bin/python3 "$src/results/summary" --csv "$out")
rows=$(awk -F, 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
  $col["step_ms_predicted"] ~ /^[0-9.]+$/ && $col["predicted_error"] ~ /^-?[0-9.e-]+$/' <<< "$csv" | wc -l)
((rows == 30)) && ok || fail "$rows of 30 runs with a predicted step and its error: $csv"
grep -qE "^  all: 30 run\(s\), median \|error\| [0-9.]+%, [0-9]+ within 10%, largest" "$out/summary.txt" \
  && ok || fail "summary.txt: no accuracy line: $(tail -n 3 "$out/summary.txt")"
grep -q '<ul id="prediction"><li>all: 30 run(s)' "$out/figures/report.html" && ok \
  || fail "report.html: no accuracy block"
# The bound: each configuration's prediction against its repeats' median p50. The runs were
# predicted from the calibration at the start; where the study says the machine moved between its
# two calibrations (beyond their spread: on CI on 2026-12-03 the 1-rank passes took 3.7 ms at the
# start and 2.7 at the end, and the start's predictions were 29% off, the held-out ones 5-7%), the
# runs lie between the two, and the same bound may instead hold from the end's calibration: each
# configuration's launch line as a dry run on profile.end.h5.
within_bound() { # reads "... median |error| M%, ... largest L% ..." lines; 0 when M <= 20 and L <= 75
  awk '{ for (i = 1; i <= NF; i++) { if ($i == "|error|") med = $(i + 1); if ($i == "largest") big = $(i + 1) } }
    END { sub(/%,?/, "", med); sub(/%,?/, "", big); exit !(med != "" && med + 0 <= 20 && big + 0 <= 75) }'
}
line=$(grep -E "^  configurations against their repeats' median p50" "$out/summary.txt")
if within_bound <<< "$line"; then
  ok
elif grep -qE "^  tiny .*\(moved\)$" "$out/summary.txt"; then
  end_line=$(/usr/bin/python3 - "$runner" "$work/study.log" "$out" <<'PY'
import csv, re, statistics, subprocess, sys
runner, log, out = sys.argv[1:4]
args = {}  # configuration -> its runner arguments, without the run's own paths and profile
for m in re.finditer(r"launch: \S+ (.*?) --out \S+ --run-id (\S+)_r\d+ ", open(log).read()):
    args[m.group(2)] = m.group(1).split()
measured = {}
for row in csv.DictReader(open(f"{out}/summary.csv")):
    measured.setdefault(re.sub(r"_r\d+$", "", row["run_id"]), []).append(float(row["step_ms_p50"]))
errors = []
for config, a in args.items():
    dry = subprocess.run([runner, *a, "--dry-run", "--profile", f"{out}/profile.end.h5"],
                         capture_output=True, text=True, check=True).stdout
    predicted = float(re.search(r"^  step +([0-9.]+) ms$", dry, re.M).group(1))
    errors.append(abs(predicted / statistics.median(measured[config]) - 1) * 100)
print(f"  from profile.end.h5: {len(errors)}, median |error| {statistics.median(errors):.1f}%, "
      f"largest {max(errors):.1f}%")
PY
  )
  echo "the machine moved during the study; $line; $end_line"
  within_bound <<< "$end_line" && ok \
    || fail "prediction against the repeats' median beyond its bound (median 20%, largest 75%) from both calibrations: $line; $end_line"
else
  fail "prediction against the repeats' median beyond its bound (median 20%, largest 75%): $line"
fi
grep -q "Calibration at the start (profile.h5) and the end (profile.end.h5)" "$out/summary.txt" && ok \
  || fail "summary.txt: no calibration drift lines"
[[ -s $out/figures/prediction.png ]] && ok || fail "no figures/prediction.png"
# The profile is no run: summary reads the directory without a complaint about it.
/usr/bin/python3 "$src/results/summary" "$out" 2>&1 >/dev/null | grep -q "profile.h5" \
  && fail "summary complains about profile.h5" || ok

# The held-out checks: each pair of ddp, zero1 and zero2 makes a profile that predicts the others.
for pair in ddp,zero1 ddp,zero2 zero1,zero2; do
  name=heldout-${pair/,/-}
  STRATA_RUNNER=$runner HELDOUT_TRAIN=$pair HELDOUT_NAME=$name HELDOUT_LIMIT=100 \
    bash "$src/scripts/heldout.sh" "$out" > "$work/$name.out" 2>&1
  code=$?
  cat "$work/$name.out"
  ((code == 0)) && ok || fail "heldout.sh $pair exited $code (a configuration beyond 100%?)"
  [[ $(grep -cE "^tiny_[a-z0-9]+_n1x[12]_strong +[0-9.]+ +[0-9.]+ +[-+][0-9.]+%$" "$out/$name.txt") -eq 6 ]] \
    && ok || fail "$name.txt: want 6 predicted configurations (the 3 other strategies x 2 shapes)"
  verdict=$(grep -E "^held-out: 6 configuration\(s\) predicted" "$out/$name.txt")
  # The profile is fitted to the pair's runs: their steps' own variation (the median of their
  # step_cv_pct) widens the bound; on a quiet machine (CV ~2%) it stays about 25%.
  cv=$(awk -F, -v pair=",$pair," 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
    index(pair, "," $col["strategy"] ",") { print $col["step_cv_pct"] }' <<< "$csv" | sort -g |
    awk '{ v[++n] = $1 } END { print n ? (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) : -1 }')
  awk -v cv="$cv" '{ m = $7; sub(/%,?/, "", m); exit !(cv >= 0 && m != "" && m + 0 <= 25 + cv) }' \
    <<< "$verdict" && ok || fail "$pair: median |error| beyond 25% + the runs' median CV $cv%: $verdict"
done
grep -q "a compute entry from its phase timers" "$out/heldout-ddp-zero2.log" && ok || fail "no compute entry from a run"
grep -q "new memory .* (fitted to its sharded runs' steps)" "$out/heldout-ddp-zero2.log" && ok \
  || fail "no new-buffer rate fitted: $(cat "$out/heldout-ddp-zero2.log")"
grep -q "heldout: fresh_memory_s_per_byte of .* from the calibration" "$out/heldout-ddp-zero1.log" && ok \
  || fail "ddp and zero1 cannot fit the new-buffer rate: it should come from the calibration"
# A study without the training runs is a usage error (exit 2), not a pass.
HELDOUT_TRAIN=fsdp STRATA_RUNNER=$runner bash "$src/scripts/heldout.sh" "$out" > /dev/null 2>&1
(($? == 2)) && ok || fail "no fsdp runs: want exit 2"
finish
