"""MLflow tracking: one parent run per benchmark run, one nested run per training cell.

The run folder stays the source of truth; MLflow is a view of it that can be rebuilt at any
time (``log_benchmark`` is idempotent), e.g. after a lost tracking server.

- ``cell_tracking(config, paths, backend, workers, repeat)``: context manager around the
  training of one cell (the ``train_cell`` stage). Creates the parent run on first use
  (id kept in ``<run_dir>/mlflow.json``, created under an fcntl lock so racing cell tasks
  share one parent), starts the nested run (``mlflow.parentRunId`` tag, id kept in
  ``cells/<cell>/mlflow_run.json``) with MLflow system metrics (CPU, memory, disk, network,
  GPU where present; sampled every ``SYSTEM_METRICS_INTERVAL_S``), logs the cell's
  result.json, metrics and model checkpoint when training ends, and ends the run FINISHED,
  or FAILED if an exception goes through or the result says failed. If the tracking store
  is unreachable it logs a warning and training goes on.
- ``log_benchmark(config, paths)``: the ``track`` stage. Parent params (resolved config),
  tags (profile, ``benchmark.status`` = success|failed, git commit, host), summary metrics
  (``<backend>-w<N>/<metric>_median``), config/manifest/report files as artifacts; every
  cell's nested run (created here if ``cell_tracking`` never ran).

The tracking URI is always ``config.resolved_tracking_uri()`` (never MLflow's cwd default);
with a SQLite store, artifacts go to ``mlartifacts/`` next to the database file.
Both files map tracking URI -> ids, so one run folder can be logged to several stores.
    python -c "from pipelines.stages import track; print(track('runs/<run>'))"
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
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from pipelines.config import Backend, BenchmarkConfig
from pipelines.fileio import atomic_write_json
from pipelines.paths import DEFAULT_STRATEGY, PROJECT_ROOT, CellPaths, RunPaths
from pipelines.results import CellResult
from pipelines.summary import read_summary

log = logging.getLogger(__name__)

SYSTEM_METRICS_INTERVAL_S = 2  # short cells still get a few samples
TAG_ROLE = "benchmark.role"  # parent | cell
TAG_STATUS = "benchmark.status"  # running | success | failed
TAG_RUN_DIR = "benchmark.run_dir"
TAG_REGRESSION = "benchmark.regression"  # set by pipelines.regression
TAG_LOGGED = "benchmark.logged_sha256"  # hash of what was logged: re-logging is skipped
TAG_FINGERPRINT = "benchmark.fingerprint"  # BenchmarkConfig.fingerprint(): what the run did
TAG_HARDWARE = "benchmark.hardware_class"  # where: device kind/count, CPU model, hosts
TAG_STARTED = "benchmark.started_at"  # when the run folder was made (a re-report keeps it)
TAG_BASELINE_ELIGIBLE = "benchmark.baseline_eligible"  # false: the data contract was relaxed


def baseline_eligible(paths: RunPaths) -> bool:
    """False when the snapshot passed only because the data contract was relaxed."""
    try:
        summary = json.loads(paths.validation_summary("snapshot").read_text())
    except (OSError, ValueError):
        return True
    return not summary.get("contract", {}).get("relaxed", False)


def run_started_at(paths: RunPaths) -> float:
    """When the run began: its config.json is written once, by prepare_run."""
    return paths.config.stat().st_mtime


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking store cannot be reached or used."""


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
    return (Path(config.output_root).resolve() / "mlartifacts").as_uri()


def experiment_id(client, config: BenchmarkConfig) -> str:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(config.mlflow_experiment)
    if exp is None:
        try:
            return client.create_experiment(config.mlflow_experiment,
                                            artifact_location=_artifact_location(config))
        except MlflowException:  # another process created it first
            exp = client.get_experiment_by_name(config.mlflow_experiment)
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
        params = json.loads(config.model_dump_json())  # enums and lists as plain JSON
        client.log_batch(run.info.run_id, params=_params(params))
        ids[uri] = {"experiment_id": exp_id, "parent_run_id": run.info.run_id}
        _write_ids(paths.mlflow_parent, ids)
        log.info("MLflow parent run %s (%s) in %s", run.info.run_id, paths.root.name, uri)
        return exp_id, run.info.run_id


