#!/usr/bin/env bash
# GPU runs in the archive tools: a copy of a CPU run made a GPU one (/config device cuda, transport
# nccl) and a copy with no /config device (a file from before --device, read as cpu). summary and
# plot list each with its device; compare keeps cpu and cuda apart as configurations and, with
# --ignore device --ignore transport, compares them like any two runs.
# usage: device.sh RESULTS_DIR E2E_DIR WORK_DIR
set -eu
tools=$1 e2e=$2 work=$3
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/cpu" "$work/gpu"
cp "$e2e/ddp.np2.h5" "$work/cpu/ddp.old.h5"
cp "$e2e/ddp.np2.h5" "$work/gpu/ddp.cuda.h5"
"$py" - "$work/cpu/ddp.old.h5" "$work/gpu/ddp.cuda.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    assert f["config"].attrs["device"] in ("cpu", b"cpu"), f["config"].attrs["device"]
    del f["config"].attrs["device"]
with h5py.File(sys.argv[2], "r+") as f:
    c = f["config"].attrs
    dtype = c.get_id("device").dtype  # the runner's own string type
    c.create("device", "cuda", dtype=dtype)
    c.create("transport", "nccl", dtype=c.get_id("transport").dtype)
    f["summary"].attrs["tokens_per_s"] = f["summary"].attrs["tokens_per_s"] * 4
PY

fail() { echo "FAIL: $*"; exit 1; }
"$tools/summary" "$work/cpu" "$work/gpu" > "$work/summary.txt" || fail "summary exit $?"
cat "$work/summary.txt"
head -1 "$work/summary.txt" | grep -qE "^run_id +strategy +ranks +device +mesh " || fail "no device column"
grep -qE "^ddp\.np2 +ddp +2 +cpu +dp2" "$work/summary.txt" || fail "old file not listed as cpu"
grep -qE "^ddp\.np2 +ddp +2 +cuda +dp2" "$work/summary.txt" || fail "GPU run not listed as cuda"
"$tools/summary" --csv "$work/gpu" | grep -q ",2,cuda,dp2" || fail "csv has no device cuda"

# Apart by default: each configuration only on its own side, named with its device.
"$tools/compare" "$work/cpu" "$work/gpu" > "$work/apart.txt" || fail "compare exit $?"
cat "$work/apart.txt"
grep -qE "^ddp .* mpi cpu +- .*only in A$" "$work/apart.txt" || fail "cpu run not only in A"
grep -qE "^ddp .* nccl cuda +- .*only in B$" "$work/apart.txt" || fail "cuda run not only in B"
# Compared across devices: 4x the throughput, flagged faster, same memory and loss.
"$tools/compare" --ignore device --ignore transport "$work/cpu" "$work/gpu" > "$work/across.txt" \
  || fail "compare across devices exit $?"
cat "$work/across.txt"
grep -qE "^ddp .*\(n=1\).*\(n=1\) +- +\+300\.0% .*faster$" "$work/across.txt" \
  || fail "cpu vs cuda not compared"
"$tools/compare" --where-a device=cpu --where-b device=cuda --ignore device --ignore transport \
  "$work/cpu" "$work/gpu" | grep -q "1 configuration(s), 1 flagged" || fail "--where device"

"$tools/plot" --out "$work/figures" "$work/cpu" "$work/gpu" > /dev/null || fail "plot exit $?"
grep -q "<th>device</th>" "$work/figures/report.html" || fail "report has no device column"
grep -q "<td>cuda</td>" "$work/figures/report.html" || fail "report has no cuda run"
grep -q "<td>cpu</td>" "$work/figures/report.html" || fail "report has no cpu run"
echo "device: cuda and old (cpu) runs listed with their device, compared apart and across"
