#!/usr/bin/python3
"""The archive tools on a study of valid runs and damaged files: one file per kind of structural
damage (made with h5py from a valid e2e run file: a group replaced by a dataset, a scalar attribute
by an array, a required dataset deleted, wrong shapes and dtypes, strings for numbers, links that
dangle or loop, an empty HDF5 file, a zero-byte file, a directory named x.h5, a FIFO, a symlink
loop; and the crashes the loader fuzz found in the tools before they checked their input). Every
damaged file is listed on stderr with its reason, one line, never a traceback; the valid runs
(among them runs holding NaN or inf, which are data: listed as a warning and kept, and runs with
hostile but legal strings) are still summarised, compared and plotted. compare flags a NaN or inf
last loss or throughput, and --strict then exits 3.
usage: malformed.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

tools, e2e, work = sys.argv[1:4]
DDP, CAL, PIPE = "ddp.np2.h5", "ddp.calibrate.np4.h5", "gpipe.pp4.h5"


def replace(f, path, value):
    parent, name = path.rsplit("/", 1)
    parent = parent or "/"
    del f[parent][name]
    if isinstance(value, h5py.SoftLink) or isinstance(value, h5py.ExternalLink):
        f[parent][name] = value
    elif isinstance(value, np.dtype):
        f[parent][name] = value  # a named datatype
    elif isinstance(value, str) and value == "group":
        f[parent].create_group(name)
    else:
        f[parent].create_dataset(name, data=value)


def set_attr(path, name, value):
    def mutate(f):
        f[path].attrs[name] = value
    return mutate


def del_attr(path, name):
    def mutate(f):
        del f[path].attrs[name]
    return mutate


def put(path, value):
    return lambda f: replace(f, path, value)


def delete(path):
    def mutate(f):
        parent, name = path.rsplit("/", 1)
        del f[parent or "/"][name]
    return mutate


def both(*mutations):
    def mutate(f):
        for m in mutations:
            m(f)
    return mutate


def edit(path, fn):
    return lambda f: replace(f, path, fn(f[path][()]))


def set_values(path, value, index=np.s_[...]):
    def mutate(f):
        a = f[path][()]
        if a.dtype.kind in "iu":  # a count (int64 since strata-run/1.1): float64, as in /1 files
            a = a.astype(np.float64)
            a[index] = value
            replace(f, path, a)
        else:
            a[index] = value
            f[path][...] = a
    return mutate


def empty_group(path):
    def mutate(f):
        for k in list(f[path].keys()):
            del f[path][k]
    return mutate


STR = h5py.string_dtype()
# name, base file, mutation, the reason expected on stderr ("skipped NAME.h5: REASON").
DAMAGED = [
    # a group where a group is expected is a dataset
    ("steps_is_dataset", DDP, put("/steps", np.arange(4.0)), "malformed: /steps is a dataset, not a group"),
    ("summary_is_dataset", DDP, put("/summary", np.float64(1)), "malformed: /summary is a dataset, not a group"),
    ("config_is_dataset", DDP, put("/config", np.arange(2.0)), "malformed: /config is a dataset, not a group"),
    ("comm_is_dataset", DDP, put("/comm", np.arange(2.0)), "malformed: /comm is a dataset, not a group"),
    ("comm_op_is_dataset", DDP, put("/comm/all_reduce", np.ones((2, 20))),
     "malformed: /comm/all_reduce is a dataset, not a group"),
    ("memory_is_dataset", DDP, put("/memory", np.ones(3)), "malformed: /memory is a dataset, not a group"),
    ("calibration_is_dataset", CAL, put("/calibration", np.ones(3)),
     "malformed: /calibration is a dataset, not a group"),
    # a dataset where a dataset is expected is a group or a named datatype
    ("steps_loss_is_group", DDP, put("/steps/loss", "group"), "malformed: /steps/loss is a group, not a dataset"),
    ("steps_loss_is_datatype", DDP, put("/steps/loss", np.dtype("f8")),
     "malformed: /steps/loss is a named datatype, not a dataset"),
    # an array where a scalar attribute is expected, and other wrong attribute types
    ("summary_attr_array", DDP, set_attr("/summary", "tokens_per_s", np.array([1.0, 2.0])),
     "malformed: /summary attribute tokens_per_s is an array of shape (2,), not a number"),
    ("summary_attr_one_element", DDP, set_attr("/summary", "step_s_p50", np.array([0.1])),
     "malformed: /summary attribute step_s_p50 is an array of shape (1,), not a number"),
    ("summary_attr_string", DDP, set_attr("/summary", "loss_last", "2.5"),
     "malformed: /summary attribute loss_last is a string, not a number"),
    ("summary_attr_empty", DDP, set_attr("/summary", "mfu", h5py.Empty("f8")),
     "malformed: /summary attribute mfu is empty (no value), not a number"),
    ("summary_attr_bool", DDP, set_attr("/summary", "mfu", np.bool_(True)),
     "malformed: /summary attribute mfu is a boolean, not a number"),
    ("summary_attr_complex", DDP, set_attr("/summary", "mfu", np.complex128(1 + 2j)),
     "malformed: /summary attribute mfu is a complex128, not a number"),
    ("summary_no_tokens", DDP, del_attr("/summary", "tokens_per_s"),
     "malformed: /summary has no attribute tokens_per_s"),
    ("summary_no_peak", DDP, del_attr("/summary", "peak_bytes_max"),
     "malformed: /summary has no attribute peak_bytes_max"),
    ("summary_no_loss_last", DDP, del_attr("/summary", "loss_last"),
     "malformed: /summary has no attribute loss_last"),
    ("pipeline_no_bubble", PIPE, del_attr("/summary", "bubble_fraction"),
     "malformed: /summary has no attribute bubble_fraction"),
    ("run_id_missing", DDP, del_attr("/", "run_id"), "malformed: / has no attribute run_id"),
    ("run_id_number", DDP, set_attr("/", "run_id", np.float64(3)),
     "malformed: attribute run_id of / is a float64, not a string"),
    ("schema_array", DDP, set_attr("/", "schema", np.array(["strata-run/1"], dtype=STR)),
     "schema is an array of shape (1,), not strata-run/1 or strata-run/1.1"),
    ("config_attr_array", DDP, set_attr("/config", "world", np.array(["2", "2"], dtype=STR)),
     "malformed: /config attribute world is an array of shape (2,), not a string, number or boolean"),
    # strata-run/1.1 types /config: strings, integers, floats and booleans; nothing else
    ("config_attr_complex", DDP, set_attr("/config", "plugin", np.complex128(1)),
     "malformed: /config attribute plugin is a complex128, not a string, number or boolean"),
    ("config_nodes_bool", DDP, set_attr("/config", "nodes", np.bool_(True)),
     "malformed: /config nodes 'true' is not an integer"),
    ("config_nodes_real", DDP, set_attr("/config", "nodes", np.float64(1.5)),
     "malformed: /config nodes '1.5' is not an integer"),
    # strings where numbers are expected
    ("config_world_word", DDP, set_attr("/config", "world", "two"), "malformed: /config world 'two' is not an integer"),
    ("config_world_zero", DDP, set_attr("/config", "world", "0"), "malformed: /config world 0 is below 1"),
    ("config_world_mismatch", DDP, set_attr("/config", "world", "8"),
     "malformed: /config world 8 but /steps has 2 rank rows"),
    ("config_nodes_float", DDP, set_attr("/config", "nodes", "0.0"), "malformed: /config nodes '0.0' is not an integer"),
    ("config_nodes_true", DDP, set_attr("/config", "nodes", "True"), "malformed: /config nodes 'True' is not an integer"),
    # beyond any count (an unbounded Python int made the plots' arrays objects: found by fuzz_loader)
    ("config_nodes_huge", DDP, set_attr("/config", "nodes", "999999999999999999999999999999"),
     "malformed: /config nodes 999999999999999999999999999999 is above 2147483647"),
    ("config_warmup_negative", DDP, set_attr("/config", "warmup", "-1"), "malformed: /config warmup -1 is below 0"),
    ("config_warmup_all_steps", DDP, set_attr("/config", "warmup", "20"),
     "malformed: /config warmup 20 leaves no timed step of the 20 in /steps"),
    ("steps_loss_strings", DDP, edit("/steps/loss", lambda a: a.astype("S8").astype(STR)),
     "malformed: /steps/loss holds strings, not numbers"),
    ("steps_loss_fixed_strings", DDP, edit("/steps/loss", lambda a: a.astype("S8")),
     "malformed: /steps/loss holds strings, not numbers"),
    ("steps_compound", DDP, edit("/steps/step_s", lambda a: np.zeros(a.shape, [("x", "f8")])),
     "malformed: /steps/step_s holds"),
    ("steps_bool", DDP, edit("/steps/tokens", lambda a: a > 0), "malformed: /steps/tokens holds bool, not numbers"),
    ("calibration_op_numbers", CAL, edit("/calibration/op", lambda a: np.arange(len(a))),
     "malformed: /calibration/op holds int64, not strings"),
    ("calibration_ranks_nan", CAL, set_values("/calibration/ranks", np.nan, 0),
     "malformed: /calibration/ranks holds nan, not an integer in [1, "),
    ("trace_rank_beyond", PIPE, set_values("/trace/rank", 9.0, 3),
     "malformed: /trace/rank holds 9.0, not an integer in [0, 4)"),
    ("trace_rank_fraction", PIPE, set_values("/trace/rank", 0.5, 0),
     "malformed: /trace/rank holds 0.5, not an integer in [0, 4)"),
    # missing or wrongly-shaped datasets
    ("steps_no_loss", DDP, delete("/steps/loss"), "malformed: no /steps/loss"),
    ("steps_no_exposed", DDP, delete("/steps/exposed_comm_s"), "malformed: no /steps/exposed_comm_s"),
    ("steps_empty", DDP, empty_group("/steps"), "malformed: no /steps/loss"),
    ("steps_no_group", DDP, delete("/steps"), "malformed: no /steps"),
    ("summary_no_group", DDP, delete("/summary"), "malformed: no /summary"),
    ("comm_no_group", DDP, delete("/comm"), "malformed: no /comm"),
    ("memory_no_peak", DDP, delete("/memory/peak_bytes"), "malformed: no /memory/peak_bytes"),
    ("memory_no_tags", DDP, del_attr("/memory", "tags"), "malformed: /memory has no attribute tags"),
    ("comm_no_busbw", DDP, delete("/comm/all_reduce/busbw"), "malformed: no /comm/all_reduce/busbw"),
    ("steps_loss_1d", DDP, edit("/steps/loss", lambda a: a[0]),
     "malformed: /steps/loss has shape [20], expected [* x *]"),
    ("steps_loss_scalar", DDP, put("/steps/loss", np.float64(2.0)),
     "malformed: /steps/loss has shape [], expected [* x *]"),
    ("steps_metric_short", DDP, edit("/steps/exposed_comm_s", lambda a: a[:, :5]),
     "malformed: /steps/exposed_comm_s has shape [2 x 5], expected [2 x 20]"),
    ("steps_no_steps", DDP, lambda f: [replace(f, "/steps/" + k, f["/steps/" + k][()][:, :0])
                                       for k in list(f["/steps"].keys())],
     "malformed: /steps/loss has shape [2 x 0]: no rank or no step"),
    # A chunked dataset declaring 2 x 2^31 values (32 GiB) in a small file: skipped, not read
    # (the tools ended with a MemoryError before).
    ("steps_huge_chunked", DDP,
     lambda f: [f["/steps"].__delitem__("loss"),
                f["/steps"].create_dataset("loss", shape=(2, 2**31), dtype="f8", chunks=(1, 1024))],
     "malformed: /steps/loss declares [2 x 2147483648] values (32 GiB), more than the tools read "
     "(1 GiB)"),
    ("steps_empty_dataspace", DDP, put("/steps/loss", h5py.Empty("f8")),
     "malformed: /steps/loss has no dataspace (empty)"),
    ("memory_peak_shape", DDP, edit("/memory/peak_bytes", lambda a: a[:, :-1]),
     "malformed: /memory/peak_bytes has shape [2 x 6], expected [2 x 7]"),
    ("memory_peak_1d", DDP, edit("/memory/peak_bytes", lambda a: a[0]),
     "malformed: /memory/peak_bytes has shape [7], expected [2 x 7]"),
    ("memory_predicted_2d", DDP, edit("/memory/predicted_bytes", lambda a: a[None]),
     "malformed: /memory/predicted_bytes has shape [1 x 7], expected [7]"),
    ("memory_tags_scalar", DDP, set_attr("/memory", "tags", "params"),
     "malformed: /memory attribute tags is a string, not a list of strings"),
    ("memory_tags_numbers", DDP, set_attr("/memory", "tags", np.arange(6.0)),
     "malformed: /memory attribute tags holds float64, not strings"),
    ("comm_time_transposed", DDP, edit("/comm/all_reduce/time_s", lambda a: a.T),
     "malformed: /comm/all_reduce/time_s has shape [20 x 2], expected [2 x 20]"),
    ("calibration_short_column", CAL, edit("/calibration/busbw", lambda a: a[:-1]),
     "malformed: /calibration/busbw has shape [35], expected [36]"),
    ("trace_short_column", PIPE, edit("/trace/kind", lambda a: a[:-1].astype(STR)),
     "malformed: /trace/kind has shape [5279], expected [5280]"),
    # links that dangle or loop
    ("link_dangling", DDP, put("/steps/loss", h5py.SoftLink("/steps/nowhere")),
     "malformed: /steps/loss is a link to /steps/nowhere, which does not resolve"),
    ("link_loop", DDP, put("/steps/loss", h5py.SoftLink("/steps/loss")),
     "malformed: /steps/loss is a link to /steps/loss, which does not resolve"),
    ("link_external", DDP, put("/summary", h5py.ExternalLink(os.path.join(e2e, DDP), "/summary")),
     "malformed: /summary is an external link (to "),
    # crashes the fuzz (fuzz_loader.py) found in the tools before the loader checked its input,
    # besides those above: a zero-length array for a number, a number or an empty value for the
    # tag list, a scalar or a group for a string column, strings for comm times
    ("summary_attr_zero_length", DDP, set_attr("/summary", "loss_last", np.zeros(0)),
     "malformed: /summary attribute loss_last is an array of shape (0,), not a number"),
    ("memory_tags_number", DDP, set_attr("/memory", "tags", np.float64(6)),
     "malformed: /memory attribute tags is a float64, not a list of strings"),
    ("memory_tags_empty_value", DDP, set_attr("/memory", "tags", h5py.Empty("f8")),
     "malformed: /memory attribute tags is empty (no value), not a list of strings"),
    ("calibration_op_scalar", CAL, put("/calibration/op", "all_reduce"),
     "malformed: /calibration/op has shape [], expected [36]"),
    ("trace_kind_group", PIPE, put("/trace/kind", "group"), "malformed: /trace/kind is a group, not a dataset"),
    ("comm_time_fixed_strings", DDP, edit("/comm/all_reduce/time_s", lambda a: a.astype("S8")),
     "malformed: /comm/all_reduce/time_s holds strings, not numbers"),
    # the runner's own skip reasons, kept
    ("other_schema", DDP, lambda f: [f.attrs.__setitem__("schema", "other/9")], "schema 'other/9', not strata-run/1"),
    ("status_timeout", DDP, both(set_attr("/", "status", "timeout"), set_attr("/", "error", "rank 0:\nhung")),
     "status timeout: rank 0:\\nhung"),
]
# Data, not damage: kept (summarised, compared, plotted), with a warning line for NaN or inf.
KEPT = [
    ("ddp.np2", DDP, lambda f: None, None),
    ("gpipe.pp4", PIPE, lambda f: None, None),
    ("ddp.calibrate.np4", CAL, lambda f: None, None),
    ("nan_loss_last", DDP, set_attr("/summary", "loss_last", np.nan), "/summary loss_last"),
    ("inf_tokens", DDP, set_attr("/summary", "tokens_per_s", np.inf), "/summary tokens_per_s"),
    ("nan_steps_loss", DDP, set_values("/steps/loss", np.nan, np.s_[:, 10:]), "/steps/loss"),
    ("inf_peak_memory", DDP, set_values("/memory/peak_bytes", np.inf, np.s_[0, 0]), "/memory/peak_bytes"),
    ("nan_trace_times", PIPE, set_values("/trace/t0", np.nan, np.s_[::7]), "/trace/t0"),
    ("nan_busbw", CAL, set_values("/comm/all_reduce/busbw", np.nan), "/comm/all_reduce/busbw"),
    # Hostile strings: mathtext in labels, a path in the run id (it names the timeline file),
    # markup in the report, other memory tags than the other runs.
    ("hostile_strings", PIPE, both(set_attr("/", "run_id", "../../x$\\frac{$<b>"),
                                   set_attr("/config", "plugin", "$\\undefined$"),
                                   set_attr("/config", "dp", "<script>")), None),
    ("other_tags", DDP, set_attr("/memory", "tags", np.array(
        ["params", "grads", "optimizer", "activations", "x", "y", "z"], dtype=STR)), None),
    # A file from before the host-memory tag `offload` (the 7th) existed: six tags still load.
    ("six_tags", DDP, both(set_attr("/memory", "tags", np.array(
        ["params", "grads", "optimizer", "activations", "comm_buffers", "workspace"], dtype=STR)),
                           edit("/memory/peak_bytes", lambda a: a[:, :6]),
                           edit("/memory/predicted_bytes", lambda a: a[:6]),
                           edit("/memory/predicted_bytes_per_rank", lambda a: a[:, :6])), None),
    # Typed /config attributes (numbers, booleans) read as the strings of older files.
    ("typed_config", DDP, both(set_attr("/config", "world", np.int64(2)),
                               set_attr("/config", "lr", np.float64(0.003)),
                               set_attr("/config", "trace", np.bool_(False)),
                               set_attr("/config", "plugin", np.bytes_(b"ddp"))), None),
    ("no_memory_tags", DDP, both(set_attr("/memory", "tags", np.array([], dtype=STR)),
                                 edit("/memory/peak_bytes", lambda a: a[:, :0]),
                                 edit("/memory/predicted_bytes", lambda a: a[:0])), None),
]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, want_code):
    p = subprocess.run([os.path.join(tools, args[0])] + args[1:], capture_output=True, text=True,
                       timeout=300)
    print("$ %s -> %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    if "Traceback" in p.stdout + p.stderr:
        fail("traceback from %s" % " ".join(args))
    if p.returncode != want_code:
        fail("%s: exit %d, want %d" % (" ".join(args), p.returncode, want_code))
    return p


def make(dir, name, base, mutation):
    path = os.path.join(dir, name + ".h5")
    shutil.copyfile(os.path.join(e2e, base), path)
    with h5py.File(path, "r+") as f:
        if name not in (n for n, _, _, _ in KEPT[:3]):
            f.attrs["run_id"] = name
        mutation(f)
    return path


def skipped_line(stderr, name, reason):
    """The one stderr line for the file; its reason contains reason."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("skipped ") and
             (ln.split(": ", 1)[0].endswith("/" + name))]
    if len(lines) != 1:
        fail("%s: %d skipped lines, want 1" % (name, len(lines)))
    if reason not in lines[0]:
        fail("%s: reason %r not in %r" % (name, reason, lines[0]))