def ensure_cell_run(client, config: BenchmarkConfig, paths: RunPaths, backend: Backend,
                    workers: int, repeat: int, strategy: str = DEFAULT_STRATEGY) -> str:
    """The nested run of one cell (reused across retries and re-logging)."""
    exp_id, parent_id = ensure_parent_run(client, config, paths)
    uri = config.resolved_tracking_uri()
    cell = paths.cell(backend, workers, repeat, strategy)
    ids = _read_ids(cell.mlflow_run)
    entry = ids.get(uri, {})
    if entry.get("parent_run_id") == parent_id and _live_run(client, entry.get("run_id")):
        return entry["run_id"]
    backend = Backend(backend)
    run = client.create_run(exp_id, run_name=cell.name, tags={
        "mlflow.parentRunId": parent_id, TAG_ROLE: "cell", "profile": config.profile,
        "backend": backend.value, "workers": str(workers), "repeat": str(repeat), "strategy": strategy,
        "host": socket.gethostname(), "git_commit": _git_commit(),
        "torch_version": _version("torch"), "transformers_version": _version("transformers"),
    })
    client.log_batch(run.info.run_id, params=_params({
        "backend": backend.value, "workers": workers, "repeat": repeat, "epochs": config.epochs,
        "batch_size_per_worker": config.batch_size, "global_batch_size": config.batch_size * workers,
        "learning_rate": config.learning_rate, "max_seq_len": config.max_seq_len,
        "seed": config.seed, "train_samples": config.train_samples,
        "test_samples": config.test_samples, "threads_per_worker": config.threads_per_worker,
        "model": config.model_source,
    }))
    ids[uri] = {"run_id": run.info.run_id, "parent_run_id": parent_id, "experiment_id": exp_id}
    _write_ids(cell.mlflow_run, ids)
    return run.info.run_id


def _checkpoint(result: CellResult, cell: CellPaths) -> Path | None:
    if not result.checkpoint_path:
        return None
    path = Path(result.checkpoint_path)
    for candidate in (path, cell.root / path, cell.root.parent.parent / path):
        if candidate.exists():
            return candidate
    log.warning("checkpoint %s of %s not found; model artifact skipped", path, cell.name)
    return None


def log_cell_result(client, run_id: str, cell: CellPaths) -> CellResult | None:
    """Metrics (per epoch: step = epoch), tags, result.json and the model of one cell."""
    from mlflow.entities import Metric, RunTag

    result_file = cell.result
    if not result_file.exists():
        return None
    result = CellResult.read(result_file)
    sha = _sha256(result_file)
    old_tags = client.get_run(run_id).data.tags
    if old_tags.get(TAG_LOGGED) == sha:
        return result  # this exact result is already there
    if "error" in old_tags and not result.error:
        client.delete_tag(run_id, "error")  # a retry succeeded after a failed attempt
    now = int(time.time() * 1000)
    metrics = []
    for e in result.epochs:
        for key in ("train_loss", "train_accuracy", "eval_loss", "eval_accuracy",
                    "epoch_seconds", "elapsed_seconds"):
            metrics.append(Metric(key, float(getattr(e, key)), now, e.epoch))
        metrics.append(Metric("epoch_samples_per_second", e.samples_per_second, now, e.epoch))
    final = {k: getattr(result, k) for k in ("startup_seconds", "training_seconds",
             "evaluation_seconds", "total_seconds", "samples_per_second", "peak_memory_mb")}
    if result.test:
        final.update({f"test_{k}": getattr(result.test, k)
                      for k in ("accuracy", "f1", "precision", "recall", "loss")})
    final.update({f"phase_{name}_seconds": seconds for name, seconds in result.phases.items()})
    if result.comm_bytes_per_step is not None:
        final["comm_bytes_per_step"] = result.comm_bytes_per_step
    metrics += [Metric(k, float(v), now, 0) for k, v in final.items()]
    tags = {"device": result.device, "strategy": result.strategy, "model_source": result.model_source or "unknown",
            "cell_status": result.status, "resumed_from_epoch": str(result.resumed_from_epoch),
            **{f"version.{k}": v for k, v in result.versions.items()}}
    if result.host:
        tags["host"] = result.host
    if result.platform_mode:
        tags["platform_mode"] = result.platform_mode
    if result.data_feed:
        tags["data_feed"] = result.data_feed
    if result.error:
        tags["error"] = result.error[:5000]
    for i in range(0, len(metrics), 1000):  # MLflow's per-batch limit
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    client.log_artifact(run_id, str(result_file), artifact_path="result")
    if cell.tensorboard.is_dir():  # pipelines.tensorboard: `tensorboard --logdir` on the download
        client.log_artifacts(run_id, str(cell.tensorboard), artifact_path="tensorboard")
    model_dir = Path(result.model_path) if result.model_path else None
    if model_dir is not None and model_dir.is_dir():  # Hugging Face format: config + weights
        client.log_artifacts(run_id, str(model_dir), artifact_path="model")
    else:  # older results: the training checkpoint is the model we have
        checkpoint = _checkpoint(result, cell)
        if checkpoint is not None and checkpoint.is_dir():
            client.log_artifacts(run_id, str(checkpoint), artifact_path=f"model/{checkpoint.name}")
        elif checkpoint is not None:
            client.log_artifact(run_id, str(checkpoint), artifact_path="model")
    client.set_tag(run_id, TAG_LOGGED, sha)  # last: a crash above means it is logged again
    return result


# --- the training-time context manager -----------------------------------------------------

