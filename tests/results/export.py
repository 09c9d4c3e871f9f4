#!/usr/bin/python3
"""results/export and the typed run file (strata-run/1.1) on real runs: reference (1 rank, no
collective), ddp.np2 (all_reduce) and zero3.np2 (all_gather and reduce_scatter too), 2 ranks
each. pandas.read_csv reads the CSV in one call with one row per run x rank x step, typed
columns, and the values h5py reads from the files; a column of an op a run never called is 0 on
its rows. h5py reads /config typed (int, float, bool, str not
bytes) and /rank and /step are dimension scales attached to the per-rank-per-step datasets. A copy
made a strata-run/1 file (string /config, float64 counts, no scales) exports the same table. Bad
calls: one line on stderr, exit 2 (1 when no file is usable).
usage: export.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pandas as pd

tools, e2e, work = sys.argv[1:4]
RUNS = ["reference.h5", "ddp.np2.h5", "zero3.np2.h5"]
INT_COLUMNS = ["nodes", "ranks", "rank", "step", "tokens"]
STR_COLUMNS = ["run_id", "strategy", "plugin", "transport", "device", "precision", "model", "mesh"]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def export(*args, code=0):
    p = subprocess.run([os.path.join(tools, "export")] + list(args), capture_output=True,
                       text=True)
    if p.returncode != code:
        fail("export %s: exit %d, want %d; stderr: %s" % (" ".join(args), p.returncode, code,
                                                          p.stderr))
    return p


def one_line_error(p, *words):
    lines = p.stderr.splitlines()
    if len(lines) != 1 or "Traceback" in p.stderr or not all(w in lines[0] for w in words):
        fail("want one line with %s, got %r" % (words, p.stderr))


def check_typed_file(path):
    """h5py reads /config typed and /rank, /step are scales attached to every [ranks x steps]."""
    with h5py.File(path, "r") as f:
        assert f.attrs["schema"] == "strata-run/1.1", f.attrs["schema"]
        c = f["config"].attrs
        for key in ("world", "steps", "warmup", "nodes", "layers", "seed", "params"):
            assert isinstance(c[key], np.int64), (key, type(c[key]))
        for key in ("lr", "weight_decay", "grad_clip", "watchdog_s"):
            assert isinstance(c[key], np.float64), (key, type(c[key]))
        for key in ("trace", "calibrate_comm"):
            assert isinstance(c[key], np.bool_) and not c[key], (key, type(c[key]), c[key])
        for key in ("plugin", "transport", "device", "precision", "model", "plugin_opts"):
            assert type(c[key]) is str, (key, type(c[key]))  # noqa: E721 (str, never bytes)
        world, steps = int(c["world"]), int(c["steps"])
        assert f["rank"][()].tolist() == list(range(world)), f["rank"][()]
        assert f["step"][()].tolist() == list(range(steps)), f["step"][()]
        matrices = ["steps/" + m for m in f["steps"]]
        matrices += ["comm/%s/%s" % (op, k) for op in f["comm"]
                     for k in ("calls", "bytes", "time_s", "algbw", "busbw")]
        for path_in in matrices:
            ds = f[path_in]
            assert ds.shape == (world, steps), (path_in, ds.shape)
            assert [d.label for d in ds.dims] == ["rank", "step"], (path_in, ds.dims)
            assert ds.dims[0][0] == f["rank"] and ds.dims[1][0] == f["step"], path_in
            assert list(ds.dims[0].keys()) == ["rank"], (path_in, ds.dims[0].keys())
        for path_in in ("memory/peak_bytes", "memory/process_peak_bytes", "provenance/hostnames"):
            ds = f[path_in]
            assert ds.dims[0].label == "rank" and ds.dims[0][0] == f["rank"], path_in
        for path_in in ("steps/tokens", "comm/all_reduce/calls", "comm/all_reduce/bytes",
                        "memory/peak_bytes"):
            if path_in in f:
                assert f[path_in].dtype == np.int64, (path_in, f[path_in].dtype)
        assert f["steps/loss"].dtype == np.float64
        return world, steps


def expect_column(frame, column, want, what):
    got = frame[column].to_numpy()
    if got.shape != want.shape or not np.array_equal(got, want):
        fail("%s: column %s differs from the file: %s vs %s" % (what, column, got[:4], want[:4]))


def check_values(frame, path, ops):
    """The rows of the run at path equal what h5py reads from it, [ranks x steps] row-major."""
    with h5py.File(path, "r") as f:
        rows = frame[frame.run_id == f.attrs["run_id"]].sort_values(["rank", "step"])
        world, steps = f["steps/loss"].shape
        if len(rows) != world * steps:
            fail("%s: %d rows, want %d x %d" % (path, len(rows), world, steps))
        expect_column(rows, "rank", np.repeat(np.arange(world), steps), path)
        expect_column(rows, "step", np.tile(np.arange(steps), world), path)
        warmup = int(f["config"].attrs["warmup"])
        expect_column(rows, "timed", np.tile(np.arange(steps) >= warmup, world), path)
        for m in f["steps"]:
            expect_column(rows, m, f["steps"][m][()].ravel(), path)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = (f["steps/tokens"][()] / f["steps/step_s"][()]).ravel()
        expect_column(rows, "tokens_per_s", rate, path)
        for op in ops:
            for field in ("calls", "bytes", "time_s", "busbw"):
                column = "comm_%s_%s" % (op, field)
                want = (f["comm"][op][field][()].ravel() if op in f["comm"]
                        else np.zeros(world * steps))
                expect_column(rows, column, want, path)
        tags = [str(t) for t in f["memory"].attrs["tags"]]
        peak = f["memory/peak_bytes"][()]
        for i, tag in enumerate(tags):
            expect_column(rows, "mem_%s_peak_bytes" % tag, np.repeat(peak[:, i], steps), path)
        expect_column(rows, "process_peak_bytes",
                      np.repeat(f["memory/process_peak_bytes"][()], steps), path)
        c = f["config"].attrs
        first = rows.iloc[0]
        assert first["plugin"] == c["plugin"] and first["transport"] == c["transport"], first
        assert first["ranks"] == c["world"] and first["nodes"] == c["nodes"], first
        assert first["precision"] == c["precision"] and first["device"] == c["device"], first
        return world * steps


def make_schema_one(src, dst):
    """dst: src as strata-run/1 wrote it: /config strings, counts float64, no dimension scales."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs["schema"] = "strata-run/1"
        c = f["config"].attrs
        for key in list(c.keys()):
            value = c[key]
            if isinstance(value, np.bool_):
                text = "true" if value else "false"
            elif isinstance(value, np.floating):
                text = "%.6g" % value  # the runner's old ostream text
            else:
                text = str(value)
            del c[key]
            c[key] = text
        for path in ["steps/tokens"] + ["comm/%s/%s" % (op, k) for op in f["comm"]
                                        for k in ("calls", "bytes")]:
            values, unit = f[path][()].astype(np.float64), f[path].attrs.get("unit", "")
            parent, name = path.rsplit("/", 1)
            del f[parent][name]
            f[parent].create_dataset(name, data=values).attrs["unit"] = unit
        del f["rank"], f["step"]


