"""Provenance and caveats of a study, for summary.txt (results/summary) and report.html
(results/plot): where and how the runs were made, read from each run file's /provenance and
/config, and what a reader must know before trusting the numbers.

Caveats, each naming its runs:
    oversubscribed   ranks on a host x BLAS threads per rank > the host's cores (ranks then share
                     cores: the timings are for correctness, not for conclusions)
    versions mixed   runs made by different strata versions (or builds of one version)
    modified tree    built from a checkout with uncommitted changes (git describe ...-dirty):
                     the version alone does not say what ran
    machines mixed   runs on different CPU models or core counts
    not Release      a build type other than Release (timings of a debug build mean little)
    MFU above 100%   a rank's MFU above its peak: the peak was measured while the node was busy
    few timed steps  fewer than MIN_TIMED_STEPS timed steps: p50/p95 rest on few samples
    unstable         the timed steps' coefficient of variation above the run's --max-cv
                     (/summary unstable): one run's figures are not to be compared as they are
    non-finite       NaN or inf in the file (a diverged loss, a NaN throughput)
    calibration moved  a study's profile.end.h5 (STRATA_PROFILE=calibrate measures the repeated
                     node shapes again at its end) whose micro-batch passes differ from profile.h5's
                     by more than the larger of the two calibrations' rounds' spreads
Files from before a provenance entry existed lack it: the notes say "unknown", never fail.
"""
import collections
import html
import os

import h5py
import numpy as np
from strata_results import group

MIN_TIMED_STEPS = 5
DRIFT_TITLE = "Calibration at the start (profile.h5) and the end (profile.end.h5) of the study"
# At most this many distinct values are listed in one provenance line.
MAX_VALUES = 6


def _int(text):
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def _distinct(runs, value_of):
    """"v" when every run has v, else "v1 (n runs), v2 (m runs), ..." most common first."""
    counts = collections.Counter(value_of(r) for r in runs)
    if len(counts) == 1:
        return next(iter(counts))
    items = counts.most_common()
    text = ", ".join("%s (%d run%s)" % (v, n, "" if n == 1 else "s") for v, n in items[:MAX_VALUES])
    return text + (", and %d more" % (len(items) - MAX_VALUES) if len(items) > MAX_VALUES else "")


def version(run):
    p = run.provenance
    v = p.get("strata_version", "unknown")
    return v + (" (git %s)" % p["git_describe"] if p.get("git_describe") else "")


def host_ranks(run):
    """The most ranks of this run on one host (by /provenance/hostnames; without them, the ranks
    per node of /config)."""
    if run.hostnames:
        return max(collections.Counter(run.hostnames).values())
    return _int(run.config.get("ranks_per_node", "")) or 1


def threads(run):
    return _int(run.provenance.get("blas_threads", ""))


def cores(run):
    return _int(run.provenance.get("cores_online", ""))


def oversubscription(run):
    """"4 ranks x 1 thread on 2 cores" when the run's busiest host had more ranks x threads than
    cores, else None (also when the file does not say its threads or cores)."""
    n, t, c = host_ranks(run), threads(run), cores(run)
    if t is None or c is None or n * t <= c:
        return None
    return "%d rank%s x %d thread%s on %d core%s" % (n, "" if n == 1 else "s", t,
                                                   "" if t == 1 else "s", c, "" if c == 1 else "s")


def _hosts(runs):
    hosts = sorted({h for r in runs for h in r.hostnames})
    if not hosts:
        return "unknown (files without /provenance/hostnames)"
    shown = ", ".join(hosts[:8])
    return shown + (" and %d more" % (len(hosts) - 8) if len(hosts) > 8 else "")


def _dates(runs):
    dates = sorted(r.created_utc for r in runs if r.created_utc)
    if not dates:
        return "unknown"
    return dates[0] if dates[0] == dates[-1] else "%s to %s" % (dates[0], dates[-1])


