#!/usr/bin/python3
"""The archive tools given a catalogue (results/catalog's SQLite file) where they take a
directory: it stands for the run files it indexes. On two studies of real runs (reference,
ddp.np2, tp.np2 | ddp.np4, zero3.np2), catalogued one by one and together:
- summary (text and --csv) and export of the catalogue of both print what they print for the two
  directories; compare of the two catalogues prints and exits as compare of the directories;
  plot draws the catalogue's runs (its report counts them);
- a file catalogued and removed since is one line ("catalogued in ..., no longer there"), the
  other runs summarised; an SQLite file that is no catalogue, and a catalogue of a future
  version, are one line each and no run (exit 1).
usage: catalog_input.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import shutil
import sqlite3
import subprocess
import sys

tools, e2e, work = sys.argv[1:4]
STUDIES = {"a": ["reference", "ddp.np2", "tp.np2"], "b": ["ddp.np4", "zero3.np2"]}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(tool, *args):
    return subprocess.run([os.path.join(tools, tool)] + list(args), capture_output=True,
                          text=True, timeout=300, cwd=work)


def same(tool, given, catalogue, *options):
    """tool on the catalogue prints and exits as on the directories it catalogues."""
    want, got = run(tool, *options, *given), run(tool, *options, catalogue)
    if (got.returncode, got.stdout) != (want.returncode, want.stdout) or want.returncode:
        fail("%s %s %s: exit %d, want %d as for %s; stdout:\n%s\nwant:\n%s\nstderr: %s"
             % (tool, " ".join(options), catalogue, got.returncode, want.returncode,
                " ".join(given), got.stdout, want.stdout, got.stderr))


def catalogue(db, *dirs):
    p = run("catalog", *dirs, "--db", db)
    if p.returncode != 0:
        fail("catalog %s: exit %d: %s" % (db, p.returncode, p.stderr))
    return db


def one_line_skipped(p, path, reason, code):
    lines = [line for line in p.stderr.splitlines() if line.startswith("skipped ")]
    if p.returncode != code or lines != ["skipped %s: %s" % (path, reason)]:
        fail("exit %d, want %d; skipped lines %r, want %s: %s"
             % (p.returncode, code, lines, path, reason))


shutil.rmtree(work, ignore_errors=True)
for study, ids in STUDIES.items():
    os.makedirs(os.path.join(work, study))
    for run_id in ids:
        shutil.copyfile(os.path.join(e2e, run_id + ".h5"), os.path.join(work, study, run_id + ".h5"))
both = catalogue("both.sqlite", "a", "b")
same("summary", ["a", "b"], both)
same("summary", ["a", "b"], both, "--csv")
same("export", ["a", "b"], both)
a, b = catalogue("a.sqlite", "a"), catalogue("b.sqlite", "b")
want, got = run("compare", "a", "b"), run("compare", a, b)
if (got.returncode, got.stdout) != (want.returncode, want.stdout):
    fail("compare of the catalogues: exit %d\n%s\nwant exit %d\n%s"
         % (got.returncode, got.stdout, want.returncode, want.stdout))
p = run("plot", both, "--out", "figures")
with open(os.path.join(work, "figures", "report.html")) as f:
    if p.returncode != 0 or "<p>5 run(s)</p>" not in f.read():
        fail("plot of the catalogue: exit %d: %s" % (p.returncode, p.stderr))

# A stale catalogue: one of its files removed since.
shutil.copytree(os.path.join(work, "b"), os.path.join(work, "c"))
c = catalogue("c.sqlite", "c")
gone = os.path.realpath(os.path.join(work, "c", "zero3.np2.h5"))
os.remove(gone)
p = run("summary", "--csv", c)
one_line_skipped(p, gone, "catalogued in c.sqlite, no longer there", 0)
if [line.split(",")[0] for line in p.stdout.splitlines()[1:]] != ["ddp.np4"]:
    fail("stale catalogue: summarised %r, want ddp.np4 alone" % p.stdout)

# SQLite files that are no catalogue of this version.
with sqlite3.connect(os.path.join(work, "other.sqlite")) as db:
    db.execute("CREATE TABLE runs (path TEXT)")
shutil.copyfile(os.path.join(work, a), os.path.join(work, "future.sqlite"))
with sqlite3.connect(os.path.join(work, "future.sqlite")) as db:
    db.execute("PRAGMA user_version = 2")
for name in ("other.sqlite", "future.sqlite"):
    one_line_skipped(run("summary", name), name,
                     "an SQLite database that is no catalogue of version 1", 1)
print("catalogue as input: summary (text, --csv), export and compare print what they print for "
      "the directories, plot draws its 5 runs; a removed file, another SQLite file and a future "
      "catalogue one line each")
