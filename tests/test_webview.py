"""The Benchmarks page (pipelines.webview) on a fabricated run folder, without Airflow.

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

from pipelines.config import Backend, save_config
from pipelines.paths import RunPaths
from pipelines.results import CellResult, EpochMetrics
from pipelines.results import TestMetrics as Scores
from pipelines.webview import create_app, list_runs, load_run, mlflow_links, render_page, report_file


def write_run(make_config, root, run_id, profile="smoke", accuracy=0.61, report=True):
    config = make_config(profile, output_root=str(root), backends=["ddp", "spark"], worker_counts=[1, 2],
                         repeats=1)
    paths = RunPaths(root / run_id)
    save_config(config, paths.config)
    for backend, _strategy, workers, repeat in config.cells():
        failed = backend == Backend.SPARK and workers == 2
        CellResult(
            backend=backend, world_size=workers, repeat=repeat,
            status="failed" if failed else "ok", error="barrier stage hung" if failed else None,
            epochs=[EpochMetrics(epoch=1, train_loss=0.69, train_accuracy=0.55, eval_loss=0.68,
                                 eval_accuracy=accuracy, epoch_seconds=3.0, elapsed_seconds=3.0,
                                 samples_per_second=130.0)],
            test=None if failed else Scores(accuracy=accuracy, f1=0.6, precision=0.6, recall=0.6,
                                            loss=0.67, confusion_matrix=[[60, 40], [38, 62]]),
            startup_seconds=7.5, training_seconds=3.0, samples_per_second=130.0,
            total_seconds=11.0 if backend == Backend.DDP else 19.0,
        ).write(paths.cell(backend, workers, repeat).result)
    if report:  # the project's real evaluation + report modules write summary.json and plots
        from pipelines.evaluation import evaluate_run
        from pipelines.report import build_report

        evaluate_run(config, paths)
        build_report(config, paths)
        uri = config.resolved_tracking_uri()  # mlflow.json as pipelines.tracking writes it
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
    assert "overhead vs ddp total" in html and "0.7273" in html  # spark-w1: (19 - 11) / 11
    assert "spark-w2-r0" in html and 'class="bad"' in html  # failed cell marked
    assert 'src="runs/manual__2026-01-01T00_00_00/report/time_vs_workers.png"' in html
    assert "abc123" in html
    # summary.json's scalars without its format version (the stray "version 1" row)
    assert "<th>status</th>" in html and "<th>version</th>" not in html


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
