"""Drive the Benchmarks page of a running Airflow API server in headless Chromium.

Run by scripts/e2e_benchmarks_page.sh inside its private network namespace:

    page_driver.py --write-history DIR    write the synthetic nightly history into DIR (the output root)
    page_driver.py --artifacts DIR        browse; write DIR/page_results.json and screenshots

The history: 10 nights of ddp, spark and determined at 1 and 2 workers (3 repeats), Spark a
little slower every night, DDP 1.7x slower on night 8 after a config change (the regression
alarm), spark-w2 failing on night 5; plus two older smoke runs. Browsing: sign in through
Airflow's login form, open the page inside the Airflow UI and on its own, read the charts'
data back from Chart.js (datasets, markers, axis titles), hover the alarm marker (tooltip),
click it (it opens the run), compare the nights before and after the alarm, follow the
profile/time-window controls, and an empty state. Exit status 0 when every step worked; the
pytest wrapper (tests/e2e/test_benchmarks_page.py) asserts on page_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from pipelines.runfolder.paths import RunPaths

PROJECT_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT_ROOT))
NIGHTS, SLOW_NIGHT, FAILED_NIGHT = 10, 8, 5
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = ["11_trends_in_airflow_ui.png", "12_trends.png", "13_alarm_marker.png", "14_compare.png",
               "15_run_with_alarm.png", "16_empty_state.png"]

CHARTS_JS = """() => Object.fromEntries(Object.entries(window.benchmarkCharts).map(([id, c]) => [id, {
  y_title: c.options.scales.y.title.text, x_title: c.options.scales.x.title.text,
  runs: c.data.labels.length,
  lines: c.data.datasets.filter(d => d._series).map(d => ({label: d.label,
      points: d.data.filter(v => v !== null).length})),
  bands: c.data.datasets.filter(d => d._band).length,
  alarms: c.data.datasets.filter(d => d._marker === 'alarm').flatMap(d => d.data.map(p => p._s.key)),
  failed: c.data.datasets.filter(d => d._marker === 'failed').flatMap(d => d.data.map(p => p._s.key)),
  drawn: c.canvas.toDataURL().length}]))"""

ALARM_POINT_JS = """() => {
  const c = window.benchmarkCharts.total_seconds;
  const i = c.data.datasets.findIndex(d => d._marker === 'alarm');
  const el = c.getDatasetMeta(i).data[0];
  const box = c.canvas.getBoundingClientRect();
  return {x: box.left + el.x, y: box.top + el.y, run: c.data.datasets[i].data[0]._i};  // viewport px
}"""


def write_history(root: Path) -> None:
    from tests.synthetic_history import write_history as write

    now = datetime.now(timezone.utc)
    write(root, NIGHTS, now=now, repeats=3, slow_nights={SLOW_NIGHT: 1.7},
          failed_nights={FAILED_NIGHT: "spark-w2-r1"}, config_changes={SLOW_NIGHT: {"threads_per_worker": 2}})
    write(root, 2, profile="smoke", now=now.replace(year=now.year - 1), backends=("ddp",))


def wait_for(what: str, check, timeout: float, interval: float = 1.0):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (httpx.HTTPError, OSError) as err:
            last = err
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


def browse(base: str, user: str, password: str, artifacts: Path, nights: list[str]) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {"screenshots": [], "js_errors": [], "console_errors": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                     args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(30_000)
        page.on("pageerror", lambda err: out["js_errors"].append(f"{page.url}: {err}"))
        page.on("console", lambda msg: msg.type == "error" and out["console_errors"].append(
            f"{msg.location.get('url')}: {msg.text}"))
        try:
            _browse_steps(page, base, user, password, artifacts, nights, out)
        except Exception:
            page.screenshot(path=artifacts / "page_error.png", full_page=True)
            out["error_page_url"] = page.url
            raise
        finally:
            browser.close()
    return out


def _browse_steps(page, base, user, password, artifacts, nights, out) -> None:
    from playwright.sync_api import expect

    def shot(name: str, locator=None) -> None:
        path = artifacts / name
        (locator.screenshot(path=path) if locator is not None else page.screenshot(path=path, full_page=True))
        out["screenshots"].append(name)

    def charts_drawn() -> None:
        page.wait_for_function("() => window.benchmarkCharts && Object.keys(window.benchmarkCharts).length == 4")

    page.goto(f"{base}/", wait_until="networkidle")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/auth/login" not in url)

    # Inside the Airflow UI: the nav entry's page embeds the plugin.
    page.goto(f"{base}/plugin/benchmarks", wait_until="networkidle")
    frame = page.frame_locator("iframe").first
    expect(frame.locator("#chart-total_seconds")).to_be_visible()
    body = frame.locator("body")
    for _ in range(100):  # the charts inside the frame: drawn once Chart.js ran there
        out["charts_in_airflow_ui"] = body.evaluate("() => Object.keys(window.benchmarkCharts || {}).length")
        if out["charts_in_airflow_ui"] == 4:
            break
        page.wait_for_timeout(200)
    shot(SCREENSHOTS[0])
    # Links out of the sandboxed frame: MLflow opens a tab, an Airflow DAG run moves the whole UI.
    requested: list[str] = []
    page.context.on("request", lambda request: requested.append(request.url))
    with page.context.expect_page() as popup:
        frame.locator("table.trend-runs a.mlflow").first.click()
    popup.value.wait_for_timeout(500)
    out["mlflow_tab_requests"] = [u for u in requested if u.startswith(os.environ["MLFLOW_UI_URL"])]
    popup.value.close()
    dag_link = frame.locator("table.trend-runs a.dag-run").first
    out["dag_link_href"] = dag_link.evaluate("a => a.href")
    dag_link.click()
    page.wait_for_url("**/dags/imdb_benchmark/runs/**")
    out["ui_url_after_dag_link"] = page.url

    # The trends view on its own: what the charts hold.
    t0 = time.perf_counter()
    page.goto(f"{base}/benchmarks/", wait_until="load")
    charts_drawn()
    out["trends_load_s"] = round(time.perf_counter() - t0, 3)
    out["charts"] = page.evaluate(CHARTS_JS)
    out["trends_text"] = page.inner_text("body")
    out["dag_run_hrefs"] = page.eval_on_selector_all("table.trend-runs a.dag-run", "els => els.map(e => e.href)")
    out["mlflow_hrefs"] = page.eval_on_selector_all("table.trend-runs a.mlflow", "els => els.map(e => e.href)")
    shot(SCREENSHOTS[1])

    # The alarm marker: hover shows the tooltip; a click opens the alarmed run.
    chart_box = page.locator(".chart").first
    chart_box.scroll_into_view_if_needed()
    point = page.evaluate(ALARM_POINT_JS)
    page.mouse.move(point["x"], point["y"])
    page.wait_for_timeout(300)
    out["tooltip"] = page.evaluate("""() => { const t = window.benchmarkCharts.total_seconds.tooltip;
        return {title: t.title, body: t.body.map(b => b.lines.join(' '))}; }""")
    shot(SCREENSHOTS[2], chart_box)
    page.mouse.click(point["x"], point["y"])
    page.wait_for_url("**/runs?run=*")
    out["alarm_click_url"] = page.url
    out["alarm_run_text"] = page.inner_text("body")
    shot(SCREENSHOTS[4])

    # Two runs side by side: the night before the alarm and the alarm night.
    page.goto(f"{base}/benchmarks/compare?a={nights[SLOW_NIGHT - 1]}&b={nights[SLOW_NIGHT]}",
              wait_until="networkidle")
    out["compare_text"] = page.inner_text("body")
    out["compare_alarm_cells"] = page.eval_on_selector_all(
        "table.cell-deltas tr", "rows => rows.filter(r => r.querySelector('td.alarm'))"
                                ".map(r => r.cells[0].innerText)")
    out["compare_config_diff"] = page.eval_on_selector_all(
        "table.config-diff tr", "rows => rows.slice(1).map(r => [...r.cells].map(c => c.innerText))")
    shot(SCREENSHOTS[3])

    # Controls: a 7-day window (a form submit through the select), then another profile.
    page.goto(f"{base}/benchmarks/", wait_until="load")
    with page.expect_navigation():
        page.select_option("select[name=window]", "7d")
    charts_drawn()
    out["window_7d"] = {"url": page.url, "runs": page.evaluate("window.benchmarkCharts.total_seconds.data.labels.length")}
    with page.expect_navigation():
        page.select_option("select[name=profile]", "smoke")
    out["smoke_7d_text"] = page.inner_text("body")
    page.goto(f"{base}/benchmarks/?profile=paper", wait_until="networkidle")
    out["empty_text"] = page.inner_text("body")
    shot(SCREENSHOTS[5])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-history", type=Path)
    parser.add_argument("--artifacts", type=Path)
    args = parser.parse_args()
    if args.write_history:
        write_history(args.write_history)
        return 0
    args.artifacts.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{os.environ.get('AIRFLOW__API__PORT', '8080')}"
    results: dict = {}
    t0 = time.monotonic()
    try:
        with httpx.Client(base_url=base, timeout=30) as anon:
            wait_for("the API server", lambda: anon.get("/api/v2/monitor/health").is_success, 240)
            results["healthy_s"] = round(time.monotonic() - t0, 1)
            results["unauthenticated_status"] = anon.get("/benchmarks/").status_code
        pw_file = Path(os.environ["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
        user, password = next(iter(json.loads(wait_for("the admin password", pw_file.read_text, 60)).items()))
        root = Path(os.environ["BENCHMARK_OUTPUT_ROOT"])
        nights = sorted(p.name for p in root.iterdir() if p.name.startswith("scheduled__"))[-NIGHTS:]
        results["nights"] = nights
        # the Airflow DAG run each folder records (folder names are made file-safe, run ids are not)
        results["dag_run_ids"] = [json.loads(RunPaths(root / n).dag_run.read_text())["run_id"] for n in nights]
        results.update(browse(base, user, password, args.artifacts, nights))
        ok = True
    except Exception as err:  # noqa: BLE001 - every failure ends up in page_results.json for the test
        results["error"] = f"{type(err).__name__}: {err}"
        ok = False
    results["driver_s"] = round(time.monotonic() - t0, 1)
    (args.artifacts / "page_results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if not k.endswith("_text")}, indent=2)[:6000])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
