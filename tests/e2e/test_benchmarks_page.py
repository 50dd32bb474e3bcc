"""Browser test of the Benchmarks page in a real Airflow API server (login, iframe, links).

Runs scripts/e2e_benchmarks_page.sh: a synthetic nightly history (10 nights, a regression
alarm on night 8 after a config change, a failed cell on night 5) in the output root, Airflow's
API server in a private network namespace, headless Chromium signing in through Airflow's
login form. Asserts on what the browser saw (tests/e2e/page_driver.py -> page_results.json):
the four charts and their data as Chart.js holds them, the alarm marker's tooltip and click,
the two-run comparison, the links out of Airflow's sandboxed iframe, the controls and the empty
state. About 1 min on 2 cores.

    .venv/bin/python -m pytest tests/e2e/test_benchmarks_page.py -m e2e

Screenshots (11_ ... 16_*.png) stay in $E2E_ARTIFACTS (default tests/e2e/artifacts/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("E2E_ARTIFACTS", PROJECT_ROOT / "tests" / "e2e" / "artifacts")).resolve()

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def page() -> dict:
    if os.geteuid() != 0:
        pytest.fail("the page test needs root: Airflow runs in a private network namespace (unshare --net)")
    if not shutil.which("chromium"):
        pytest.fail("chromium is not installed: run `bash scripts/system_deps.sh`")
    proc = subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "e2e_benchmarks_page.sh"), str(ARTIFACTS)],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=420)
    results_file = ARTIFACTS / "page_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    if proc.returncode != 0:
        log = ARTIFACTS / "api_server.log"
        pytest.fail(f"e2e_benchmarks_page.sh exited {proc.returncode}: {results.get('error', 'no results')}\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n--- api server log (tail) ---\n"
                    f"{log.read_text()[-3000:] if log.exists() else '(none)'}\nmore in {ARTIFACTS}")
    return results


def test_page_requires_airflow_login(page):
    assert page["unauthenticated_status"] == 401


def test_trends_charts_hold_every_cell_with_band_alarm_and_failed_markers(page):
    charts = page["charts"]
    assert list(charts) == ["total_seconds", "samples_per_second", "overhead_vs_reference_total", "test_accuracy"]
    total = charts["total_seconds"]
    assert total["y_title"] == "total time per cell (s, median)" and total["x_title"].startswith("run start (UTC)")
    assert total["runs"] == 10 and len(total["lines"]) == 6 and all(line["points"] == 10 for line in total["lines"])
    assert total["bands"] == 2 * 6  # lower + upper edge per cell
    assert total["alarms"] == ["ddp-w1", "ddp-w2"] and total["failed"] == ["spark-w2"]
    assert charts["test_accuracy"]["bands"] == 12 and charts["test_accuracy"]["alarms"] == []
    assert [line["label"] for line in charts["overhead_vs_reference_total"]["lines"]] == [  # the platforms' order
        "spark, 1 worker", "spark, 2 workers", "determined, 1 worker", "determined, 2 workers"]
    assert all(c["drawn"] > 20_000 for c in charts.values())  # canvases hold a drawing, not blank
    assert page["js_errors"] == []
    # its time (page["trends_load_s"], in page_results.json) is no check on a shared machine: bench/webview_page.py
    # measures it against a view without charts in the same browser (bench/RESULTS.md, "Benchmarks page")
    assert page["trends_load_s"] > 0


def test_alarm_marker_tooltip_and_click_open_the_alarmed_run(page):
    alarm_night = page["nights"][8]
    assert page["tooltip"]["title"][0].startswith(alarm_night) and "regression check failed" in page["tooltip"]["title"][0]
    assert any(line.startswith("ALARM ddp, 1 worker:") for line in page["tooltip"]["body"])
    assert page["alarm_click_url"].endswith(f"/benchmarks/runs?run={alarm_night}")
    assert f"Run {alarm_night}" in page["alarm_run_text"] and "Regression check:" in page["alarm_run_text"]
    assert "Regression alarms in the last 30 days" in page["trends_text"]


def test_compare_shows_config_diff_and_cell_deltas(page):
    assert page["compare_config_diff"] == [["threads_per_worker", "1", "2"]]
    assert page["compare_alarm_cells"] == ["ddp-w1", "ddp-w2"]  # beyond the regression limit
    text = page["compare_text"]
    assert "Cell by cell" in text and "spark-w2" in text and "determined-w1" in text


def test_links_reach_airflow_dag_runs_and_mlflow_from_inside_the_airflow_ui(page):
    dag_run_id = page["dag_run_ids"][-1]  # e.g. scheduled__2026-11-30T02:00:00+00:00
    assert page["dag_link_href"].endswith("/dags/imdb_benchmark/runs/" + quote(dag_run_id, safe=""))
    assert page["ui_url_after_dag_link"] == page["dag_link_href"]  # the whole Airflow UI moved there
    assert page["mlflow_tab_requests"], "the MLflow link opened no tab"
    assert all(h.startswith("http://127.0.0.1:5000/#/experiments/1/runs/") for h in page["mlflow_hrefs"])
    assert len(page["dag_run_hrefs"]) == 10


def test_controls_and_empty_states(page):
    assert page["window_7d"]["runs"] == 7 and "window=7d" in page["window_7d"]["url"]
    assert "No evaluated smoke run in the last 7 days" in page["smoke_7d_text"]
    assert "choose a longer time window" in page["smoke_7d_text"]
    assert "No evaluated paper run in the last 30 days" in page["empty_text"]
    assert "airflow dags test imdb_benchmark" in page["empty_text"]


def test_screenshots_were_saved(page):
    from tests.e2e.page_driver import SCREENSHOTS

    assert sorted(page["screenshots"]) == sorted(SCREENSHOTS)
    for name in SCREENSHOTS:
        data = (ARTIFACTS / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 10_000, name
