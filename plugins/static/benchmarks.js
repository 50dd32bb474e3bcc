// The Benchmarks page's one script (pipelines/webview.py; loaded by base.html on every view, after
// Chart.js on the trends view). The page's Content-Security-Policy allows no inline script, so
// everything the page does in the browser is here:
// - the click relay: inside the Airflow UI the page sits in a sandboxed iframe that may neither
//   navigate the top window nor open tabs; links to Airflow (target=_top) and MLflow
//   (target=_blank) are re-clicked from the top window's document (same origin), which may do
//   both. Only http(s) URLs under a prefix of the page's allow-list (<script id="link-relay">:
//   the page's own folder, AIRFLOW_UI_URL, MLFLOW_UI_URL; pipelines.webview.relay_allow_list)
//   are relayed: javascript:, data:, other hosts and paths are refused (relayTarget).
// - the controls: a <select data-autosubmit> submits its form when changed.
// - the trend charts: the JSON in <script id="trend-data"> (pipelines.trends.trend_series), one
//   Chart.js line chart per metric: one line per cell (backend, strategy, workers), the
//   regression band each run was judged against (shaded), red triangles on regression alarms,
//   red crosses where a cell failed. Clicking a point opens that run; the legend hides a cell
//   (with its band). The charts are kept in window.benchmarkCharts (metric id -> Chart).
// Text from run folders (errors, run ids, labels) only reaches the DOM as text or canvas
// drawing: nothing here writes HTML (no innerHTML / insertAdjacentHTML / document.write).
// Under node (`require`), the file only exports relayTarget (tests/web/test_webview.py).
(function () {
  "use strict";

  // The URL a relayed click may open (absolute), or null. `href`: the link's URL; `prefixes`:
  // the allow-list (absolute or relative URLs); `base`: what relative ones resolve against (the
  // page's URL). Allowed: http(s), no user:password@, same origin as a prefix and its path under
  // the prefix's path (a prefix path without a trailing slash also matches as a whole segment).
  function relayTarget(href, prefixes, base) {
    let url;
    try { url = new URL(String(href), base); } catch (err) { return null; }
    if (url.protocol !== "http:" && url.protocol !== "https:") return null;
    if (url.username || url.password) return null;
    for (const entry of prefixes || []) {
      let prefix;
      try { prefix = new URL(String(entry), base); } catch (err) { continue; }
      if (prefix.protocol !== "http:" && prefix.protocol !== "https:") continue;
      if (prefix.origin !== url.origin || prefix.username || prefix.password) continue;
      const dir = prefix.pathname.endsWith("/") ? prefix.pathname : `${prefix.pathname}/`;
      if (url.pathname === prefix.pathname || url.pathname.startsWith(dir)) return url.href;
    }
    return null;
  }

  if (typeof module === "object" && module && module.exports) {
    module.exports = { relayTarget };
    return;
  }

  function relayClicks() {
    if (window.top === window) return;
    let topDoc;
    try { topDoc = window.top.document; } catch (err) { return; }
    const source = document.getElementById("link-relay");
    const prefixes = source ? JSON.parse(source.textContent) : [];
    document.addEventListener("click", function (event) {
      const link = event.target.closest && event.target.closest('a[target="_top"], a[target="_blank"]');
      if (!link || event.defaultPrevented) return;
      event.preventDefault();  // the sandbox would block it anyway; refused links do nothing
      const href = relayTarget(link.href, prefixes, document.baseURI);
      if (!href) {
        console.warn("Benchmarks page: link not relayed (not an allowed URL):", link.href);
        return;
      }
      const proxy = topDoc.createElement("a");
      proxy.href = href;
      proxy.target = link.target === "_blank" ? "_blank" : "_self";
      proxy.rel = "noopener noreferrer";
      topDoc.body.appendChild(proxy);
      proxy.click();
      proxy.remove();
    });
  }

  function autoSubmit() {
    for (const select of document.querySelectorAll("select[data-autosubmit]")) {
      select.addEventListener("change", () => { if (select.form) select.form.submit(); });
    }
  }

  const EXTRA = ["#0e7490", "#a16207", "#be185d", "#4d7c0f"];
  const DASHES = [[], [7, 4], [2, 3], [10, 3, 2, 3]];  // by worker count, like the point styles
  const POINTS = ["circle", "rect", "rectRot", "star"];
  const ALARM = "#d92d20";

  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${a})`;
  }
  function fmt(v, unit) {
    if (v === null || v === undefined) return "n/a";
    const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
    return `${v.toFixed(digits)}${unit === "%" ? " %" : unit ? " " + unit : ""}`;
  }

  // What every chart shares: the data, its run labels, each cell's colour and worker index.
  function trendContext(data) {
    // each platform's colour comes with the data (pipelines.platforms); EXTRA for one not registered
    const colours = Object.fromEntries(Object.entries(data.platforms || {}).map(([k, v]) => [k, v.colour]));
    const backends = [...new Set(data.series.map((s) => s.backend))];
    const labels = data.runs.map((r) => r.started);
    return {
      data, labels,
      dense: labels.length > 60,  // many runs: plain lines (points cost the most to draw)
      workerCounts: [...new Set(data.series.map((s) => s.workers))].sort((a, b) => a - b),
      color: (s) => colours[s.backend] || EXTRA[backends.indexOf(s.backend) % EXTRA.length],
    };
  }

  function bandDatasets(t, s, m, c) {
    // Focused on one or two cells: a shaded band. All cells: its edges dotted, barely shaded.
    const bands = m.bands || [];
    const focused = t.data.series.length <= 2;
    const edge = { borderWidth: focused ? 0 : 1, borderDash: [2, 3], borderColor: alpha(c, 0.55),
                   pointRadius: 0, pointHitRadius: 0, spanGaps: false };
    return [
      { label: `${s.label} band`, _band: s.key, data: bands.map((b) => (b ? b[0] : null)), fill: false, ...edge },
      { label: `${s.label} band`, _band: s.key, data: bands.map((b) => (b ? b[1] : null)),
        fill: "-1", backgroundColor: alpha(c, focused ? 0.18 : 0.035), ...edge },
    ];
  }

  function datasets(t, metric) {
    const out = [];
    const alarms = [];
    const failed = [];
    for (const s of t.data.series) {
      const m = s.metrics[metric.id];
      if (!m) continue;
      const c = t.color(s);
      const w = t.workerCounts.indexOf(s.workers);
      const bands = m.bands || [];
      if (metric.band && bands.some((b) => b)) out.push(...bandDatasets(t, s, m, c));
      out.push({ label: s.label, _series: s.key, _metric: m, data: m.values, borderColor: c,
                 backgroundColor: c, borderDash: DASHES[w % DASHES.length], pointStyle: POINTS[w % POINTS.length],
                 borderWidth: 2, pointRadius: t.dense ? 0 : 3.5, pointHoverRadius: 6, pointHitRadius: 4,
                 spanGaps: true, tension: 0 });
      for (const i of m.alarms) {
        if (m.values[i] !== null) alarms.push({ x: t.labels[i], y: m.values[i], _s: s, _i: i });
      }
      for (const [key, error] of Object.entries(m.failed)) {
        // a failed cell has no median: mark it at its last value (or the band's baseline)
        const i = Number(key);
        const before = m.values.slice(0, i + 1).filter((v) => v !== null);
        const y = before.length ? before[before.length - 1] : bands[i] ? bands[i][0] : null;
        if (y !== null) failed.push({ x: t.labels[i], y: y, _s: s, _i: i, _error: error });
      }
    }
    out.push({ label: "regression alarm", _marker: "alarm", type: "scatter", data: alarms, pointStyle: "triangle",
               pointRadius: 9, pointHoverRadius: 11, borderColor: ALARM, backgroundColor: ALARM, borderWidth: 2 });
    out.push({ label: "failed cell", _marker: "failed", type: "scatter", data: failed, pointStyle: "crossRot",
               pointRadius: 9, pointHoverRadius: 11, borderColor: ALARM, backgroundColor: ALARM, borderWidth: 3 });
    return out;
  }

  const tooltipLabel = (metric) => (ctx) => {
    const unit = metric.unit;
    const ds = ctx.dataset;
    if (ds._marker === "alarm") {
      const p = ctx.raw;
      return `ALARM ${p._s.label}: ${fmt(p.y, unit)} (beyond the band)`;
    }
    if (ds._marker === "failed") return `FAILED ${ctx.raw._s.label}: ${ctx.raw._error}`;
    const m = ds._metric;
    let text = `${ds.label}: ${fmt(ctx.parsed.y, unit)}`;
    const band = (m.bands || [])[ctx.dataIndex];
    if (band) text += ` (band ${fmt(band[0], unit)} to ${fmt(band[1], unit)})`;
    return text;
  };

  function runIndex(ctx) {
    const raw = ctx.raw;
    return raw && raw._i !== undefined ? raw._i : ctx.dataIndex;
  }

  // An empty chart says why instead of showing bare axes.
  const emptyNote = (t, metric) => ({
    id: "emptyNote",
    afterDraw(chart) {
      const lines = chart.data.datasets.filter((d) => d._series);
      if (lines.some((d) => d.data.some((v) => v !== null))) return;
      const { ctx, chartArea: a } = chart;
      const reference = t.data.reference;  // the platform overheads are measured against (pipelines.platforms)
      const text = metric.id === "overhead_vs_reference_total" && t.data.series.every((s) => s.backend === reference)
        ? `${reference} is the reference (0 %): choose another backend's cell`
        : "no values for the chosen cells in this window";
      ctx.save();
      ctx.fillStyle = "#616e7c";
      ctx.font = "14px system-ui, sans-serif";
      ctx.textAlign = "center";
      ctx.fillText(text, (a.left + a.right) / 2, (a.top + a.bottom) / 2);
      ctx.restore();
    },
  });

  const legendOptions = () => ({
    labels: { filter: (item, chartData) => {
                const ds = chartData.datasets[item.datasetIndex];
                return !ds._band && !(ds._marker && ds.data.length === 0);  // no empty markers
              }, usePointStyle: true, boxHeight: 8 },
    onClick: (event, item, legendBox) => {
      const chart = legendBox.chart;
      const key = chart.data.datasets[item.datasetIndex]._series;
      chart.data.datasets.forEach((ds, i) => {
        if (i === item.datasetIndex || (key && ds._band === key)) {
          chart.setDatasetVisibility(i, !chart.isDatasetVisible(i));
        }
      });
      chart.update();
    },
  });

  function chartOptions(t, metric) {
    return {
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "nearest", intersect: true },
      scales: {
        x: { title: { display: true, text: "run start (UTC), one point per run" }, offset: t.labels.length < 3,
             ticks: { maxRotation: 0, autoSkip: true, autoSkipPadding: 12 } },
        y: { title: { display: true, text: metric.y_label }, beginAtZero: metric.id === "overhead_vs_reference_total" },
      },
      plugins: {
        legend: legendOptions(),
        tooltip: {
          filter: (item) => !item.dataset._band,
          callbacks: {
            title: (items) => {
              if (!items.length) return "";
              const run = t.data.runs[runIndex(items[0])];
              const check = run.regression ? `; regression check ${run.regression}` : "";
              return `${run.run_id} (${run.started} UTC${check})`;
            },
            label: tooltipLabel(metric),
          },
        },
      },
      onClick: (event, elements, chart) => {
        const hit = elements.find((e) => !chart.data.datasets[e.datasetIndex]._band);
        if (!hit) return;
        const ds = chart.data.datasets[hit.datasetIndex];
        const i = ds._marker ? ds.data[hit.index]._i : hit.index;
        window.location.href = `runs?run=${encodeURIComponent(t.data.runs[i].run_id)}`;
      },
    };
  }

  function drawTrends() {
    const source = document.getElementById("trend-data");
    if (!source || typeof Chart === "undefined") return;
    const t = trendContext(JSON.parse(source.textContent));
    window.benchmarkCharts = {};
    for (const metric of t.data.metrics) {
      const canvas = document.getElementById(`chart-${metric.id}`);
      if (!canvas) continue;
      window.benchmarkCharts[metric.id] = new Chart(canvas, {
        type: "line", plugins: [emptyNote(t, metric)],
        data: { labels: t.labels, datasets: datasets(t, metric) }, options: chartOptions(t, metric),
      });
    }
  }

  relayClicks();
  autoSubmit();
  drawTrends();
})();