shutil.rmtree(work, ignore_errors=True)
study = os.path.join(work, "study")
os.makedirs(study)
for name, base, mutation, _ in DAMAGED + KEPT:
    make(study, name, base, mutation)
# Damage outside the HDF5 content.
with h5py.File(os.path.join(study, "empty_hdf5.h5"), "w"):
    pass
open(os.path.join(study, "zero_bytes.h5"), "w").close()
with open(os.path.join(study, "text.h5"), "w") as f:
    f.write("not hdf5\n")
with open(os.path.join(study, "truncated.h5"), "wb") as f:
    f.write(open(os.path.join(e2e, DDP), "rb").read()[:4096])
os.makedirs(os.path.join(study, "directory.h5"))
shutil.copyfile(os.path.join(e2e, DDP), os.path.join(study, "directory.h5", "inside.h5"))
os.symlink("symlink_loop.h5", os.path.join(study, "symlink_loop.h5"))
os.symlink("nowhere.h5", os.path.join(study, "dangling_link.h5"))
os.mkfifo(os.path.join(study, "fifo.h5"))  # would block a reader that opens it
OUTSIDE = [
    ("empty_hdf5", "schema '', not strata-run/1"),
    ("zero_bytes", "unreadable or partial (Unable to"),
    ("text", "unreadable or partial (Unable to"),
    ("truncated", "unreadable or partial (Unable to"),
    ("directory", "a directory, not a run file"),
    ("symlink_loop", "unreadable or partial (Too many levels of symbolic links)"),
    ("dangling_link", "unreadable or partial (No such file or directory)"),
    ("fifo", "unreadable or partial (not a regular file)"),
]
expected = [(n, r) for n, _, _, r in DAMAGED] + OUTSIDE
kept = [n for n, _, _, _ in KEPT]

