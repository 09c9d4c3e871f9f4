#!/usr/bin/python3
"""results/plot's timeline of a traced run shows every rank's whole last step: for each rank, the
forward and backward intervals drawn (plot --timeline-json writes them beside the figure) are
exactly that rank's intervals of the last step in the file's /trace (the last forwards-per-step
of them), none missing and none of an earlier step. Checked on the traced 4-stage gpipe run, and
on a copy of it in which one rank's whole trace is moved earlier, so that its last step begins
before rank 0's previous optimizer ends (a faster rank): a window common to all ranks, starting
at rank 0's step, drops that rank's first forward (the defect this test guards against; on the
gpipe run itself that window drew 3, 1 and 5 of the 8 forwards of ranks 1, 2 and 3); and on a
copy of that in which the moved rank has no optimizer intervals (as dp's ranks other than 0).
usage: plot_timeline.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.dont_write_bytecode = True
tools, e2e, work = sys.argv[1:4]
PHASES = ("forward", "backward")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def trace_of(path):
    with h5py.File(path, "r") as f:
        t = f["trace"]
        steps = f["steps/loss"].shape[1]
        text = {k: [v.decode() if isinstance(v, bytes) else str(v) for v in t[k][()]]
                for k in ("stream", "kind")}
        return steps, t["rank"][()].astype(int), text["kind"], t["t0"][()], t["t1"][()]


def last_step(path):
    """{(rank, phase): sorted t0 of the rank's last-step intervals of that phase}, from /trace."""
    steps, rank, kind, t0, _ = trace_of(path)
    want = {}
    for r in sorted(set(rank)):
        for phase in PHASES:
            starts = sorted(t0[i] for i in range(len(t0)) if rank[i] == r and kind[i] == phase)
            if len(starts) % steps:
                fail("rank %d: %d %s intervals for %d steps" % (r, len(starts), phase, steps))
            want[(r, phase)] = starts[-(len(starts) // steps):]
    return want


def drawn(path, out):
    """{(rank, phase): sorted t0 drawn} from plot --timeline-json on the one file."""
    with h5py.File(path, "r") as f:
        run_id = f.attrs["run_id"]
        run_id = run_id.decode() if isinstance(run_id, bytes) else str(run_id)
    p = subprocess.run([os.path.join(tools, "plot"), "--timeline-json", "--out", out, path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail("plot exit %d: %s" % (p.returncode, p.stderr))
    with open(os.path.join(out, "timeline-%s.json" % run_id)) as f:
        data = json.load(f)
    got = {}
    for e in data["intervals"]:
        if e["kind"] in PHASES:
            got.setdefault((e["rank"], e["kind"]), []).append(e["t0"])
    return {k: sorted(v) for k, v in got.items()}


def check(path, out):
    want, got = last_step(path), drawn(path, out)
    for key, starts in sorted(want.items()):
        if got.get(key, []) != starts:
            fail("%s: rank %d %s: drawn %s, the last step has %s"
                 % (os.path.basename(path), key[0], key[1],
                    ["%.2f ms" % (t * 1e3) for t in got.get(key, [])],
                    ["%.2f ms" % (t * 1e3) for t in starts]))
    n = sum(len(v) for k, v in want.items() if k[1] == "forward")
    print("%s: every rank's %d forward(s) and backward(s) of the last step drawn, no other"
          % (os.path.basename(path), n))


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
source = os.path.join(e2e, "gpipe.pp4.h5")
check(source, os.path.join(work, "figures"))

# A rank that began its last step before rank 0's previous optimizer ended.
early = os.path.join(work, "early.h5")
shutil.copy(source, early)
steps, rank, kind, t0, t1 = trace_of(early)
moved = int(rank.max())
r0_opt = sorted(t1[i] for i in range(len(t1)) if rank[i] == 0 and kind[i] == "optimizer")
per_step = len(r0_opt) // steps
r0_prev_end = r0_opt[-per_step - 1]
first_fwd = last_step(early)[(moved, "forward")][0]
shift = first_fwd - r0_prev_end + 1e-3  # its first forward now starts 1 ms before that end
with h5py.File(early, "r+") as f:
    mask = rank == moved
    f["trace/t0"][mask] = t0[mask] - shift
    f["trace/t1"][mask] = t1[mask] - shift
_, rank, kind, t0, _ = trace_of(early)
if not last_step(early)[(moved, "forward")][0] < r0_prev_end:
    fail("the moved rank's forward does not begin before rank 0's previous optimizer end")
check(early, os.path.join(work, "figures-early"))

# A rank without optimizer intervals (dp updates on rank 0 only): from its last step's first forward.
bare = os.path.join(work, "bare.h5")
shutil.copy(early, bare)
with h5py.File(bare, "r+") as f:
    t = f["trace"]
    kinds = [v.decode() if isinstance(v, bytes) else str(v) for v in t["kind"][()]]
    keep = ~((t["rank"][()] == moved) & (np.array(kinds) == "optimizer"))
    for name in list(t.keys()):
        column = t[name][()][keep]
        dtype = t[name].dtype
        del t[name]
        t.create_dataset(name, data=column, dtype=dtype)
check(bare, os.path.join(work, "figures-bare"))
