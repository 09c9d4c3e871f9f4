"""Intervals from repeats, for results/summary, results/compare and results/plot's report.

A configuration run several times in a study (STRATA_REPEATS) has a median tokens/s and a
distribution-free interval for it: the order statistics x(k) and x(n+1-k) of the n repeats, with k
the largest rank whose coverage 1 - 2 P(B(n, 1/2) < k) is at least 95% (as the runner's interval of
its median step, core/src/run/summary.hpp). Below 6 repeats no k reaches 95%: the interval is then the
range [min, max], whose coverage 1 - 2^(1-n) is stated with it (50% for 2 repeats, 75% for 3,
87.5% for 4), never rounded up. No repeat (n = 1) gives no interval.

Two figures whose intervals overlap are "no difference": the tools do not rank them. Rankings name
each configuration that cannot be told from the one above it.
"""
import html
import math
import statistics

import study_notes
from strata_results import describe, group

LEVEL = 0.95


def median_interval(values, level=LEVEL):
    """(low, high, coverage) for the median the values sample, or None below 2 values or with a
    value that is not finite."""
    v = sorted(values)
    n = len(v)
    if n < 2 or not all(math.isfinite(x) for x in v):
        return None

    def coverage(k):  # P(x(k) <= median <= x(n+1-k)) for a continuous distribution
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return v[k - 1], v[n - k], coverage(k)


def overlap(a, b):
    """Whether two (low, high, ...) intervals share a point; False when either is None."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def interval_text(iv):
    """'[1200, 1250] 75%' or '-' without an interval."""
    return "-" if iv is None else "[%.4g, %.4g] %.3g%%" % (iv[0], iv[1], 100 * iv[2])


class Configuration:
    """One configuration of a study: its runs (repeats), median tokens/s and its interval."""

    def __init__(self, key, runs):
        self.key, self.runs = key, runs
        self.name = describe(key)
        tps = [r.summary["tokens_per_s"] for r in runs]
        self.tokens_per_s = statistics.median(tps)
        self.interval = median_interval(tps)
        self.step_s_p50 = statistics.median(r.summary.get("step_s_p50", math.nan) for r in runs)
        # A configuration is oversubscribed when any of its repeats shared cores.
        self.oversubscribed = any(study_notes.oversubscription(r) for r in runs)


def configurations(runs, ignore=()):
    """[Configuration], in the order the configurations first appear in runs."""
    return [Configuration(k, rs) for k, rs in group(runs, ignore).items()]


def ranking(configs):
    """[(Configuration, same_as_above)] by median tokens/s, fastest first; same_as_above when its
    interval overlaps the one ranked just above it (no difference can be claimed)."""
    ranked = sorted(configs, key=lambda c: (-c.tokens_per_s if math.isfinite(c.tokens_per_s)
                                            else math.inf, c.name))
    return [(c, i > 0 and overlap(c.interval, ranked[i - 1].interval))
            for i, c in enumerate(ranked)]


def reversed_pairs(a_runs, b_runs, ignore=()):
    """How two studies rank their common configurations: (pairs, reversed). pairs counts the pairs
    of configurations, not oversubscribed on either side, whose intervals are apart in both studies
    (each study tells them apart); reversed lists those of them (faster in A, faster in B) that the
    studies order oppositely. Pairs that either study cannot tell apart say nothing about the
    ranking, so two studies of a noisy machine agree unless one contradicts the other."""
    a = {c.key: c for c in configurations(a_runs, ignore) if not c.oversubscribed}
    b = {c.key: c for c in configurations(b_runs, ignore) if not c.oversubscribed}
    common = sorted(set(a) & set(b), key=lambda k: a[k].name)
    pairs, flipped = 0, []
    for i, x in enumerate(common):
        for y in common[i + 1:]:
            if overlap(a[x].interval, a[y].interval) or overlap(b[x].interval, b[y].interval) \
                    or a[x].interval is None or a[y].interval is None \
                    or b[x].interval is None or b[y].interval is None:
                continue
            pairs += 1
            a_first = a[x].tokens_per_s > a[y].tokens_per_s
            if a_first != (b[x].tokens_per_s > b[y].tokens_per_s):
                flipped.append((a[x].name, a[y].name) if a_first else (a[y].name, a[x].name))
    return pairs, flipped


def ranking_lines(runs):
    """Text lines: the not-oversubscribed configurations ranked by median tokens/s with their
    intervals ('=' marks no difference from the line above), then how many were left out as
    oversubscribed. Empty when no configuration has repeats."""
    configs = configurations(runs)
    if not any(len(c.runs) > 1 for c in configs):
        return []
    apart = [c for c in configs if not c.oversubscribed]
    lines = ["", "Ranking by tokens/s (median over repeats, interval of the median; '=': no "
             "difference from the line above, the intervals overlap)"]
    for c, same in ranking(apart):
        lines.append("  %s %-10.4g %-28s n=%d  %s" % ("=" if same else " ", c.tokens_per_s,
                                                     interval_text(c.interval), len(c.runs),
                                                     c.name))
    left = len(configs) - len(apart)
    if left:
        lines.append("  (%d oversubscribed configuration(s) not ranked: their ranks share cores)"
                     % left)
    return lines


def ranking_html(runs):
    """The ranking of ranking_lines as an HTML table (report.html), or "" without repeats."""
    configs = configurations(runs)
    if not any(len(c.runs) > 1 for c in configs):
        return ""
    apart = [c for c in configs if not c.oversubscribed]
    rows = "".join("<tr><td>%s</td><td>%.4g</td><td>%s</td><td>%d</td><td>%s</td></tr>"
                   % ("=" if same else "", c.tokens_per_s, html.escape(interval_text(c.interval)),
                      len(c.runs), html.escape(c.name)) for c, same in ranking(apart))
    left = len(configs) - len(apart)
    note = ("<p>%d oversubscribed configuration(s) not ranked: their ranks share cores.</p>" % left
            if left else "")
    return ('<h2>Ranking by tokens/s</h2><p>Median over repeats and the interval of the median '
            '(its coverage stated); "=": no difference from the row above, the intervals '
            'overlap.</p><table id="ranking"><tr><th></th><th>tokens/s</th><th>interval</th>'
            '<th>repeats</th><th>configuration</th></tr>%s</table>%s\n' % (rows, note))
