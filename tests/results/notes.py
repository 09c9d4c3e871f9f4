#!/usr/bin/python3
"""The provenance and caveats block of summary.txt (results/summary) and report.html
(results/plot), on copies of a 4-rank run whose /provenance is set to known values:
  busy      4 ranks on one host x 1 thread, 2 cores          -> named as oversubscribed
  roomy     the same on 8 cores                              -> not named
  spread    4 ranks on 4 hosts, 2 cores each                 -> not named (1 rank per host)
  old       another strata version from a modified tree,     -> "versions mixed", "modified
            typed attributes (ints)                              tree"; read as text
  topo      a topology_summary attribute                     -> shown as the topology line
  roomy is also marked unstable (CV 25% > --max-cv 10%)        -> the only one "unstable"
  profile.h5 and profile.end.h5 beside them, one entry moved 20% -> "calibration moved", that
            (spread 5%), one 1% (spread 3%)                         entry alone
usage: notes.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.dont_write_bytecode = True
tools, e2e, work = sys.argv[1:4]
TOPOLOGY = "1 package, 1 NUMA node, 2 cores, L3 32 MiB, no GPU, 1 NIC (eth0)"


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def make(name, cores, threads, hosts, unstable=False, **more):
    path = os.path.join(work, "study", name + ".h5")
    shutil.copy(os.path.join(e2e, "ddp.np4.h5"), path)
    with h5py.File(path, "r+") as f:
        f.attrs["run_id"] = name
        # The source run's own noise (4 ranks on 2 cores) is replaced by a known one.
        f["summary"].attrs["unstable"] = 1.0 if unstable else 0.0
        f["summary"].attrs["step_s_cv"] = 0.25 if unstable else 0.01
        f["config"].attrs["max_cv"] = 0.1
        p = f["provenance"]
        p.attrs["cores_online"] = cores
        p.attrs["blas_threads"] = threads
        p.attrs["blas_threads_origin"] = "test"
        if "topology_summary" in p.attrs:  # real runs record one: the test sets its own
            del p.attrs["topology_summary"]
        for k, v in more.items():
            p.attrs[k] = v
        del p["hostnames"]
        p.create_dataset("hostnames", data=np.array(hosts, dtype=h5py.string_dtype()))


shutil.rmtree(work, ignore_errors=True)
os.makedirs(os.path.join(work, "study"))
version = h5py.File(os.path.join(e2e, "ddp.np4.h5"), "r")["provenance"].attrs["strata_version"]
make("busy", "2", "1", ["vm"] * 4)
make("roomy", "8", "1", ["vm"] * 4, unstable=True)
make("spread", "2", "1", ["n1", "n2", "n3", "n4"])
make("old", np.int64(8), np.int64(2), ["vm"] * 4, strata_version="0.0.1",
     git_describe="0a1b2c3-dirty")
make("topo", "8", "2", ["vm"] * 4, topology_summary=TOPOLOGY)



def run_summary():
    """The notes below summary's table (its stdout after the first blank line)."""
    p = subprocess.run([os.path.join(tools, "summary"), os.path.join(work, "study")],
                       capture_output=True, text=True)
    if p.returncode != 0 or p.stderr:
        fail("summary exit %d: %s" % (p.returncode, p.stderr))
    print(p.stdout)
    return p.stdout.split("\n\n", 1)[1]


notes = run_summary()
over = [ln for ln in notes.splitlines() if "oversubscribed:" in ln]
if len(over) != 1 or "busy (4 ranks x 1 thread on 2 cores)" not in over[0]:
    fail("busy is not named as oversubscribed: %s" % over)
for name in ("roomy", "spread", "old", "topo"):
    if name + " (" in over[0]:
        fail("%s named as oversubscribed" % name)
if "1 of 5 run(s)" not in over[0]:
    fail("oversubscribed count: %s" % over[0])
mixed = [ln for ln in notes.splitlines() if "versions mixed" in ln]
if len(mixed) != 1 or "0.0.1" not in mixed[0] or str(version) not in mixed[0]:
    fail("no 'versions mixed' caveat naming both versions: %s" % mixed)
