"""Run index, trend series, run comparison and alert messages on a synthetic nightly history.

The history (tests/synthetic_history.py) is written through the project's own models and its
real evaluation and regression-comparison code: 8 nights of ddp and spark at 1 and 2 workers,
Spark slowing down a little every night, DDP 1.8x slower on night 6 (the alarm), spark-w2
failing on night 4.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi import Header, HTTPException
from fastapi.testclient import TestClient

from pipelines.tracking.alerts import build_alert
from pipelines.web.comparison import compare_runs
from pipelines.web.trends import (RunIndex, asset_extra, dag_run_link, load_record, mlflow_links,
                              record_dag_run, trend_series)
from pipelines.web.view import create_app, render_compare, render_page, render_trends
from tests.synthetic_history import write_history

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
SLOW_NIGHT, FAILED_NIGHT = 6, 4


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("history") / "runs"
    write_history(root, 8, now=NOW, backends=("ddp", "spark"), slow_nights={SLOW_NIGHT: 1.8},
                  failed_nights={FAILED_NIGHT: "spark-w2-r0"})
    write_history(root, 2, profile="smoke", now=NOW - timedelta(days=60), backends=("ddp",))
    return root.resolve()


def _by_night(history: Path, night: int) -> str:
    """The folder of that night's scheduled run (what prepare_run makes of the DAG run id)."""
    from pipelines.runfolder.paths import safe_run_id

    return safe_run_id(f"scheduled__{(NOW - timedelta(days=7 - night)).strftime('%Y-%m-%d')}T02:00:00+00:00")


