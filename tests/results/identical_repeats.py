#!/usr/bin/python3
"""results/plot on studies of 10 identical repeats (copies of one run file, run ids rep0..rep9):
the throughput error bars (the median's interval) are exactly zero, never negative. The
float mean of 10 equal values can lie an ulp below (255813.95671368227) or above
(3103.947297759582) the value itself, which made matplotlib refuse a negative bar; both are tried.
summary lists the 10 runs and compare of a study with itself finds no difference.
usage: identical_repeats.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from archive_tool import import_tool  # noqa: E402
tools, e2e, work = sys.argv[1:4]
VALUES = {"below": 255813.95671368227, "above": 3103.947297759582}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(*args):
    p = subprocess.run([os.path.join(tools, args[0])] + list(args[1:]), capture_output=True,
                       text=True, timeout=300)
    print("$ %s -> %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    if p.returncode != 0 or "Traceback" in p.stderr:
        fail("%s: exit %d" % (" ".join(args), p.returncode))
    return p


plot = import_tool(tools, "plot")

shutil.rmtree(work, ignore_errors=True)
for side, value in VALUES.items():
    # The premise: the float mean of these 10 equal values is not the value.
    if float(np.mean([value] * 10)) == value:
        fail("%r: the mean of 10 copies is exact; pick another value" % value)
    study = os.path.join(work, side)
    os.makedirs(study)
    for i in range(10):
        path = os.path.join(study, "rep%d.h5" % i)
        shutil.copyfile(os.path.join(e2e, "ddp.np2.h5"), path)
        with h5py.File(path, "r+") as f:
            f.attrs["run_id"] = "rep%d" % i
            f["summary"].attrs["tokens_per_s"] = value
    p = run("plot", study)
    if not os.path.getsize(os.path.join(study, "figures", "throughput.png")):
        fail("no throughput.png")
    runs, skipped = plot.load([study])
    series = plot.throughput_series(runs)
    if len(runs) != 10 or skipped or list(series) != ["ddp"]:
        fail("expected 10 runs of one series, got %d runs, %s" % (len(runs), list(series)))
    x, mean, below, above = series["ddp"]
    if list(x) != [2.0] or mean[0] != value or below[0] != 0.0 or above[0] != 0.0:
        fail("%s: x %s mean %r bars %r %r, want the value and bars 0"
             % (side, x, mean[0], below[0], above[0]))
    p = run("summary", study)
    if len(p.stdout.split("\n\n")[0].splitlines()) != 11:  # the table, above the notes
        fail("summary: expected a header and 10 rows")
    p = run("compare", "--strict", study, study)
    if "(n=10)" not in p.stdout or "no difference" not in p.stdout:
        fail("compare of 10 identical repeats with themselves")
print("identical repeats: 2 studies of 10 plotted, error bars exactly 0")