@contextlib.contextmanager
def cell_tracking(config: BenchmarkConfig, paths: RunPaths, backend: Backend, workers: int,
                  repeat: int = 0, strategy: str = DEFAULT_STRATEGY) -> Iterator[str | None]:
    """Wrap the training of one cell; yields the nested run id (None if tracking is off)."""
    import mlflow

    cell = paths.cell(backend, workers, repeat, strategy)
    client, run_id = None, None
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI to the process: put it back after,
    # so this cell's store never becomes the default of configs built later in the process.
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        client = client_for(config)
        run_id = ensure_cell_run(client, config, paths, backend, workers, repeat, strategy)
        mlflow.set_tracking_uri(config.resolved_tracking_uri())
        mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)
        # resuming the run we created keeps its parent tag; a retry reuses the same run
        mlflow.start_run(run_id=run_id, nested=True, log_system_metrics=True)
    except Exception as err:  # tracking is a view; never let it stop training
        log.warning("MLflow tracking is off for cell %s (%s): %s. Training goes on; "
                    "log it later with the track stage.", cell.name,
                    config.resolved_tracking_uri(), err)
        run_id = None
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    finally:
        if run_id is not None:
            _end_cell_run(client, run_id, cell, status)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


def _end_cell_run(client, run_id: str, cell: CellPaths, status: str) -> None:
    import mlflow

    try:
        result = log_cell_result(client, run_id, cell)
        if result is not None and result.status != "ok":
            status = "FAILED"
    except Exception as err:
        log.warning("could not log result of %s to MLflow: %s", cell.name, err)
    try:
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            mlflow.end_run(status)  # also stops and flushes the system metrics monitor
        else:
            client.set_terminated(run_id, status)
    except Exception as err:
        log.warning("could not end MLflow run of %s: %s", cell.name, err)


# --- whole-run logging ---------------------------------------------------------------------

def log_benchmark(config: BenchmarkConfig, paths: RunPaths) -> dict[str, Any]:
    """Log the whole run folder to MLflow (idempotent). Raises TrackingUnavailable if the
    store cannot be reached (retry the stage; the files are unaffected)."""
    from mlflow.entities import Metric

    from pipelines.evaluation import summary_metrics

    summary = read_summary(paths)
    client = client_for(config)
    _, parent_id = ensure_parent_run(client, config, paths)

    cell_ids: dict[str, str] = {}
    for backend, strategy, workers, repeat in config.cells():
        cell = paths.cell(backend, workers, repeat, strategy)
        run_id = ensure_cell_run(client, config, paths, backend, workers, repeat, strategy)
        cell_ids[cell.name] = run_id
        try:
            result = log_cell_result(client, run_id, cell)
        except ValueError as err:  # a damaged result.json: the cell counts as failed (as in the summary)
            result = None
            client.set_tag(run_id, "error", f"unreadable {cell.result}: {str(err)[:4000]}")
        else:
            if result is None:
                client.set_tag(run_id, "error", "no result.json: the training task never finished")
        if client.get_run(run_id).info.status == "RUNNING":  # never ended (lost process)
            client.set_terminated(run_id, "FINISHED" if result and result.status == "ok" else "FAILED")

    status = summary.status
    files = [paths.config, paths.manifest, *sorted(p for p in paths.report.rglob("*") if p.is_file())]
    sha = _sha256(*files)
    if client.get_run(parent_id).data.tags.get(TAG_LOGGED) != sha:
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in summary_metrics(summary).items()]
        for i in range(0, len(metrics), 1000):
            client.log_batch(parent_id, metrics=metrics[i:i + 1000])
        for f in (paths.config, paths.manifest):
            if f.exists():
                client.log_artifact(parent_id, str(f), artifact_path="run")
        if paths.report.exists():
            client.log_artifacts(parent_id, str(paths.report), artifact_path="report")
        client.set_tag(parent_id, TAG_LOGGED, sha)
    dataset = summary.dataset or {}
    client.set_tag(parent_id, TAG_STATUS, status)
    client.set_tag(parent_id, TAG_FINGERPRINT, summary.fingerprint or config.fingerprint())
    client.set_tag(parent_id, TAG_HARDWARE, summary.hardware.hardware_class)
    client.set_tag(parent_id, TAG_STARTED, repr(run_started_at(paths)))
    client.set_tag(parent_id, TAG_BASELINE_ELIGIBLE, str(baseline_eligible(paths)).lower())
    client.set_tag(parent_id, "model_sources", ",".join(summary.model_sources) or "unknown")
    devices = summary.hardware.devices
    client.set_tag(parent_id, "devices", ",".join(devices) or "unknown")
    client.set_tag(parent_id, "dataset_source", str(dataset.get("source", config.dataset_source)))
    client.set_terminated(parent_id, "FINISHED" if status == "success" else "FAILED")
    log.info("logged %s to MLflow %s: parent %s, %d cells, status %s", paths.root.name,
             config.resolved_tracking_uri(), parent_id, len(cell_ids), status)
    return {"parent_run_id": parent_id, "cell_run_ids": cell_ids,
            "tracking_uri": config.resolved_tracking_uri(), "status": status}
