"""The stack's MLflow permissions without Docker: a real ``mlflow server --app-name basic-auth
--enable-workspaces`` (started through the image's entrypoint, docker/entrypoint.sh, as the
compose service is, on SQLite), then docker/mlflow_init.py as the mlflow-init service runs it.

The workers' user logs the benchmark into the benchmark's experiment and cannot create an
experiment (403 PERMISSION_DENIED); a run naming another experiment fails its tracking step with
a clear message and creates nothing. The same checks against the running stack: stack_driver.py (f).

Needs MLflow's ``auth`` extra (Flask-WTF) for the server, as the image has; skipped otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "distributed-training-benchmark"
ADMIN, ADMIN_PW = "admin", "admin-" + "a1" * 12
WORKER, WORKER_PW = "benchmark-worker", "worker-" + "b2" * 12
UP_S = 240.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("flask_wtf", reason="the basic-auth server needs mlflow[auth] (Flask-WTF)")
    tmp = tmp_path_factory.mktemp("mlflow-auth")
    uri = f"http://127.0.0.1:{_free_port()}"
    env = {**os.environ, "HOME": str(tmp), "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp}/auth.db",
           "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN, "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PW,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for key in ("SPARK_AUTH_SECRET", "AIRFLOW_ADMIN_PASSWORD", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    log = open(tmp / "server.log", "w")  # noqa: SIM115 - the server's output while it runs
    proc = subprocess.Popen(
        ["bash", str(ROOT / "docker" / "entrypoint.sh"), "mlflow", "server", "--app-name", "basic-auth",
         "--enable-workspaces", "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--artifacts-destination", str(tmp / "artifacts"),
         "--serve-artifacts"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + UP_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if requests.get(f"{uri}/health", timeout=5).ok:
                    break
            except requests.RequestException:
                time.sleep(1)
        else:
            pytest.fail(f"mlflow server did not come up: {(tmp / 'server.log').read_text()[-3000:]}")
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _init(uri: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_TRACKING_USERNAME": ADMIN,
           "MLFLOW_TRACKING_PASSWORD": ADMIN_PW, "MLFLOW_WORKER_USERNAME": WORKER,
           "MLFLOW_WORKER_PASSWORD": WORKER_PW, "BENCHMARK_MLFLOW_EXPERIMENT": EXPERIMENT}
    return subprocess.run([sys.executable, str(ROOT / "docker" / "mlflow_init.py")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def initialised(server):
    runs = [_init(server), _init(server)]  # idempotent: the second `up` changes nothing
    for out in runs:
        assert out.returncode == 0, out.stdout + out.stderr
    assert "(created)" in runs[0].stdout and "existed" in runs[1].stdout
    return server


def test_workers_user_cannot_create_an_experiment(initialised):
    resp = requests.post(f"{initialised}/api/2.0/mlflow/experiments/create", json={"name": "from-a-trigger"},
                         auth=(WORKER, WORKER_PW), timeout=30)
    assert resp.status_code == 403 and "denied" in resp.text.lower(), resp.text
    admin = requests.get(f"{initialised}/api/2.0/mlflow/experiments/get-by-name", auth=(ADMIN, ADMIN_PW),
                         params={"experiment_name": "from-a-trigger"}, timeout=30)
    assert admin.status_code == 404  # nothing was created


@pytest.fixture
def as_worker(initialised, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", initialised)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", WORKER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", WORKER_PW)
    monkeypatch.setenv("BENCHMARK_MLFLOW_EXPERIMENT", EXPERIMENT)
    return initialised


def _run_folder(make_config, tmp_path, **overrides):
    from pipelines.runfolder.paths import RunPaths

    config = make_config(**overrides)
    paths = RunPaths(tmp_path / "runs" / "r1")
    paths.root.mkdir(parents=True)
    paths.config.write_text(config.model_dump_json())
    return config, paths


def test_workers_log_the_benchmark_into_its_experiment(as_worker, make_config, tmp_path):
    from mlflow import MlflowClient

    from pipelines.tracking.store import client_for, ensure_parent_run

    config, paths = _run_folder(make_config, tmp_path)
    client = client_for(config)
    exp_id, run_id = ensure_parent_run(client, config, paths)
    client.log_metric(run_id, "accuracy", 0.5)
    client.log_artifact(run_id, str(paths.config), artifact_path="run")
    client.set_terminated(run_id, "FINISHED")
    run = MlflowClient(tracking_uri=as_worker).get_run(run_id)
    assert run.info.experiment_id == exp_id and run.data.metrics["accuracy"] == 0.5
    assert client.get_experiment(exp_id).name == EXPERIMENT


def test_a_run_naming_another_experiment_fails_and_creates_nothing(as_worker, make_config, tmp_path):
    from pipelines.tracking.store import (
        ExperimentNotAllowed,
        TrackingUnavailable,
        client_for,
        ensure_parent_run,
    )

    config, paths = _run_folder(make_config, tmp_path, mlflow_experiment="my-own-experiment")
    with pytest.raises(ExperimentNotAllowed, match="logs to the experiment 'distributed-training-benchmark' only"):
        ensure_parent_run(client_for(config), config, paths)
    assert issubclass(ExperimentNotAllowed, TrackingUnavailable)
    admin = requests.get(f"{as_worker}/api/2.0/mlflow/experiments/get-by-name", auth=(ADMIN, ADMIN_PW),
                         params={"experiment_name": "my-own-experiment"}, timeout=30)
    assert admin.status_code == 404


def test_a_missing_deployment_experiment_is_not_created_by_a_run(as_worker, make_config, tmp_path, monkeypatch):
    from pipelines.tracking.store import ExperimentNotAllowed, client_for, ensure_parent_run

    monkeypatch.setenv("BENCHMARK_MLFLOW_EXPERIMENT", "never-initialised")
    config, paths = _run_folder(make_config, tmp_path, mlflow_experiment="never-initialised")
    with pytest.raises(ExperimentNotAllowed, match="created when the stack starts"):
        ensure_parent_run(client_for(config), config, paths)