shutil.rmtree(work, ignore_errors=True)
os.makedirs(os.path.join(work, "study", "sub"))
for i, name in enumerate(RUNS):
    shutil.copyfile(os.path.join(e2e, name),
                    os.path.join(work, "study", "sub" if i else "", name))
paths = [os.path.join(work, "study", "sub" if i else "", n) for i, n in enumerate(RUNS)]

shapes = [check_typed_file(p) for p in paths]
# The tools see /config as the runner prints it, whatever its type on disk.
sys.path.insert(0, tools)
import strata_results  # noqa: E402
config = strata_results.read_run(paths[1]).config
want = {"world": "2", "steps": "20", "trace": "false", "plugin": "ddp", "lr": "0.003",
        "watchdog_s": "300", "grad_clip": "1"}
if {k: config.get(k) for k in want} != want:
    fail("the tools' /config text: %s, want %s" % ({k: config.get(k) for k in want}, want))
print("typed /config and dimension scales: ok in %d files" % len(paths))

csv_path = os.path.join(work, "steps.csv")
export(os.path.join(work, "study"), "-o", csv_path)  # a directory, searched recursively
frame = pd.read_csv(csv_path)
want_rows = sum(w * s for w, s in shapes)
if len(frame) != want_rows:
    fail("%d rows, want %d (runs x ranks x steps)" % (len(frame), want_rows))
