"""MLflow tracking against a real SQLite store and a real ``mlflow server`` on 127.0.0.1.

The server (one per module, ~10-16 s to become healthy) keeps its SQLite database and
artifacts under tmp_path and is killed, with its worker processes, at the end.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import requests
from mlflow import MlflowClient
from mlflow.artifacts import download_artifacts

from pipelines.evaluation import evaluate_run
from pipelines.runfolder.paths import RunPaths
from pipelines.measure.tensorboard import write_events
from pipelines.tracking.runs import (SYSTEM_METRICS_INTERVAL_S, TrackingUnavailable,
                                cell_tracking, client_for, ensure_cell_run, log_benchmark, parent_run_id)
from tests.synthetic_results import make_result, write_synthetic_run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log_file = open(root / "server.log", "w")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers needed
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts")],
        stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(url + "/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"url": url, "root": root}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log_file.close()


def _children(client, parent_id: str):
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    return {r.data.tags["mlflow.runName"]: r for r in runs}


@pytest.fixture(scope="module")
def shared_sqlite(tmp_path_factory) -> str:
    """One SQLite store for the tests that do not need a new one (creating one takes ~5 s)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow-sqlite') / 'mlflow.db'}"


@pytest.mark.parametrize("store", ["sqlite", pytest.param("server", marks=pytest.mark.slow)])  # starts mlflow server
def test_log_benchmark_parent_and_nested_runs(store, make_config, request, tmp_path):
    # sqlite: the default URI (<output_root>/mlflow.db), so the artifact location is checked too
    uri = request.getfixturevalue("mlflow_server")["url"] if store == "server" else None
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], mlflow_tracking_uri=uri)
    paths, results = write_synthetic_run(config)
    summary = evaluate_run(config, paths).model_dump()
    write_events(results["spark-w2-r0"], paths.cell("spark", 2, 0))  # as TrainingBackend.run does

    out = log_benchmark(config, paths)
    uri = config.resolved_tracking_uri()
    assert out["tracking_uri"] == uri and out["status"] == "success"
    client = MlflowClient(tracking_uri=uri)

    parent = client.get_run(out["parent_run_id"])
    assert parent.info.run_name == paths.root.name and parent.info.status == "FINISHED"
    assert parent.data.params["epochs"] == str(config.training.epochs)
    assert json.loads(parent.data.params["backends"]) == ["ddp", "spark"]
    assert parent.data.tags["profile"] == "smoke" and parent.data.tags["benchmark.status"] == "success"
    agg = {a["key"]: a for a in summary["aggregates"]}
    assert parent.data.metrics["ddp-w2/total_seconds_median"] == agg["ddp-w2"]["total_seconds"]["median"]
    assert parent.data.metrics["spark-w1/test_accuracy_median"] == agg["spark-w1"]["test_accuracy"]["median"]
    parent_files = {f.path for d in ("run", "report") for f in client.list_artifacts(parent.info.run_id, d)}
    assert {"run/config.json", "run/manifest.json", "report/summary.json"} <= parent_files

    children = _children(client, parent.info.run_id)
    assert set(children) == set(results) == set(out["cell_run_ids"])
    for name, run in children.items():
        result = results[name]
        assert run.info.status == "FINISHED"
        assert run.data.params["workers"] == str(result.world_size)
        assert run.data.tags["device"] == "cpu" and run.data.tags["model_source"] == "random_init"
        assert run.data.tags["platform_mode"] == result.platform_mode
        assert run.data.tags["network"] == run.data.params["network"] == "local"
        assert "link_bytes_per_step" not in run.data.metrics
        assert run.data.metrics["test_accuracy"] == result.test.accuracy
        assert run.data.metrics["total_seconds"] == result.total_seconds
        assert run.data.metrics["phase_launch_seconds"] == result.phases["launch"]
        history = client.get_metric_history(run.info.run_id, "eval_accuracy")
        expected = [(e.epoch, e.eval_accuracy) for e in result.epochs]
        assert sorted((m.step, m.value) for m in history) == expected
    some = children["spark-w2-r0"].info.run_id
    assert [f.path for f in client.list_artifacts(some, "model")] == ["model/model.pt"]
    events = [f.path for f in client.list_artifacts(some, "tensorboard")]
    assert len(events) == 1 and "tfevents" in events[0]
    local = download_artifacts(run_id=some, artifact_path="result/result.json", tracking_uri=uri,
                               dst_path=str(tmp_path / "dl"))
    original = paths.cell("spark", 2, 0).result
    assert json.loads(Path(local).read_text()) == json.loads(original.read_text())
    if store == "sqlite":  # artifacts next to the database, never in the working directory
        beside_db = (Path(config.tracking.output_root).resolve() / "mlartifacts").as_uri()
        assert parent.info.artifact_uri.startswith(beside_db)

    # idempotent: a second call reuses every run and does not duplicate metric history
    again = log_benchmark(config, paths)
    assert again["parent_run_id"] == out["parent_run_id"] and again["cell_run_ids"] == out["cell_run_ids"]
    assert len(client.get_metric_history(some, "eval_accuracy")) == len(results["spark-w2-r0"].epochs)
    assert len(_children(client, parent.info.run_id)) == len(results)


