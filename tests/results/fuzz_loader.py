#!/usr/bin/python3
"""Seeded structural-mutation fuzz of the run-file loader (results/strata_results.py) and of what
the tools compute from what it loads.

Each trial copies one of the given valid run files, applies 1..STRATA_FUZZ_MUTATIONS random
structural mutations with h5py (delete, replace a group by a dataset or a dataset by a group,
retype, reshape, change values to NaN/inf/strings/arrays, links that dangle or loop; picked from
every group, dataset and attribute the loader reads) and then requires read_run() to load the
file or to reject it with RunFileError, never another exception. A loaded mutant also goes through
the tools' own computations: results/summary's row, results/compare against the original and
itself, results/plot's throughput series, results/export's table, and for every
STRATA_FUZZ_DRAW-th loaded mutant every figure drawn (Agg) with the original beside it.

Bounded by STRATA_FUZZ_TRIALS (300) and STRATA_FUZZ_SECONDS (60), whichever comes first. The seed
is STRATA_FUZZ_SEED or taken from the clock, and printed; every trial has its own generator, so
STRATA_FUZZ_SEED=S STRATA_FUZZ_TRIAL=T replays trial T alone. A crash prints the mutations and the
traceback and keeps the file as WORK_DIR/crash-T.h5; the exit code is then 1.

usage: fuzz_loader.py RESULTS_DIR WORK_DIR RUN_FILE...
"""
import argparse
import json
import os
import random
import shutil
import sys
import time
import traceback
import warnings

import h5py
import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from archive_tool import import_tool  # noqa: E402

STRINGS = ["", "nan", "inf", "-1", "0", "4", "2.5", "1e999", "abc", "x$\\frac{$", "../../x",
           "a\nb", "\u00e9\u4e2d", "9" * 30, "y" * 2000]
NUMBERS = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 0.5, 1.0, 3.0, 1e300, -1e300,
           2.0 ** 63]


# --- what can be mutated ------------------------------------------------------------------------

def targets(f):
    """(kind, path, attr) for every group, dataset, link and attribute the loader may read: all
    but /provenance and the units."""
    out = []

    def attrs(obj, path):
        try:
            names = list(obj.attrs.keys())
        except Exception:  # noqa: BLE001 -- a mutated object may not list; not what is tested
            return
        out.extend(("attr", path, a) for a in names if a != "unit" and not a.endswith(".unit"))

    def walk(group, path):
        for name in list(group.keys()):
            child = (path.rstrip("/") + "/" + name)
            if child == "/provenance":
                continue
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                out.append(("link", child, None))
                continue
            obj = group[name]
            if isinstance(obj, h5py.Group):
                out.append(("group", child, None))
                attrs(obj, child)
                walk(obj, child)
            elif isinstance(obj, h5py.Dataset):
                out.append(("dataset", child, None))
    attrs(f, "/")
    walk(f, "/")
    return out


def split(path):
    parent, name = path.rsplit("/", 1)
    return parent or "/", name


def replace(f, path, value):
    parent, name = split(path)
    del f[parent][name]
    if isinstance(value, (h5py.SoftLink, h5py.ExternalLink)):
        f[parent][name] = value
    elif isinstance(value, str) and value == "group":
        f[parent].create_group(name)
    else:
        f[parent].create_dataset(name, data=value)


def junk_value(rng, like=None):
    """A random wrong value: a string, a number, an array, an empty value."""
    kind = rng.choice(["str", "num", "int", "numarray", "strarray", "empty", "bool", "bytes",
                       "complex", "2d", "zerolen"])
    if kind == "str":
        return rng.choice(STRINGS)
    if kind == "num":
        return np.float64(rng.choice(NUMBERS))
    if kind == "int":
        return np.int64(rng.randint(-3, 9))
    if kind == "numarray":
        return np.array([rng.choice(NUMBERS) for _ in range(rng.randint(1, 4))])
    if kind == "strarray":
        return np.array([rng.choice(STRINGS[:12]) for _ in range(rng.randint(1, 4))],
                        dtype=h5py.string_dtype())
    if kind == "empty":
        return h5py.Empty("f8")
    if kind == "bool":
        return np.bool_(rng.random() < 0.5)
    if kind == "bytes":
        return np.bytes_(b"\xff\xfe\x00x"[:rng.randint(1, 4)])
    if kind == "complex":
        return np.complex128(1 + 2j)
    if kind == "2d":
        return np.ones((2, 2))
    return np.zeros(0)


