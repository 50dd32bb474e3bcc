"""Time of the Benchmarks page with many run folders in the output root (default 200 nights).

    PYTHONPATH=. .venv/bin/python bench/webview_page.py     # 200 runs, server + browser timings
    PYTHONPATH=. .venv/bin/python bench/webview_page.py --runs 50 --no-browser --keep /tmp/hist

(PYTHONPATH=. makes the test fixtures' run-folder writer, tests/synthetic_history.py, importable.)

Writes ``--runs`` synthetic-but-well-formed nightly run folders (tests/synthetic_history.py:
config.json, one result.json per cell for 3 backends x 2 worker counts x 3 repeats, summary.json
from the real evaluation, regression.json from the real comparison, mlflow.json, airflow.json),
serves the page's FastAPI app (pipelines.web.view) with uvicorn on 127.0.0.1 and times GET
requests over HTTP: the first one (cold: the run index reads every folder) and the median of
``--repeat`` more (warm: nothing changed, nothing re-read), for the trends view (30 days and
all runs), the run view and the comparison: the page time, budgeted at 1 s. With Debian's
chromium (unless --no-browser), it also times a full page load of the trends view in headless
Chromium until all four charts are drawn (reported, not budgeted: it is mostly Chromium's
drawing on a CPU this machine shares), and as a ratio to the run view's load in the same browser
(a page without charts, measured in the same run: what the charts cost, whatever the machine's
load; tests/e2e/test_benchmarks_page.py checks the charts, not their time). Prints one line per
figure, the load average, and the verdict; exit status 1 when a page (cold or warm) takes longer
than the budget. The auth dependency is a no-op here (the page's own cost is measured; Airflow's
login adds a JWT check).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipelines.cluster.processes import free_port

BUDGET_S = 1.0


def _serve(root: Path):
    import uvicorn

    from pipelines.web.view import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(auth=lambda: None, root=root), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


def _time_get(client, url: str) -> tuple[float, int]:
    start = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, len(response.content)


def _browser_load(base: str, path: str, charts: bool = True) -> float:
    """Seconds from navigation start until the four trend charts exist (headless Chromium); with
    charts=False until the page's load event (a view without charts: the reference)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        times = []
        for _ in range(3):  # first load fetches Chart.js; later ones use the browser cache
            start = time.perf_counter()
            page.goto(base + path, wait_until="load")
            if charts:
                page.wait_for_function("() => window.benchmarkCharts && Object.keys(window.benchmarkCharts).length == 4")
            times.append(time.perf_counter() - start)
        browser.close()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="nightly run folders to write")
    parser.add_argument("--repeat", type=int, default=10, help="warm requests per view (median)")
    parser.add_argument("--keep", type=Path, help="write the runs here and keep them (default: temp)")
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium page load")
    args = parser.parse_args()

    import httpx

    from tests.synthetic_history import write_history

    work = args.keep or Path(tempfile.mkdtemp(prefix="webview-bench-"))
    runs_root = work / "runs"
    t0 = time.perf_counter()
    if not runs_root.exists():
        write_history(runs_root, args.runs, repeats=3, slow_nights={args.runs - 3: 1.6},
                      failed_nights={args.runs // 2: "spark-w2-r1"})
    files = sum(1 for _ in runs_root.rglob("*.json"))
    print(f"output root: {runs_root}: {args.runs} run folders, {files} JSON files "
          f"(written in {time.perf_counter() - t0:.1f} s)")
    server, thread, base = _serve(runs_root)
    first_b, last_b = "scheduled__", ""
    names = sorted(p.name for p in runs_root.iterdir() if p.name.startswith(first_b))
    last_b = names[-1]
    views = [("trends, last 30 days", "/"), ("trends, all runs", "/?window=all"),
             ("run view", f"/runs?run={last_b}"), ("compare two runs", f"/compare?a={names[-2]}&b={last_b}")]
    worst = 0.0
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            for label, url in views:
                cold = ""
                if label.startswith("trends, last"):
                    seconds, _ = _time_get(client, url)
                    worst = max(worst, seconds)
                    cold = f"cold (index reads {args.runs} folders) {seconds * 1000:.0f} ms, "
                samples = [_time_get(client, url) for _ in range(args.repeat)]
                median = statistics.median(s for s, _ in samples)
                worst = max(worst, median)
                print(f"page time, {label}: {cold}warm median {median * 1000:.1f} ms "
                      f"(max {max(s for s, _ in samples) * 1000:.1f} ms, {samples[0][1] / 1024:.0f} KiB)")
        if not args.no_browser and shutil.which(os.environ.get("CHROMIUM", "chromium")):
            plain = _browser_load(base, views[2][1], charts=False)
            print(f"browser load of the run view (no charts: the reference): {plain * 1000:.0f} ms (median of 3)")
            for label, url in views[:2]:
                seconds = _browser_load(base, url)
                print(f"browser load until 4 charts drawn, {label}: {seconds * 1000:.0f} ms (median of 3), "
                      f"{seconds / plain:.1f}x the run view's")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    verdict = "within" if worst <= BUDGET_S else "OVER"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"slowest page time {worst * 1000:.0f} ms: {verdict} the {BUDGET_S:.0f}-s budget "
          f"(load average {load} on {os.cpu_count()} cores)")
    return 0 if worst <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