def test_index_rereads_only_changed_folders(history, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(history, root)
    index = RunIndex()
    runs = index.runs(root)
    assert len(runs) == 10 and index.reads == 10
    assert [r.run_id for r in runs[:2]] == [_by_night(history, 7), _by_night(history, 6)]  # newest first
    assert index.runs(root) and index.reads == 10  # nothing changed: nothing read
    summary = root / _by_night(history, 3) / "report" / "summary.json"
    data = json.loads(summary.read_text())
    data["status"] = "failed"
    summary.write_text(json.dumps(data))
    os.utime(summary, (time.time() + 5,) * 2)
    changed = {r.run_id: r for r in index.runs(root)}
    assert index.reads == 11 and changed[_by_night(history, 3)].status == "failed"
    # a run still training (no summary.json yet) is read on every request; a removed one drops out
    fresh = root / "manual__2026-11-30T08_00_00"
    shutil.copytree(root / _by_night(history, 7), fresh)
    (fresh / "report" / "summary.json").unlink()
    for _ in range(2):
        assert {r.run_id: r for r in index.runs(root)}[fresh.name].state == "4 cell(s) trained"
    assert index.reads == 13
    shutil.rmtree(root / _by_night(history, 0))
    assert len(index.runs(root)) == 10 and index.reads == 14  # only the training one again


def test_trend_series_marks_band_alarm_and_failed_cell(history):
    runs = RunIndex().runs(history)
    trends = trend_series(runs, "nightly", window_days=30, now=NOW)
    assert [r["run_id"] for r in trends["runs"]] == [_by_night(history, n) for n in range(8)]  # oldest first
    assert [s["key"] for s in trends["series"]] == ["ddp-w1", "ddp-w2", "spark-w1", "spark-w2"]
    ddp = trends["series"][0]
    assert ddp["label"] == "ddp, 1 worker" and "overhead_vs_reference_total" not in ddp["metrics"]
    total = ddp["metrics"]["total_seconds"]
    regression = json.loads((history / _by_night(history, SLOW_NIGHT) / "report" / "regression.json").read_text())
    old = next(c for c in regression["cells"] if c["cell"] == "ddp-w1")["old_total_seconds"]
    assert total["bands"][0] is None  # the first night set the baseline
    assert total["bands"][SLOW_NIGHT] == pytest.approx([old, old * 1.25], rel=1e-4)
    assert total["values"][SLOW_NIGHT] > old * 1.25
    assert total["alarms"] == [SLOW_NIGHT]
    assert ddp["metrics"]["test_accuracy"]["alarms"] == []
    assert "bands" not in ddp["metrics"]["samples_per_second"]  # the check judges time and accuracy only
    spark_w2 = trends["series"][3]["metrics"]
    assert list(spark_w2["total_seconds"]["failed"]) == [FAILED_NIGHT]
    assert "exited with code 1" in spark_w2["total_seconds"]["failed"][FAILED_NIGHT]
    assert spark_w2["total_seconds"]["values"][FAILED_NIGHT] is None
    overhead = trends["series"][2]["metrics"]["overhead_vs_reference_total"]["values"]
    assert overhead[5] > overhead[1] > 0  # Spark's overhead grows night by night (in %)
    assert [a["run_id"] for a in trends["alarms"]] == [_by_night(history, SLOW_NIGHT)]
    assert "ddp-w1: median total time" in trends["alarms"][0]["message"]
    # the time window and the profile choose the runs
    assert len(trend_series(runs, "nightly", window_days=3, now=NOW)["runs"]) == 3
    assert len(trend_series(runs, "smoke", window_days=30, now=NOW)["runs"]) == 0
    assert len(trend_series(runs, "smoke", window_days=None, now=NOW)["runs"]) == 2


def test_compare_runs_diffs_config_and_cells(history, tmp_path):
    a = load_record(history / _by_night(history, 5))
    b = load_record(history / _by_night(history, SLOW_NIGHT))
    same = compare_runs(a, b)
    assert same["config_diff"] == [] and same["config_same"] > 20
    ddp = next(r for r in same["cells"] if r["cell"] == "ddp-w1")
    total = next(m for m in ddp["metrics"] if m["metric"] == "total_seconds")
    assert total["delta"] == pytest.approx(total["b"] - total["a"]) and total["pct"] > 0.25
    b.config = {**b.config, "batch_size": 64, "backends": ["ddp"]}
    diff = {k: (va, vb) for k, va, vb in compare_runs(a, b)["config_diff"]}
    assert diff == {"batch_size": (32, 64), "backends": ('["ddp", "spark"]', '["ddp"]')}
    failed = next(r for r in compare_runs(load_record(history / _by_night(history, FAILED_NIGHT)), a)["cells"]
                  if r["cell"] == "spark-w2")
    assert failed["failed"] == (True, False) and failed["repeats"] == ("0/1", "1/1")


def test_links_and_asset_extra(history, tmp_path):
    run = load_record(history / _by_night(history, 7))
    label, url = dag_run_link(run, "http://airflow:8080/")
    dag_run_id = f"scheduled__{(NOW - timedelta(days=0)).strftime('%Y-%m-%d')}T02:00:00+00:00"
    assert label == f"Airflow DAG run {dag_run_id}"
    assert url == "http://airflow:8080/dags/imdb_benchmark/runs/scheduled__2026-11-30T02%3A00%3A00%2B00%3A00"
    assert dag_run_link(run, "..")[1].startswith("../dags/imdb_benchmark/runs/")
    [(label, url)] = mlflow_links(run, "http://mlflow:5000")
    assert url.startswith("http://mlflow:5000/#/experiments/1/runs/")
    run.dag_run, run.run_id = None, "nightly-20261130T020000Z"  # a CLI run: no Airflow link
    assert dag_run_link(run) is None
    extra = asset_extra(history / _by_night(history, 7), "scheduled__x")
    assert extra["run_id"] == "scheduled__x" and extra["status"] == "success" and extra["profile"] == "nightly"
    assert Path(extra["summary"]).is_file()
    target = tmp_path / "r"
    target.mkdir()
    record_dag_run(target, "imdb_benchmark", "manual__1", NOW)
    assert json.loads((target / "airflow.json").read_text())["started"] == NOW.isoformat()


def test_alert_names_run_cells_and_old_new_values(history):
    run_dir = history / _by_night(history, SLOW_NIGHT)
    regression = json.loads((run_dir / "report" / "regression.json").read_text())
    alert = build_alert(run_dir, dag_run_id="scheduled__2026-11-29T02:00:00+00:00", task_id="check_regression")
    cell = next(c for c in regression["cells"] if c["cell"] == "ddp-w1")
    values = f"{cell['old_total_seconds']:.2f} s -> {cell['new_total_seconds']:.2f} s"
    assert alert.subject.startswith("[benchmark] nightly run scheduled__2026-11-29T02:00:00+00:00: regression in")
    assert values in alert.subject and values in alert.text
    assert alert.cells == ("ddp-w1", "ddp-w2") and "ddp-w2" in alert.html
    assert values.replace(">", "&gt;") in alert.html
    failed = build_alert(history / _by_night(history, FAILED_NIGHT))
    assert "1 training cell(s) failed: spark-w2-r0" in failed.subject and "exited with code 1" in failed.text
    bare = build_alert(None, dag_run_id="manual__1", task_id="evaluate", exception=RuntimeError("no cells"))
    assert bare.subject == "[benchmark] run manual__1: task evaluate failed: no cells"


def test_trends_page_embeds_series_and_explains_empty_states(history, tmp_path):
    html = render_trends(history, now=NOW)  # default profile: nightly
    assert "Trends of the <code>nightly</code> profile: 8 evaluated run(s), in the last 30 days" in html
    assert 'id="trend-data"' in html and 'src="static/chartjs/chart.umd.min.js' in html
    for metric in ("total_seconds", "samples_per_second", "overhead_vs_reference_total", "test_accuracy"):
        assert f'id="chart-{metric}"' in html
    assert "Regression alarms in the last 30 days" in html and 'class="alarm"' in html
    assert 'href="../dags/imdb_benchmark/runs/scheduled__' in html and 'target="_top"' in html
    one = render_trends(history, cell="spark-w2", now=NOW)
    assert one.count('"key": "spark-w2"') == 1 and '"key": "ddp-w1"' not in one.split('id="trend-data"')[1]
    old = render_trends(history, profile="smoke", window="7d", now=NOW)
    assert "No evaluated <code>smoke</code> run in the last 7 days" in old and "choose a longer time window" in old
    assert 'id="trend-data"' not in old
    assert "Only one evaluated run so far" not in render_trends(history, profile="smoke", window="all", now=NOW)
    single = tmp_path / "single"
    shutil.copytree(history / _by_night(history, 7), single / "one")
    assert "Only one evaluated run so far" in render_trends(single, now=NOW)
    assert "No benchmark runs in" in render_trends(tmp_path / "nothing") and "airflow dags test" in \
        render_trends(tmp_path / "nothing")


def test_compare_and_run_pages(history):
    html = render_compare(history)  # default: newest run against the evaluated run before it
    assert f"Run A <a href=\"runs?run={_by_night(history, 6)}\"" in html.replace("%3A", ":")
    assert "Same configuration" in html and "ddp-w1" in html and "bad alarm" not in html
    slow = render_compare(history, _by_night(history, 5), _by_night(history, SLOW_NIGHT))
    assert 'class="bad alarm"' in slow  # DDP beyond the regression limit
    run = render_page(history, _by_night(history, SLOW_NIGHT))
    assert "Regression check:" in run and "failed" in run and "compare with the previous nightly run" in run
    assert "<th>version</th>" not in run and "Summary" in run  # no stray "version 1" row


def require_header(x_user: str | None = Header(None)) -> None:
    if x_user != "tester":
        raise HTTPException(status_code=401, detail="Not authenticated")


def test_app_serves_views_static_files_and_api_behind_auth(history):
    client = TestClient(create_app(auth=require_header, root=history))
    ok = {"x-user": "tester"}
    urls = ["/", "/trends?profile=smoke&window=all", "/compare", "/runs", "/static/chartjs/chart.umd.min.js",
            "/static/benchmarks.js", "/api/trends?window=all"]
    for url in urls:
        assert client.get(url).status_code == 401, url
        assert client.get(url, headers=ok).status_code == 200, url
    js = client.get("/static/chartjs/chart.umd.min.js", headers=ok)
    assert js.headers["content-type"].startswith("text/javascript") and "Chart.js v4" in js.text[:200]
    for bad in ["/static/../webview.py", "/static/chartjs/LICENSE.txt", "/static/%2e%2e/benchmarks_plugin.py",
                "/compare?a=nope"]:
        assert client.get(bad, headers=ok).status_code == 404, bad
    trends = client.get("/api/trends?window=all", headers=ok).json()
    assert trends["profile"] == "nightly" and len(trends["runs"]) == 8
    assert client.get(f"/?run={_by_night(history, 6)}", headers=ok).text.count("Run scheduled__") == 1


def test_previous_run_is_the_nearest_older_evaluated_run_of_the_same_profile(history):
    from pipelines.web.view import _previous_runs

    runs = RunIndex().runs(history)
    previous = _previous_runs(runs)
    assert previous[_by_night(history, 7)] == _by_night(history, 6)
    assert _by_night(history, 0) not in previous  # the first night has none
    smoke = [r.run_id for r in runs if r.profile == "smoke"]
    assert previous[smoke[0]] == smoke[1]  # never across profiles
