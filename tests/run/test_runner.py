"""The one policy after training (pipelines.run.runner), as the CLI applies it: same order as the
DAG (tests/airflow/test_dag.py::test_task_graph), stop at the first failure, exit 1 with a
hint saying how to continue, tracebacks with --verbose. Real MLflow stores, synthetic cells."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.run import runner
from tests.synthetic_results import write_synthetic_run

DEAD_SERVER = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_finish_stops_at_the_first_failed_step_and_keeps_what_was_done(make_config):
    config = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=DEAD_SERVER)
    paths, _ = write_synthetic_run(config)
    with pytest.raises(runner.StepFailed) as err:
        runner.finish(str(paths.root))
    assert err.value.step == "track"
    assert "re-log it with: python -m pipelines report" in err.value.hint
    assert paths.summary.exists() and paths.report_html.exists()  # evaluate and report ran
    assert not paths.regression.exists()  # the regression check never ran


def test_steps_run_in_order_without_mlflow(make_config):
    config = make_config(backends=["ddp"], worker_counts=[1])
    paths, _ = write_synthetic_run(config)
    done = runner.finish(str(paths.root), with_mlflow=False)
    assert list(done) == ["evaluate", "report"] == list(runner.FINISH_STEPS[:2])


@pytest.mark.slow
def test_cli_exit_status_hint_and_verbose_traceback(make_config, tmp_path):
    dead = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=DEAD_SERVER)
    paths, _ = write_synthetic_run(dead, name="dead-store")
    proc = cli("report", str(paths.root), cwd=tmp_path)
    assert proc.returncode == 1
    assert "error: track failed" in proc.stderr and "re-log it with" in proc.stderr
    assert "Traceback" not in proc.stderr

    proc = cli("--verbose", "report", str(paths.root), cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr

    # failed cells: reported and logged, then the run fails, naming how to resume them
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    broken = make_config(backends=["ddp"], worker_counts=[1, 2], mlflow_tracking_uri=store)
    paths, _ = write_synthetic_run(broken, name="broken", failed=("ddp-w2-r0",))
    proc = cli("report", str(paths.root), cwd=tmp_path)
    assert proc.returncode == 1
    assert "check_regression failed: FailedCellsError" in proc.stderr and "ddp-w2-r0" in proc.stderr
    assert f"python -m pipelines run --run-dir {paths.root}" in proc.stderr
    assert paths.report_html.exists() and paths.regression.exists()


def test_a_broken_result_fails_report_naming_the_cell_and_ends_every_mlflow_run(make_config, tmp_path):
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = make_config(backends=["ddp"], worker_counts=[1, 2], mlflow_tracking_uri=store)
    paths, _ = write_synthetic_run(config, name="broken-result")
    damaged = paths.cell("ddp", 2, 0).result
    damaged.write_text(damaged.read_text()[:200])  # a result.json cut short
    with pytest.raises(runner.StepFailed) as err:
        runner.finish(str(paths.root))
    assert err.value.step == "check_regression" and "ddp-w2-r0" in str(err.value)
    assert "unreadable result" in str(err.value) and "MLflow" not in str(err.value)
    assert paths.report_html.exists()  # the report came out, listing the damaged cell
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status in ("FINISHED", "FAILED") for r in runs)  # none left RUNNING
    cell = next(r for r in runs if r.info.run_name == "ddp-w2-r0")
    assert cell.info.status == "FAILED" and "unreadable" in cell.data.tags["error"]


def test_data_steps_run_in_the_dags_order_and_stop_at_the_first_failure(monkeypatch):
    """The CLI's data stage is the DAG's data tasks (tests/airflow/test_dag.py::test_task_graph): one list."""
    from pipelines.run import stages

    calls = []
    for step in runner.DATA_STEPS:
        monkeypatch.setattr(stages, step, lambda run_dir, step=step: calls.append(step) or {"step": step})
    assert list(runner.data_stage("R")) == calls == ["ingest", "validate_snapshot", "preprocess", "validate_tokens"]

    def broken(run_dir):
        raise ValueError("bad snapshot")

    calls.clear()
    monkeypatch.setattr(stages, "validate_snapshot", broken)
    with pytest.raises(ValueError, match="bad snapshot"):
        runner.data_stage("R")
    assert calls == ["ingest"]


def test_the_cli_starts_and_stops_its_clusters_with_the_dags_functions(monkeypatch, tmp_path):
    """stages.run_clusters (the CLI) calls the functions of the DAG's setup/teardown tasks: started
    tied to the CLI, stopped in reverse order whatever happened (services a cell started on
    demand too)."""
    from pipelines.run import stages

    calls, started = [], {"embedded Spark cluster": "spark://127.0.0.1:7077"}
    monkeypatch.setattr(stages, "start_services", lambda run_dir, tied_to_caller=False:
                        calls.append(("start_services", tied_to_caller)) or started)
    monkeypatch.setattr(stages, "start_cluster", lambda run_dir, tied_to_caller=False:
                        calls.append(("start_cluster", tied_to_caller)))
    for name in ("stop_services", "stop_cluster"):
        monkeypatch.setattr(stages, name, lambda run_dir, name=name: calls.append((name,)))
    with pytest.raises(RuntimeError, match="a cell broke"), stages.run_clusters(str(tmp_path)):
        calls.append(("block",))
        raise RuntimeError("a cell broke")
    assert calls == [("start_services", True), ("start_cluster", True), ("block",), ("stop_cluster",),
                     ("stop_services",)]

    # the token shards already there: nothing is started for the data stage, what a cell started on
    # demand is still stopped (the CLI's `train` of a per-job cell waits for no run cluster)
    calls.clear()
    with stages.run_clusters(str(tmp_path), data_stage=False):
        calls.append(("block",))
    assert calls == [("start_cluster", True), ("block",), ("stop_cluster",), ("stop_services",)]



def test_a_local_run_has_no_cluster_to_start_or_stop(make_config, tmp_path):
    from pipelines.config import save_config
    from pipelines.run import stages
    from pipelines.runfolder.paths import RunPaths

    config = make_config(backends=["ddp"], worker_counts=[1])
    paths = RunPaths(tmp_path / "local-run")
    save_config(config, paths.config)
    run_dir = str(paths.root)
    assert config.engine("spark").master != "embedded" and config.cluster.kind == "local"
    assert stages.start_services(run_dir) == {} and stages.start_cluster(run_dir) is None
    assert stages.stop_services(run_dir) == [] and stages.stop_cluster(run_dir) == []
    with stages.run_clusters(run_dir):
        assert not paths.engine_cluster_info("spark").exists()
