#!/usr/bin/env bash
# runner --version prints the project version and git describe; every run file records both in
# /provenance; --log-interval N prints a progress line every N steps and at the last.
# usage: version_log.sh RUNNER OUTDIR PROJECT_VERSION
set -u
runner=$1 out=$2 project_version=$3
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
version=$("$runner" --version) || fail "runner --version exited $?"
[[ $version =~ ^runner:\ strata\ ([0-9.]+)\ \(git\ ([^\)]+)\)$ ]] || fail "runner --version: '$version'"
[[ ${BASH_REMATCH[1]} == "$project_version" ]] || fail "version ${BASH_REMATCH[1]}, CMake says $project_version"
describe=${BASH_REMATCH[2]}
echo "ok: $version"
export OPENBLAS_NUM_THREADS=1
# STRATA_VERSION and STRATA_HELP are not options from the environment (a module may set the first).
STRATA_VERSION=0.1 STRATA_HELP=1 "$runner" --plugin ddp --model tiny --steps 7 --warmup 1 --peak-tflops 1 \
  --log-interval 3 --out "$out" --run-id log3 > "$out/log3.txt" 2>&1 \
  || fail "run with --log-interval 3 (STRATA_VERSION=0.1 STRATA_HELP=1 set): $(tail -n 2 "$out/log3.txt")"
prov=$(/usr/bin/python3 -c 'import h5py, sys
a = h5py.File(sys.argv[1], "r")["provenance"].attrs
print(*(a[k].decode() if isinstance(a[k], bytes) else a[k] for k in ("strata_version", "git_describe")))' "$out/log3.h5") \
  || fail "no version in /provenance"
[[ $prov == "$project_version $describe" ]] || fail "/provenance says '$prov', runner --version '$project_version $describe'"
echo "ok: /provenance strata_version git_describe = $prov"
# Steps 3, 6 and the last (7): "step k/N | elapsed T | ETA T | loss L | X ms/step | Y tok/s | Z TFLOP/s/rank".
line='^step +([0-9]+)/7 \| elapsed [0-9.:]+s? \| ETA [0-9.:]+s? \| loss [0-9]+\.[0-9]{4} \| +[0-9.]+ ms/step \| +[0-9]+ tok/s \| [0-9]+\.[0-9]{3} TFLOP/s/rank$'
steps=$(grep -E "$line" "$out/log3.txt" | sed -E 's/^step +([0-9]+).*/\1/' | tr '\n' ' ')
[[ $steps == "3 6 7 " ]] || { cat "$out/log3.txt"; fail "progress lines at steps '$steps', expected '3 6 7 '"; }
[[ $(grep -c '^step ' "$out/log3.txt") -eq 3 ]] || fail "other step lines than the progress lines"
grep -E '^step +7/7 .*\| ETA 0\.0s \|' "$out/log3.txt" >/dev/null || fail "the last line's ETA is not 0"
# The mean loss of steps 4..6 is the mean of the run file's losses there.
want=$(/usr/bin/python3 -c 'import h5py, sys
f = h5py.File(sys.argv[1], "r")
import numpy as np
print("%.4f" % np.mean(f["steps/loss"][0, 3:6]))' "$out/log3.h5" 2>&1)
grep -qE "^step +6/7 .*\| loss $want \|" "$out/log3.txt" || { cat "$out/log3.txt"; fail "step 6's loss is not the mean of steps 4..6 ($want)"; }
grep -q "^summary\|^  compute" "$out/log3.txt" || fail "no final summary"
# Default: a line every step.
"$runner" --plugin ddp --model tiny --steps 3 --peak-tflops 1 --out "$out" --run-id log1 > "$out/log1.txt" 2>&1 \
  || fail "default run"
[[ $(grep -cE "$(sed 's#/7#/3#' <<<"$line")" "$out/log1.txt") -eq 3 ]] || { cat "$out/log1.txt"; fail "default: not one line per step"; }
echo "ok: --log-interval 3 prints steps 3 6 7 (mean loss of the interval), the default every step"
