#!/usr/bin/env bash
# results/summary on a generated study: three good runs, a failed run, a truncated file and a file
# of another schema. The good runs are rows (values as in the files), the others are listed on
# stderr with their reason, and nothing crashes. Then the predicted step time and the replayed
# pipeline bubble of runs given --profile, as in their files.
# usage: summary.sh RESULTS_DIR E2E_DIR WORK_DIR
set -eu
tools=$1 e2e=$2 work=$3
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/study/sub"
cp "$e2e/reference.h5" "$e2e/ddp.np2.h5" "$work/study/"
cp "$e2e/tp.np2.h5" "$work/study/sub/"        # directories are searched recursively
cp "$e2e/fail.throw.h5" "$work/study/"
head -c 4096 "$e2e/ddp.np4.h5" > "$work/study/truncated.h5"
"$py" -c "import h5py; h5py.File('$work/study/other.h5', 'w').attrs['schema'] = 'other/9'"

fail() { echo "FAIL: $*"; exit 1; }
"$tools/summary" "$work/study" > "$work/out.txt" 2> "$work/err.txt" || fail "exit code $?"
cat "$work/out.txt" "$work/err.txt"
[[ $(sed '/^$/q' "$work/out.txt" | grep -c .) -eq 4 ]] || fail "expected a header and 3 rows"
for id in reference ddp.np2 tp.np2; do grep -q "^$id " "$work/out.txt" || fail "no row for $id"; done
grep -q "fail.throw.h5: status failed: rank 1: faulty plugin" "$work/err.txt" || fail "failed run not listed"
grep -q "truncated.h5: unreadable or partial" "$work/err.txt" || fail "truncated file not listed"
grep -q "other.h5: schema 'other/9'" "$work/err.txt" || fail "other schema not listed"

# --csv carries the file's own numbers.
"$tools/summary" --csv "$work/study/ddp.np2.h5" > "$work/out.csv"
"$py" - "$work/out.csv" "$work/study/ddp.np2.h5" <<'PY' || fail "csv values differ from the file"
import csv, sys, h5py
row = next(csv.DictReader(open(sys.argv[1])))
s = h5py.File(sys.argv[2])["summary"].attrs
assert row["strategy"] == "ddp" and row["ranks"] == "2", row
for k in ("tokens_per_s", "loss_first", "loss_last"):
    assert float(row[k]) == float(s[k]), (k, row[k], s[k])
assert float(row["mfu_pct"]) == 100 * float(s["mfu"]), (row["mfu_pct"], s["mfu"])  # percent
print("csv: values equal the run file's /summary")
PY
# A run given --profile: its predicted step time and error beside p50 (the others show "-").
cp "$work/study/ddp.np2.h5" "$work/predicted.h5"
"$py" -c "import h5py; s = h5py.File('$work/predicted.h5', 'r+')['summary'].attrs
s['step_s_predicted'] = 0.25; s['step_s_predicted_error'] = 0.125"
"$tools/summary" --csv "$work/predicted.h5" "$work/study/reference.h5" > "$work/pred.csv"
"$py" - "$work/pred.csv" <<'PY' || fail "predicted step time not in the table"
import csv, sys
rows = {r["run_id"]: r for r in csv.DictReader(open(sys.argv[1]))}
p = next(r for k, r in rows.items() if k != "reference")
assert float(p["step_ms_predicted"]) == 250.0 and float(p["predicted_error"]) == 0.125, p
assert rows["reference"]["step_ms_predicted"] == "" and rows["reference"]["predicted_error"] == ""
print("predicted: 250 ms, error 0.125; none for a run without --profile")
PY
# A pipeline given --profile: its replayed bubble beside the measured and the schedule's (the e2e
# runs have no --profile: the replay is written into a copy), "-" for a run without one.
cp "$e2e/1f1b.pp2.h5" "$work/replayed.h5"
"$py" -c "import h5py; h5py.File('$work/replayed.h5', 'r+')['summary'].attrs['bubble_fraction_replayed'] = 0.23"
"$tools/summary" --csv "$work/replayed.h5" "$work/study/reference.h5" > "$work/bubble.csv"
"$tools/summary" "$work/replayed.h5" "$work/study/reference.h5" > "$work/bubble.txt"
"$py" - "$work/bubble.csv" "$work/bubble.txt" "$work/replayed.h5" <<'PY' || fail "replayed bubble not in the table"
import csv, sys, h5py
rows = {r["run_id"]: r for r in csv.DictReader(open(sys.argv[1]))}
s = h5py.File(sys.argv[3])["summary"].attrs
pipe = rows["1f1b.pp2"]
for column, attr in (("bubble_fraction", "bubble_fraction"),
                     ("bubble_predicted", "bubble_fraction_predicted"),
                     ("bubble_replayed", "bubble_fraction_replayed")):
    assert float(pipe[column]) == float(s[attr]), (column, pipe[column], s[attr])
assert rows["reference"]["bubble_replayed"] == "", rows["reference"]
text = [line.split() for line in open(sys.argv[2]).read().split("\n\n")[0].splitlines()]
column = text[0].index("bubble_replayed")
assert text[0][column - 1] == "bubble_predicted", text[0]
cells = {line[0]: line[column] for line in text[1:]}
assert cells == {"1f1b.pp2": "%.4g" % s["bubble_fraction_replayed"], "reference": "-"}, cells
print("bubble: replayed %s beside predicted %s, as in the file; none for a run without --profile"
      % (pipe["bubble_replayed"], pipe["bubble_predicted"]))
PY
# Nothing usable: exit 1, but still no crash.
if "$tools/summary" "$work/study/truncated.h5" 2>/dev/null; then fail "exit 0 with no usable run"; fi
echo "summary: 3 runs, 3 files skipped with their reasons"
