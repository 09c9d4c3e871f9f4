#!/usr/bin/python3
"""results/summary, compare, plot and export called as a careless user would: no or unknown
arguments, paths that do not exist, empty directories, directories without .h5 files, a text
file, a FIFO, bad --where and tolerance values, --out (export -o) on a file, under a file, in
/proc, empty, over a directory in the way. Table-driven: each case is the tool, its arguments, the exit code (0 done, 1 nothing
usable, 2 usage error, 3 compare --strict flagged) and a substring of stderr; no case may print a
traceback, and a usage error is exactly one line on stderr.
usage: bad_calls.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

tools, e2e, w = sys.argv[1:4]
shutil.rmtree(w, ignore_errors=True)


def mkdir(*parts):
    path = os.path.join(w, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def write(path, data=b""):
    with open(path, "wb") as f:
        f.write(data)
    return path


GOOD = mkdir("good")
for id in ("ddp.np2", "tp.np2"):
    shutil.copy(os.path.join(e2e, id + ".h5"), GOOD)
GOOD_FILE = os.path.join(GOOD, "ddp.np2.h5")
OTHER_FILE = shutil.copy(os.path.join(e2e, "reference.h5"), mkdir("other"))
EMPTY = mkdir("empty")
NOH5 = mkdir("noh5")
write(os.path.join(NOH5, "notes.txt"), b"no run here\n")
mkdir("noh5", "sub")
TEXT = write(os.path.join(w, "notes.txt"), b"not a run file\n")
ZERO = write(os.path.join(w, "zero.h5"))
ONLYBAD = mkdir("onlybad")
write(os.path.join(ONLYBAD, "truncated.h5"), open(GOOD_FILE, "rb").read()[:4096])
FIFODIR = mkdir("fifo")
os.mkfifo(os.path.join(FIFODIR, "run.h5"))
DANGLING = os.path.join(w, "dangling.h5")
os.symlink("nowhere.h5", DANGLING)
MISSING = os.path.join(w, "no", "such", "study")
AFILE = write(os.path.join(w, "a-file"), b"x")
IN_THE_WAY = mkdir("in-the-way")
mkdir("in-the-way", "report.html")  # a directory where the report goes
OUT = mkdir("out")

S, C, P, E = "summary", "compare", "plot", "export"
CASES = [
    # summary
    (S, [], 2, "the following arguments are required: paths"),
    (S, ["--csv"], 2, "the following arguments are required: paths"),
    (S, ["--bogus", GOOD], 2, "unrecognized arguments: --bogus"),
    (S, [MISSING], 2, MISSING + ": no such file or directory"),
    (S, [GOOD, MISSING], 2, MISSING + ": no such file or directory"),
    (S, [DANGLING], 2, DANGLING + ": no such file or directory"),
    (S, [EMPTY], 1, "skipped %s: no .h5 file in it" % EMPTY),
    (S, ["--csv", EMPTY], 1, "summary: no usable run file in " + EMPTY),
    (S, [NOH5], 1, "skipped %s: no .h5 file in it" % NOH5),
    (S, [TEXT], 1, "skipped %s: unreadable or partial (Unable to" % TEXT),
    (S, [ZERO], 1, "skipped %s: unreadable or partial (Unable to" % ZERO),
    (S, [ONLYBAD], 1, "truncated.h5: unreadable or partial"),
    (S, [FIFODIR], 1, "run.h5: unreadable or partial (not a regular file)"),
    (S, [GOOD, EMPTY], 0, "skipped %s: no .h5 file in it" % EMPTY),
    (S, [GOOD, GOOD_FILE], 0, ""),
    (S, ["--help"], 0, ""),
    # compare
    (C, [], 2, "the following arguments are required: a, b"),
    (C, [GOOD], 2, "the following arguments are required: b"),
    (C, [GOOD, GOOD, GOOD], 2, "unrecognized arguments: " + GOOD),
    (C, ["--bogus", GOOD, GOOD], 2, "unrecognized arguments: --bogus"),
    (C, [MISSING, GOOD], 2, MISSING + ": no such file or directory"),
    (C, [GOOD, MISSING], 2, MISSING + ": no such file or directory"),
    (C, ["--strict", GOOD, MISSING], 2, MISSING + ": no such file or directory"),
    (C, [GOOD, EMPTY], 1, "compare: B (%s): no usable run file" % EMPTY),
    (C, ["--strict", GOOD, EMPTY], 1, "compare: B (%s): no usable run file" % EMPTY),
    (C, [EMPTY, GOOD], 1, "compare: A (%s): no usable run file" % EMPTY),
    (C, ["--strict", GOOD, ONLYBAD], 1, "compare: B (%s): no usable run file" % ONLYBAD),
    (C, ["--strict", GOOD, TEXT], 1, "compare: B (%s): no usable run file" % TEXT),
    (C, ["--strict", GOOD, NOH5], 1, "compare: B (%s): no usable run file" % NOH5),
    # ddp and tp on 2 ranks against the 1-rank reference: nothing in common, nothing compared
    # (--strict fails; without it the table lists each as "only in" one side).
    (C, ["--strict", GOOD, OTHER_FILE], 1, "compare: A and B have no configuration in common"),
    (C, [GOOD, OTHER_FILE], 0, "compare: A and B have no configuration in common"),
    (C, ["--where-a", "transport", GOOD, GOOD], 2, "--where-a/--where-b transport: expected FIELD=VALUE"),
    (C, ["--where-b", "=mpi", GOOD, GOOD], 2, "--where-a/--where-b =mpi: expected FIELD=VALUE"),
    (C, ["--where-a"], 2, "argument --where-a: expected one argument"),
    (C, ["--where-a", "transport=nccl", GOOD, GOOD], 1, "A (%s): --where-a transport=nccl matches none" % GOOD),
    (C, ["--strict", "--where-b", "trnasport=mpi", GOOD, GOOD], 1,
     "B (%s): no config field trnasport in any of its 2 usable run(s)" % GOOD),
    (C, ["--level", "abc", GOOD, GOOD], 2, "argument --level: 'abc' is not a number"),
    (C, ["--level", "-1", GOOD, GOOD], 2, "argument --level: '-1' is not a finite number >= 0"),
    (C, ["--level", "1", GOOD, GOOD], 2,
     "argument --level: '1' is not a coverage strictly between 0 and 1"),
    (C, ["--min-change", "nan", GOOD, GOOD], 2, "argument --min-change: 'nan' is not a finite"),
    (C, ["--loss-tol", "inf", GOOD, GOOD], 2, "argument --loss-tol: 'inf' is not a finite"),
    (C, ["--ignore", "bogus", GOOD, GOOD], 2, "argument --ignore: invalid choice: 'bogus'"),
    (C, ["--strict", GOOD, GOOD], 0, ""),
    (C, [GOOD_FILE, GOOD], 0, ""),
    (C, ["--help"], 0, ""),
    # plot
    (P, [], 2, "the following arguments are required"),
    (P, ["--bogus", GOOD], 2, "unrecognized arguments: --bogus"),
    (P, [MISSING], 2, MISSING + ": no such file or directory"),
    (P, [GOOD, MISSING], 2, MISSING + ": no such file or directory"),
    (P, [EMPTY], 1, "plot: %s: no usable run file" % EMPTY),
    (P, [NOH5], 1, "plot: %s: no usable run file" % NOH5),
    (P, [TEXT], 1, "plot: %s: no usable run file" % TEXT),
    (P, ["--out", os.path.join(OUT, "nothing"), EMPTY], 1, "no usable run file"),
    (P, ["--out"], 2, "argument --out: expected one argument"),
    (P, ["--out", "", GOOD], 2, "--out: empty path"),
    (P, ["--out", AFILE, GOOD], 2, "--out %s: exists and is not a directory" % AFILE),
    (P, ["--out", os.path.join(AFILE, "sub"), GOOD], 2,
     "cannot write the figures into %s: Not a directory" % os.path.join(AFILE, "sub")),
    (P, ["--out", "/proc/strata-plot-out", GOOD], 2, "cannot write the figures into /proc/strata-plot-out"),
    (P, ["--out", IN_THE_WAY, GOOD], 2,
     "cannot write the figures into %s: report.html is a directory" % IN_THE_WAY),
    (P, [GOOD, GOOD_FILE], 2, "would both be drawn into %s/figures: give --out" % GOOD),
    (P, ["--out", os.path.join(OUT, "one-file"), GOOD_FILE], 0, ""),
    (P, ["--out", os.path.join(OUT, "mixed"), GOOD, OTHER_FILE], 0, ""),
    (P, [OTHER_FILE], 0, ""),
    (P, ["--help"], 0, ""),
    # export
    (E, [], 2, "the following arguments are required: paths"),
    (E, ["--bogus", GOOD], 2, "unrecognized arguments: --bogus"),
    (E, [MISSING], 2, MISSING + ": no such file or directory"),
    (E, [DANGLING], 2, DANGLING + ": no such file or directory"),
    (E, ["-o"], 2, "argument -o/--output: expected one argument"),
    (E, [EMPTY], 1, "export: no usable run file in " + EMPTY),
    (E, [TEXT], 1, "skipped %s: unreadable or partial (Unable to" % TEXT),
    (E, [ONLYBAD], 1, "truncated.h5: unreadable or partial"),
    (E, ["-o", os.path.join(AFILE, "x.csv"), GOOD], 2,
     "cannot write %s: Not a directory" % os.path.join(AFILE, "x.csv")),
    (E, ["-o", IN_THE_WAY, GOOD], 2, "cannot write %s: Is a directory" % IN_THE_WAY),
    (E, ["-o", os.path.join(OUT, "steps.csv"), GOOD, EMPTY], 0, "skipped %s: no .h5 file" % EMPTY),
    (E, ["--help"], 0, ""),
]
if os.geteuid() != 0:  # root writes anywhere: the /proc case stands in for it there
    RO = mkdir("read-only")
    os.chmod(RO, 0o555)
    CASES.append((P, ["--out", os.path.join(RO, "figs"), GOOD], 2, "cannot write the figures into"))

failures = []
for tool, args, code, text in CASES:
    call = "%s %s" % (tool, " ".join(repr(a) if not a or " " in a else a for a in args))
    try:
        p = subprocess.run([os.path.join(tools, tool)] + args, capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        failures.append("%s: hangs" % call)
        continue
    problems = []
    if p.returncode != code:
        problems.append("exit %d, want %d" % (p.returncode, code))
    if text not in p.stderr:
        problems.append("stderr lacks %r" % text)
    if "Traceback" in p.stderr + p.stdout:
        problems.append("traceback")
    if code == 2 and len(p.stderr.splitlines()) != 1:
        problems.append("a usage error in %d lines" % len(p.stderr.splitlines()))
    if args == ["--help"] and "usage:" not in p.stdout:
        problems.append("no usage on stdout")
    print("%-4s %s -> %d %s" % ("ok" if not problems else "FAIL", call, p.returncode,
                                (p.stderr.splitlines() or [""])[-1][:150]))
    if problems:
        failures.append("%s: %s\n%s" % (call, "; ".join(problems), p.stderr))

# What the calls must and must not have left behind.
if os.path.exists(os.path.join(OUT, "nothing")):
    failures.append("plot with nothing usable created its --out")
if os.listdir(IN_THE_WAY) != ["report.html"]:
    failures.append("plot into a directory in the way left %s" % os.listdir(IN_THE_WAY))
for d in ("one-file", "mixed"):
    if not os.path.isfile(os.path.join(OUT, d, "throughput.png")):
        failures.append("plot --out %s: no throughput.png" % d)
if "run(s)" not in open(os.path.join(OUT, "mixed", "report.html")).read():
    failures.append("no report for the mixed study")
if not os.path.isfile(os.path.join(os.path.dirname(OTHER_FILE), "figures", "report.html")):
    failures.append("plot FILE: no figures/ beside the file")
if os.path.exists(os.path.join(GOOD, "figures")):
    failures.append("the refused plot of a directory and its own file wrote figures")

if len(open(os.path.join(OUT, "steps.csv")).read().splitlines()) < 2:
    failures.append("export -o steps.csv: no rows")

if failures:
    print("\n".join(["FAIL: " + f for f in failures]))
    sys.exit(1)
print("bad calls: %d calls of summary, compare, plot and export, each its exit code and one "
      "clear line, no traceback" % len(CASES))
