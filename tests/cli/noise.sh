#!/usr/bin/env bash
# The timed steps' noise figures in /summary (step_s_cv, step_s_p5, the median's 95% interval)
# equal what the run file's own step times give, --max-cv marks a run unstable (/summary
# unstable, the runner's warning line, /config max_cv), and --target-ci stops the steps once
# the median is pinned down.
# usage: noise.sh RUNNER OUTDIR
set -u
runner=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
export OPENBLAS_NUM_THREADS=1
run() {  # run ID [OPTIONS...]
  local id=$1
  shift
  "$runner" --plugin ddp --model tiny --warmup 2 --peak-tflops 1 --quiet --out "$out" \
    --run-id "$id" "$@" > "$out/$id.txt" 2>&1 || fail "run $id: $(tail -n 2 "$out/$id.txt")"
}
run strict --steps 12 --max-cv 0
run lenient --steps 12 --max-cv 1e9
for id in strict lenient; do
  /usr/bin/python3 - "$out/$id.h5" "$id" <<'PY' || fail "$id: /summary noise figures"
import sys
import h5py
import numpy as np
f = h5py.File(sys.argv[1], "r")
s, c = f["summary"].attrs, f["config"].attrs
steps = f["steps/step_s"][:].max(axis=0)[2:]  # the slowest rank's time per timed step
assert len(steps) == 10, steps
cv = steps.std(ddof=1) / steps.mean()
assert abs(s["step_s_cv"] - cv) <= 1e-12 * cv, (s["step_s_cv"], cv)
assert abs(s["step_s_p5"] - np.percentile(steps, 5)) <= 1e-15, s["step_s_p5"]
low, high = np.sort(steps)[[1, 8]]  # n 10: P(B(10, 1/2) <= 1) = 1.07% -> x(2), x(9)
assert (s["step_s_p50_ci_low"], s["step_s_p50_ci_high"]) == (low, high), (low, high)
assert s["step_s_p5"] <= s["step_s_p50"] <= s["step_s_p95"]
want = 1.0 if sys.argv[2] == "strict" else 0.0
assert s["unstable"] == want and s["unstable.unit"] in (b"1", "1"), s["unstable"]
max_cv = c["max_cv"].decode() if isinstance(c["max_cv"], bytes) else str(c["max_cv"])
assert float(max_cv) == (0.0 if want else 1e9), max_cv
print("%s: CV %.2f%%, median interval %.3f-%.3f ms, unstable %d"
      % (sys.argv[2], 100 * cv, 1e3 * low, 1e3 * high, want))
PY
done
grep -q "^  warning      unstable: the step time varies by CV [0-9.]*% > --max-cv 0.0%" "$out/strict.txt" \
  || { cat "$out/strict.txt"; fail "no unstable warning with --max-cv 0"; }
grep -q "unstable" "$out/lenient.txt" && fail "an unstable warning with --max-cv 1e9"
grep -qE "^  noise        CV [0-9.]+% of the timed steps, p5 [0-9.]+ ms, median's 95% interval [0-9.]+-[0-9.]+ ms$" \
  "$out/lenient.txt" || { cat "$out/lenient.txt"; fail "no noise line"; }
# The archive tools: the CV column, and the caveat (summary.txt and report.html share it) naming
# the unstable run only.
table=$(/usr/bin/python3 "$(dirname "$0")/../../results/summary" "$out") || fail "results/summary"
echo "$table" | grep -q "step_cv_pct" || fail "no step_cv_pct column: $table"
echo "$table" | grep -qE "^  - unstable: .*--max-cv \(0%\).*: strict \(CV [0-9.]+%\)$" \
  || { echo "$table"; fail "no unstable caveat naming strict alone"; }
# --target-ci: the run stops at the first step whose timed steps' median interval is within
# +-1% of the median (from 6 timed steps), never before, at most at --steps; /config steps is the
# width of /steps, steps_requested the bound.
run settle --steps 300 --target-ci 0.01
/usr/bin/python3 - "$out/settle.h5" <<'PY' || fail "--target-ci: stopped at the wrong step"
import math
import sys
import h5py
import numpy as np
f = h5py.File(sys.argv[1], "r")
c = f["config"].attrs
steps = f["steps/step_s"][:].max(axis=0)
n = len(steps)
assert c["steps"] == n and c["steps_requested"] == 300 and c["target_ci"] == 0.01, dict(c)


def settled(times):  # the runner's rule (summary.hpp step_noise), from the binomial tail
    m = len(times)
    k, tail = 0, 0.0
    while k < m // 2 and tail + math.comb(m, k) / 2.0**m <= 0.025:
        tail += math.comb(m, k) / 2.0**m
        k += 1
    if k == 0:
        return False
    x = np.sort(times)
    p50 = np.percentile(times, 50)
    return max(p50 - x[k - 1], x[m - k] - p50) <= 0.01 * p50


stops = [j for j in range(3, n + 1) if settled(steps[2:j])]
assert stops[:1] == [n] or (not stops and n == 300), (n, stops[:3])
print("--target-ci 0.01: stopped after %d of 300 steps" % n)
PY
grep -qE "^  steps        ([0-9]+ of --steps 300: the median's interval came within \+-1%|all 300: )" \
  "$out/settle.txt" || { cat "$out/settle.txt"; fail "no steps line for --target-ci"; }
echo "ok: noise figures, --max-cv and --target-ci"