def mutate_attr(f, rng, path, attr):
    obj = f[path]
    value = obj.attrs[attr]
    op = rng.choice(["delete", "junk", "junk", "value", "array-edit"])
    if op == "delete":
        del obj.attrs[attr]
    elif op == "junk":
        obj.attrs[attr] = junk_value(rng)
    elif op == "value":  # same kind, hostile value
        if isinstance(value, (str, bytes)):
            obj.attrs[attr] = rng.choice(STRINGS)
        else:
            obj.attrs[attr] = np.float64(rng.choice(NUMBERS))
    else:  # an array: shorter, longer, a scalar of its first element, 2-D
        a = np.asarray(value)
        how = rng.choice(["shorter", "longer", "scalar", "2d"])
        if how == "shorter":
            a = a.ravel()[:max(0, a.size - rng.randint(1, 3))]
        elif how == "longer":
            a = np.concatenate([a.ravel(), a.ravel()[:1]]) if a.size else np.array(["x"], object)
        elif how == "scalar":
            a = a.ravel()[0] if a.size else "x"
        else:
            a = a.ravel()[:1].reshape(1, -1) if a.size else np.zeros((1, 1))
        if isinstance(a, np.ndarray) and a.dtype.kind in "OU":
            a = a.astype(h5py.string_dtype())
        obj.attrs[attr] = a
        op += " " + how
    return "%s attr %s of %s" % (op, attr, path)


def mutate_dataset(f, rng, path, all_paths):
    ds = f[path]
    data = ds[()]
    op = rng.choice(["delete", "group", "scalar", "reshape", "reshape", "retype", "retype",
                     "values", "values", "values", "empty", "link"])
    if op == "delete":
        parent, name = split(path)
        del f[parent][name]
    elif op == "group":
        replace(f, path, "group")
    elif op == "scalar":
        replace(f, path, np.float64(rng.choice(NUMBERS)))
    elif op == "reshape":
        a = np.asarray(data)
        how = rng.choice(["transpose", "ravel", "row", "add-axis", "truncate", "extend", "zero"])
        if how == "transpose":
            a = a.T if a.ndim == 2 else a.reshape(-1, 1)
        elif how == "ravel":
            a = a.ravel()
        elif how == "row":
            a = a[0] if a.ndim and a.shape[0] else a.ravel()
        elif how == "add-axis":
            a = a[None]
        elif how == "truncate" and a.ndim:
            axis = rng.randrange(a.ndim)
            a = np.take(a, range(max(0, a.shape[axis] - rng.randint(1, 3))), axis=axis)
        elif how == "extend" and a.ndim:
            axis = rng.randrange(a.ndim)
            a = np.concatenate([a, np.take(a, range(min(1, a.shape[axis])), axis=axis)], axis=axis)
        else:
            a = np.zeros((0,) * max(1, a.ndim))
        a = np.asarray(a)
        if a.dtype.kind == "O" and a.size == 0:
            a = np.zeros(a.shape)
        replace(f, path, a)
        op += " " + how
    elif op == "retype":
        a = np.asarray(data)
        how = rng.choice(["strings", "fixed-strings", "ints", "bool", "complex", "compound",
                          "float16", "numbers"])
        if how == "strings":
            a = np.array([rng.choice(STRINGS[:12]) for _ in range(a.size)], dtype=object)
            a = a.reshape(np.shape(data))
            a = a.astype(h5py.string_dtype())
        elif how == "fixed-strings":
            a = np.full(np.shape(data), b"\xff12", dtype="S4")
        elif how == "ints":
            a = np.zeros(np.shape(data), dtype=np.int64) + rng.randint(-2, 5)
        elif how == "bool":
            a = np.ones(np.shape(data), dtype=bool)
        elif how == "complex":
            a = np.ones(np.shape(data), dtype=np.complex128)
        elif how == "compound":
            a = np.zeros(np.shape(data), dtype=[("x", "f8"), ("y", "i4")])
        elif how == "float16":
            a = np.ones(np.shape(data), dtype=np.float16)
        else:
            a = np.full(np.shape(data), rng.choice(NUMBERS))
        replace(f, path, a)
        op += " " + how
    elif op == "values":
        a = np.array(data)
        if a.dtype.kind in "fiu" and a.size:
            a = a.astype(np.float64)
            flat = a.reshape(-1)
            every = rng.random() < 0.3
            for i in (range(flat.size) if every else rng.sample(range(flat.size),
                                                                  min(flat.size, 3))):
                flat[i] = rng.choice(NUMBERS)
            ds[...] = a
        elif a.size:
            b = a.reshape(-1).copy()
            b[rng.randrange(b.size)] = rng.choice(STRINGS).encode()
            replace(f, path, b.reshape(a.shape).astype(h5py.string_dtype()))
        op += " (few)" if a.size else " (none)"
    elif op == "empty":
        parent, name = split(path)
        del f[parent][name]
        f[parent].create_dataset(name, data=h5py.Empty("f8"))
    else:
        replace(f, path, random_link(rng, path, all_paths))
        op += " " + f[split(path)[0]].get(split(path)[1], getlink=True).__class__.__name__
    return "%s dataset %s" % (op, path)


