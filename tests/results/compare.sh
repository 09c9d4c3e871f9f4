#!/usr/bin/env bash
# results/compare on two generated studies with 3 repeats per configuration: ddp made 2x slower in
# B (flagged: the intervals of the medians are apart), tp within its repeat noise (no difference:
# they overlap), the reference only in B, a truncated file
# skipped. --strict turns a flag into exit code 3.
# usage: compare.sh RESULTS_DIR E2E_DIR WORK_DIR
set -eu
tools=$1 e2e=$2 work=$3
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/a" "$work/b"
# repeat SRC DIR NAME SCALE...: copies of SRC whose tokens/s are scaled, one per SCALE.
repeat() {
  local src=$1 dir=$2 name=$3; shift 3
  local i=0
  for scale in "$@"; do
    cp "$src" "$dir/$name.$i.h5"
    "$py" -c "import h5py; s = h5py.File('$dir/$name.$i.h5', 'r+')['summary'].attrs; s['tokens_per_s'] = s['tokens_per_s'] * $scale"
    i=$((i + 1))
  done
}
repeat "$e2e/ddp.np2.h5" "$work/a" ddp 1.0 1.01 0.99
repeat "$e2e/tp.np2.h5" "$work/a" tp 1.0 1.01 0.99
repeat "$e2e/ddp.np2.h5" "$work/b" ddp 0.5 0.505 0.495
repeat "$e2e/tp.np2.h5" "$work/b" tp 1.005 0.995 1.0
cp "$e2e/reference.h5" "$work/b/"
head -c 4096 "$e2e/ddp.np4.h5" > "$work/b/truncated.h5"

fail() { echo "FAIL: $*"; exit 1; }
"$tools/compare" "$work/a" "$work/b" > "$work/out.txt" 2> "$work/err.txt" || fail "exit $?"
cat "$work/out.txt" "$work/err.txt"
grep -E "^ddp .*\(n=3\) +\[.*\] 75% +.*\(n=3\) .* -50\.0% +SLOWER$" "$work/out.txt" || fail "ddp not flagged slower"
grep -E "^tp .*\(n=3\).*no difference$" "$work/out.txt" || fail "tp flagged although within noise"
grep -E "^dp .*only in B$" "$work/out.txt" || fail "reference not listed as only in B"
grep -q "3 configuration(s), 1 flagged" "$work/out.txt" || fail "count line"
grep -q "truncated.h5: unreadable or partial" "$work/err.txt" || fail "truncated file not listed"
set +e
"$tools/compare" --strict "$work/a" "$work/b" > /dev/null 2>&1; code=$?
"$tools/compare" --strict "$work/a" "$work/a" > /dev/null 2>&1; same=$?
set -e
[[ $code -eq 3 && $same -eq 0 ]] || fail "--strict exit codes $code (want 3) and $same (want 0)"
echo "compare: regression flagged beyond noise, noise-level change not flagged"