# summary: every damaged file one line with its reason; every kept run a row.
p = run(["summary", study], 0)
for name, reason in expected:
    skipped_line(p.stderr, name + ".h5", reason)
rows = p.stdout.split("\n\n")[0].splitlines()[1:]  # the table, above the provenance notes
if len(rows) != len(kept):
    fail("%d rows, want %d" % (len(rows), len(kept)))
for name in kept:
    if not any(r.startswith(name + " ") or (name == "hostile_strings" and "frac" in r) for r in rows):
        fail("no row for " + name)
for name, _, _, where in KEPT:
    if where:
        want = "warning %s: non-finite values (kept) in " % os.path.join(study, name + ".h5")
        if not any(ln.startswith(want) and where in ln for ln in p.stderr.splitlines()):
            fail("%s: no warning naming %s" % (name, where))
n_lines = len(p.stderr.splitlines())
if n_lines != len(expected) + sum(1 for k in KEPT if k[3]):
    fail("%d stderr lines, want one per damaged file and warning" % n_lines)
run(["summary", "--csv", study], 0)

# compare: the study with itself compares its configurations and lists the same files.
p = run(["compare", study, study], 0)
for name, reason in expected:
    skipped_line(p.stderr, name + ".h5", reason)
if "configuration(s)" not in p.stdout:
    fail("no compare table")

