"""Browser end-to-end test: a real Airflow runs imdb_benchmark; Chromium checks its UI.

Runs scripts/e2e_browser.sh, which starts ``airflow standalone`` in a private network (and PID)
namespace, triggers a one-cell smoke run over the REST API, waits for it, then signs in with
headless Chromium (Playwright) and screenshots the trigger form and the Benchmarks page. During
the run the driver SIGKILLs the training processes after epoch 1: Airflow retries the task and
the retry resumes from the checkpoint. This
test asserts on what the driver saw (tests/e2e/ui_driver.py -> results.json).

    .venv/bin/python -m pytest tests/e2e -m e2e        # ~3-4 min on 2 cores; root, chromium

Screenshots and logs stay in $E2E_ARTIFACTS (default tests/e2e/artifacts/).
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
SCREENSHOTS = ["01_login.png", "02_trigger_form.png", "03_benchmarks_in_airflow_ui.png", "04_benchmarks_page.png"]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def e2e_results() -> dict:
    if os.geteuid() != 0:
        pytest.fail("the e2e test needs root: it runs Airflow in a private network namespace (unshare --net)")
    if not shutil.which("chromium"):
        pytest.fail("chromium is not installed: run `bash scripts/system_deps.sh`")
    proc = subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "e2e_browser.sh"), str(ARTIFACTS)],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=720)
    results_file = ARTIFACTS / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    if proc.returncode != 0:
        logs = ARTIFACTS / "failed_task_logs.txt"
        pytest.fail(
            f"e2e_browser.sh exited {proc.returncode}: {results.get('error', 'no results.json')}\n"
            f"--- stdout/stderr (tail) ---\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
            f"--- failed task logs (tail) ---\n{logs.read_text()[-4000:] if logs.exists() else '(none)'}\n"
            f"more in {ARTIFACTS}")
    return results


def test_dag_run_succeeds_through_the_rest_api(e2e_results):
    run = e2e_results["dag_run"]
    assert run["state"] == "success", run
    # production-style: LocalExecutor on PostgreSQL (the dags-test tests run on SQLite)
    assert e2e_results["executor"] == "LocalExecutor"
    expected_db = "sqlite" if os.environ.get("E2E_DB") == "sqlite" else "postgresql+psycopg2"
    assert e2e_results["metadata_db"] == expected_db
    print(f"dag run {run['run_id']}: {run['seconds']} s; timings {e2e_results['timings']}")


def test_killed_training_is_retried_and_resumes(e2e_results):
    run = e2e_results["dag_run"]
    assert run["killed_training"]["killed_pids"], "no training process was found to kill"
    tries = [t for t in run["train_tries"] if t["state"] == "success"]
    # two repeats ran as two mapped instances; the held one (r0) was killed and retried inside its
    # task by pipelines.run.stages.train_cell (matrix.cell_retries: the CLI's policy too), so every task
    # instance succeeded on Airflow's first try
    assert sorted(t["try_number"] for t in tries) == [1, 1], run["train_tries"]
    cell = run["cell_result"]
    assert cell["status"] == "ok" and cell["resumed_from_epoch"] == 1  # not from zero
    assert [e["epoch"] for e in cell["epochs"]] == [1, 2]
    # every attempt counted: the killed one with its checkpointed epoch, the retry with its recovery
    first, second = cell["attempts"]
    assert first["outcome"] == "failed" and first["epoch_reached"] == 1 and first["lost_seconds"] >= 0
    assert second["outcome"] == "ok" and second["recovery_seconds"] > 0
    total = sum(a["end"] - a["start"] for a in cell["attempts"])
    assert abs(cell["total_seconds"] - total) < 1e-6 and cell["recovery_seconds"] == second["recovery_seconds"]


def test_concurrent_cells_never_share_the_timed_window(e2e_results):
    """Two repeats were runnable at once (2 pool slots); the host lock serialised them."""
    cells = e2e_results["dag_run"]["cell_results"]
    assert set(cells) == {"ddp-w1-r0", "ddp-w1-r1"}
    windows = sorted((a["start"], a["end"], name) for name, c in cells.items() for a in c["attempts"])
    for (_, end, before), (start, _, after) in zip(windows, windows[1:]):
        assert end <= start, f"{before} and {after} were timed at the same time: {windows}"
    # one of them waited for the other (the held r0 may have waited in its first attempt)
    waits = [a["lock_wait_seconds"] for c in cells.values() for a in c["attempts"]]
    assert max(waits) > 1, f"no attempt waited for the host lock: {windows}, waits {waits}"


def test_benchmarks_endpoints_require_login(e2e_results):
    assert e2e_results["unauthenticated_status"] == 401
    assert e2e_results["authenticated_status"] == 200
    assert "_token" in e2e_results["cookies"]  # the browser got in through the login form


def test_trigger_form_shows_the_params(e2e_results):
    form = e2e_results["trigger_form_text"]
    for label in ("IMDB distributed-training benchmark", "Profile", "Training matrix", "Backends",
                  "Worker counts"):
        assert label in form, f"{label!r} missing from the trigger form:\n{form}"


def test_benchmarks_page_shows_the_finished_run(e2e_results):
    from pipelines.runfolder.paths import safe_run_id

    text = e2e_results["benchmarks_text"]
    run_folder = safe_run_id(e2e_results["dag_run"]["run_id"])
    assert e2e_results["nav_has_benchmarks"] and e2e_results["benchmarks_status"] == 200
    assert f"Run {run_folder}" in text  # the latest run is the one just finished
    assert "Comparison (median over repeats)" in text and "ddp-w1" in text
    assert "ddp-w1-r0\tok" in text  # the cell table from result.json
    assert "MLflow parent run" in text
    # the run links back to its Airflow DAG run (airflow.json, written by prepare_run)
    assert e2e_results["dag_run_link"].endswith("/dags/imdb_benchmark/runs/" + quote(e2e_results["dag_run"]["run_id"], safe=""))
    assert e2e_results["plots_total"] >= 1
    assert e2e_results["plots_loaded"] == e2e_results["plots_total"]  # PNGs served behind the login


def test_screenshots_were_saved(e2e_results):
    assert e2e_results["screenshots"] == SCREENSHOTS
    for name in SCREENSHOTS:
        data = (ARTIFACTS / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 10_000, name
