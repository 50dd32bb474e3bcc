"""The Benchmarks page (pipelines.web.view) on a fabricated run folder, without Airflow.

The run folder is written through the project's own models (BenchmarkConfig, CellResult) with
made-up timings, then the real evaluation and report modules write summary.json, report.html
and the PNG plots, so the page is tested against the file contract, not a copy of it.
The authentication seam is a plain FastAPI dependency here; tests/plugins checks Airflow's.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from fastapi import Header, HTTPException
from fastapi.testclient import TestClient

from pipelines.config import save_config
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult, EpochMetrics
from pipelines.runfolder.results import TestMetrics as Scores
from pipelines.web.view import create_app, list_runs, load_run, mlflow_links, render_page, report_file


def write_run(make_config, root, run_id, profile="smoke", accuracy=0.61, report=True):
    config = make_config(profile, output_root=str(root), backends=["ddp", "spark"], worker_counts=[1, 2],
                         repeats=1)
    paths = RunPaths(root / run_id)
    save_config(config, paths.config)
    for backend, _strategy, _network, workers, repeat in config.cells():
        failed = backend == "spark" and workers == 2
        CellResult(
            backend=backend, world_size=workers, repeat=repeat,
            status="failed" if failed else "ok", error="barrier stage hung" if failed else None,
            epochs=[EpochMetrics(epoch=1, train_loss=0.69, train_accuracy=0.55, eval_loss=0.68,
                                 eval_accuracy=accuracy, epoch_seconds=3.0, elapsed_seconds=3.0,
                                 samples_per_second=130.0)],
            test=None if failed else Scores(accuracy=accuracy, f1=0.6, precision=0.6, recall=0.6,
                                            loss=0.67, confusion_matrix=[[60, 40], [38, 62]]),
            startup_seconds=7.5, training_seconds=3.0, samples_per_second=130.0,
            total_seconds=11.0 if backend == "ddp" else 19.0,
        ).write(paths.cell(backend, workers, repeat).result)
    if report:  # the project's real evaluation + report modules write summary.json and plots
        from pipelines.evaluation import evaluate_run
        from pipelines.report import build_report

        evaluate_run(config, paths)
        build_report(config, paths)
        uri = config.resolved_tracking_uri()  # mlflow.json as pipelines.tracking.runs writes it
        (paths.root / "mlflow.json").write_text(json.dumps({uri: {"experiment_id": "7",
                                                                  "parent_run_id": "abc123"}}))
    return paths


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """Two reported runs (built once: the report's plots take a few seconds); read-only."""
    from pipelines.config import load_config

    def make_config(profile, **overrides):
        return load_config(profile, dict(dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir),
                                         model_source=str(bert_tiny_dir), **overrides))

    root = tmp_path_factory.mktemp("webview") / "runs"
    old = write_run(make_config, root, "nightly_old", profile="nightly", accuracy=0.7)
    os.utime(old.config, (time.time() - 3600,) * 2)  # an hour older than the smoke run
    write_run(make_config, root, "manual__2026-01-01T00_00_00", accuracy=0.61)
    (root / "not_a_run").mkdir()  # no config.json: ignored
    return root.resolve()


def test_runs_are_listed_newest_first_with_state(runs_root):
    runs = list_runs(runs_root)
    assert [r.run_id for r in runs] == ["manual__2026-01-01T00_00_00", "nightly_old"]
    assert [r.profile for r in runs] == ["smoke", "nightly"]
    assert runs[0].state == "reported: failed"  # spark-w2 failed


def test_run_details_read_cells_plots_and_mlflow(runs_root):
    run = load_run(runs_root / "nightly_old")
    assert {c["cell"] for c in run.cells} == {"ddp-w1-r0", "ddp-w2-r0", "spark-w1-r0", "spark-w2-r0"}
    failed = [c for c in run.cells if c["status"] == "failed"]
    assert [c["cell"] for c in failed] == ["spark-w2-r0"] and failed[0]["error"] == "barrier stage hung"
    assert "time_vs_workers.png" in run.plots and run.has_html_report
    [(label, url)] = mlflow_links(run, "http://mlflow.local:5000/")
    assert label.startswith("MLflow parent run abc123 (sqlite:///")
    assert url == "http://mlflow.local:5000/#/experiments/7/runs/abc123"
    assert mlflow_links(run, "")[0][1] is None  # no UI known: id only, no dead link


