"""The nested MLflow run of one training cell: created under the parent run, its result,
metrics and model logged, and ``cell_tracking``, the context manager around training."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from pipelines import platforms
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import DEFAULT_NETWORK, DEFAULT_STRATEGY, CellPaths, RunPaths
from pipelines.measure.resources import RESOURCES_FILE, read_timeline
from pipelines.runfolder.results import CellResult
from pipelines.tracking.store import (TAG_LOGGED, TAG_ROLE, _git_commit, _live_run, _params, _read_ids,
                                      _sha256, _version, _write_ids, client_for, ensure_parent_run)

log = logging.getLogger("pipelines.tracking.runs")  # one logger for all of tracking, as before the split

SYSTEM_METRICS_INTERVAL_S = 2  # short cells still get a few samples


def ensure_cell_run(client, config: BenchmarkConfig, paths: RunPaths, backend: str,
                    workers: int, repeat: int, strategy: str = DEFAULT_STRATEGY,
                    network: str = DEFAULT_NETWORK) -> str:
    """The nested run of one cell (reused across retries and re-logging)."""
    exp_id, parent_id = ensure_parent_run(client, config, paths)
    uri = config.resolved_tracking_uri()
    cell = paths.cell(backend, workers, repeat, strategy, network)
    ids = _read_ids(cell.mlflow_run)
    entry = ids.get(uri, {})
    if entry.get("parent_run_id") == parent_id and _live_run(client, entry.get("run_id")):
        return entry["run_id"]
    backend = platforms.check_name(backend)
    run = client.create_run(exp_id, run_name=cell.name, tags={
        "mlflow.parentRunId": parent_id, TAG_ROLE: "cell", "profile": config.profile,
        "backend": str(backend), "workers": str(workers), "repeat": str(repeat), "strategy": strategy,
        "network": network, "cluster": config.cluster.kind, "host": socket.gethostname(), "git_commit": _git_commit(),
        "torch_version": _version("torch"), "transformers_version": _version("transformers"),
    })
    client.log_batch(run.info.run_id, params=_params({
        "backend": str(backend), "workers": workers, "repeat": repeat, "epochs": config.training.epochs,
        "batch_size_per_worker": config.training.batch_size, "global_batch_size": config.training.batch_size * workers,
        "learning_rate": config.training.learning_rate, "max_seq_len": config.data.max_seq_len,
        "seed": config.training.seed, "train_samples": config.data.train_samples,
        "test_samples": config.data.test_samples, "threads_per_worker": config.training.threads_per_worker,
        "model": config.training.model_source, "network": network, "cluster": config.cluster.kind,
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


def resource_metrics(result: CellResult, cell: CellPaths, now: int) -> list:
    """What the cell's processes used (``CellResult.resources``) as ``resources.*`` metrics (per host:
    ``resources.<host>.*``), and its timeline as step series (step = sample index, timestamp = when it
    was taken): ``resources.{ranks,platform}_{cpu_percent,rss_mb}`` [, ``resources.gpu_*``]. MLflow's
    own system metrics (``system/*``, the whole machine) are logged beside them by ``cell_tracking``."""
    from mlflow.entities import Metric

    usage = result.resources
    if usage is None:
        return []
    figures = {k: v for k, v in usage.model_dump(exclude={"per_host", "notes", "source"}).items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    kinds = usage.platform_processes
    figures.update({f"platform_processes.{kind}_peak_rss_mb": mb for kind, mb in kinds.items()})
    for host, part in usage.per_host.items():
        figures.update({f"{host}.{k}": v for k, v in part.model_dump(exclude={"platform_processes"}).items()
                        if isinstance(v, int | float) and not isinstance(v, bool)})
    out = [Metric(f"resources.{k}", float(v), now, 0) for k, v in figures.items() if k != "started"]
    for step, row in enumerate(read_timeline(cell.root)):
        stamp = int((usage.started + row.get("t", 0.0)) * 1000)
        out += [Metric(f"resources.{k}", float(v), stamp, step) for k, v in row.items()
                if k != "t" and isinstance(v, int | float)]
    return out


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
    if result.link_bytes_per_step is not None:  # across hosts: all links' tx bytes / steps trained
        final["link_bytes_per_step"] = result.link_bytes_per_step
    metrics += [Metric(k, float(v), now, 0) for k, v in final.items()] + resource_metrics(result, cell, now)
    tags = {"device": result.device, "strategy": result.strategy, "network": result.network,
            "cluster": result.cluster, "model_source": result.model_source or "unknown",
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
    if (cell.root / RESOURCES_FILE).exists():  # the usage and its timeline (pipelines.measure.resources)
        client.log_artifact(run_id, str(cell.root / RESOURCES_FILE), artifact_path="result")
    if cell.tensorboard.is_dir():  # pipelines.measure.tensorboard: `tensorboard --logdir` on the download
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
def cell_tracking(config: BenchmarkConfig, paths: RunPaths, backend: str, workers: int,
                  repeat: int = 0, strategy: str = DEFAULT_STRATEGY,
                  network: str = DEFAULT_NETWORK) -> Iterator[str | None]:
    """Wrap the training of one cell; yields the nested run id (None if tracking is off)."""
    import mlflow

    cell = paths.cell(backend, workers, repeat, strategy, network)
    client, run_id = None, None
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI to the process: put it back after,
    # so this cell's store never becomes the default of configs built later in the process.
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        client = client_for(config)
        run_id = ensure_cell_run(client, config, paths, backend, workers, repeat, strategy, network)
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