def _model(run):
    c = run.config
    family = c.get("arch", "gpt2")  # files before the llama family: gpt2
    if family == "moe":
        family += " %s experts top %s" % (c.get("experts", "?"), c.get("top_k", "?"))
    return "%s (%s%s layers, hidden %s, seq %s, vocab %s, %s)" % (
        c.get("model", "?"), "" if family == "gpt2" else family + ", ", c.get("layers", "?"),
        c.get("hidden", "?"), c.get("seq", "?"), c.get("vocab", "?"), c.get("precision", "fp32"))


def _steps(run):
    steps, warmup = _int(run.config.get("steps", "")), run.warmup
    if steps is None:
        return "unknown"
    return "%d (%d warm-up, %d timed)" % (steps, warmup, steps - warmup)


def _threads_origin(run):
    t = threads(run)
    origin = run.provenance.get("blas_threads_origin", "")
    return "%s%s" % ("unknown" if t is None else t, " (%s)" % origin if origin else "")


def _device(run):
    p = run.provenance
    return run.device + (": %s" % p["gpu_names"] if p.get("gpu_names") else "")


def _machine(run):
    c = cores(run)
    return "%s, %s cores" % (run.provenance.get("cpu_model", "unknown CPU"),
                             "unknown" if c is None else c)


def provenance(runs):
    """[(label, text)]: the study's provenance, one line each."""
    rows = [("strata", _distinct(runs, version)),
            ("date (UTC)", _dates(runs)),
            ("hosts", _hosts(runs)),
            ("machine", _distinct(runs, _machine)),
            ("device", _distinct(runs, _device)),
            ("model", _distinct(runs, _model)),
            ("steps", _distinct(runs, _steps)),
            ("transport", _distinct(runs, lambda r: r.config.get("transport", "mpi"))),
            ("BLAS threads per rank", _distinct(runs, _threads_origin)),
            ("build", _distinct(runs, lambda r: "%s, %s, %s" % (
                r.provenance.get("build_type", "?"), r.provenance.get("compiler", "?"),
                r.provenance.get("mpi_version", "?"))))]
    topology = [r for r in runs if r.provenance.get("topology_summary")]
    if topology:  # /provenance topology_summary: newer files only
        rows.append(("topology", _distinct(topology, lambda r: r.provenance["topology_summary"]) +
                     ("" if len(topology) == len(runs) else " (%d of %d runs record it)"
                      % (len(topology), len(runs)))))
    jobs = sorted({r.provenance.get("slurm_job_id") for r in runs} - {None, ""})
    if jobs:
        rows.append(("Slurm job(s)", ", ".join(jobs)))
    return rows


def _named(runs, detail=None):
    return ", ".join(r.run_id + (" (%s)" % detail(r) if detail else "") for r in runs)


