#!/usr/bin/env bash
# A CPU profile calibrated on one model shape predicts a run of another (issue 27 item 6): the
# profile of `small` (h 256, 4 layers) with its GEMM sweep predicts ddp on h 384, 6 layers within
# 15% of the median of three runs' step p50. Before the sweep such a profile had no time model for
# another shape; FLOP-proportional scaling at small's achieved rate is what the sweep replaces.
#   predict_shape.sh RUNNER SCRATCH_DIR
set -eu
runner=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
profile=$dir/small.h5
"$runner" --calibrate --profile "$profile" --model small --micro-batch 8 >"$dir/calibrate.txt" 2>&1 \
  || { cat "$dir/calibrate.txt"; fail "calibrate"; }
grep -qE "^  GEMM sweep forward +25 shapes: " "$dir/calibrate.txt" || { cat "$dir/calibrate.txt"; fail "no sweep"; }
shape=(--plugin ddp --model small --hidden 384 --layers 6 --micro-batch 8)
out=$("$runner" --dry-run --profile "$profile" "${shape[@]}")
grep -q "carried from the small entry (h 256, 4 layers) by its GEMM sweep" <<<"$out" \
  || { echo "$out"; fail "not carried by the sweep"; }
for i in 1 2 3; do
  "$runner" "${shape[@]}" --steps 8 --warmup 2 --profile "$profile" --quiet --out "$dir" \
    --run-id "run$i" >"$dir/run$i.txt" 2>&1 || { cat "$dir/run$i.txt"; fail "run $i"; }
done
/usr/bin/python3 - "$profile" "$dir"/run{1,2,3}.h5 <<'PY'
import statistics, sys, h5py
profile, runs = sys.argv[1], sys.argv[2:]
g = h5py.File(profile)["gemm"]
assert len(g["m"]) == 50 and (g["time_s"][:] > 0).all(), len(g["m"])  # 5 hiddens x 5 linears x 2
predicted = {h5py.File(r)["summary"].attrs["step_s_predicted"] for r in runs}
assert len(predicted) == 1, predicted  # one profile, one prediction
predicted = predicted.pop()
p50 = [h5py.File(r)["summary"].attrs["step_s_p50"] for r in runs]
measured = statistics.median(p50)
error = predicted / measured - 1
print(f"predict_shape: h 384 x 6 layers from small's profile: predicted {1e3 * predicted:.1f} ms, "
      f"measured {', '.join(f'{1e3 * x:.1f}' for x in p50)} ms (median {1e3 * measured:.1f}): "
      f"{100 * error:+.1f}%")
assert abs(error) <= 0.15, f"prediction {100 * error:+.1f}% off the runs' median (bound 15%)"
PY