def random_link(rng, path, all_paths):
    how = rng.choice(["other", "dangling", "self", "external"])
    if how == "other" and all_paths:
        return h5py.SoftLink(rng.choice(all_paths))
    if how == "self":
        return h5py.SoftLink(path)
    if how == "external":
        return h5py.ExternalLink("/nonexistent/strata-fuzz.h5", "/x")
    return h5py.SoftLink(path + "_nowhere")


def mutate_group(f, rng, path, all_paths):
    g = f[path]
    op = rng.choice(["delete", "dataset", "empty", "add-member", "strip-attrs", "link"])
    if op == "delete":
        parent, name = split(path)
        del f[parent][name]
    elif op == "dataset":
        replace(f, path, rng.choice([np.float64(1.0), np.arange(4.0), np.array(["a"], object)]))
    elif op == "empty":
        for k in list(g.keys()):
            del g[k]
    elif op == "add-member":
        name = rng.choice(["junk", "loss2", "x y", "all_reduce2", "tp"])
        if name not in g:
            if rng.random() < 0.5:
                g.create_group(name)
            else:
                g.create_dataset(name, data=junk_value(rng) if rng.random() < 0.5 else np.ones(3))
    elif op == "strip-attrs":
        for a in list(g.attrs.keys()):
            del g.attrs[a]
    else:
        replace(f, path, random_link(rng, path, all_paths))
    return "%s group %s" % (op, path)


def mutate(path, rng, n):
    """Apply n mutations to the file at path; their descriptions."""
    done = []
    with h5py.File(path, "r+") as f:
        for _ in range(n):
            found = targets(f)
            if not found:
                break
            kind, p, attr = rng.choice(found)
            paths = [t[1] for t in found if t[0] in ("group", "dataset")]
            try:
                if kind == "attr":
                    done.append(mutate_attr(f, rng, p, attr))
                elif kind == "dataset":
                    done.append(mutate_dataset(f, rng, p, paths))
                elif kind == "group":
                    done.append(mutate_group(f, rng, p, paths))
                else:
                    parent, name = split(p)
                    del f[parent][name]
                    done.append("delete link %s" % p)
            except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
                done.append("(h5py refused a mutation of %s: %s)" % (p, str(e).splitlines()[0]
                                                                      if str(e) else type(e)))
    if rng.random() < 0.02:  # now and then, a file cut short
        size = os.path.getsize(path)
        with open(path, "r+b") as fh:
            fh.truncate(rng.randrange(size))
        done.append("truncate file")
    return done