def caveats(runs):
    """[text]: what a reader must know before trusting the numbers, each naming its runs."""
    out = []
    over = [r for r in runs if oversubscription(r)]
    if over:
        out.append("oversubscribed: %d of %d run(s) put more ranks x threads on a host than it has "
                   "cores, so ranks shared cores and their timings, throughput and MFU are for "
                   "correctness, not for conclusions: %s"
                   % (len(over), len(runs), _named(over, oversubscription)))
    unknown = [r for r in runs if threads(r) is None or cores(r) is None]
    if unknown:
        out.append("oversubscription unknown: %d run(s) do not record their BLAS threads or cores: "
                   "%s" % (len(unknown), _named(unknown)))
    if len({version(r) for r in runs}) > 1:
        out.append("versions mixed: runs of different strata versions or builds: %s"
                   % _distinct(runs, version))
    dirty = [r for r in runs if r.provenance.get("git_describe", "").endswith("-dirty")]
    if dirty:
        out.append("built from a modified tree (git %s): the version alone does not say what ran: "
                   "%s" % (", ".join(sorted({r.provenance["git_describe"] for r in dirty})),
                           _named(dirty)))
    if len({_machine(r) for r in runs}) > 1:
        out.append("machines mixed: runs on different CPUs or core counts: %s"
                   % _distinct(runs, _machine))
    debug = [r for r in runs if r.provenance.get("build_type", "Release") != "Release"]
    if debug:
        out.append("not a Release build: timings of these runs mean little: %s"
                   % _named(debug, lambda r: r.provenance["build_type"]))
    hot = [r for r in runs if r.summary.get("mfu_rank_max", 0) > 1]
    if hot:
        out.append("MFU above 100%% on a rank (the peak was measured while the node was busy): %s"
                   % _named(hot, lambda r: "%.1f%%" % (100 * r.summary["mfu_rank_max"])))
    few = [r for r in runs if r.steps["loss"].shape[1] - r.warmup < MIN_TIMED_STEPS]
    if few:
        out.append("fewer than %d timed steps: step p50/p95 and tokens/s rest on few samples: %s"
                   % (MIN_TIMED_STEPS, _named(few, lambda r: "%d timed" % (
                       r.steps["loss"].shape[1] - r.warmup))))
    shaky = [r for r in runs if r.summary.get("unstable", 0) > 0]
    if shaky:
        out.append("unstable: the step time varied by more than the run's --max-cv (%s), so these "
                   "runs' figures may say more about the machine than about the strategy; repeat "
                   "them: %s" % (_distinct(shaky, lambda r: "%g%%" % (
                       100 * float(r.config.get("max_cv", "nan")))),
                       _named(shaky, lambda r: "CV %.1f%%" % (100 * r.summary["step_s_cv"]))))
    moved = [text for text, flagged in calibration_drift(runs) if flagged]
    if moved:
        out.append("calibration moved: measured again at the end of the study, %d profile "
                   "entr%s moved by more than the calibration's own spread, so the machine was not "
                   "the same throughout and predictions from it carry that change: %s"
                   % (len(moved), "y" if len(moved) == 1 else "ies", "; ".join(moved)))
    bad = [r for r in runs if r.nonfinite]
    if bad:
        out.append("non-finite values (NaN or inf) kept: %s" % _named(bad))
    return out


# What makes two compute entries of a profile one configuration (profile.hpp same_configuration).
ENTRY_KEY = ("preset", "micro_batch", "device", "precision", "threads", "ranks_per_node", "tp")


def _entries(path):
    """{configuration: (pass seconds of a micro-batch, spread)} of a profile's /compute table."""
    with h5py.File(path, "r") as f:
        c = f["compute"]
        col = {k: c[k][()] for k in c.keys()}
    n = len(col["preset"])
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
    out = {}
    for i in range(n):
        key = tuple(text(col[k][i]) if k in ("preset", "device", "precision") else
                    int(col[k][i]) if k in col else 1 for k in ENTRY_KEY)
        passes = (col["embedding_forward_s"][i] + col["embedding_backward_s"][i]
                  + col["layers"][i] * (col["block_forward_s"][i] + col["block_backward_s"][i])
                  + col["head_forward_s"][i] + col["head_backward_s"][i])
        out[key] = (float(passes), float(col["pass_spread"][i]) if "pass_spread" in col else 0.0)
    return out


def calibration_drift(runs):
    """[(text, moved)] per compute entry measured both at the start (profile.h5) and at the end
    (profile.end.h5) of the studies the runs are in: its micro-batch passes then and now, and
    whether it moved more than the larger spread of the two. A profile that cannot be read is
    left out (the notes never fail on it)."""
    out = []
    for d in sorted({os.path.dirname(os.path.abspath(r.path)) for r in runs}):
        start, end = os.path.join(d, "profile.h5"), os.path.join(d, "profile.end.h5")
        if not (os.path.isfile(start) and os.path.isfile(end)):
            continue
        try:
            a, b = _entries(start), _entries(end)
        except (OSError, KeyError, ValueError, TypeError, IndexError):
            continue
        for key in sorted(set(a) & set(b)):
            (t0, s0), (t1, s1) = a[key], b[key]
            if not (t0 > 0 and np.isfinite(t0) and np.isfinite(t1)):
                continue
            change, spread = t1 / t0 - 1, max(s0, s1)
            label = "%s mb%s %s %s, %s thread(s) x %s rank(s)%s" % (
                key[0], key[1], key[2], key[3], key[4], key[5],
                ", tp %s" % key[6] if key[6] != 1 else "")
            out.append(("%s: passes %.1f ms at the start, %.1f ms at the end (%+.1f%%; spread %.1f%%)"
                        % (label, 1e3 * t0, 1e3 * t1, 100 * change, 100 * spread),
                        abs(change) > spread))
    return out


