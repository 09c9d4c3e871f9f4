#!/usr/bin/python3
"""results/plot's interactive report.html, opened in headless Chromium (driven over the DevTools
protocol on a pipe) from a file:// URL with no network, on a study of 9 strategies from the e2e
runs (a repeated configuration, pipelines with a bubble, runs with a predicted step time):
- the file is self-contained: no script, style or image from anywhere but the file itself, and
  the page asks for nothing but file: and data: URLs while it is open;
- the charts render as SVG: one point per run, whose run ids are those of the HDF5 files (read
  here with h5py); hovering a point shows its run id and values; a click on a legend entry hides
  that strategy's points and a second shows them again; the metric control redraws the chart for
  each metric (the bubble for the pipeline runs, the replayed bubble for the pipeline given
  --profile, predicted vs measured for the runs with one); the chart data's replayed bubble is
  the file's bubble_fraction_replayed in percent, and none for the runs without one;
- the runs table sorts by a clicked column, ascending then descending;
- a screenshot of the charts is written (WORK_DIR/report.png);
- without the charting libraries (STRATA_WEB_MODULES pointing nowhere) plot says so in one line
  and still writes the static report.
usage: report_html.py RESULTS_DIR E2E_DIR WORK_DIR
"""
import base64
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import h5py

sys.dont_write_bytecode = True
tools, e2e, work = sys.argv[1:4]
RUNS = ("ddp.np1 ddp.np2 ddp.np4 zero1.np2 zero3.np4 gpipe.pp2 1f1b.pp4 tp.np2 tp.dp2.zero1.np4"
        .split())
REPEAT = "ddp.np2.r2"  # a copy of ddp.np2: two points at one x, one median line
# Predicted step time errors and, for a pipeline among them, the replayed bubble: what a run given
# --profile stores (the e2e runs have none).
ERRORS = {"ddp.np2": 0.03, "zero1.np2": -0.2, "tp.np2": 0.12, "1f1b.pp4": -0.08}
REPLAYED = {"1f1b.pp4": 0.3}
HIDE = "zero1.np2"  # the run whose strategy is hidden by a click on its legend entry
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TIMEOUT = 30  # seconds for the page to draw a chart


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def make_study():
    """The study's directory and {run id: file's summary attributes}, read back with h5py."""
    study = os.path.join(work, "study")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(study)
    for run_id in RUNS:
        shutil.copyfile(os.path.join(e2e, run_id + ".h5"), os.path.join(study, run_id + ".h5"))
    shutil.copyfile(os.path.join(e2e, "ddp.np2.h5"), os.path.join(study, REPEAT + ".h5"))
    with h5py.File(os.path.join(study, REPEAT + ".h5"), "r+") as f:
        f.attrs["run_id"] = REPEAT
        f["summary"].attrs["tokens_per_s"] = f["summary"].attrs["tokens_per_s"] * 1.1
    for name, error in ERRORS.items():
        with h5py.File(os.path.join(study, name + ".h5"), "r+") as f:
            s = f["summary"].attrs
            s["step_s_predicted"] = s["step_s_p50"] * (1 + error)
            s["step_s_predicted_error"] = error
    for name, fraction in REPLAYED.items():
        with h5py.File(os.path.join(study, name + ".h5"), "r+") as f:
            f["summary"].attrs["bubble_fraction_replayed"] = fraction
    summaries = {}
    for name in sorted(os.listdir(study)):
        with h5py.File(os.path.join(study, name), "r") as f:
            run_id = f.attrs["run_id"]
            summaries[run_id.decode() if isinstance(run_id, bytes) else run_id] = dict(
                f["summary"].attrs)
    return study, summaries


def plot(study, out, env=None):
    p = subprocess.run([os.path.join(tools, "plot"), study, "--out", out], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, **(env or {})))
    report = os.path.join(out, "report.html")
    if p.returncode != 0 or not os.path.isfile(report):
        fail("plot exit %d: %s" % (p.returncode, p.stderr))
    with open(report, encoding="utf-8") as f:
        return f.read(), p.stderr


