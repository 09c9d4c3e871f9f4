#!/usr/bin/env bash
# A CPU profile calibrated on one model shape predicts a run of another (issue 27 item 6): the
# profile of `small` (h 256, 4 layers) with its GEMM sweep carries to ddp on h 384, 6 layers. Before
# the sweep such a profile had no time model for another shape; FLOP-proportional scaling at
# small's achieved rate is what the sweep replaces.
#   predict_shape.sh RUNNER SCRATCH_DIR
# The bound is on the carry, measured as a ratio in one window: the carried prediction's error
# against the fastest of three runs' step p50, divided by the calibrated shape's own (small's
# prediction against three runs of small, interleaved with the others), within 15%. The machine's
# speed between the calibration and the runs cancels in the ratio: on CI on 2026-12-03/04 it moved
# by a fifth (predictions of 568 and 615 ms against runs of 466 and 492), failing a bound on the
# error alone. The fastest run, not the median: a busy machine only adds time, and on 2026-12-04
# a loaded one measured small at 373/361/291 ms and the carried shape at 813/735/671, a ratio of
# medians of +17.0% and of minima of +3.3%. The carried error itself is held to 50%, a gross
# bound (a unit slip, a lost pass).
# The ratio cannot cancel a calibration disturbed while it ran: on CI on 2026-12-06 one whose
# rounds spread 47.5% measured the sweep at 132 GFLOP/s at most (185-189 in the two calibrations
# before it, spread 6% and 22%), and the carry came out +27.4%. So a calibration whose rounds
# spread more than 25% is made again, at most three in all, and the steadiest is used, as a user
# would redo a calibration that reports such a spread. Nor one slowed evenly: on 2026-12-07, alone
# on the machine, a calibration whose rounds spread 1.4% predicted small at 275.5 ms and the runs
# after it took 176.9-193.0 ms (+55.8%; the carry +4.6%). When both shapes miss their predictions
# by more than the gross bound the same way and the carry holds, calibration and runs are made
# once more; a predictor that is off stays off and fails.
set -eu
runner=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
# measure: in $work, the steadiest of up to three calibrations of small, then three runs of each
# shape.
measure() {
  best='' best_spread=''
  for attempt in 1 2 3; do
    log=$work/calibrate$attempt.txt
    "$runner" --calibrate --profile "$work/small$attempt.h5" --model small --micro-batch 8 >"$log" 2>&1 \
      || { cat "$log"; fail "calibrate"; }
    grep -qE "^  GEMM sweep forward +25 shapes: " "$log" || { cat "$log"; fail "no sweep"; }
    spread=$(grep -oE "rounds' spread [0-9.]+%" "$log" | grep -oE "[0-9.]+") || { cat "$log"; fail "no spread"; }
    echo "predict_shape: calibration $attempt: rounds' spread $spread%"
    if [[ -z $best ]] || awk -v a="$spread" -v b="$best_spread" 'BEGIN { exit !(a < b) }'; then
      best=$attempt best_spread=$spread
    fi
    awk -v a="$spread" 'BEGIN { exit !(a <= 25) }' && break
  done
  profile=$work/small$best.h5
  carried=(--plugin ddp --model small --hidden 384 --layers 6 --micro-batch 8)
  calibrated=(--plugin ddp --model small --micro-batch 8)
  out=$("$runner" --dry-run --profile "$profile" "${carried[@]}")
  grep -q "carried from the small entry (h 256, 4 layers) by its GEMM sweep" <<<"$out" \
    || { echo "$out"; fail "not carried by the sweep"; }
  out=$("$runner" --dry-run --profile "$profile" "${calibrated[@]}")
  grep -q "carried from" <<<"$out" && { echo "$out"; fail "small's own shape carried"; }
  for i in 1 2 3; do
    for shape in calibrated carried; do
      declare -n args=$shape
      "$runner" "${args[@]}" --steps 8 --warmup 2 --profile "$profile" --quiet --out "$work" \
        --run-id "$shape$i" >"$work/$shape$i.txt" 2>&1 || { cat "$work/$shape$i.txt"; fail "$shape run $i"; }
    done
  done
}
# check: the carry's bound and the gross bound; 3 when both shapes missed alike (see above).
check() {
  /usr/bin/python3 - "$profile" "$work" <<'PY'
import sys, h5py
profile, dir = sys.argv[1:3]
g = h5py.File(profile)["gemm"]
assert len(g["m"]) == 50 and (g["time_s"][:] > 0).all(), len(g["m"])  # 5 hiddens x 5 linears x 2
def error(shape):
    runs = [h5py.File(f"{dir}/{shape}{i}.h5")["summary"].attrs for i in (1, 2, 3)]
    predicted = {r["step_s_predicted"] for r in runs}
    assert len(predicted) == 1, predicted  # one profile, one prediction
    predicted, p50 = predicted.pop(), [r["step_s_p50"] for r in runs]
    print(f"predict_shape: {shape}: predicted {1e3 * predicted:.1f} ms, measured "
          f"{', '.join(f'{1e3 * x:.1f}' for x in p50)} ms: {100 * (predicted / min(p50) - 1):+.1f}% of the fastest")
    return predicted / min(p50)
calibrated, carried = error("calibrated"), error("carried")
carry = carried / calibrated - 1
print(f"predict_shape: h 256 x 4 layers carried to h 384 x 6 layers: {100 * carry:+.1f}% beyond small's own error")
assert abs(carry) <= 0.15, f"the carry {100 * carry:+.1f}% off (bound 15%)"
if abs(carried - 1) > 0.50 and abs(calibrated - 1) > 0.50 and (carried > 1) == (calibrated > 1):
    print(f"predict_shape: both shapes {100 * (calibrated - 1):+.1f}% and {100 * (carried - 1):+.1f}% "
          "off their predictions: the machine moved between the calibration and the runs")
    sys.exit(3)
assert abs(carried - 1) <= 0.50, f"the carried prediction {100 * (carried - 1):+.1f}% off (gross bound 50%)"
PY
}
for try in 1 2; do
  work=$dir/try$try
  mkdir -p "$work"
  measure
  rc=0
  check || rc=$?
  ((rc == 0)) && exit 0
  ((rc == 3 && try == 1)) || fail "the predictions (attempt $try)"
  echo "predict_shape: calibrating and running again"
done