@pytest.mark.slow  # the mlflow server
def test_cell_tracking_records_system_metrics_on_server(mlflow_server, make_config):
    config = make_config(backends=["ddp"], worker_counts=[2], mlflow_tracking_uri=mlflow_server["url"])
    paths, _ = write_synthetic_run(config, skip=("ddp-w2-r0",))
    cell = paths.cell("ddp", 2, 0)
    with cell_tracking(config, paths, "ddp", 2, 0) as run_id:
        assert run_id is not None
        time.sleep(SYSTEM_METRICS_INTERVAL_S + 1.5)  # "training": the monitor samples meanwhile
        result = make_result("ddp", 2)
        (cell.checkpoints / "final").mkdir(parents=True)
        (cell.checkpoints / "final/model.pt").write_bytes(b"w" * 100)
        result.write(cell.result)
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the fluent API's export was undone

    client = MlflowClient(tracking_uri=mlflow_server["url"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent_run_id(config, paths)
    system = [k for k in run.data.metrics if k.startswith("system/")]
    assert "system/cpu_utilization_percentage" in system and "system/system_memory_usage_megabytes" in system
    assert run.data.metrics["test_f1"] == result.test.f1
    assert [f.path for f in client.list_artifacts(run_id, "model")] == ["model/model.pt"]
    assert json.loads(cell.mlflow_run.read_text())[mlflow_server["url"]]["run_id"] == run_id

    evaluate_run(config, paths)
    assert log_benchmark(config, paths)["cell_run_ids"] == {"ddp-w2-r0": run_id}  # reused


def test_cell_tracking_failure_marks_run_failed_and_reraises(make_config, shared_sqlite):
    config = make_config(backends=["spark"], worker_counts=[1], mlflow_tracking_uri=shared_sqlite)
    paths, _ = write_synthetic_run(config, skip=("spark-w1-r0",))
    with pytest.raises(RuntimeError, match="worker died"):
        with cell_tracking(config, paths, "spark", 1, 0) as run_id:
            raise RuntimeError("worker died")
    client = MlflowClient(tracking_uri=config.resolved_tracking_uri())
    assert client.get_run(run_id).info.status == "FAILED"

    # a retry reuses the same nested run; a result saying "failed" also ends it FAILED
    with cell_tracking(config, paths, "spark", 1, 0) as retry_id:
        make_result("spark", 1, status="failed").write(paths.cell("spark", 1, 0).result)
    assert retry_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and "exited with code 1" in run.data.tags["error"]

    # the third attempt succeeds: FINISHED, and the old error is gone
    with cell_tracking(config, paths, "spark", 1, 0) as third_id:
        make_result("spark", 1).write(paths.cell("spark", 1, 0).result)
    run = client.get_run(third_id)
    assert third_id == run_id and run.info.status == "FINISHED" and "error" not in run.data.tags
    assert run.data.tags["cell_status"] == "ok"


def test_network_cells_carry_network_cluster_and_link_bytes(make_config, shared_sqlite):
    config = make_config(backends=["ddp"], worker_counts=[2], networks=["1gbit", "100mbit"],
                         mlflow_tracking_uri=shared_sqlite, **{"cluster.kind": "emulated"})
    paths, results = write_synthetic_run(config)
    evaluate_run(config, paths)
    out = log_benchmark(config, paths)
    assert set(out["cell_run_ids"]) == {"ddp-1gbit-w2-r0", "ddp-100mbit-w2-r0"}
    client = MlflowClient(tracking_uri=config.resolved_tracking_uri())
    run = client.get_run(out["cell_run_ids"]["ddp-100mbit-w2-r0"])
    assert run.data.tags["network"] == run.data.params["network"] == "100mbit"
    assert run.data.tags["cluster"] == run.data.params["cluster"] == "emulated"
    assert run.data.metrics["link_bytes_per_step"] == results["ddp-100mbit-w2-r0"].link_bytes_per_step > 0
    parent = client.get_run(out["parent_run_id"]).data.metrics
    assert "ddp-100mbit-w2/total_seconds_median" in parent and "ddp-w2/total_seconds_median" not in parent


def test_unreachable_server_lets_training_go_on(make_config, caplog):
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    config = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=uri)
    paths, _ = write_synthetic_run(config)
    trained = False
    with caplog.at_level(logging.WARNING, logger="pipelines.tracking.runs"):
        with cell_tracking(config, paths, "ddp", 1, 0) as run_id:
            trained = True
    assert trained and run_id is None
    assert "tracking is off" in caplog.text and uri in caplog.text
    assert not paths.cell("ddp", 1, 0).mlflow_run.exists()
    evaluate_run(config, paths)
    with pytest.raises(TrackingUnavailable, match="unreachable"):
        log_benchmark(config, paths)


def _start_cell(run_dir: str, workers: int) -> str:
    from pipelines.config import read_config

    paths = RunPaths(Path(run_dir))
    config = read_config(paths.config)
    client = client_for(config)  # as cell_tracking does: creates the new database, once
    ensure_cell_run(client, config, paths, "ddp", workers, 0)
    return json.loads(paths.mlflow_parent.read_text())[config.resolved_tracking_uri()]["parent_run_id"]


def test_racing_cell_tasks_share_one_parent(make_config):
    config = make_config(backends=["ddp"], worker_counts=[1, 2])
    paths, _ = write_synthetic_run(config)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        parents = list(pool.map(_start_cell, [str(paths.root)] * 2, [1, 2]))
    assert parents[0] == parents[1]
    client = MlflowClient(tracking_uri=config.resolved_tracking_uri())
    exp = client.get_experiment_by_name(config.tracking.mlflow_experiment)
    assert len(client.search_runs([exp.experiment_id], "tags.`benchmark.role` = 'parent'")) == 1
    assert set(_children(client, parents[0])) == {"ddp-w1-r0", "ddp-w2-r0"}