# What would make the page fetch something: an attribute or CSS that names a URL other than an
# anchor or data:, a <link>, an <iframe>, an @import.
FETCHES = re.compile(r"""<link\b|<iframe\b|@import|\b(?:src|href|srcset|action)\s*=\s*"""
                     r"""(?!["']?(?:data:|#))|url\(\s*(?!["']?data:)""", re.I)


def check_self_contained(page):
    """Every <script> inline; nothing that loads from elsewhere, outside the inlined code."""
    outside_scripts = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S | re.I)
    found = FETCHES.findall(outside_scripts)
    if found or re.search(r"<script\b[^>]*\bsrc\s*=", page, re.I):
        fail("report.html loads from outside itself: %r" % found[:5])
    if len(re.findall(r"<script\b", page)) < 3 or 'id="chart-data"' not in page:
        fail("report.html has no inlined charting libraries and chart data")


class Browser:
    """Headless Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: it reads
    commands on fd 3 and writes answers on fd 4, each a JSON text ended by a NUL byte); one page,
    attached as a flat session."""

    def __init__(self, profile):
        if not os.access(CHROMIUM, os.X_OK):
            fail("no Chromium at %s (scripts/install-deps.sh installs Debian's chromium)" % CHROMIUM)
        to_chrome, self.commands = os.pipe()
        self.answers, from_chrome = os.pipe()

        def pipes():  # in the child: the protocol's two descriptors, kept across exec
            ends = os.dup(to_chrome), os.dup(from_chrome)  # first away from 3 and 4
            for fd, end in zip((3, 4), ends):
                os.dup2(end, fd)
                os.set_inheritable(fd, True)

        self.log = open(os.path.join(work, "chromium.log"), "w")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-quic", "--host-resolver-rules=MAP * ~NOTFOUND",
             "--remote-debugging-pipe", "--user-data-dir=" + profile, "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            # Python's own descriptors are not inherited (os.pipe's are close-on-exec); the two
            # dup2 makes are, and close_fds would close them after preexec_fn
            preexec_fn=pipes, close_fds=False)
        os.close(to_chrome)
        os.close(from_chrome)
        self.buffer, self.next_id, self.session, self.events = b"", 0, None, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def read_message(self, deadline):
        while b"\0" not in self.buffer:
            if time.time() > deadline:
                fail("Chromium did not answer (see %s)" % self.log.name)
            chunk = os.read(self.answers, 1 << 20)
            if not chunk:
                fail("Chromium closed the pipe (see %s)" % self.log.name)
            self.buffer += chunk
        text, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(text)

    def call(self, method, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self.commands, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + TIMEOUT
        while True:
            answer = self.read_message(deadline)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    fail("%s: %s" % (method, answer["error"]))
                return answer["result"]
            self.events.append(answer)

    def js(self, expression):
        """The value of a JavaScript expression in the page (awaited when a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            fail("%s: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def wait_for(self, expression, what):
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            if self.js(expression):
                return
            time.sleep(0.05)
        fail("timed out waiting for %s (charts: %r)"
             % (what, self.js("document.body.dataset.charts")))

    def mouse(self, kind, x, y):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                  clickCount=1 if kind != "mouseMoved" else 0)

    def click(self, x, y):
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def close(self):
        try:
            self.call("Browser.close")
        finally:
            self.proc.wait(timeout=10)
            self.log.close()


# The chart's run points (not the legend's symbols): each has an aria-label "...; run: ID; ...".
POINTS = """Array.from(document.querySelectorAll('#chart g.mark-symbol.role-mark path'))
  .map(p => [p.getAttribute('aria-label') || '', Number(p.getAttribute('opacity') ?? 1)])"""


def points(browser):
    """[(run id, series, opacity)] of the chart's points."""
    out = []
    for label, opacity in browser.js(POINTS):
        fields = dict(f.split(": ", 1) for f in label.split("; ") if ": " in f)
        if "run" in fields:
            out.append((fields["run"], fields.get("strategy"), opacity))
    return out


def center(browser, selector, text=None):
    """The viewport position of the middle of the first element matching selector (and
    holding text), scrolled into view."""
    box = browser.js("""(() => {
      const el = Array.from(document.querySelectorAll(%s)).find(e => %s === null
        || e.textContent === %s || e.getAttribute('aria-label')?.includes(%s));
      if (!el) return null;
      el.scrollIntoView({block: 'center'});
      const r = el.getBoundingClientRect();
      return [r.x + r.width / 2, r.y + r.height / 2];
    })()""" % (json.dumps(selector), json.dumps(text), json.dumps(text), json.dumps(text)))
    if box is None:
        fail("no %s %r in the page" % (selector, text))
    return box


def check_tokens_chart(browser, summaries):
    """One point per run, the files' run ids; a hover shows the run; the legend hides a
    strategy and shows it again."""
    drawn = points(browser)
    if sorted(p[0] for p in drawn) != sorted(summaries):
        fail("tokens/s points %r, want the runs %r" % (sorted(p[0] for p in drawn),
                                                      sorted(summaries)))
    svgs = browser.js("document.querySelectorAll('#chart svg').length")
    if svgs != 1:
        fail("%d svg elements in #chart, want 1" % svgs)
    browser.mouse("mouseMoved", *center(browser, "#chart g.mark-symbol.role-mark path", REPEAT))
    browser.wait_for("document.getElementById('vg-tooltip-element')?.classList.contains('visible')",
                     "the tooltip")
    tip = browser.js("document.getElementById('vg-tooltip-element').textContent")
    want = "%.4g" % summaries[REPEAT]["tokens_per_s"]
    if REPEAT not in tip or want.split("e")[0][:4] not in tip.replace(",", ""):
        fail("tooltip over %s: %r (want its run id and tokens/s %s)" % (REPEAT, tip, want))
    series = next(p[1] for p in drawn if p[0] == HIDE)
    legend = center(browser, "#chart g.role-legend-label text", series)
    for hidden in (True, False):
        browser.click(*legend)
        time.sleep(0.2)
        faded = {p[0] for p in points(browser) if p[2] < 0.5}
        want = {p[0] for p in drawn if p[1] == series} if hidden else set()
        if faded != want:
            fail("after %s click on the legend's %s: hidden %r, want %r"
                 % ("a" if hidden else "a second", series, sorted(faded), sorted(want)))
    return len(drawn)


def check_metrics(browser, summaries):
    """Each metric of the control redraws the chart with its points; the bubble has the
    pipeline runs, predicted vs measured the runs with a prediction. {metric: points}."""
    want = {"bubble_pct": {r for r, s in summaries.items() if "bubble_fraction_predicted" in s},
            "bubble_replayed_pct": {r for r, s in summaries.items()
                                    if "bubble_fraction_replayed" in s},
            "prediction": {r for r, s in summaries.items() if "step_s_predicted_error" in s},
            "mfu_pct": set(summaries)}
    metrics = browser.js("Array.from(document.getElementById('metric').options, o => o.value)")
    if not set(want) <= set(metrics):
        fail("metrics offered %r, want %r among them" % (metrics, sorted(want)))
    counts = {}
    for metric in metrics:
        browser.js("""(() => { const s = document.getElementById('metric'); s.value = %s;
                      s.dispatchEvent(new Event('change')); })()""" % json.dumps(metric))
        browser.wait_for("document.body.dataset.charts === 'ready' && "
                         "document.body.dataset.metric === %s" % json.dumps(metric), metric)
        ids = {p[0] for p in points(browser)}
        counts[metric] = len(points(browser))
        if not ids or not ids <= set(summaries) or ids != want.get(metric, ids):
            fail("%s: points of %r, want %r" % (metric, sorted(ids),
                                                sorted(want.get(metric, summaries))))
    return counts


def check_replayed_values(page, summaries):
    """Each run's record in the chart data: bubble_replayed_pct is 100 x its file's
    bubble_fraction_replayed, None where the file has none. The runs that have one."""
    data = json.loads(re.search(r'<script type="application/json" id="chart-data">(.*?)</script>',
                                page, re.S).group(1))
    records = {r["run_id"]: r for r in data["runs"] if r["kind"] == "run"}
    if sorted(records) != sorted(summaries):
        fail("chart records of %r, want the runs %r" % (sorted(records), sorted(summaries)))
    for run_id, s in summaries.items():
        got = records[run_id].get("bubble_replayed_pct", "absent")
        if "bubble_fraction_replayed" in s:
            want = 100 * s["bubble_fraction_replayed"]
            right = isinstance(got, float) and math.isclose(got, want, rel_tol=1e-12)
        else:
            want = None
            right = got is None
        if not right:
            fail("%s: bubble_replayed_pct %r, want %r" % (run_id, got, want))
    return sorted(r for r, s in summaries.items() if "bubble_fraction_replayed" in s)


def check_sort(browser):
    """A click on "tokens/s" sorts the table ascending, a second descending."""
    column = browser.js("""Array.from(document.querySelectorAll('#runs thead th'),
                                      th => th.textContent).indexOf('tokens/s')""")
    for order in ("ascending", "descending"):
        values = browser.js("""(() => {
          document.querySelectorAll('#runs thead th')[%d].click();
          return Array.from(document.querySelectorAll('#runs tbody tr'),
                            tr => Number(tr.cells[%d].dataset.v)); })()""" % (column, column))
        if values != sorted(values, reverse=order == "descending") or len(values) < 2:
            fail("tokens/s column after a click, want %s: %r" % (order, values))


def check_network(browser):
    """Nothing asked for but file: and data: URLs; no script error."""
    for e in browser.events:
        if e.get("method") == "Network.requestWillBeSent":
            url = e["params"]["request"]["url"]
            if not url.startswith(("file:", "data:", "about:")):
                fail("the page asked for %s" % url)
        if e.get("method") == "Runtime.exceptionThrown" or (
                e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error"):
            fail("the page failed: %s" % json.dumps(e["params"])[:2000])


def screenshot(browser, path):
    center(browser, "#chart")
    shot = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    if not shot.startswith(b"\x89PNG") or len(shot) < 10000:
        fail("screenshot is not a PNG of the page (%d bytes)" % len(shot))
    with open(path, "wb") as f:
        f.write(shot)


def open_report(report, summaries):
    browser = Browser(os.path.join(work, "chromium-profile"))
    try:
        for domain in ("Network", "Page", "Runtime"):
            browser.call(domain + ".enable")
        browser.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                     deviceScaleFactor=1, mobile=False)
        browser.call("Page.navigate", url="file://" + os.path.abspath(report))
        browser.wait_for("document.body?.dataset.charts === 'ready'", "the first chart")
        n = check_tokens_chart(browser, summaries)
        counts = check_metrics(browser, summaries)
        check_sort(browser)
        browser.js("""(() => { const s = document.getElementById('metric');
                      s.value = 'tokens_per_s'; s.dispatchEvent(new Event('change')); })()""")
        browser.wait_for("document.body.dataset.metric === 'tokens_per_s'", "tokens/s again")
        screenshot(browser, os.path.join(work, "report.png"))
        check_network(browser)
        return n, counts
    finally:
        browser.close()


def check_without_libraries(study):
    """No libraries: one stderr line, the static report still written."""
    page, err = plot(study, os.path.join(work, "static"),
                     {"STRATA_WEB_MODULES": os.path.join(work, "nowhere")})
    lines = [line for line in err.splitlines() if "without interactive charts" in line]
    if len(lines) != 1 or 'id="no-charts"' not in page or "data:image/png;base64," not in page:
        fail("without the libraries: stderr %r, static report %s" % (err, 'id="no-charts"' in page))


start = time.time()
study, summaries = make_study()
page, err = plot(study, os.path.join(work, "figures"))
if "without interactive charts" in err:
    fail("the charting libraries were not found: " + err.strip())
check_self_contained(page)
replayed = check_replayed_values(page, summaries)
n, counts = open_report(os.path.join(work, "figures", "report.html"), summaries)
check_without_libraries(study)
print("report.html: %d runs drawn as points with their run ids, hover, legend hide/show, %d "
      "metrics (%s), replayed bubble of %s as in the files, table sort, no network, screenshot "
      "%s; %.1f s"
      % (n, len(counts), ", ".join("%s %d" % kv for kv in counts.items()), " ".join(replayed),
         os.path.join(work, "report.png"), time.time() - start))
