"""Reading strata run files (HDF5, schema strata-run/1 or strata-run/1.1) for the archive tools.

A study is a directory of run files; the tools take directories and/or files. Files that cannot
be used are reported with the reason, one line each, and skipped: a study with a failed
configuration, a truncated copy or a damaged file is still a study. The reasons:
    unreadable or partial (...)   not HDF5, truncated, a broken link, not a regular file
    schema 'X', not strata-run/1 or strata-run/1.1   another kind of file
    status S: ERROR               a run that did not end ok
    malformed: WHAT               a strata run file, but a group, dataset or attribute the tools
                                  read is missing, of the wrong kind, shape or type
strata-run/1.1 is strata-run/1 with typed values (docs/run-file.md): /config attributes are
int64, float64, booleans (h5py's enum) or strings; counts are int64; /rank and /step are
dimension scales. Run.config holds every /config value as text, the same for both schemas (as
the runner prints it: 3, 0.0003, true), so that --where and compare's configurations match
across them.
read_run() checks everything the tools use (kinds, shapes, dtypes, integer fields), so that a Run
holds only well-formed data and the tools never fail on a file; it raises RunFileError and
nothing else. Non-finite numbers (a diverged loss, a NaN throughput) are data, not damage: such a
run is kept and Run.nonfinite names where they are, for the tools to list and flag.

Exit codes shared by the tools: 0 done; 1 no usable run (every file skipped, no .h5 file found,
or nothing matching --where); 2 usage error (bad option, path that does not exist, an output
directory that cannot be written); 3 compare --strict found a change; 4 internal error (a bug:
one line, please report).
"""
import argparse
import os
import signal
import sqlite3
import stat
import sys

import h5py
import numpy as np

SCHEMA = "strata-run/1.1"  # what the runner writes
SCHEMAS = ("strata-run/1", SCHEMA)  # what the tools read
SCHEMAS_TEXT = " or ".join(SCHEMAS)

# What h5py raises for a file whose bytes are damaged (a bad object header, a truncated chunk, a
# dangling or looping link): all mean "unreadable", never a bug of ours.
_H5_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError)
# Summary measures the tools read without a default.
SUMMARY_REQUIRED = ("tokens_per_s", "mfu", "peak_bytes_max", "loss_last")
STEPS_REQUIRED = ("loss", "exposed_comm_s")
COMM_FIELDS = ("time_s", "calls", "bytes", "busbw")
CALIBRATION_NUMBERS = ("ranks", "bytes", "time_s", "algbw", "busbw")
CALIBRATION_STRINGS = ("group", "op")
TRACE_NUMBERS = ("rank", "t0", "t1", "bytes")
TRACE_STRINGS = ("stream", "kind", "name")


class RunFileError(Exception):
    """A file that cannot be used as a run; the message (one line) says why."""


class ProfileFile(RunFileError):
    """A machine profile (schema strata-profile/1): no run, but no damaged file either."""


def one_line(text, limit=200):
    """text with control characters (newlines) escaped and cut to limit: safe for a one-line
    message whatever a file holds."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _why(e):
    lines = str(e).splitlines()
    return one_line(lines[0] if lines and lines[0] else type(e).__name__)


def _text(value):
    """A str from an HDF5 string (bytes are UTF-8; undecodable bytes are replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _malformed(what):
    return RunFileError("malformed: " + one_line(what))


# --- checked access: each returns well-formed data or raises RunFileError ----------------------

def _kind(obj):
    if isinstance(obj, h5py.Group):
        return "group"
    if isinstance(obj, h5py.Dataset):
        return "dataset"
    return "named datatype" if isinstance(obj, h5py.Datatype) else type(obj).__name__


def _has(group, name, path):
    try:
        return name in group
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))