for c in INT_COLUMNS + [c for c in frame if c.startswith("mem_") or
                        c.endswith(("_calls", "_bytes"))]:
    if frame[c].dtype != np.int64:
        fail("column %s is %s, not int64" % (c, frame[c].dtype))
for c in ["step_s", "loss", "comm_s", "exposed_comm_s", "tokens_per_s"] + [
        c for c in frame if c.endswith(("_time_s", "_busbw"))]:
    if frame[c].dtype != np.float64:
        fail("column %s is %s, not float64" % (c, frame[c].dtype))
for c in STR_COLUMNS:
    if frame[c].dtype != object or not all(isinstance(v, str) for v in frame[c]):
        fail("column %s is not strings: %s" % (c, frame[c].dtype))
if frame["timed"].dtype != bool:
    fail("column timed is %s, not bool" % frame["timed"].dtype)
ops = sorted({c.split("_", 1)[1].rsplit("_", 1)[0] for c in frame if c.endswith("_calls")})
with h5py.File(paths[1], "r") as a, h5py.File(paths[2], "r") as b:
    if not set(b["comm"]) - set(a["comm"]):
        fail("zero3.np2 calls no op ddp.np2 does not: the 0-filled columns are not tested")
# The CSV holds each double exactly (its shortest round-trip text): read with pandas' round-trip
# parser the values equal the files' bit for bit. pandas' default parser trades the last digits for
# speed (measured: up to 9e-13 relative on 17-digit step times): within 1e-11.
exact = pd.read_csv(csv_path, float_precision="round_trip")
counted = sum(check_values(exact, p, ops) for p in paths)
for c in frame:
    if frame[c].dtype == np.float64:
        if not np.allclose(frame[c], exact[c], rtol=1e-11, atol=0, equal_nan=True):
            fail("column %s: the default parser is more than 1e-11 off" % c)
    elif not frame[c].equals(exact[c]):
        fail("column %s differs between the two parsers" % c)
print("csv: %d rows = runs x ranks x steps, typed columns, values equal the files (ops %s)"
      % (counted, ", ".join(ops)))

# A strata-run/1 file exports the same table as the file it was made from.
old_dir = os.path.join(work, "old")
os.makedirs(old_dir)
make_schema_one(paths[1], os.path.join(old_dir, "ddp.np2.h5"))
old_csv, new_csv = os.path.join(work, "old.csv"), os.path.join(work, "new.csv")
export(old_dir, "-o", old_csv)
export(paths[1], "-o", new_csv)
old, new = pd.read_csv(old_csv), pd.read_csv(new_csv)
if list(old.dtypes) != list(new.dtypes) or not old.equals(new):
    fail("the strata-run/1 copy exports another table:\n%s\n%s" % (old.dtypes, new.dtypes))
print("strata-run/1 file: the same table, the same dtypes")

# Bad calls: one clear line each.
one_line_error(export(os.path.join(work, "nowhere"), code=2), "nowhere", "no such file")
empty = os.path.join(work, "empty")
os.makedirs(empty)
p = export(empty, code=1)  # as results/summary: the skipped path, then the verdict
if p.stderr.splitlines() != ["skipped %s: no .h5 file in it" % empty,
                             "export: no usable run file in %s" % empty]:
    fail("empty directory: %r" % p.stderr)
one_line_error(export(paths[0], "-o", os.path.join(work, "no", "dir", "x.csv"), code=2),
               "cannot write", "x.csv")
one_line_error(export("--bogus", paths[0], code=2), "--bogus")
try:
    import pyarrow  # noqa: F401
    parquet = os.path.join(work, "steps.parquet")
    export(paths[1], "-o", os.devnull, "--parquet", parquet)
    if not pd.read_parquet(parquet).equals(pd.read_csv(new_csv, float_precision="round_trip")):
        fail("the Parquet table differs from the CSV one")
    print("parquet: the same table")
except ImportError:
    one_line_error(export(paths[0], "--parquet", os.path.join(work, "x.parquet"), code=2),
                   "--parquet needs pyarrow")
    print("parquet: pyarrow not installed, refused with one line (as expected)")
print("bad calls: one line each")
