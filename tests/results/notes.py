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

p = subprocess.run([os.path.join(tools, "summary"), os.path.join(work, "study")],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail("summary exit %d: %s" % (p.returncode, p.stderr))
text = p.stdout
print(text)
notes = text.split("\n\n", 1)[1]
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

p = subprocess.run([os.path.join(tools, "plot"), os.path.join(work, "study")],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail("plot exit %d: %s" % (p.returncode, p.stderr))
page = open(os.path.join(work, "study", "figures", "report.html")).read()
for want in ("<h2>Provenance</h2>", "<h2>Caveats</h2>", "busy (4 ranks x 1 thread on 2 cores)",
             "versions mixed", "<th>topology</th>", "MFU (% of peak)", "roomy (CV 25.0%)"):
    if want not in page:
        fail("report.html lacks %r" % want)
print("notes: busy named as oversubscribed (not roomy, spread, old, topo), roomy as unstable, "
      "versions mixed, topology shown, in summary and report")