# plot: figures of the kept runs, the damaged files in the report; nothing outside --out.
figs = os.path.join(work, "figures")
p = run(["plot", "--out", figs, study], 0)
for name, reason in expected:
    skipped_line(p.stderr, name + ".h5", reason)
report = open(os.path.join(figs, "report.html")).read()
for name, _ in expected:
    if name + ".h5: " not in report:
        fail(name + " not listed in report.html")
for name in ("throughput", "efficiency", "memory", "comm", "loss", "bubble", "transport"):
    if not os.path.getsize(os.path.join(figs, name + ".png")):
        fail("no " + name + ".png")
timelines = sorted(n for n in os.listdir(figs) if n.startswith("timeline-") and n.endswith(".png"))
if len(timelines) != 3 or "timeline-.._.._x__frac___b_.png" not in timelines:
    fail("timelines %s" % timelines)
if "<script>" in report or "<b>" in report.split("<h1>")[1]:
    fail("markup from a run file in the report")
if os.path.exists(os.path.join(work, "x.png")) or [n for n in os.listdir(figs) if n.startswith(".")]:
    fail("a file outside --out or a leftover temporary directory")

# compare flags a NaN or inf last loss or throughput on either side, and --strict fails.
def study_of(name, *files):
    d = os.path.join(work, name)
    os.makedirs(d)
    for f in files:
        shutil.copy(os.path.join(study, f + ".h5"), d)
    return d


base = study_of("base", "ddp.np2")
for name, verdict in (("nan_loss_last", "loss B=nan"), ("inf_tokens", "throughput B=inf")):
    other = study_of("with_" + name, name)
    p = run(["compare", base, other], 0)
    if verdict not in p.stdout or "1 flagged" not in p.stdout:
        fail("%s not flagged (%s)" % (name, verdict))
    run(["compare", "--strict", base, other], 3)
    p = run(["compare", "--strict", other, other], 3)
    if verdict.replace("B=", "A=") not in p.stdout:
        fail("%s not flagged against itself" % name)
print("malformed: %d damaged files listed with their reasons, %d runs kept, summarised, compared "
      "and plotted; NaN/inf loss and throughput flagged" % (len(expected), len(kept)))