# --- the trials ---------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("work")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    env = os.environ.get
    trials = int(env("STRATA_FUZZ_TRIALS", "300"))
    seconds = float(env("STRATA_FUZZ_SECONDS", "60"))
    max_mutations = int(env("STRATA_FUZZ_MUTATIONS", "3"))
    draw_every = int(env("STRATA_FUZZ_DRAW", "8"))
    seed = int(env("STRATA_FUZZ_SEED") or time.time_ns() % 10 ** 9)
    only = env("STRATA_FUZZ_TRIAL")
    print("fuzz_loader: seed %d (replay: STRATA_FUZZ_SEED=%d), up to %d trials or %g s, "
          "1..%d mutations each" % (seed, seed, trials, seconds, max_mutations), flush=True)

    sys.path.insert(0, args.results)
    import strata_results as sr
    warnings.simplefilter("ignore")
    summary, compare, plot, export = (import_tool(args.results, t)
                                      for t in ("summary", "compare", "plot", "export"))
    import matplotlib.pyplot as plt

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    bases = [(p, sr.read_run(p)) for p in args.files]  # valid files: they must load
    cmp_args = argparse.Namespace(ignore=[], level=0.95, min_change=0.02, loss_tol=1e-5)

    def tools(run, base):
        summary.row(run)
        compare.compare([base], [run], cmp_args)
        compare.compare([run], [run, run], cmp_args)
        plot.throughput_series([run, base])
        pair = sorted([run, base], key=lambda r: r.run_id)
        # report.html's chart data: JSON a browser parses (no NaN or inf)
        json.dumps(plot.chart_specs(pair, plot.StudyStyle(pair)), allow_nan=False)
        export.table([run, base], export.absent_is_zero)
        sr.list_problems([run], [], out=open(os.devnull, "w"))

    start = time.monotonic()
    counts = {"trials": 0, "mutations": 0, "loaded": 0, "rejected": 0, "drawn": 0}
    reasons, crashes = {}, []
    indices = [int(only)] if only else range(trials)
    for trial in indices:
        if not only and time.monotonic() - start > seconds:
            break
        rng = random.Random("%d:%d" % (seed, trial))
        base_path, base = rng.choice(bases)
        path = os.path.join(args.work, "trial.h5")
        shutil.copyfile(base_path, path)
        done = mutate(path, rng, rng.randint(1, max_mutations))
        if only:
            print("trial %d of %s, mutations:\n  %s" % (trial, os.path.basename(base_path),
                                                        "\n  ".join(done)))
        counts["trials"] += 1
        counts["mutations"] += sum(not d.startswith("(") for d in done)
        stage = "loader"
        try:
            try:
                run = sr.read_run(path)
            except sr.RunFileError as e:
                counts["rejected"] += 1
                reason = str(e).split()[0]
                reasons[reason] = reasons.get(reason, 0) + 1
                if only:
                    print("rejected: %s" % e)
                continue
            counts["loaded"] += 1
            stage = "tools"
            tools(run, base)
            if draw_every and counts["loaded"] % draw_every == 0:
                stage = "figures"
                for _, fig in plot.figures(sorted([run, base], key=lambda r: r.run_id)):
                    fig.canvas.draw()
                    plt.close(fig)
                counts["drawn"] += 1
            if only:
                print("loaded; nonfinite: %s" % run.nonfinite)
        except Exception:  # noqa: BLE001 -- what this test looks for
            keep = os.path.join(args.work, "crash-%d.h5" % trial)
            shutil.copyfile(path, keep)
            crashes.append(trial)
            print("CRASH in the %s, trial %d of %s (replay: STRATA_FUZZ_SEED=%d STRATA_FUZZ_TRIAL="
                  "%d), file kept as %s; mutations:" % (stage, trial, os.path.basename(base_path),
                                                       seed, trial, keep))
            for d in done:
                print("  " + d)
            traceback.print_exc(file=sys.stdout)
        finally:
            plt.close("all")
    elapsed = time.monotonic() - start
    print("rejections by reason: " + ", ".join("%s %d" % kv for kv in sorted(reasons.items())))
    print("fuzz_loader: seed %d: %d trials, %d mutations in %.1f s: %d loaded (%d drawn), "
          "%d rejected cleanly, %d crashes"
          % (seed, counts["trials"], counts["mutations"], elapsed, counts["loaded"],
             counts["drawn"], counts["rejected"], len(crashes)))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