def test_page_shows_latest_run_comparison_and_plots(runs_root):
    html = render_page(runs_root)
    assert "Latest run per profile" in html and "nightly_old" in html
    assert "Run manual__2026-01-01T00_00_00" in html  # newest run selected by default
    assert "Comparison (median over repeats)" in html and "ddp-w2" in html  # summary.json table
    assert "overhead vs reference total" in html and "0.7273" in html  # spark-w1: (19 - 11) / 11
    assert "spark-w2-r0" in html and 'class="bad"' in html  # failed cell marked
    assert 'src="runs/manual__2026-01-01T00_00_00/report/time_vs_workers.png"' in html
    assert "abc123" in html
    # summary.json's scalars without its format version (the stray "version 1" row)
    assert "<th>status</th>" in html and "<th>version</th>" not in html
    # what it takes to run each platform: the summary's table, with what evaluation measured here
    assert "What it takes to run each platform" in html and "install mb" in html.lower()
    assert "engines.spark.master" in html and "pyspark" in html


def test_run_view_opens_with_the_reports_verdict(runs_root):
    """The verdict the report wrote (report/verdict.json), read, not recomputed: first in the run's section."""
    verdict = json.loads((runs_root / "nightly_old" / "report" / "verdict.json").read_text())
    assert verdict["chart"] == "verdict.png" and [f["kind"] for f in verdict["findings"]][:2] == ["fastest", "fastest"]
    assert verdict["findings"][1]["text"].startswith("At 2 workers, only ddp finished: ")  # spark-w2 failed
    assert load_run(runs_root / "nightly_old").verdict["findings"] == verdict["findings"]
    html = render_page(runs_root, "nightly_old")
    run = html.split('<h2 id="run">Run nightly_old</h2>')[1]
    assert run.lstrip().startswith('<section class="verdict" id="verdict"><h3>Verdict</h3>')  # first
    section = run.split("</section>")[0]
    assert "**" not in section and "At 1 worker, ddp is fastest: 11.00 s total." in section  # plain text
    assert "spark is 72.7 % slower (+8.00 s)" in section  # 19 s vs 11 s
    assert '<li class="failed">1 cell failed: spark-w2-r0 — barrier stage hung.' in section
    assert 'src="runs/nightly_old/report/verdict.png"' in section
    assert html.count("report/verdict.png") == 1  # not again among the plots
    # the regression check runs after the report: its outcome joins the verdict on the page
    regression = runs_root / "nightly_old" / "report" / "regression.json"
    regression.write_text(json.dumps({"status": "failed", "message": "regression: ddp-w1 total +80 %"}))
    try:
        findings = load_run(runs_root / "nightly_old").verdict["findings"]
        assert findings[-1] == {"kind": "regressed", "text": "Regression check failed: regression: ddp-w1 total +80 %."}
    finally:
        regression.unlink()