def _member(group, name, want, path, required=True):
    """group[name] when it is a want ("group" or "dataset"); None when absent and not required."""
    if not _has(group, name, path):
        if required:
            raise _malformed("no %s" % path)
        return None
    try:
        link = group.get(name, getlink=True)
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))
    if isinstance(link, h5py.ExternalLink):  # a run file is one file: never open another
        raise _malformed("%s is an external link (to %s)" % (path, link.filename))
    try:
        obj = group[name]
    except _H5_ERRORS as e:
        if isinstance(link, h5py.SoftLink):
            raise _malformed("%s is a link to %s, which does not resolve" % (path, link.path))
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))
    if _kind(obj) != want:
        raise _malformed("%s is a %s, not a %s" % (path, _kind(obj), want))
    return obj


def _members(group, path):
    try:
        return list(group.keys())
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))


_MISSING = object()


def _attr(obj, name, where):
    """The raw value of attribute name, or _MISSING."""
    try:
        if name not in obj.attrs:
            return _MISSING
        return obj.attrs[name]
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (attribute %s of %s: %s)" % (name, where, _why(e)))


def _attr_names(obj, where):
    try:
        return list(obj.attrs.keys())
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (attributes of %s: %s)" % (where, _why(e)))


def _describe(value):
    if isinstance(value, h5py.Empty):
        return "empty (no value)"
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return "an array of shape %s" % (value.shape,)
    if isinstance(value, (str, bytes)):
        return "a string"
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    return "a %s" % type(value).__name__


def _scalar(value):
    return value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value


def _string(value, what):
    value = _scalar(value)
    if isinstance(value, (str, bytes)):
        return _text(value)
    raise _malformed("%s is %s, not a string" % (what, _describe(value)))


def _number(value, what):
    value = _scalar(value)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)):
        return float(value)
    raise _malformed("%s is %s, not a number" % (what, _describe(value)))


def real_text(value):
    """The shortest %g text that reads back as value, in fixed notation for whole powers below
    1e16 ("0.0003", "300" not "3e+02", "1e-300", "1e+16"): how the runner prints a float option
    and its C++ reader (run_record.hpp real_text) turns a float /config value into text."""
    for digits in range(1, 18):
        text = "%.*g" % (digits, value)
        if float(text) == value:
            break
    exponent = int(text.split("e")[1]) if "e" in text else -1
    if 0 <= exponent < 16:
        text = "%.*g" % (exponent + 1, value)
    return text


def _config_text(value, what):
    """The text of a /config attribute: a string (every value in strata-run/1), an integer, a
    float or a boolean (strata-run/1.1), as the runner prints it."""
    value = _scalar(value)
    if isinstance(value, (str, bytes)):
        return _text(value)
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return real_text(float(value))
    raise _malformed("%s is %s, not a string, number or boolean" % (what, _describe(value)))


def _provenance(f):
    """(attributes as str, hostnames per rank) of /provenance; ({}, []) where a file has none.
    Provenance describes a run and is never needed to use it: what cannot be read is left out."""
    try:
        group = f["provenance"] if "provenance" in f else None
        if not isinstance(group, h5py.Group):
            return {}, []
        attrs = {}
        for k in group.attrs.keys():
            try:
                attrs[k] = _config_text(group.attrs[k], k)
            except RunFileError:
                continue  # an array or an empty value: not one line of text
        hosts = []
        ds = group.get("hostnames")
        if isinstance(ds, h5py.Dataset) and ds.ndim == 1 and ds.size <= 1 << 20 and (
                h5py.check_string_dtype(ds.dtype) or ds.dtype.kind == "S"):
            hosts = [_text(v) for v in ds[()]]
        return attrs, hosts
    except _H5_ERRORS:
        return {}, []


def _strings(value, what):
    """A 1-D array attribute of strings, as a list of str."""
    if not (isinstance(value, np.ndarray) and value.ndim == 1):
        raise _malformed("%s is %s, not a list of strings" % (what, _describe(value)))
    if not all(isinstance(v, (str, bytes)) for v in value):
        raise _malformed("%s holds %s, not strings" % (what, value.dtype))
    return [_text(v) for v in value]


def _shape_text(shape):
    return "[%s]" % " x ".join("*" if n is None else str(n) for n in shape)