def predicted(runs):
    """The runs given --profile (a predicted step time), sorted by run id."""
    return sorted((r for r in runs if "step_s_predicted_error" in r.summary),
                  key=lambda r: r.run_id)


def _errors_line(label, runs):
    errors = np.abs([r.summary["step_s_predicted_error"] for r in runs])
    worst = max(runs, key=lambda r: abs(r.summary["step_s_predicted_error"]))
    return ("%s: %d run(s), median |error| %.1f%%, %d within 10%%, largest %.1f%% (%s)"
            % (label, len(runs), 100 * float(np.median(errors)), int((errors <= 0.10).sum()),
               100 * float(errors.max()), worst.run_id))


def prediction(runs):
    """[text]: how well the profile's predicted step times (--profile, STRATA_PROFILE) matched
    the measured p50, for the runs that did not share cores and for those that did."""
    runs = predicted(runs)
    if not runs:
        return []
    apart = [r for r in runs if not oversubscription(r)]
    shared = [r for r in runs if oversubscription(r)]
    out = [_errors_line("all", runs)]
    if apart and shared:
        out += [_errors_line("not oversubscribed", apart),
                _errors_line("oversubscribed (ranks share cores)", shared)]
    return out + _repeats_line(apart)


def _repeats_line(runs):
    """[text] for a study with repeats: each configuration's predicted step time (the median of its
    runs' predictions) against the median of its runs' p50, for the not-oversubscribed runs."""
    configs = group(runs).values()
    if not any(len(rs) > 1 for rs in configs):
        return []
    errors = []
    for rs in configs:
        measured = float(np.median([r.summary["step_s_p50"] for r in rs]))
        predicted_s = float(np.median([r.summary["step_s_predicted"] for r in rs]))
        errors.append((predicted_s - measured) / measured)
    errors = np.abs(errors)
    return ["configurations against their repeats' median p50 (not oversubscribed): %d, median "
            "|error| %.1f%%, %d within 10%%, largest %.1f%%"
            % (len(errors), 100 * float(np.median(errors)), int((errors <= 0.10).sum()),
               100 * float(errors.max()))]


def text(runs):
    """The notes as lines of text (summary.txt)."""
    rows = provenance(runs)
    width = max(len(label) for label, _ in rows)
    lines = ["", "Provenance"] + ["  %s  %s" % (label.ljust(width), value) for label, value in rows]
    notes = caveats(runs)
    lines += ["", "Caveats"] + ["  - " + c for c in notes] if notes else ["", "Caveats", "  none"]
    accuracy = prediction(runs)
    if accuracy:
        lines += ["", "Predicted step time vs measured p50 (--profile)"] + ["  " + a for a in accuracy]
    drift = calibration_drift(runs)
    if drift:
        lines += ["", DRIFT_TITLE] + ["  %s%s" % (t, " (moved)" if m else "") for t, m in drift]
    return lines


def html_block(runs):
    """The notes as HTML (report.html): a provenance table and the caveats, warnings first."""
    rows = "".join("<tr><th>%s</th><td>%s</td></tr>" % (html.escape(k), html.escape(v))
                   for k, v in provenance(runs))
    notes = caveats(runs)
    items = "".join('<li class="caveat">%s</li>' % html.escape(c) for c in notes)
    block = ('<h2>Provenance</h2><table class="provenance">%s</table>\n<h2>Caveats</h2>'
             '<ul id="caveats">%s</ul>\n' % (rows, items or "<li>none</li>"))
    accuracy = prediction(runs)
    if accuracy:
        block += ('<h2>Predicted step time vs measured p50 (--profile)</h2><ul id="prediction">%s'
                  '</ul>\n' % "".join("<li>%s</li>" % html.escape(a) for a in accuracy))
    drift = calibration_drift(runs)
    if drift:
        block += '<h2>%s</h2><ul id="calibration">%s</ul>\n' % (html.escape(DRIFT_TITLE), "".join(
            "<li>%s%s</li>" % (html.escape(t), " (moved)" if m else "") for t, m in drift))
    return block
