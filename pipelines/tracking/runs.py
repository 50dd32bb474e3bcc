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
    python -c "from pipelines.run.stages import track; print(track('runs/<run>'))"

The code: ``pipelines.tracking.store`` (client, experiment, parent run, tags),
``pipelines.tracking.cells`` (the nested cell runs, ``cell_tracking``) and here ``log_benchmark``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.summary import read_summary
from pipelines.tracking.cells import (SYSTEM_METRICS_INTERVAL_S, cell_tracking, ensure_cell_run,
                                      log_cell_result)
from pipelines.tracking.store import (TAG_BASELINE_ELIGIBLE, TAG_FINGERPRINT, TAG_HARDWARE, TAG_LOGGED,
                                      TAG_REGRESSION, TAG_ROLE, TAG_RUN_DIR, TAG_STARTED, TAG_STATUS,
                                      TrackingUnavailable, _sha256, client_for, ensure_parent_run,
                                      experiment_id, parent_run_id, run_started_at)

log = logging.getLogger(__name__)

# what the stages, regression and tests import from here (wherever it is defined)
__all__ = ["SYSTEM_METRICS_INTERVAL_S", "TAG_BASELINE_ELIGIBLE", "TAG_FINGERPRINT", "TAG_HARDWARE",
           "TAG_LOGGED", "TAG_REGRESSION", "TAG_ROLE", "TAG_RUN_DIR", "TAG_STARTED", "TAG_STATUS",
           "TrackingUnavailable", "baseline_eligible", "cell_tracking", "client_for", "ensure_cell_run",
           "ensure_parent_run", "experiment_id", "log_benchmark", "log_cell_result", "parent_run_id",
           "run_started_at"]


def baseline_eligible(paths: RunPaths) -> bool:
    """False when the snapshot passed only because the data contract was relaxed."""
    try:
        summary = json.loads(paths.validation_summary("snapshot").read_text())
    except (OSError, ValueError):
        return True
    return not summary.get("contract", {}).get("relaxed", False)


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
    for backend, strategy, network, workers, repeat in config.cells():
        cell = paths.cell(backend, workers, repeat, strategy, network)
        run_id = ensure_cell_run(client, config, paths, backend, workers, repeat, strategy, network)
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
    client.set_tag(parent_id, "dataset_source", str(dataset.get("source", config.data.dataset_source)))
    client.set_terminated(parent_id, "FINISHED" if status == "success" else "FAILED")
    log.info("logged %s to MLflow %s: parent %s, %d cells, status %s", paths.root.name,
             config.resolved_tracking_uri(), parent_id, len(cell_ids), status)
    return {"parent_run_id": parent_id, "cell_run_ids": cell_ids,
            "tracking_uri": config.resolved_tracking_uri(), "status": status}
