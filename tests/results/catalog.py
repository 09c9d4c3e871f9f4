#!/usr/bin/python3
"""results/catalog on two studies of real runs (reference, ddp.np2, tp.np2 | ddp.np2, ddp.np4,
zero3.np2; the second ddp.np2 made faster, three runs given a predicted step time): one runs row
per run file with the values h5py reads from it, its steps and comm rows; the documented queries
(fastest configuration of a model on N nodes over every study, MFU by strategy, predictions off
by more than 10%) answer what the files say; a truncated file, a machine profile and a file of a
future schema are each one line on stderr, the rest indexed. Indexing again reads nothing; a
touched or rewritten file is indexed again without duplicates, a removed file's rows go; two
invocations started together on one new catalogue leave every file once. Bad calls: exit 2.
usage: catalog.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import csv
import io
import os
import shutil
import sqlite3
import subprocess
import sys

import h5py
import numpy as np

tools, e2e, work = sys.argv[1:4]
STUDIES = {"study-a": ["reference", "ddp.np2", "tp.np2"],
           "study-b": ["ddp.np2", "ddp.np4", "zero3.np2"]}
# Predicted step time / measured p50 written into copies, as a run given --profile has it.
PREDICTED = {("study-a", "ddp.np2"): 1.25, ("study-a", "tp.np2"): 1.05,
             ("study-b", "zero3.np2"): 0.8}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def catalog(*args, code=0):
    p = subprocess.run([os.path.join(tools, "catalog")] + list(args), capture_output=True,
                       text=True, cwd=work)
    if p.returncode != code or "Traceback" in p.stderr:
        fail("catalog %s: exit %d, want %d; stderr: %s" % (" ".join(args), p.returncode, code,
                                                           p.stderr))
    return p


def query(db, sql):
    """The rows of --query --csv as lists of str, without the header."""
    return list(csv.reader(io.StringIO(catalog("--db", db, "--query", sql, "--csv").stdout)))[1:]


def make_studies():
    """{path: study} of the run files; and the three files that are no usable run."""
    files = {}
    for study, ids in STUDIES.items():
        os.makedirs(os.path.join(work, study, "sub"))
        for i, id in enumerate(ids):  # one in a subdirectory: searched recursively
            path = os.path.join(work, study, "sub" if i == 2 else "", id + ".h5")
            shutil.copyfile(os.path.join(e2e, id + ".h5"), path)
            files[path] = study
            with h5py.File(path, "r+") as f:
                s = f["summary"].attrs
                if (study, id) in PREDICTED:
                    ratio = PREDICTED[(study, id)]
                    s["step_s_predicted"] = s["step_s_p50"] * ratio
                    s["step_s_predicted_error"] = ratio - 1
                # A repeat far faster than any run measured here, so that the fastest
                # configuration is these two repeats from two studies whatever the machine did.
                if study == "study-b" and id == "ddp.np2":
                    s["tokens_per_s"] = 1e12
    a = os.path.join(work, "study-a")
    truncated = os.path.join(a, "truncated.h5")
    with open(os.path.join(e2e, "ddp.np4.h5"), "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read()[:4096])
    profile = os.path.join(a, "profile.h5")
    with h5py.File(profile, "w") as f:
        f.attrs["schema"] = "strata-profile/1"
        f.create_group("entries")
    future = os.path.join(a, "future.h5")
    shutil.copyfile(os.path.join(e2e, "ddp.np2.h5"), future)
    with h5py.File(future, "r+") as f:
        f.attrs["schema"] = "strata-run/2"
    return files, {truncated: "unreadable or partial", profile: "a machine profile",
                   future: "schema 'strata-run/2'"}


def file_facts(path):
    """What the checks compare against, read with h5py alone."""
    with h5py.File(path, "r") as f:
        c, s = f["config"].attrs, f["summary"].attrs
        opts = str(c["plugin_opts"])
        world, steps = f["steps/loss"].shape
        return {"run_id": str(f.attrs["run_id"]), "model": str(c["model"]),
                "nodes": int(c["nodes"]), "world": int(world), "steps": int(steps),
                "strategy": str(c["plugin"]) + (":" + opts.replace(",", ":") if opts else ""),
                "tokens_per_s": float(s["tokens_per_s"]), "mfu": float(s["mfu"]),
                "step_s_p50": float(s["step_s_p50"]),
                "predicted_error": (float(s["step_s_predicted_error"])
                                    if "step_s_predicted_error" in s else None),
                "version": str(f["provenance"].attrs["strata_version"]),
                "loss": f["steps/loss"][()], "ops": {op: f["comm"][op]["bytes"][()]
                                                     for op in f["comm"]},
                "schema": str(f.attrs["schema"]), "size": os.path.getsize(path),
                "configuration": (
                    str(c["plugin"]) + (":" + opts.replace(",", ":") if opts else ""),
                    "dp%d.tp%d.pp%d" % (c["dp"], c["tp"], c["pp"]), str(c["micro_batch"]),
                    str(c["global_batch"]), str(c["precision"]), str(c["transport"]),
                    str(c["device"]))}


def counts(db):
    with sqlite3.connect(db) as con:
        return tuple(con.execute("SELECT count(*) FROM %s" % t).fetchone()[0]
                     for t in ("runs", "steps", "comm", "skipped"))


def expected_counts(facts, n_skipped):
    return (len(facts), sum(f["world"] * f["steps"] for f in facts.values()),
            sum(len(f["ops"]) * f["world"] * f["steps"] for f in facts.values()), n_skipped)


def check_skip_lines(stderr, bad):
    lines = stderr.splitlines()
    if len(lines) != len(bad):
        fail("want one stderr line per unusable file (%d), got %r" % (len(bad), stderr))
    for path, reason in bad.items():
        mine = [line for line in lines if line.startswith("skipped %s: " % path)]
        if len(mine) != 1 or reason not in mine[0]:
            fail("%s: want one line 'skipped %s: %s...', got %r" % (path, path, reason, lines))


def check_rows(db, facts):
    """Each file's runs, steps and comm rows hold the file's values."""
    for path, want in facts.items():
        rows = query(db, "SELECT id, run_id, model, nodes, ranks, strategy, tokens_per_s, mfu, "
                         "schema, size, study, provenance_strata_version FROM runs "
                         "WHERE path = '%s'" % path)
        if len(rows) != 1:
            fail("%s: %d runs rows, want 1" % (path, len(rows)))
        key, run_id, model, nodes, ranks, strategy, tps, mfu, schema, size, study, version = rows[0]
        got = (run_id, model, int(nodes), int(ranks), strategy, float(tps), float(mfu), schema,
               int(size), study, version)
        expect = (want["run_id"], want["model"], want["nodes"], want["world"], want["strategy"],
                  want["tokens_per_s"], want["mfu"], want["schema"], want["size"],
                  os.path.dirname(path), want["version"])
        if got != expect:
            fail("%s: runs row %s, want %s" % (path, got, expect))
        loss = query(db, "SELECT rank, step, loss FROM steps WHERE run = %s ORDER BY rank, step"
                     % key)
        if not np.array_equal(np.array([float(r[2]) for r in loss]), want["loss"].ravel()):
            fail("%s: steps.loss differs from /steps/loss" % path)
        for op, sent in want["ops"].items():
            got_bytes = query(db, "SELECT bytes FROM comm WHERE run = %s AND op = '%s' "
                                  "ORDER BY rank, step" % (key, op))
            if [int(b[0]) for b in got_bytes] != [int(b) for b in sent.ravel()]:
                fail("%s: comm bytes of %s differ from /comm/%s/bytes" % (path, op, op))


def check_queries(db, facts):
    """The documented queries answer what the files say."""
    groups = {}
    for f in facts.values():
        if f["model"] == "tiny" and f["nodes"] == 2:
            groups.setdefault(f["configuration"], []).append(f["tokens_per_s"])
    fastest = max(groups, key=lambda c: np.mean(groups[c]))
    got = query(db, "SELECT strategy, mesh, micro_batch, global_batch, precision, transport, "
                    "device, count(*) AS runs, avg(tokens_per_s) AS tokens_per_s, "
                    "group_concat(study) AS studies FROM runs WHERE model = 'tiny' AND nodes = 2 "
                    "GROUP BY strategy, mesh, micro_batch, global_batch, precision, transport, "
                    "device ORDER BY avg(tokens_per_s) DESC LIMIT 1")  # docs/run-file.md's
    if (tuple(got[0][:7]) != fastest or int(got[0][7]) != len(groups[fastest]) or
            not np.isclose(float(got[0][8]), np.mean(groups[fastest]), rtol=1e-12) or
            len(groups[fastest]) != 2):
        fail("fastest tiny on 2 nodes: %s, want %s at %s" % (got, fastest, groups[fastest]))
    by_strategy = {}
    for f in facts.values():
        by_strategy.setdefault(f["strategy"], []).append(100 * f["mfu"])
    got = {r[0]: (int(r[1]), float(r[2])) for r in query(
        db, "SELECT strategy, count(*), avg(100 * mfu) FROM runs GROUP BY strategy")}
    if set(got) != set(by_strategy) or any(
            got[s][0] != len(v) or not np.isclose(got[s][1], np.mean(v), rtol=1e-12)
            for s, v in by_strategy.items()):
        fail("MFU by strategy: %s, want %s" % (got, by_strategy))
    missed = sorted(p for p, f in facts.items()
                    if f["predicted_error"] is not None and abs(f["predicted_error"]) > 0.1)
    got = sorted(r[0] for r in query(db, "SELECT path, step_s_predicted, step_s_p50, "
                                         "step_s_predicted_error FROM runs "
                                         "WHERE abs(step_s_predicted_error) > 0.1"))
    if got != missed or len(missed) != 2:
        fail("predictions off by more than 10%%: %s, want %s" % (got, missed))
    print("queries: fastest tiny on 2 nodes %s over %d runs; MFU of %d strategies; %d "
          "predictions missed" % (" ".join(fastest), len(groups[fastest]), len(by_strategy),
                                  len(missed)))


def check_updates(db, facts, studies):
    """Again: nothing read; touched, rewritten and removed files."""
    before = query(db, "SELECT id, path, indexed_utc FROM runs ORDER BY id")
    p = catalog("--db", db, *studies)
    if "0 runs indexed, %d unchanged" % len(facts) not in p.stdout:
        fail("indexing again read files: %r" % p.stdout)
    if query(db, "SELECT id, path, indexed_utc FROM runs ORDER BY id") != before:
        fail("indexing again changed the runs rows")
    if counts(db) != expected_counts(facts, 3):
        fail("indexing again: counts %s, want %s" % (counts(db), expected_counts(facts, 3)))
    touched, rewritten, removed = sorted(facts)[:3]
    stat = os.stat(touched)
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with h5py.File(rewritten, "r+") as f:
        f["summary"].attrs["tokens_per_s"] = 12345.5
    facts[rewritten] = file_facts(rewritten)
    facts[touched] = file_facts(touched)
    p = catalog("--db", db, *studies)
    if "2 runs indexed, %d unchanged" % (len(facts) - 2) not in p.stdout:
        fail("touched and rewritten files: %r" % p.stdout)
    if counts(db) != expected_counts(facts, 3):
        fail("re-indexed: counts %s, want %s (duplicates?)" % (counts(db),
                                                              expected_counts(facts, 3)))
    check_rows(db, facts)
    gone = query(db, "SELECT id FROM runs WHERE path = '%s'" % removed)[0][0]
    os.remove(removed)
    del facts[removed]
    p = catalog("--db", db, *studies)
    if "1 removed" not in p.stdout or counts(db) != expected_counts(facts, 3):
        fail("removed file: %r, counts %s" % (p.stdout, counts(db)))
    for table in ("steps", "comm", "environment"):
        if query(db, "SELECT count(*) FROM %s WHERE run = %s" % (table, gone)) != [["0"]]:
            fail("removed file: rows left in %s" % table)
    print("again: nothing read; touched and rewritten files re-indexed without duplicates; "
          "a removed file's rows gone")


def check_concurrent(facts):
    """Two invocations started together on one new catalogue: every file once."""
    many = os.path.join(work, "many")
    for copy in range(8):
        for path in facts:
            dst = os.path.join(many, str(copy), os.path.relpath(path, work).replace("/", "_"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(path, dst)
    n_files = 8 * len(facts)
    db = os.path.join(work, "concurrent.sqlite")
    procs = [subprocess.Popen([os.path.join(tools, "catalog"), "--db", db, many],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate() for p in procs]
    if any(p.returncode != 0 for p in procs) or any(err for _, err in outs):
        fail("concurrent invocations: exit %s, %s" % ([p.returncode for p in procs], outs))
    indexed = sum(int(out.split(": ")[1].split(" runs indexed")[0]) for out, _ in outs)
    want = expected_counts({p: f for p, f in facts.items()}, 0)
    want = (n_files, 8 * want[1], 8 * want[2], 0)
    with sqlite3.connect(db) as con:
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        paths = con.execute("SELECT count(DISTINCT path) FROM runs").fetchone()[0]
        orphans = con.execute("SELECT count(*) FROM steps WHERE run NOT IN "
                              "(SELECT id FROM runs)").fetchone()[0]
    if counts(db) != want or integrity != "ok" or paths != n_files or orphans or \
            indexed != n_files:
        fail("concurrent invocations: counts %s (want %s), integrity %s, %d paths, %d orphan "
             "steps, %d indexed by the two" % (counts(db), want, integrity, paths, orphans,
                                               indexed))
    print("concurrent: two invocations, %d files each indexed once (%d + %d), integrity ok"
          % (n_files, *[int(out.split(": ")[1].split(" ")[0]) for out, _ in outs]))


def check_output_and_bad_calls(db, studies):
    p = catalog("--db", db, "--query", "SELECT run_id, ranks FROM runs ORDER BY ranks DESC, "
                                       "run_id LIMIT 2")
    if p.stdout.splitlines() != ["run_id   ranks", "ddp.np4  4", "ddp.np2  2"]:
        fail("aligned table: %r" % p.stdout)
    only_bad = os.path.join(work, "only-bad")
    os.makedirs(only_bad)
    shutil.copyfile(os.path.join(work, "study-a", "truncated.h5"),
                    os.path.join(only_bad, "t.h5"))
    p = catalog("--db", db, only_bad, code=1)
    if "no usable run file" not in p.stderr:
        fail("nothing usable: %r" % p.stderr)
    other = os.path.join(work, "other.sqlite")  # someone else's database: not written to
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE notes (text)")
    for args, words in ((["--db", db], "give directories"),
                        (["--db", db, "--query", "SELECT nope FROM runs"], "no such column"),
                        (["--db", db, "--query", "DELETE FROM runs"], "readonly"),
                        (["--db", os.path.join(work, "none.sqlite"), "--query", "SELECT 1"],
                         "no such catalogue"),
                        (["--db", os.path.join(work, "study-a", "reference.h5"), studies[0]],
                         "not a database"),
                        (["--db", db, os.path.join(work, "nowhere")], "no such file"),
                        (["--db", other, studies[0]], "no catalogue"),
                        (["--db", db, "--csv", studies[0]], "--csv goes with --query")):
        p = catalog(*args, code=2)
        if len(p.stderr.splitlines()) != 1 or words not in p.stderr:
            fail("catalog %s: want one line with %r, got %r" % (args, words, p.stderr))
    print("aligned table; nothing usable: exit 1; bad calls: one line, exit 2")


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
files, bad = make_studies()
facts = {path: file_facts(path) for path in files}
studies = [os.path.join(work, s) for s in STUDIES]
db = os.path.join(work, "catalog.sqlite")
p = catalog(*studies)  # the default --db: catalog.sqlite in the current directory (work)
check_skip_lines(p.stderr, bad)
if counts(db) != expected_counts(facts, len(bad)):
    fail("counts (runs, steps, comm, skipped) %s, want %s" % (counts(db),
                                                               expected_counts(facts, len(bad))))
check_rows(db, facts)
print("indexed: %d runs, %d steps rows, %d comm rows as in the files; %d files skipped with one "
      "line each" % (counts(db)[:3] + (len(bad),)))
check_queries(db, facts)
again = catalog("--db", db, *studies)
check_skip_lines(again.stderr, bad)  # listed again, from the catalogue
check_updates(db, facts, studies)
check_concurrent(facts)
check_output_and_bad_calls(db, studies)