# The most a dataset the tools read may hold: a run of 1,000 ranks x 100,000 steps is 0.8 GB a
# metric; a larger one is damage or not strata's, and reading it (a chunked dataset can declare
# terabytes in a small file) would end the whole tool with a MemoryError.
_MAX_DATASET_BYTES = 1 << 30


def _read(ds, path):
    try:
        shape = ds.shape
        dtype = ds.dtype
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))
    if shape is None:
        raise _malformed("%s has no dataspace (empty)" % path)
    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if size > _MAX_DATASET_BYTES:
        raise _malformed("%s declares %s values (%.3g GiB), more than the tools read (1 GiB)"
                         % (path, _shape_text(shape), size / 2**30))
    return shape, dtype


def _check_shape(shape, want, path):
    if len(shape) != len(want) or any(w is not None and n != w for n, w in zip(shape, want)):
        raise _malformed("%s has shape %s, expected %s" % (path, _shape_text(shape),
                                                          _shape_text(want)))


def _numbers(group, name, want, path):
    """The dataset group[name] as float64, checked to be numbers of shape want (None: any)."""
    ds = _member(group, name, "dataset", path)
    shape, dtype = _read(ds, path)
    if dtype.kind not in "iuf":
        what = "strings" if h5py.check_string_dtype(dtype) or dtype.kind in "SU" else str(dtype)
        raise _malformed("%s holds %s, not numbers" % (path, what))
    _check_shape(shape, want, path)
    try:
        return np.asarray(ds[()], dtype=np.float64)
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))


def _string_data(group, name, want, path):
    """The dataset group[name] as a list of str, checked to be strings of shape want."""
    ds = _member(group, name, "dataset", path)
    shape, dtype = _read(ds, path)
    if not (h5py.check_string_dtype(dtype) or dtype.kind == "S"):
        raise _malformed("%s holds %s, not strings" % (path, dtype))
    _check_shape(shape, want, path)
    try:
        return [_text(v) for v in np.asarray(ds[()]).ravel()]
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s: %s)" % (path, _why(e)))


# The largest count a run file holds (the runner's options stay far below it): a larger one is
# damage, and Python's unbounded ints would turn the plots' arrays into objects.
_MAX_COUNT = 2**31 - 1


def _integer(text, what, minimum):
    try:
        n = int(text.strip())
    except ValueError:
        raise _malformed("%s '%s' is not an integer" % (what, text))
    if n < minimum:
        raise _malformed("%s %d is below %d" % (what, n, minimum))
    if n > _MAX_COUNT:
        raise _malformed("%s %d is above %d" % (what, n, _MAX_COUNT))
    return n


