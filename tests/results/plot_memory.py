#!/usr/bin/python3
"""results/plot's memory figure and report on zero3 with and without offload=optimizer (2 ranks):
host memory is a hatched bar of its own labelled "offload (host)", beside the device's stacked
bar, with the file's offload peak as its height; the device bar and its predicted marker add up
the device's tags only (the offloaded run's device bar is the other's less its optimizer state);
the report's table gives the host peak in its own column; the comm figure has d2h and h2d.
usage: plot_memory.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from archive_tool import import_tool  # noqa: E402
tools, e2e, work = sys.argv[1:4]
MIB = 2.0 ** 20


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


plot = import_tool(tools, "plot")

shutil.rmtree(work, ignore_errors=True)
study = os.path.join(work, "study")
os.makedirs(study)
for name in ("zero3.np2", "zero3.offload.np2"):
    shutil.copyfile(os.path.join(e2e, name + ".h5"), os.path.join(study, name + ".h5"))
runs, skipped = plot.load([study])
if skipped or len(runs) != 2:
    fail("load: %d runs, skipped %r" % (len(runs), skipped))
runs.sort(key=lambda r: "offload" in r.config.get("plugin_opts", ""))
plain, offloaded = runs
if "offload=optimizer" not in offloaded.config.get("plugin_opts", ""):
    fail("the second run is not offloaded: %r" % offloaded.config.get("plugin_opts"))


def peak(run, tag):
    return run.memory_peak[:, run.memory_tags.index(tag)].max() / MIB


fig, ax = plt.subplots()
plot.memory(runs, ax)
bars = {c.get_label(): c for c in ax.containers}
if "offload (host)" not in bars or "offload" in bars:
    fail("no bar labelled 'offload (host)': %s" % sorted(bars))
host = bars["offload (host)"]
heights = [p.get_height() for p in host.patches]
if not np.allclose(heights, [0.0, peak(offloaded, "offload")], rtol=0, atol=1e-12):
    fail("host bar heights %r, want [0, %r]" % (heights, peak(offloaded, "offload")))
if peak(offloaded, "offload") <= 0 or not all(p.get_hatch() for p in host.patches):
    fail("the host bar is empty or not hatched")
device_tags = [t for t in offloaded.memory_tags if t != "offload"]
device_x = {round(p.get_x(), 9) for t in device_tags for p in bars[t].patches}
host_x = {round(p.get_x(), 9) for p in host.patches}
if device_x & host_x or any(p.get_hatch() for t in device_tags for p in bars[t].patches):
    fail("the host bar shares a slot with the device's, or a device bar is hatched")
for i, run in enumerate(runs):
    # The device bar's top: the sum of its tags (no offload in it).
    top = max(bars[t].patches[i].get_y() + bars[t].patches[i].get_height() for t in device_tags)
    want = sum(peak(run, t) for t in device_tags)
    if abs(top - want) > 1e-9:
        fail("%s: device bar reaches %.6f MiB, device tags sum to %.6f" % (run.label, top, want))
lines = {ln.get_label(): ln for ln in ax.get_lines()}
device_pred = lines["predicted device total"].get_ydata()
want_pred = [sum(p for t, p in zip(r.memory_tags, r.memory_predicted) if t != "offload") / MIB
             for r in runs]
if not np.allclose(device_pred, want_pred, rtol=0, atol=1e-9):
    fail("predicted device total %r, want %r" % (list(device_pred), want_pred))
host_pred = lines["predicted host total"].get_ydata()
if not (np.isnan(host_pred[0]) and abs(host_pred[1] - peak(offloaded, "offload")) < 1e-9):
    fail("predicted host total %r (the run's prediction equals its measurement)" % list(host_pred))
# The offloaded run holds exactly the other's device memory less its optimizer state.
opt = peak(plain, "optimizer")
dev = [sum(peak(r, t) for t in device_tags) for r in runs]
if opt <= 0 or abs(dev[0] - dev[1] - opt) > 1e-9:
    fail("device totals %r differ by %r, want the optimizer's %r MiB" % (dev, dev[0] - dev[1], opt))
plt.close(fig)

fig, ax = plt.subplots()
plot.comm(runs, ax)
ops = {c.get_label() for c in ax.containers}
if not {"d2h", "h2d"} <= ops:
    fail("comm figure ops %s lack d2h/h2d" % sorted(ops))
plt.close(fig)

p = subprocess.run([os.path.join(tools, "plot"), study], capture_output=True, text=True,
                   timeout=300)
if p.returncode != 0:
    fail("plot exit %d: %s" % (p.returncode, p.stderr))
with open(os.path.join(study, "figures", "report.html")) as f:
    page = re.sub(r' data-v="[^"]*"', "", f.read())  # the cells as shown, not their sort keys
if "<th>host MiB (offload)</th>" not in page:
    fail("report.html has no host column")
cell = "<td>%.1f</td><td>%.4f</td></tr>" % (peak(offloaded, "offload"),
                                          offloaded.summary["loss_last"])
if cell not in page or "<td>0.0</td><td>%.4f</td></tr>" % plain.summary["loss_last"] not in page:
    fail("report.html rows lack the host peaks %s" % cell)
print("plot memory: host bar 'offload (host)' %.3f MiB hatched beside the device bars; device "
      "totals %.3f / %.3f MiB (differ by the optimizer's %.3f); d2h, h2d in the comm figure; "
      "host column in report.html" % (peak(offloaded, "offload"), dev[0], dev[1], opt))
