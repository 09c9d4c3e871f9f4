// report.html's own script (results/plot inlines it after the Vega libraries): the chart of the
// metric the control names, and the runs table sorted by the column clicked. The page's state for
// a test or a reader: body[data-charts] "ready" once a chart is drawn ("error: ..." if not),
// body[data-metric] the metric drawn, window.strataView the Vega view.
(function () {
  "use strict";

  // A cell's sort key: data-v, a number the cell shows rounded or with a unit, else its text.
  function cellKey(cell) {
    return cell.dataset.v !== undefined ? Number(cell.dataset.v) : cell.textContent;
  }

  // Numbers ascending with NaN (a run without the value) last, text in natural order.
  function compare(a, b) {
    if (typeof a === "number" && typeof b === "number") {
      if (isNaN(a) || isNaN(b)) return isNaN(a) - isNaN(b);
      return a - b;
    }
    return String(a).localeCompare(String(b), undefined, { numeric: true });
  }

  function sortable(table) {
    const heads = Array.from(table.tHead.rows[0].cells);
    heads.forEach(function (th, col) {
      th.addEventListener("click", function () {
        const up = th.dataset.order !== "up";
        heads.forEach(function (h) { delete h.dataset.order; });
        th.dataset.order = up ? "up" : "down";
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort(function (r, s) {
          const order = compare(cellKey(r.cells[col]), cellKey(s.cells[col]));
          return up ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  }

  let view = null;  // the Vega view drawn, finalized before the next

  function draw(charts, key) {
    document.body.dataset.charts = "drawing";
    const spec = Object.assign({}, charts.specs[key], { datasets: { runs: charts.runs } });
    if (view) view.finalize();
    return vegaEmbed("#chart", spec, { mode: "vega-lite", renderer: "svg", actions: false })
      .then(function (result) {
        view = result.view;
        window.strataView = view;
        document.body.dataset.metric = key;
        document.body.dataset.charts = "ready";
      })
      .catch(function (e) { document.body.dataset.charts = "error: " + e.message; });
  }

  // The metric control and its first chart; nothing where the report has no charts.
  function charts() {
    const data = document.getElementById("chart-data");
    if (!data || typeof vegaEmbed === "undefined") return;
    const specs = JSON.parse(data.textContent);
    const select = document.getElementById("metric");
    specs.metrics.forEach(function (m) { select.add(new Option(m[1], m[0])); });
    select.addEventListener("change", function () { draw(specs, select.value); });
    draw(specs, select.value);
  }

  // The script sits above the table it sorts: it starts once the page is parsed.
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable").forEach(sortable);
    charts();
  });
})();