def _integral(values, what, low, high):
    """values (float array) are integers in [low, high)."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(values) & (values == np.round(values)) & (values >= low) & (values < high)
    if not ok.all():
        bad = values[~ok][0]
        raise _malformed("%s holds %r, not an integer in [%d, %d)" % (what, float(bad), low, high))


class Run:
    """One usable run file: its identity, resolved configuration, summary measures and arrays,
    every one checked (see read_run)."""

    def __init__(self, path, f):
        self.path = path
        self.nonfinite = []  # where the file holds NaN or inf: "/summary loss_last", "/steps/loss"
        self.run_id = _string(_required_attr(f, "run_id", "/"), "attribute run_id of /")
        self.status = _string(_required_attr(f, "status", "/"), "attribute status of /")
        created = _scalar(_attr(f, "created_utc", "/"))
        self.created_utc = _text(created) if isinstance(created, (str, bytes)) else ""

        config = _member(f, "config", "group", "/config")
        self.config = {k: _config_text(_attr(config, k, "/config"), "/config attribute %s" % k)
                       for k in _attr_names(config, "/config")}
        # Files from before --device ran on the CPU: so the tables, --where and compare's
        # configurations treat them like runs that say device cpu.
        self.config.setdefault("device", "cpu")
        # Files from before the model families and --precision: a GPT-2 block in fp32.
        for k, v in OLD_FILE_CONFIG.items():
            self.config.setdefault(k, v)
        if "hidden" in self.config:
            hidden = _integer(self.config["hidden"], "/config hidden", 1)
            self.config.setdefault("ffn", str(4 * hidden))
        if "heads" in self.config:
            self.config.setdefault("kv_heads", self.config["heads"])

        self.provenance, self.hostnames = _provenance(f)

        summary = _member(f, "summary", "group", "/summary")
        self.summary = {}
        for k in _attr_names(summary, "/summary"):
            if not k.endswith(".unit"):
                self.summary[k] = _number(_attr(summary, k, "/summary"), "/summary attribute " + k)
        required = SUMMARY_REQUIRED + (("bubble_fraction",) if "bubble_fraction_predicted"
                                       in self.summary else ())
        for k in required:
            if k not in self.summary:
                raise _malformed("/summary has no attribute %s" % k)
        self.nonfinite += ["/summary " + k for k, v in sorted(self.summary.items())
                           if not np.isfinite(v)]

        # /steps: every metric [ranks x steps], one shape for all.
        steps = _member(f, "steps", "group", "/steps")
        names = _members(steps, "/steps")
        for k in STEPS_REQUIRED:
            if k not in names:
                raise _malformed("no /steps/%s" % k)
        shape = [None, None]
        self.steps = {}
        for k in sorted(names, key=lambda k: (k != "loss", k)):  # loss sets the shape
            self.steps[k] = self._array(steps, k, shape, "/steps/" + k)
            shape = list(self.steps[k].shape)
        n_ranks, n_steps = shape
        if n_ranks < 1 or n_steps < 1:
            raise _malformed("/steps/loss has shape %s: no rank or no step"
                             % _shape_text(shape))
        self.world = n_ranks
        if "world" in self.config:
            self.world = _integer(self.config["world"], "/config world", 1)
            if self.world != n_ranks:
                raise _malformed("/config world %d but /steps has %d rank rows"
                                 % (self.world, n_ranks))
        self.warmup = _integer(self.config.get("warmup", "0"), "/config warmup", 0)
        if self.warmup >= n_steps:
            raise _malformed("/config warmup %d leaves no timed step of the %d in /steps"
                             % (self.warmup, n_steps))
        self.nodes = _integer(self.config.get("nodes", "1"), "/config nodes", 1)

        # /comm per op, [ranks x steps] each: time, calls, bytes and the achieved busbw.
        comm = _member(f, "comm", "group", "/comm")
        fields = {field: {} for field in COMM_FIELDS}
        for op in _members(comm, "/comm"):
            group = _member(comm, op, "group", "/comm/" + op)
            for field in COMM_FIELDS:
                fields[field][op] = self._array(group, field, shape,
                                                "/comm/%s/%s" % (op, field))
        self.comm_time, self.comm_calls = fields["time_s"], fields["calls"]
        self.comm_bytes, self.comm_busbw = fields["bytes"], fields["busbw"]

        memory = _member(f, "memory", "group", "/memory")
        tags = _attr(memory, "tags", "/memory")
        if tags is _MISSING:
            raise _malformed("/memory has no attribute tags")
        self.memory_tags = _strings(tags, "/memory attribute tags")
        n_tags = len(self.memory_tags)
        self.memory_peak = self._array(memory, "peak_bytes", [n_ranks, n_tags],
                                       "/memory/peak_bytes")  # [ranks x tags]
        self.memory_predicted = self._array(memory, "predicted_bytes", [n_tags],
                                            "/memory/predicted_bytes")  # [tags]
        # [ranks], or None: not in the file, or written with no rows (not measured).
        self.process_peak = None
        if _member(memory, "process_peak_bytes", "dataset", "/memory/process_peak_bytes",
                   required=False) is not None:
            peak = self._array(memory, "process_peak_bytes", [None],
                               "/memory/process_peak_bytes")
            if len(peak) not in (0, n_ranks):
                raise _malformed("/memory/process_peak_bytes has %d values for %d ranks"
                                 % (len(peak), n_ranks))
            self.process_peak = peak if len(peak) else None

        # --calibrate-comm: rows of group, op, ranks, bytes, time_s, algbw, busbw.
        self.calibration = self._table(f, "calibration", CALIBRATION_NUMBERS,
                                       CALIBRATION_STRINGS)
        if self.calibration is not None:
            _integral(self.calibration["ranks"], "/calibration/ranks", 1, 2 ** 31)
        # --trace: one row per interval: rank, stream, kind, name, t0, t1, bytes.
        self.trace = self._table(f, "trace", TRACE_NUMBERS, TRACE_STRINGS)
        if self.trace is not None:
            _integral(self.trace["rank"], "/trace/rank", 0, n_ranks)

    def _array(self, group, name, shape, path):
        a = _numbers(group, name, shape, path)
        if not np.isfinite(a).all():
            self.nonfinite.append(path)
        return a

    def _table(self, f, name, numbers, strings):
        """An optional group of 1-D columns of one length."""
        group = _member(f, name, "group", "/" + name, required=False)
        if group is None:
            return None
        table, n = {}, [None]
        for k in numbers:
            table[k] = self._array(group, k, n, "/%s/%s" % (name, k))
            n = list(table[k].shape)
        for k in strings:
            table[k] = _string_data(group, k, n, "/%s/%s" % (name, k))
        return table

    @property
    def strategy(self):
        return self.config.get("plugin", "?")

    @property
    def variant(self):
        """The strategy with the options it ran with, as a study names it: tp:dp=zero1."""
        opts = self.config.get("plugin_opts", "")
        if not isinstance(opts, str):  # a damaged file's attribute: the strategy alone
            opts = ""
        return self.strategy + (":" + opts.replace(",", ":") if opts else "")

    @property
    def ranks(self):
        return self.world

    @property
    def label(self):
        return "%s@%d" % (self.strategy, self.ranks)

    def timed(self, metric):
        """Per-step mean over ranks of a /steps metric, timed steps only."""
        return self.steps[metric][:, self.warmup:].mean(axis=0)

    @property
    def device(self):
        return self.config["device"]

    @property
    def mesh(self):
        ep, cp = self.config.get("ep", "1"), self.config.get("cp", "1")
        return "dp%s.tp%s.pp%s%s%s" % (self.config.get("dp", "?"), self.config.get("tp", "?"),
                                       self.config.get("pp", "?"), "" if ep == "1" else ".ep" + ep,
                                       "" if cp == "1" else ".cp" + cp)


def _required_attr(obj, name, where):
    value = _attr(obj, name, where)
    if value is _MISSING:
        raise _malformed("%s has no attribute %s" % (where, name))
    return value


# What a configuration is: what was run (strategy and its options, mesh, nodes, model, batch,
# transport, device). Runs of one configuration in a study are its repeats (results/compare,
# results/summary).
# What makes two runs the same configuration (results/compare, the summary's repeats, catalog
# columns): the strategy, mesh, model (its family and shape included), batch, precision, recompute,
# transport and device.
KEY_FIELDS = ["plugin", "plugin_opts", "dp", "tp", "pp", "ep", "cp", "nodes", "ranks_per_node", "model",
              "arch", "layers", "hidden", "heads", "kv_heads", "ffn", "experts", "top_k",
              "shared_experts", "capacity_factor", "aux_loss_coef", "seq", "vocab", "micro_batch",
              "global_batch", "precision", "recompute", "transport", "device"]
# /config attributes of those that older files lack, as such a run was (ffn and kv_heads follow
# hidden and heads).
OLD_FILE_CONFIG = {"arch": "gpt2", "experts": "0", "top_k": "0", "shared_experts": "0",
                   "capacity_factor": "0", "aux_loss_coef": "0", "precision": "fp32", "ep": "1",
                   "cp": "1"}


def config_key(run, ignore=()):
    return tuple("*" if k in ignore else run.config.get(k, "") for k in KEY_FIELDS)


def describe(key):
    c = dict(zip(KEY_FIELDS, key))
    opts = " " + c["plugin_opts"] if c["plugin_opts"] else ""
    precision = " " + c["precision"] if c["precision"] not in ("fp32", "*") else ""
    model = c["model"]  # with its family where the name does not say it (mixtral-8x7b moe)
    if c["arch"] not in ("gpt2", "*", "") and c["arch"] not in model:
        model += " " + c["arch"]
    ep = ".ep" + c["ep"] if c["ep"] not in ("1", "*", "") else ""
    ep += ".cp" + c["cp"] if c["cp"] not in ("1", "*", "") else ""
    return one_line("%s%s dp%s.tp%s.pp%s%s %sx%s %s mb%s/gb%s%s %s %s" % (
        c["plugin"], opts, c["dp"], c["tp"], c["pp"], ep, c["nodes"], c["ranks_per_node"], model,
        c["micro_batch"], c["global_batch"], precision, c["transport"], c["device"]), 400)


def group(runs, ignore=()):
    """{configuration key: [runs]}, in the order the configurations first appear."""
    out = {}
    for r in runs:
        out.setdefault(config_key(r, ignore), []).append(r)
    return out


def read_run(path):
    """The Run of the file at path; RunFileError (and no other exception) when it cannot be
    used, its message the reason."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise RunFileError("unreadable or partial (%s)" % one_line(e.strerror or e))
    if not stat.S_ISREG(mode):  # a FIFO would block, a directory is no file
        raise RunFileError("unreadable or partial (not a regular file)")
    try:
        f = h5py.File(path, "r")
    except _H5_ERRORS as e:
        raise RunFileError("unreadable or partial (%s)" % _why(e))
    try:
        schema = _attr(f, "schema", "/")
        schema = "" if schema is _MISSING else _scalar(schema)
        if not isinstance(schema, (str, bytes)):
            raise RunFileError("schema is %s, not %s" % (_describe(schema), SCHEMAS_TEXT))
        if _text(schema).startswith("strata-profile/"):
            raise ProfileFile("a machine profile (%s), not a run file" % _text(schema))
        if _text(schema) not in SCHEMAS:
            raise RunFileError("schema '%s', not %s" % (one_line(_text(schema), 60),
                                                        SCHEMAS_TEXT))
        status = _attr(f, "status", "/")
        status = "?" if status is _MISSING else _string(status, "attribute status of /")
        if status != "ok":
            error = _attr(f, "error", "/")
            error = "" if error is _MISSING else _text(_scalar(error))
            raise RunFileError("status %s: %s" % (one_line(status, 40), one_line(error)))
        return Run(path, f)
    finally:
        try:
            f.close()
        except _H5_ERRORS:
            pass