# (the copies of a run built from a modified tree are named there too)
dirty = [ln for ln in notes.splitlines() if "modified tree (git " in ln]
named = dirty[0].rsplit(": ", 1)[1].split(", ") if dirty else []
if len(dirty) != 1 or "0a1b2c3-dirty" not in dirty[0] or "old" not in named:
    fail("no 'modified tree' caveat for the one dirty run: %s" % dirty)
shaky = [ln for ln in notes.splitlines() if "unstable:" in ln]
if len(shaky) != 1 or not shaky[0].endswith(": roomy (CV 25.0%)") or "--max-cv (10%)" not in shaky[0]:
    fail("no 'unstable' caveat naming roomy alone: %s" % shaky)
topology = [ln for ln in notes.splitlines() if ln.startswith("  topology ")]
if len(topology) != 1 or not topology[0].endswith(TOPOLOGY + " (1 of 5 runs record it)"):
    fail("topology line: %s" % topology)
for label in ("strata", "date (UTC)", "hosts", "machine", "device", "model", "steps", "transport",
              "BLAS threads per rank"):
    if "\n  " + label + " " not in notes:
        fail("provenance has no %s line" % label)
if "2 (test) (1 run)" not in notes and "2 (test) (2 runs)" not in notes:
    fail("BLAS threads and their origin not listed: %s" % notes)



def profile(name, block_s, spreads):
    """A profile's /compute table, as runner --calibrate writes it, with two entries (micro-batch
    8 and 4) of block passes block_s and rounds' spreads."""
    with h5py.File(os.path.join(work, "study", name), "w") as f:
        f.attrs["schema"] = "strata-profile/1"
        c = f.create_group("compute")
        for k, v in (("preset", [b"small"] * 2), ("device", [b"cpu"] * 2),
                     ("precision", [b"fp32"] * 2)):
            c[k] = np.array(v, dtype=h5py.string_dtype())
        ints = {"micro_batch": [8, 4], "threads": [1, 1], "ranks_per_node": [2, 2], "tp": [1, 1],
                "layers": [4, 4]}
        for k, v in ints.items():
            c[k] = np.array(v, dtype=float)
        for k in ("embedding_forward_s", "embedding_backward_s", "head_forward_s",
                  "head_backward_s"):
            c[k] = np.zeros(2)
        c["block_forward_s"] = np.array(block_s) / 3
        c["block_backward_s"] = 2 * np.array(block_s) / 3
        c["pass_spread"] = np.array(spreads)


# The calibration measured again at the end: micro-batch 8 moved by 20% (spreads 5% and 4%),
# micro-batch 4 by 1% (spread 3%): only the first is a caveat; both are listed.
profile("profile.h5", [0.030, 0.020], [0.05, 0.03])
profile("profile.end.h5", [0.036, 0.0202], [0.04, 0.01])
notes = run_summary()
moved = [ln for ln in notes.splitlines() if "calibration moved:" in ln]
if len(moved) != 1 or "1 profile entry moved" not in moved[0] or "small mb8 " not in moved[0] \
        or "small mb4 " in moved[0] or "passes 120.0 ms at the start, 144.0 ms at the end " \
        "(+20.0%; spread 5.0%)" not in moved[0]:
    fail("calibration moved: want small mb8 alone, +20%%: %s" % moved)
listed = notes[notes.index("Calibration at the start"):].splitlines()[1:3]
if len(listed) != 2 or not listed[1].endswith("(moved)") or "(+1.0%; spread 3.0%)" not in listed[0]:
    fail("the calibration lines: %s" % listed)

p = subprocess.run([os.path.join(tools, "plot"), os.path.join(work, "study")],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail("plot exit %d: %s" % (p.returncode, p.stderr))
page = open(os.path.join(work, "study", "figures", "report.html")).read()
for want in ("<h2>Provenance</h2>", "<h2>Caveats</h2>", "busy (4 ranks x 1 thread on 2 cores)",
             "versions mixed", "<th>topology</th>", "MFU (% of peak)", "roomy (CV 25.0%)",
             '<ul id="calibration">', "calibration moved"):
    if want not in page:
        fail("report.html lacks %r" % want)
print("notes: busy named as oversubscribed (not roomy, spread, old, topo), roomy as unstable, "
      "versions mixed, topology shown, in summary and report")
