"""Reading strata run files (HDF5, schema strata-run/1) for the archive tools.

A study is a directory of run files; the tools take directories and/or files. Files that cannot
be used (unreadable or partial, another schema, a run that did not end ok) are reported with the
reason and skipped: a study with a failed configuration is still a study.
"""
import os

import h5py
import numpy as np

SCHEMA = "strata-run/1"


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


class Run:
    """One usable run file: its identity, resolved configuration and summary measures."""

    def __init__(self, path, f):
        self.path = path
        self.run_id = _text(f.attrs["run_id"])
        self.status = _text(f.attrs["status"])
        self.config = {k: _text(v) for k, v in f["config"].attrs.items()}
        self.summary = {k: float(v) for k, v in f["summary"].attrs.items()
                        if not k.endswith(".unit")}
        # Arrays for the figures: [ranks x steps] per metric, timed steps only where it matters.
        self.steps = {k: np.asarray(f["steps"][k]) for k in f["steps"].keys()}
        self.warmup = int(self.config.get("warmup", "0"))
        # /comm per op, [ranks x steps] each: time, calls, bytes and the achieved busbw.
        comm = {field: {op: np.asarray(f["comm"][op][field]) for op in f["comm"].keys()}
                for field in ("time_s", "calls", "bytes", "busbw")}
        self.comm_time, self.comm_calls = comm["time_s"], comm["calls"]
        self.comm_bytes, self.comm_busbw = comm["bytes"], comm["busbw"]
        self.memory_tags = [_text(t) for t in f["memory"].attrs["tags"]]
        self.memory_peak = np.asarray(f["memory"]["peak_bytes"])            # [ranks x tags]
        self.memory_predicted = np.asarray(f["memory"]["predicted_bytes"])  # [tags]
        # --calibrate-comm: rows of group, op, ranks, bytes, time_s, algbw, busbw.
        self.calibration = None
        if "calibration" in f:
            c = f["calibration"]
            self.calibration = {k: np.asarray(c[k]) for k in
                                ("ranks", "bytes", "time_s", "algbw", "busbw")}
            for k in ("group", "op"):
                self.calibration[k] = [_text(v) for v in c[k][...]]
        self.trace = None
        if "trace" in f:
            t = f["trace"]
            self.trace = {k: np.asarray(t[k]) for k in ("rank", "t0", "t1", "bytes")}
            for k in ("stream", "kind", "name"):
                self.trace[k] = [_text(v) for v in t[k][...]]

    @property
    def strategy(self):
        return self.config.get("plugin", "?")

    @property
    def ranks(self):
        return int(self.config.get("world", "0"))

    @property
    def label(self):
        return "%s@%d" % (self.strategy, self.ranks)

    def timed(self, metric):
        """Per-step mean over ranks of a /steps metric, timed steps only."""
        return self.steps[metric][:, self.warmup:].mean(axis=0)

    @property
    def mesh(self):
        return "dp%s.tp%s.pp%s" % (self.config.get("dp", "?"), self.config.get("tp", "?"),
                                   self.config.get("pp", "?"))


def run_files(paths):
    """Every .h5 under the given directories (recursively) and every given file, sorted."""
    found = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                found += [os.path.join(root, n) for n in names if n.endswith(".h5")]
        else:
            found.append(p)
    return sorted(found)


def load(paths):
    """(runs, skipped): the usable runs, and (path, reason) for every file left out."""
    runs, skipped = [], []
    for path in run_files(paths):
        try:
            with h5py.File(path, "r") as f:
                schema = _text(f.attrs.get("schema", ""))
                if schema != SCHEMA:
                    skipped.append((path, "schema '%s', not %s" % (schema, SCHEMA)))
                    continue
                status = _text(f.attrs.get("status", "?"))
                if status != "ok":
                    error = _text(f.attrs.get("error", ""))
                    skipped.append((path, "status %s: %s" % (status, error)))
                    continue
                runs.append(Run(path, f))
        except (OSError, KeyError, ValueError) as e:
            skipped.append((path, "unreadable or partial (%s)" % str(e).splitlines()[0]))
    return runs, skipped