# results/catalog's database: its layout's version (PRAGMA user_version) and how an SQLite file
# begins. A catalogue given to a tool stands for the run files it indexes, as a directory does.
CATALOG_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\0"


def is_sqlite(path):
    if not os.path.isfile(path):  # a FIFO would block the read
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def catalogued_files(path):
    """The run files results/catalog indexed into the catalogue at path (runs.path, resolved
    when indexed), read-only; CatalogueError when it is no catalogue of this version."""
    try:
        db = sqlite3.connect(path)
        try:
            db.execute("PRAGMA query_only = ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != CATALOG_VERSION:
                raise CatalogueError("an SQLite database that is no catalogue of version %d"
                                     % CATALOG_VERSION)
            return [row[0] for row in db.execute("SELECT path FROM runs ORDER BY path")]
        finally:
            db.close()
    except sqlite3.Error as e:
        raise CatalogueError("unreadable catalogue (%s)" % one_line(e))


class CatalogueError(Exception):
    """A file that looks like a catalogue but cannot be read as one; the message says why."""


def run_files(paths):
    """(files, skipped): every .h5 under the given directories (recursively, not following
    links to directories), every file a given catalogue (results/catalog) indexes and every
    other given file, sorted, each once; and (path, reason) for a directory named like a run
    file (not searched), one that cannot be listed, a directory with no .h5 file at all, an
    unusable catalogue, a catalogued file gone since, and a path that does not exist."""
    found, skipped = {}, []
    for p in paths:
        if not os.path.isdir(p) and is_sqlite(p):
            try:
                for path in catalogued_files(p):
                    if os.path.lexists(path):
                        found.setdefault(os.path.realpath(path), path)
                    else:
                        skipped.append((path, "catalogued in %s, no longer there" % p))
            except CatalogueError as e:
                skipped.append((p, str(e)))
        elif os.path.isdir(p):
            before = (len(found), len(skipped))
            errors = []
            for root, dirs, names in os.walk(p, onerror=errors.append):
                # A directory named like a run file is no run file: listed, not searched.
                skipped += [(os.path.join(root, d), "a directory, not a run file")
                            for d in sorted(dirs) if d.endswith(".h5")]
                dirs[:] = sorted(d for d in dirs if not d.endswith(".h5"))
                for n in names:
                    if n.endswith(".h5"):
                        path = os.path.join(root, n)
                        found.setdefault(os.path.realpath(path), path)
            skipped += [(e.filename or p, "cannot list (%s)" % one_line(e.strerror or e))
                        for e in errors]
            if (len(found), len(skipped)) == before:
                skipped.append((p, "no .h5 file in it"))
        elif os.path.lexists(p):
            found.setdefault(os.path.realpath(p), p)
        else:
            skipped.append((p, "no such file or directory"))
    return sorted(found.values()), skipped


def load(paths):
    """(runs, skipped): the usable runs, and (path, reason) for every file left out. A machine
    profile found in a directory (a study's profile.h5, STRATA_PROFILE=calibrate) belongs there:
    left out without a reason; one named on its own is reported."""
    files, skipped = run_files(paths)
    named = {os.path.realpath(p) for p in paths if not os.path.isdir(p)}
    runs = []
    for path in files:
        try:
            runs.append(read_run(path))
        except ProfileFile as e:
            if os.path.realpath(path) in named:
                skipped.append((path, str(e)))
        except RunFileError as e:
            skipped.append((path, str(e)))
        except MemoryError:  # a last resort: _read bounds what a file may declare
            skipped.append((path, "too large to read (out of memory)"))
    return runs, skipped


def list_problems(runs, skipped, out=sys.stderr):
    """One line per skipped file and per kept run holding non-finite numbers (each once)."""
    for path, reason in dict.fromkeys(skipped):
        print("skipped %s: %s" % (one_line(path, 400), reason), file=out)
    for r in {r.path: r for r in runs}.values():
        if r.nonfinite:
            print("warning %s: non-finite values (kept) in %s"
                  % (one_line(r.path, 400), ", ".join(r.nonfinite)), file=out)


# --- the command line, common to the tools ------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit code 2."""

    def error(self, message):
        print("%s: %s (see --help)" % (self.prog, one_line(message, 400)), file=sys.stderr)
        sys.exit(2)


def check_paths(parser, paths):
    """Every path exists (a broken link counts as missing); otherwise a usage error."""
    for p in paths:
        if not os.path.exists(p):
            parser.error("%s: no such file or directory" % p)


def finite_nonnegative(text):
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not a number" % text)
    if not np.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("'%s' is not a finite number >= 0" % text)
    return value


def coverage_level(text):
    """argparse type: a probability strictly between 0 and 1 (an interval's coverage)."""
    value = finite_nonnegative(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError("'%s' is not a coverage strictly between 0 and 1" % text)
    return value


def main_guard(prog, main):
    """Run main() and exit with its code: quiet on a closed pipe and on Ctrl-C, and a bug is one
    line and exit code 4, never a traceback."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    try:
        sys.stdout.reconfigure(errors="backslashreplace")
        sys.stderr.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError):
        pass
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    except Exception as e:  # noqa: BLE001 -- the last resort: tests call the functions directly
        print("%s: internal error (please report): %s: %s" % (prog, type(e).__name__, _why(e)),
              file=sys.stderr)
        code = 4
    sys.exit(code)