def test_run_view_without_or_with_a_broken_verdict(runs_root, tmp_path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(runs_root / "nightly_old", root / "old_report")
    verdict = root / "old_report" / "report" / "verdict.json"
    verdict.unlink()  # a report from before verdicts: the page as before
    assert load_run(root / "old_report").verdict is None
    assert 'class="verdict"' not in render_page(root, "old_report")
    verdict.write_text('{"findings": "not a list"}')
    run = load_run(root / "old_report")
    assert run.verdict is None and [e for e in run.errors if e.startswith("verdict.json: unreadable")]
    assert "verdict.json: unreadable" in render_page(root, "old_report")


def test_page_without_runs_names_the_folder(tmp_path):
    html = render_page(tmp_path / "missing")
    assert "No benchmark runs in" in html and str(tmp_path / "missing") in html
    assert "airflow dags test imdb_benchmark" in html  # says what to run


def test_report_files_stay_inside_the_report_folder(runs_root):
    path, media = report_file(runs_root, "nightly_old", "time_vs_workers.png")
    assert media == "image/png" and path.read_bytes()[:4] == b"\x89PNG"
    for run_id, name in [("nightly_old", "../config.json"), ("../runs", "time_vs_workers.png"),
                         ("nightly_old", "summary.py"), ("missing", "time_vs_workers.png")]:
        with pytest.raises(LookupError):
            report_file(runs_root, run_id, name)


def require_header(x_user: str | None = Header(None)) -> None:
    if x_user != "tester":
        raise HTTPException(status_code=401, detail="Not authenticated")


def test_app_routes_all_pass_the_auth_dependency(runs_root):
    client = TestClient(create_app(auth=require_header, root=runs_root))
    for url in ["/", "/api/runs", "/runs/nightly_old/report/time_vs_workers.png"]:
        assert client.get(url).status_code == 401, url
    ok = {"x-user": "tester"}
    page = client.get("/?run=nightly_old", headers=ok)
    assert page.status_code == 200 and "Run nightly_old" in page.text
    png = client.get("/runs/nightly_old/report/time_vs_workers.png", headers=ok)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert [r["run_id"] for r in client.get("/api/runs", headers=ok).json()][-1] == "nightly_old"
    assert client.get("/?run=nope", headers=ok).status_code == 404
    assert client.get("/runs/nightly_old/report/..%2Fconfig.json", headers=ok).status_code == 404
    with pytest.raises(ValueError, match="authentication"):
        create_app(auth=None)


# --- the page's script policy and click relay ----------------------------------------------------

RELAY_PAGE = "http://airflow.example:8080/benchmarks/runs?run=x"  # where Airflow serves the page
RELAY_CASES = [  # (link, relayed?) with MLFLOW_UI_URL=http://mlflow.example:5000 and AIRFLOW_UI_URL unset
    ("../dags/imdb_benchmark/runs/manual__1", True),  # a DAG run: Airflow's UI, same origin
    ("http://airflow.example:8080/dags/imdb_benchmark/runs", True),
    ("compare?a=1&b=2", True),  # the page's own views
    ("http://mlflow.example:5000/#/experiments/7/runs/abc", True),
    ("javascript:alert(1)", False), (" JavaScript:alert(1)", False), ("java\tscript:alert(1)", False),
    ("data:text/html,<script>alert(1)</script>", False), ("vbscript:msgbox(1)", False),
    ("http://evil.example/", False), ("https://airflow.example:8080/", False),  # other host / origin
    ("http://mlflow.example:5001/", False), ("http://mlflow.example.evil/", False),
    ("http://user:pw@airflow.example:8080/dags", False), ("ftp://airflow.example:8080/", False),
]


def _relay(cases: list[str], prefixes: list[str]) -> list[str | None]:
    """relayTarget of plugins/static/benchmarks.js (the browser's logic itself) under node."""
    import shutil
    import subprocess

    from pipelines.web.data import STATIC_DIR

    if not shutil.which("node"):
        pytest.skip("node is not installed: the relay's allow-list is JavaScript")
    script = ("const {relayTarget} = require(process.argv[1]); const [links, prefixes, base] = "
              "JSON.parse(process.argv[2]); console.log(JSON.stringify(links.map((l) => relayTarget(l, prefixes, base))))")
    out = subprocess.run(["node", "-e", script, str(STATIC_DIR / "benchmarks.js"),
                          json.dumps([cases, prefixes, RELAY_PAGE])], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_relay_forwards_only_http_links_to_the_page_airflow_and_mlflow(monkeypatch):
    from pipelines.web.view import relay_allow_list

    monkeypatch.delenv("AIRFLOW_UI_URL", raising=False)
    monkeypatch.setenv("MLFLOW_UI_URL", "http://mlflow.example:5000")
    prefixes = relay_allow_list()
    assert prefixes == ["./", "..", "http://mlflow.example:5000"]
    got = _relay([link for link, _ in RELAY_CASES], prefixes)
    assert [(link, url is not None) for (link, _), url in zip(RELAY_CASES, got)] == RELAY_CASES
    assert got[0] == "http://airflow.example:8080/dags/imdb_benchmark/runs/manual__1"  # resolved, absolute


def test_relay_with_a_configured_airflow_url_refuses_the_rest_of_the_origin(monkeypatch):
    from pipelines.web.view import relay_allow_list

    monkeypatch.setenv("AIRFLOW_UI_URL", "http://airflow.example:8080/airflow")
    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    links = ["http://airflow.example:8080/airflow/dags/x", "http://airflow.example:8080/airflow",
             "http://airflow.example:8080/airflowevil/x", "http://airflow.example:8080/other/x",
             "http://airflow.example:8080/benchmarks/compare", "http://mlflow.example:5000/"]
    assert [u is not None for u in _relay(links, relay_allow_list())] == [True, True, False, False, True, False]


def test_pages_expose_the_allow_list_and_run_no_inline_script(runs_root, monkeypatch):
    monkeypatch.setenv("MLFLOW_UI_URL", "http://mlflow.example:5000")
    client = TestClient(create_app(auth=lambda: None, root=runs_root))
    for url in ["/", "/runs?run=nightly_old", "/compare"]:
        resp = client.get(url)
        assert resp.status_code == 200 and "script-src 'self'" in resp.headers["content-security-policy"]
        allow = resp.text.split('<script id="link-relay" type="application/json">')[1].split("</script>")[0]
        assert json.loads(allow) == ["./", "..", "http://mlflow.example:5000"]
        assert '<script src="static/benchmarks.js?v=' in resp.text  # the relay runs on every view
        assert "<script>" not in resp.text and " onchange=" not in resp.text and " onclick=" not in resp.text
    assert client.get("/").text.count("data-autosubmit") == 3  # the selects submit through benchmarks.js
    report = client.get("/runs/nightly_old/report/report.html")
    assert report.headers["content-security-policy"].startswith("sandbox")  # not the page's policy


def test_page_script_writes_no_html():
    import re

    from pipelines.web.data import STATIC_DIR

    js = re.sub(r"^\s*//.*$", "", (STATIC_DIR / "benchmarks.js").read_text(), flags=re.MULTILINE)  # code only
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink
