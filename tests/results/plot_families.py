"""results/plot's per-strategy figures as small multiples, checked on the Figure objects of a study
of 21 strategies (every family, a family of 7 split in two, compositions, a user's plugin, a
configuration with 3 repeats, 11 runs with a predicted step time, 9 of them outliers, two of
them at one point):
- throughput, efficiency and loss: no panel has more than 6 strategy series; every strategy is in
  exactly one panel of each figure, the one of its family; a strategy has one colour in all three
  figures (colour and marker differ within a panel); throughput and efficiency draw the ideal
  reference once per panel and no other line; the repeats are an interval at their median;
- memory, comm and bubble (one bar slot per run): every panel holds runs of one family, the one
  of its title, at most 12 runs; every run (for bubble, every pipelined run) in exactly one panel;
  a memory tag, a comm op, measured / schedule / replayed bubble in one colour in every panel (and
  no two of them in one colour); one legend a figure, naming every part drawn; the bars' heights
  (and the predicted device total's marker) equal to what h5py reads from the files of runs of
  three families (a pipeline with a replayed bubble among them);
- bubble: a replayed bar for exactly the runs whose file has bubble_fraction_replayed; a slot's
  bars side by side, three a slot in a panel with a replay, two wider ones in a panel without;
- prediction: only the 5 furthest outliers are labelled (a number at the point, the run in the
  key), no run inside the +-10% band; no number overlaps another, the legend or the key;
- the command draws the study and its report.
usage: plot_families.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import collections
import os
import shutil
import subprocess
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.container  # noqa: E402
import matplotlib.text  # noqa: E402
import numpy as np  # noqa: E402

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from archive_tool import import_tool  # noqa: E402
tools, e2e, work = sys.argv[1:4]
MAX_SERIES = 6
MAX_RUNS = 12  # runs (slots of two bars) a panel of the bar figures
MIB = 2.0 ** 20
# Runs whose bars are checked against the file: sharded (its tags and collectives) and a
# composition (send / recv beside them, and a pipeline bubble).
READ_BACK = ("zero3.np4", "1f1b.dp2.pp2.zero1", "1f1b.pp2")
# Run files of the e2e fixtures (tests/e2e/*.cmake) and the family each one's strategy belongs in.
RUNS = {
    "data parallel": "dp.np1 dp.np2 dp.np4 ddp.np1 ddp.np2 ddp.np4 allreduce.np2",
    "sharded": "zero1.np1 zero1.np2 zero1.np4 zero2.np1 zero2.np2 zero2.np4 zero3.np1 zero3.np2 "
               "zero3.np4 zero3.noprefetch.np4 fsdp.np1 fsdp.np2 fsdp.np4 fsdp-grad-op.np1 "
               "fsdp-grad-op.np2 fsdp-grad-op.np4 fsdp-hybrid.np1 fsdp-hybrid.np2 fsdp-hybrid.np4",
    # 1f1b.dp2.pp2: dp=2 under the default all-reduce, the same strategy as 1f1b.pp2 scaled out
    "pipeline": "gpipe.pp2 gpipe.pp4 1f1b.pp2 1f1b.pp4 1f1b.dp2.pp2 interleaved.pp2 "
                "interleaved.pp4",
    "tensor": "tp.np2 tp.np4 tp.sp.np2 tp.sp.np4 tp.dp2.np4",
    # dp=zero1/fsdp on a model-parallel plugin; a pipeline over a tp=2 mesh
    "compositions": "tp.dp2.zero1.np4 tp.dp2.fsdp.np4 1f1b.dp2.pp2.zero1 interleaved.tp2.pp2",
}
REPEATS = {"ddp.np2.r2": 0.9, "ddp.np2.r3": 1.2}  # copies of ddp.np2, tokens/s scaled
# Predicted step errors written into runs (the e2e runs have no --profile).
ERRORS = {"dp.np2": 0.02, "ddp.np1": -0.05, "zero1.np2": 0.3, "zero3.np4": -0.4, "tp.np2": 0.15,
          "gpipe.pp2": 0.5, "fsdp.np2": 0.25, "1f1b.pp2": 0.12, "tp.sp.np4": -0.6,
          # two repeats, one point: their numbers must still be apart
          "ddp.np2": 0.45, "ddp.np2.r2": 0.45}
# The replayed bubble (bubble_fraction_replayed) written into two pipelines given a prediction
# above: the pipeline panel has a replay, the compositions' panel none.
REPLAYED = {"gpipe.pp2": 0.17, "1f1b.pp2": 0.23}
REPLAYED_BAR = "replayed (calibrated profile)"


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


plot = import_tool(tools, "plot")


def make_study():
    """The study's directory, {strategy: family} expected, strategies named as plot does:
    plugin, options and model (the study has two models), and {run id: family}."""
    study = os.path.join(work, "study")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(study)
    expected = {}
    for family, ids in RUNS.items():
        for run_id in ids.split():
            shutil.copyfile(os.path.join(e2e, run_id + ".h5"), os.path.join(study, run_id + ".h5"))
    for run_id, scale in REPEATS.items():
        path = os.path.join(study, run_id + ".h5")
        shutil.copyfile(os.path.join(e2e, "ddp.np2.h5"), path)
        with h5py.File(path, "r+") as f:
            f.attrs["run_id"] = run_id
            f["summary"].attrs["tokens_per_s"] = f["summary"].attrs["tokens_per_s"] * scale
    # A user's own plugin: ddp.np2's file under another plugin name.
    path = os.path.join(study, "mine.np2.h5")
    shutil.copyfile(os.path.join(e2e, "ddp.np2.h5"), path)
    with h5py.File(path, "r+") as f:
        f.attrs["run_id"] = "mine.np2"
        f["config"].attrs["plugin"] = "mine"
    for run_id, error in ERRORS.items():
        with h5py.File(os.path.join(study, run_id + ".h5"), "r+") as f:
            s = f["summary"].attrs
            s["step_s_predicted"] = s["step_s_p50"] * (1 + error)
            s["step_s_predicted_error"] = error
    for run_id, fraction in REPLAYED.items():
        with h5py.File(os.path.join(study, run_id + ".h5"), "r+") as f:
            f["summary"].attrs["bubble_fraction_replayed"] = fraction
    run_family = dict.fromkeys(REPEATS, "data parallel")
    for family, ids in list(RUNS.items()) + [("other", "mine.np2")]:
        for run_id in ids.split():
            run_family[run_id] = family
            with h5py.File(os.path.join(study, run_id + ".h5"), "r") as f:
                c = {k: plot.one_line(v.decode() if isinstance(v, bytes) else v)
                     for k, v in f["config"].attrs.items()
                     if k in ("plugin", "plugin_opts", "model")}
            opts = " " + c["plugin_opts"] if c.get("plugin_opts") else ""
            name = "%s%s %s" % (c["plugin"], opts, c["model"])
            if expected.setdefault(name, family) != family:
                fail("%s: in %s and %s" % (name, family, expected[name]))
    return study, expected, run_family


def series_handles(ax):
    """{label: (colour, marker)} of the axes' legend entries that name a strategy (not the
    reference)."""
    out = {}
    for handle, label in zip(*ax.get_legend_handles_labels()):
        if label == plot.IDEAL:
            continue
        line = handle.lines[0] if isinstance(handle, matplotlib.container.Container) else handle
        if label in out:
            fail("%s: %s twice in one panel" % (ax.get_title(), label))
        out[label] = (matplotlib.colors.to_rgba(line.get_color()), line.get_marker())
    return out


def check_panels(name, fig, expected, colors):
    """One figure's panels: at most MAX_SERIES strategies each, each strategy once, in a panel of
    its family, in the colour it has in the other figures; the ideal reference once a panel."""
    seen = collections.Counter()
    for ax in fig.axes:
        title = ax.get_title()
        handles = series_handles(ax)
        if not 0 < len(handles) <= MAX_SERIES:
            fail("%s: panel %r has %d strategies" % (name, title, len(handles)))
        if len(set(handles.values())) != len(handles):
            fail("%s: panel %r repeats a colour and marker: %s" % (name, title, handles))
        for label, color in handles.items():
            seen[label] += 1
            if label not in expected or not title.startswith(expected[label]):
                fail("%s: %r in panel %r, want family %r" % (name, label, title,
                                                            expected.get(label)))
            if colors.setdefault(label, color) != color:
                fail("%s: %r is %s here, %s in another figure" % (name, label, color,
                                                                  colors[label]))
        if name == "loss":
            continue
        labels = ax.get_legend_handles_labels()[1]
        in_containers = {id(a) for c in ax.containers for a in c.get_children()}
        loose = [ln for ln in ax.get_lines() if id(ln) not in in_containers]
        if labels.count(plot.IDEAL) != 1 or len(loose) != 1:
            fail("%s: panel %r has %d ideal references and %d other lines"
                 % (name, title, labels.count(plot.IDEAL), len(loose)))
    if set(seen) != set(expected) or any(n != 1 for n in seen.values()):
        fail("%s: strategies drawn %s, want each of %s once" % (name, dict(seen), sorted(expected)))
    return len(fig.axes)


def check_packing():
    """pack_panels: a series' runs (a group) never cut across panels unless it alone is more than
    a panel holds; at most MAX_RUNS a panel; every run once; panels about even."""
    cases = {(7, 7, 7, 7): [7, 7, 7, 7], (3, 3, 3, 3, 3): [9, 6], (13,): [12, 1],
             (5, 4): [9], (12, 1): [12, 1]}
    for sizes, want in cases.items():
        groups = [["g%d.%d" % (g, i) for i in range(n)] for g, n in enumerate(sizes)]
        panels = plot.pack_panels("f", groups, MAX_RUNS)
        got = [len(items) for _, items in panels]
        placed = [x for _, items in panels for x in items]
        cut = [g for g in groups if len(g) <= MAX_RUNS
               and len({i for i, (_, items) in enumerate(panels) if g[0] in items and g[-1] in items}) != 1]
        if got != want or sorted(placed) != sorted(x for g in groups for x in g) or cut:
            fail("pack_panels%s: panels of %s, want %s; cut %s" % (sizes, got, want, cut))
        titles = [t for t, _ in panels]
        if len(panels) > 1 and titles[0] != "f (1/%d)" % len(panels):
            fail("pack_panels%s: titles %s" % (sizes, titles))


def check_repeats(fig, runs):
    """The ddp tiny series at 2 ranks: the median of its 3 repeats, bars to their min and max
    (intervals.py below 6 repeats)."""
    tps = sorted(r.summary["tokens_per_s"] for r in runs
                 if r.strategy == "ddp" and r.ranks == 2 and not r.config.get("plugin_opts"))
    if len(tps) != 3:
        fail("want 3 repeats of ddp at 2 ranks, have %d" % len(tps))
    for ax in fig.axes:
        for c in ax.containers:
            if c.get_label() == "ddp tiny":
                x, y = c.lines[0].get_data()
                segs = [s for s in c.lines[2][0].get_segments() if s[0][0] == 2]
                lo, hi = sorted([segs[0][0][1], segs[0][1][1]])
                if y[list(x).index(2)] != tps[1] or not np.allclose([lo, hi], [tps[0], tps[2]]):
                    fail("ddp at 2 ranks: %r [%r, %r], want %r" % (y, lo, hi, tps))
                return
    fail("no ddp tiny series in the throughput figure")


def check_prediction(fig, runs):
    """Numbers 1..5 at the 5 furthest outliers, the key naming those runs only; on the figure's
    layout as saved (tight_layout), no number overlaps another number, the key or the legend."""
    ax = fig.axes[0]
    numbers = [t.get_text() for t in ax.texts if isinstance(t, matplotlib.text.Annotation)]
    key = "\n".join(t.get_text() for t in ax.texts
                    if not isinstance(t, matplotlib.text.Annotation))
    outliers = sorted((i for i, e in ERRORS.items() if abs(e) > 0.10),
                      key=lambda i: -abs(ERRORS[i]))
    if numbers != [str(i) for i in range(1, 6)]:
        fail("prediction: numbered %r, want 1..5" % numbers)
    named = [line.split()[1] for line in key.splitlines()]
    if named != outliers[:5]:
        fail("prediction: key names %r, want %r" % (named, outliers[:5]))
    title = ax.get_title()
    if "%d run(s) outside" % len(outliers) not in title:
        fail("prediction title %r does not count %d outliers" % (title, len(outliers)))
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]
    boxes.append(("the legend", ax.get_legend().get_window_extent(renderer)))
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            if box_a.overlaps(box_b):
                fail("prediction: %r overlaps %r" % (a, b))


def bars_by_run(ax):
    """{run id: {part label: bar}} of a bar panel, each bar's run read from its gid."""
    out = {}
    for c in ax.containers:
        for bar in c:
            out.setdefault(bar.get_gid(), {})[c.get_label()] = bar
    return out


def check_bar_panels(name, fig, run_family, want_runs):
    """memory, comm or bubble: each panel the runs of one family (its title's), at most MAX_RUNS;
    every run of want_runs in one panel; a part (tag, op) in one colour throughout and no two
    parts in one; one legend, naming every part. The number of panels."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends
    if len(legends) != 1:
        fail("%s: %d legends, want one for the figure" % (name, len(legends)))
    legend = {t.get_text() for t in legends[0].get_texts()}
    seen, colors = collections.Counter(), {}
    for ax in fig.axes:
        title, bars = ax.get_title(), bars_by_run(ax)
        families = {run_family.get(r, "run %r unknown" % r) for r in bars}
        if len(families) != 1 or not title.startswith(families.copy().pop()):
            fail("%s: panel %r holds runs of %s" % (name, title, sorted(families)))
        if not 0 < len(bars) <= MAX_RUNS or len(ax.get_xticks()) != len(bars):
            fail("%s: panel %r has %d runs, %d ticks (at most %d)"
                 % (name, title, len(bars), len(ax.get_xticks()), MAX_RUNS))
        seen.update(list(bars))  # the run ids (a dict would add its values)
        for parts in bars.values():
            for label, bar in parts.items():
                color = matplotlib.colors.to_rgba(bar.get_facecolor())
                if colors.setdefault(label, color) != color:
                    fail("%s: %r is %s in panel %r, %s in another" % (name, label, color, title,
                                                                    colors[label]))
    if set(seen) != want_runs or any(n != 1 for n in seen.values()):
        fail("%s: runs drawn %s, want each of %s once" % (name, dict(seen), sorted(want_runs)))
    if len(set(colors.values())) != len(colors) or not set(colors) <= legend:
        fail("%s: part colours %s, legend %s" % (name, colors, sorted(legend)))
    return len(fig.axes)


def read_back(run_id):
    """What the file of the run says, read here with h5py: {figure: {part: value}}."""
    with h5py.File(os.path.join(study, run_id + ".h5"), "r") as f:
        warmup = int(f["config"].attrs["warmup"])
        tags = [t.decode() if isinstance(t, bytes) else t for t in f["memory"].attrs["tags"]]
        peaks = f["memory/peak_bytes"][()].max(axis=0) / MIB
        device = [i for i, t in enumerate(tags) if t != "offload"]
        memory = {t: peaks[i] for i, t in enumerate(tags) if t != "offload"}
        memory["predicted device total"] = f["memory/predicted_bytes"][()][device].sum() / MIB
        comm = {op: 1e3 * f["comm"][op]["time_s"][:, warmup:].mean() for op in f["comm"]}
        comm["exposed comm"] = 1e3 * f["steps/exposed_comm_s"][:, warmup:].mean()
        s = f["summary"].attrs
        bubble = ({"measured": 100 * s["bubble_fraction"],
                   "schedule (equal passes, free transfers)": 100 * s["bubble_fraction_predicted"]}
                  if "bubble_fraction_predicted" in s else None)
        if "bubble_fraction_replayed" in s:
            bubble[REPLAYED_BAR] = 100 * s["bubble_fraction_replayed"]
    return {"memory": memory, "comm": comm, "bubble": bubble}


def drawn_values(fig, run_id):
    """{part: height} of the run's bars in the figure, and the predicted device total's marker
    (its point at the device bar's middle)."""
    for ax in fig.axes:
        parts = bars_by_run(ax).get(run_id)
        if parts is None:
            continue
        out = {label: bar.get_height() for label, bar in parts.items()}
        for line in ax.get_lines():
            if line.get_label() == "predicted device total":
                bar = next(iter(parts.values()))
                x, y = line.get_data()
                out[line.get_label()] = y[list(x).index(bar.get_x() + bar.get_width() / 2)]
        return out
    fail("%s: no bar in the figure" % run_id)


def check_bubble_slots(fig, runs):
    """A replayed bar for exactly the runs that have one; in each panel a slot's bars side by side
    (none overlapping), 0.8 / parts wide: three parts where a run of the panel has a replay, two
    where none has. {panel title: parts}."""
    replayed = {r.run_id for r in runs if "bubble_fraction_replayed" in r.summary}
    parts_of = {}
    for ax in fig.axes:
        by_run = bars_by_run(ax)
        parts = 3 if any(REPLAYED_BAR in bars for bars in by_run.values()) else 2
        parts_of[ax.get_title()] = parts
        for run_id, bars in by_run.items():
            if (REPLAYED_BAR in bars) != (run_id in replayed):
                fail("bubble %s: replayed bar %s, replay in the file %s"
                     % (run_id, REPLAYED_BAR in bars, run_id in replayed))
            spans = sorted((b.get_x(), b.get_x() + b.get_width()) for b in bars.values())
            if (not np.allclose([b - a for a, b in spans], 0.8 / parts)
                    or any(end > start + 1e-9 for (_, end), (start, _) in zip(spans, spans[1:]))):
                fail("bubble %s: bars %s, want %d parts side by side" % (run_id, spans, parts))
    return parts_of


def check_heights(figs, run_id):
    """The run's bars in memory, comm and bubble against its file: a part drawn that the file does
    not have is 0; the file's parts all drawn."""
    for name, want in read_back(run_id).items():
        if want is None:
            continue
        drawn = drawn_values(figs[name], run_id)
        missing = set(want) - set(drawn)
        wrong = {k: (v, want.get(k, 0.0)) for k, v in drawn.items()
                 if not np.isclose(v, want.get(k, 0.0), rtol=1e-9, atol=1e-12)}
        if missing or wrong:
            fail("%s %s: %s not drawn; drawn vs file %s" % (name, run_id, sorted(missing), wrong))


study, expected, run_family = make_study()
runs, skipped = plot.load([study])
if skipped:
    fail("skipped %r" % skipped)
runs.sort(key=lambda r: (r.strategy, r.ranks, r.run_id))
figs = dict(plot.figures(runs))
colors = {}
panels = {name: check_panels(name, figs[name], expected, colors)
          for name in ("throughput", "efficiency", "loss")}
titles = [ax.get_title() for ax in figs["throughput"].axes]
if "sharded (1/2)" not in titles or "sharded (2/2)" not in titles:
    fail("the 7 sharded strategies are not split in two panels: %r" % titles)
check_repeats(figs["throughput"], runs)
check_packing()
check_prediction(figs["prediction"], runs)
bar_panels = {name: check_bar_panels(name, figs[name], run_family, want) for name, want in (
    ("memory", set(run_family)), ("comm", set(run_family)),
    ("bubble", {r.run_id for r in runs if "bubble_fraction_predicted" in r.summary}))}
bubble_parts = check_bubble_slots(figs["bubble"], runs)
if sorted(bubble_parts.values()) != [2, 3]:
    fail("bubble: parts a slot per panel %s, want one panel with a replay, one without"
         % bubble_parts)
for run_id in READ_BACK:
    check_heights(figs, run_id)
p = subprocess.run([os.path.join(tools, "plot"), study], capture_output=True, text=True,
                   timeout=300)
if p.returncode != 0 or not os.path.getsize(os.path.join(study, "figures", "report.html")):
    fail("plot exit %d: %s" % (p.returncode, p.stderr))
print("plot families: %d strategies, panels %s (at most %d series each, one colour per strategy "
      "in all three, one ideal reference a panel: %s); bar figures' panels %s (at most %d runs "
      "of one family each, one colour per part, one legend, heights of %s as in the files); "
      "bubble bars a slot %s, replayed for %s only; prediction numbers the 5 furthest of %d "
      "outliers, apart"
      % (len(expected), panels, MAX_SERIES, ", ".join(titles), bar_panels, MAX_RUNS,
         ", ".join(READ_BACK), bubble_parts, " and ".join(REPLAYED),
         sum(abs(e) > 0.10 for e in ERRORS.values())))
