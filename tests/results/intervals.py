#!/usr/bin/python3
"""Intervals from repeats (results/intervals.py) and the tools that use them.

- median_interval: the order statistics and coverages of the binomial formula (n = 2..12), and a
  simulated coverage of the true median within 1% of the stated one (lognormal samples);
- summary of a study of 3 configurations x 3 repeats: the faster one ranked first, the two whose
  intervals overlap marked '=' (no difference), the repeats' medians and intervals printed;
- compare of that study with itself: every configuration "no difference", nothing flagged, even
  though each configuration's repeats differ by up to 6%; with the slow one made 2x slower in B,
  only it is flagged; with the fastest made the slowest in C, the two pairs both studies tell
  apart are named as ranked the other way round, the pair neither can tell apart is not;
- report.html holds the ranking table;
- the prediction block gives each configuration's predicted step against its repeats' median.
usage: intervals.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import math
import os
import random
import shutil
import subprocess
import sys

import h5py

sys.dont_write_bytecode = True
tools, e2e, work = sys.argv[1:4]
sys.path.insert(0, tools)
import intervals  # noqa: E402


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(*args, code=0):
    p = subprocess.run([os.path.join(tools, args[0])] + list(args[1:]), capture_output=True,
                       text=True, timeout=300)
    print("$ %s -> %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    if p.returncode != code or "Traceback" in p.stderr:
        fail("%s: exit %d, want %d" % (" ".join(args), p.returncode, code))
    return p


def check_formula():
    for n in range(2, 13):
        low, high, cov = intervals.median_interval(list(range(n)))
        k = low + 1  # the values are 0..n-1: x(k) = k - 1
        want = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if high != n - k or abs(cov - want) > 1e-15:
            fail("n=%d: interval [%d, %d] coverage %r, want [%d, %d] %r"
                 % (n, low, high, cov, k - 1, n - k, want))
        if n >= 6 and cov < 0.95:
            fail("n=%d: coverage %.4f below 95%%" % (n, cov))
        if k + 1 <= (n + 1) // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n >= 0.95:
            fail("n=%d: k=%d is not the largest rank with 95%% coverage" % (n, k))
    if intervals.median_interval([1.0]) or intervals.median_interval([1.0, math.nan]):
        fail("an interval from one value or from a NaN")
    print("formula: order statistics and coverages of n = 2..12 as the binomial gives")


def check_coverage():
    """The stated coverage is the real one: lognormal samples (the median is 1), 20000 trials."""
    rng = random.Random(7)
    for n in (3, 5, 9, 15):
        trials, hits = 20000, 0
        for _ in range(trials):
            low, high, cov = intervals.median_interval([rng.lognormvariate(0, 0.3) for _ in range(n)])
            hits += low <= 1.0 <= high
        if abs(hits / trials - cov) > 0.01:
            fail("n=%d: simulated coverage %.4f, stated %.4f" % (n, hits / trials, cov))
        print("coverage n=%d: simulated %.4f, stated %.4f" % (n, hits / trials, cov))


def study(path, scales, predicted_s=None):
    """Copies of the e2e run files, tokens/s (and step p50) scaled, 3 repeats per configuration."""
    os.makedirs(path)
    for name, factors in scales.items():
        for i, factor in enumerate(factors):
            out = os.path.join(path, "%s.%d.h5" % (name, i))
            shutil.copyfile(os.path.join(e2e, name + ".h5"), out)
            with h5py.File(out, "r+") as f:
                f.attrs["run_id"] = "%s.%d" % (name, i)
                # Not oversubscribed wherever the e2e runs were made: the ranking leaves those out.
                f["provenance"].attrs["blas_threads"] = "1"
                f["provenance"].attrs["cores_online"] = "64"
                s = f["summary"].attrs
                s["tokens_per_s"] = 1000.0 * factor
                s["step_s_p50"] = 0.1 / factor
                if predicted_s is not None:
                    s["step_s_predicted"] = predicted_s[name]
                    s["step_s_predicted_error"] = predicted_s[name] / s["step_s_p50"] - 1
    return path


check_formula()
check_coverage()
shutil.rmtree(work, ignore_errors=True)
# ddp.np2 clearly fastest; tp.np2 and reference overlap ([0.97, 1.03] and [1.0, 1.06]).
scales = {"ddp.np2": [1.50, 1.55, 1.45], "tp.np2": [1.00, 0.97, 1.03],
          "reference": [1.02, 1.06, 1.00]}
predicted = {"ddp.np2": 0.1 / 1.5 * 1.04, "tp.np2": 0.1 * 0.8, "reference": 0.1 / 1.02}
a = study(os.path.join(work, "a"), scales, predicted)
out = run("summary", a).stdout
ranked = out[out.index("Ranking by tokens/s"):].splitlines()[1:4]
want = [("ddp", False, "1500", "[1450, 1550] 75%"), ("dp", False, "1020", "[1000, 1060] 75%"),
        ("tp", True, "1000", "[970, 1030] 75%")]
for line, (plugin, same, median, interval) in zip(ranked, want):
    fields = line.split()
    if (fields[0] == "=") != same or median not in line or interval not in line \
            or not line.rstrip().split("n=3  ")[1].startswith(plugin + " "):
        fail("ranking line %r, want %s %s %s%s" % (line, plugin, median, interval,
                                                   " marked =" if same else ""))
if "configurations against their repeats' median p50 (not oversubscribed): 3, median |error| " \
        "4.0%, 2 within 10%, largest 20.0%" not in out:
    fail("prediction against the repeats' median")
p = run("compare", "--strict", a, a)
if p.stdout.count("no difference") != 3 or "3 configuration(s), 0 flagged" not in p.stdout \
        or "ranking: 2 pair(s) of configurations told apart in both studies (intervals apart, " \
           "not oversubscribed), 0 ranked the other way round" not in p.stdout:
    fail("compare A A flagged something")
# ddp from fastest to slowest: the two pairs both studies tell apart (ddp-dp, ddp-tp) reversed; the
# pair neither can tell apart (dp-tp) says nothing.
c = study(os.path.join(work, "c"), dict(scales, **{"ddp.np2": [0.5, 0.485, 0.515]}))
p = run("compare", "--strict", a, c, code=3)
flipped = [l.strip() for l in p.stdout.splitlines() if l.strip().startswith("REVERSED:")]
if "2 pair(s) of configurations told apart in both studies" not in p.stdout or len(flipped) != 2 \
        or not all(f.startswith("REVERSED: A ranks ddp ") for f in flipped) \
        or sorted(f.split(" above ")[1].split()[0] for f in flipped) != ["dp", "tp"]:
    fail("compare: ddp's two pairs should be ranked the other way round")
b = study(os.path.join(work, "b"), dict(scales, **{"tp.np2": [0.5, 0.485, 0.515]}))
p = run("compare", "--strict", a, b, code=3)
rows = {line.split()[0]: line for line in p.stdout.splitlines()[1:4]}
if not rows["tp"].endswith("SLOWER") or "-50.0%" not in rows["tp"] \
        or not all(rows[k].endswith("no difference") for k in ("ddp", "dp")):
    fail("compare: only tp should be flagged slower")
run("plot", a)
with open(os.path.join(a, "figures", "report.html")) as f:
    page = f.read()
if '<table id="ranking">' not in page or "<td>=</td><td>1000</td>" not in page:
    fail("report.html: no ranking table with tp marked '='")
print("intervals: summary ranks with '=', compare A A flags nothing, a 2x slowdown is flagged")
