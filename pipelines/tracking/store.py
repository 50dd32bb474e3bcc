"""MLflow store access shared by the tracking modules: the tags, the id files kept in the run
folder, the client and experiment, and the one parent run per benchmark run folder.

A deployment that names its experiment (``BENCHMARK_MLFLOW_EXPERIMENT``: the compose stack's
workers log as a user with edit rights on that experiment alone, created by its mlflow-init
step) is never asked to create one: a run whose ``tracking.mlflow_experiment`` names another
experiment, or a missing deployment experiment, fails the tracking step with
``ExperimentNotAllowed`` saying so. Without that variable a missing experiment is created, as
on a local SQLite store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from pipelines.config import BenchmarkConfig
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths

log = logging.getLogger("pipelines.tracking.runs")  # one logger for all of tracking, as before the split

TAG_ROLE = "benchmark.role"  # parent | cell
TAG_STATUS = "benchmark.status"  # running | success | failed
TAG_RUN_DIR = "benchmark.run_dir"
TAG_REGRESSION = "benchmark.regression"  # set by pipelines.tracking.regression
TAG_LOGGED = "benchmark.logged_sha256"  # hash of what was logged: re-logging is skipped
TAG_FINGERPRINT = "benchmark.fingerprint"  # BenchmarkConfig.fingerprint(): what the run did
TAG_HARDWARE = "benchmark.hardware_class"  # where: device kind/count, CPU model, hosts
TAG_STARTED = "benchmark.started_at"  # when the run folder was made (a re-report keeps it)
TAG_BASELINE_ELIGIBLE = "benchmark.baseline_eligible"  # false: the data contract was relaxed


def run_started_at(paths: RunPaths) -> float:
    """When the run began: its config.json is written once, by prepare_run."""
    return paths.config.stat().st_mtime


DEPLOYED_EXPERIMENT_ENV = "BENCHMARK_MLFLOW_EXPERIMENT"  # the one experiment a deployment allows


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking store cannot be reached or used."""


class ExperimentNotAllowed(TrackingUnavailable):
    """The run names an experiment the deployment does not provide (it is never created)."""


# --- small helpers -------------------------------------------------------------------------

def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _sha256(*files: Path) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes() if f.exists() else b"-")
    return digest.hexdigest()


def _read_ids(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_ids(path: Path, data: dict[str, Any]) -> None:
    atomic_write_json(path, data)


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """Exclusive lock between processes on this machine (cell tasks racing for the parent)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- store, experiment, runs ---------------------------------------------------------------

def client_for(config: BenchmarkConfig):
    """MlflowClient on the config's tracking URI; TrackingUnavailable if it cannot be reached."""
    from mlflow import MlflowClient

    uri = config.resolved_tracking_uri()
    # MLflow retries a dead server for minutes by default; fail within seconds instead.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
        except requests.RequestException as err:
            raise TrackingUnavailable(f"MLflow tracking server {uri} is unreachable: {err}") from err
    elif uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        # The client creates/migrates the schema on construction; two cell tasks doing it
        # at once on a new file fail ("table already exists"): one at a time per file.
        with _locked(db.with_name(db.name + ".lock")):
            return MlflowClient(tracking_uri=uri)
    return MlflowClient(tracking_uri=uri)


def _artifact_location(config: BenchmarkConfig) -> str | None:
    """Where a new experiment's artifacts go: next to a SQLite file, the server's own root
    for a tracking server (None), else the output root. Never MLflow's ./mlruns."""
    uri = config.resolved_tracking_uri()
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    if uri.startswith(("http://", "https://", "databricks", "file:")):
        return None
    return (Path(config.tracking.output_root).resolve() / "mlartifacts").as_uri()


def deployed_experiment() -> str | None:
    """The experiment the deployment provides (``BENCHMARK_MLFLOW_EXPERIMENT``), if it names one."""
    return os.environ.get(DEPLOYED_EXPERIMENT_ENV) or None


def _check_allowed(config: BenchmarkConfig) -> str | None:
    deployed, wanted = deployed_experiment(), config.tracking.mlflow_experiment
    if deployed and wanted != deployed:
        raise ExperimentNotAllowed(
            f"tracking.mlflow_experiment={wanted!r}, but this deployment logs to the experiment "
            f"{deployed!r} only ({DEPLOYED_EXPERIMENT_ENV}); experiments are not created from a run: "
            f"trigger without tracking.mlflow_experiment, or set it to {deployed!r}")
    return deployed


def experiment_id(client, config: BenchmarkConfig) -> str:
    from mlflow.exceptions import MlflowException

    deployed = _check_allowed(config)
    exp = client.get_experiment_by_name(config.tracking.mlflow_experiment)
    if exp is None and deployed:
        raise ExperimentNotAllowed(
            f"the deployment's MLflow experiment {deployed!r} does not exist on "
            f"{config.resolved_tracking_uri()}: it is created when the stack starts (the mlflow-init "
            "service, docker/mlflow_init.py), not by a run")
    if exp is None:
        try:
            return client.create_experiment(config.tracking.mlflow_experiment,
                                            artifact_location=_artifact_location(config))
        except MlflowException:  # another process created it first
            exp = client.get_experiment_by_name(config.tracking.mlflow_experiment)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def _live_run(client, run_id: str | None):
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return None if run.info.lifecycle_stage == "deleted" else run


def _params(values: dict[str, Any]) -> list:
    from mlflow.entities import Param

    def text(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v)

    return [Param(k, text(v)[:6000]) for k, v in values.items()]


def parent_run_id(config: BenchmarkConfig, paths: RunPaths) -> str | None:
    """This run folder's parent run id in the config's store, if it was created."""
    return _read_ids(paths.mlflow_parent).get(config.resolved_tracking_uri(), {}).get("parent_run_id")


def ensure_parent_run(client, config: BenchmarkConfig, paths: RunPaths) -> tuple[str, str]:
    """(experiment_id, parent_run_id); creates the parent once per run folder and store."""
    _check_allowed(config)
    uri = config.resolved_tracking_uri()
    with _locked(paths.mlflow_parent.with_name(paths.mlflow_parent.name + ".lock")):
        ids = _read_ids(paths.mlflow_parent)
        entry = ids.get(uri, {})
        if _live_run(client, entry.get("parent_run_id")):
            return entry["experiment_id"], entry["parent_run_id"]
        exp_id = experiment_id(client, config)
        commit = _git_commit()
        run = client.create_run(exp_id, run_name=paths.root.name, tags={
            TAG_ROLE: "parent", TAG_STATUS: "running", "profile": config.profile,
            TAG_RUN_DIR: str(paths.root.resolve()), "git_commit": commit,
            TAG_FINGERPRINT: config.fingerprint(), TAG_STARTED: repr(run_started_at(paths)),
            "mlflow.source.git.commit": commit, "host": socket.gethostname(),
        })
        params = config.flat()  # flat names, as runs logged before the config had sections
        client.log_batch(run.info.run_id, params=_params(params))
        ids[uri] = {"experiment_id": exp_id, "parent_run_id": run.info.run_id}
        _write_ids(paths.mlflow_parent, ids)
        log.info("MLflow parent run %s (%s) in %s", run.info.run_id, paths.root.name, uri)
        return exp_id, run.info.run_id

