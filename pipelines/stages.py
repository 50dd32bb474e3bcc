"""The benchmark's steps as plain functions of a run folder (Kedro-style nodes).

The Airflow DAG runs one task per function and passes only the run folder (a path) between
them; ``python -m pipelines run`` calls the same functions in order. Every step reads the
resolved config from ``<run_dir>/config.json``, so any step can be retried on its own.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from pipelines.config import Backend, BenchmarkConfig, load_config, read_config, save_config
from pipelines.paths import DEFAULT_STRATEGY, CellPaths, RunPaths, safe_run_id

log = logging.getLogger(__name__)


def _load(run_dir: str | Path, tracking_uri: str | None = None) -> tuple[BenchmarkConfig, RunPaths]:
    """Config of the run folder; ``tracking_uri`` re-points MLflow (e.g. after losing a server)."""
    paths = RunPaths(Path(run_dir))
    config = read_config(paths.config)
    if tracking_uri:
        config = config.model_copy(update={"mlflow_tracking_uri": tracking_uri})
    return config, paths


def prepare_run(profile: str, overrides: dict[str, Any] | None, run_id: str) -> str:
    """Resolve the config and create ``<output_root>/<run_id>/config.json``. Returns run_dir.

    Idempotent for the same inputs (a retried task writes the same file).
    """
    config = load_config(profile, overrides)
    root = Path(config.output_root).resolve()
    paths = RunPaths(root / safe_run_id(run_id))
    if paths.root.resolve().parent != root:  # safe_run_id never allows it; keep it that way
        raise ValueError(f"run id {run_id!r} would leave the output root {root}")
    if paths.config.exists():  # a retried task: same config, and its time of birth is kept
        if read_config(paths.config) != config:
            raise FileExistsError(f"{paths.root} already holds a run with a different config")
    else:
        save_config(config, paths.config)
    log.info("run folder %s, config:\n%s", paths.root, config.to_json())
    return str(paths.root)


def ingest(run_dir: str) -> dict:
    from pipelines.data.ingest import ingest as _ingest

    return _ingest(*_load(run_dir))


def validate_snapshot(run_dir: str) -> dict:
    from pipelines.data.validate import validate_snapshot as _validate

    return _validate(*_load(run_dir))


def preprocess(run_dir: str) -> dict:
    from pipelines.data.preprocess import preprocess as _preprocess

    return _preprocess(*_load(run_dir))


def validate_tokens(run_dir: str) -> dict:
    from pipelines.data.validate import validate_tokens as _validate

    return _validate(*_load(run_dir))


def data_stage(run_dir: str) -> dict:
    """ingest -> validate -> preprocess -> validate tokens; stops at the first failure."""
    return {
        "ingest": ingest(run_dir),
        "validate_snapshot": validate_snapshot(run_dir),
        "preprocess": preprocess(run_dir),
        "validate_tokens": validate_tokens(run_dir),
    }


def planned_cells(run_dir: str) -> list[tuple[Backend, str, int, int]]:
    """Every (backend, strategy, workers, repeat) of the run (Backend is a str: JSON-friendly)."""
    config, _ = _load(run_dir)
    return config.cells()


def completed_result(cell: CellPaths):
    """The cell's result if it finished (status ok, last attempt ok), else None."""
    from pipelines.results import CellResult

    if not cell.result.exists():
        return None
    try:
        result = CellResult.read(cell.result)
    except ValueError:
        return None
    done = result.status == "ok" and (not result.attempts or result.attempts[-1].outcome == "ok")
    return result if done else None


def train_cell(run_dir: str, backend: Backend, workers: int, repeat: int = 0,
               node_rank: int | None = None, force: bool = False, strategy: str = DEFAULT_STRATEGY) -> dict:
    """Train one (backend, strategy, workers, repeat) cell; writes cells/<cell>/result.json.

    ``strategy``: the name of one of the run's ``strategies`` (``"default"``, ``"powersgd-r2"``).

    A cell that already finished is skipped (its result stands); ``force`` deletes the cell
    folder and trains it from scratch. An unfinished cell resumes from its last checkpoint
    (an Airflow retry, ``run --run-dir``). ``node_rank`` (multi-node ddp): this machine's rank;
    every node runs the same cell.
    """
    from pipelines.backends import run_cell
    from pipelines.signals import terminate_tree_on_signal
    from pipelines.tracking import cell_tracking

    config, paths = _load(run_dir)
    config.strategy(strategy)  # a name the run does not have is refused before anything happens
    cell = paths.cell(backend, workers, repeat, strategy)
    if force:
        shutil.rmtree(cell.root, ignore_errors=True)
    elif (done := completed_result(cell)) is not None:
        log.info("%s already finished (%s): skipped; --force trains it again", cell.name, cell.result)
        return {"cell": cell.name, "status": done.status, "total_seconds": done.total_seconds, "skipped": True}
    if node_rank is not None:
        config = config.model_copy(update={"ddp_node_rank": node_rank})
    with terminate_tree_on_signal():  # SIGTERM/SIGINT: no orphan keeps training, the cell fails
        if config.ddp_node_rank > 0:  # node 0 tracks the cell; other nodes only lend processes
            result = run_cell(config, paths, backend, workers, repeat, strategy)
        else:
            with cell_tracking(config, paths, backend, workers, repeat, strategy):
                result = run_cell(config, paths, backend, workers, repeat, strategy)
    return {"cell": cell.name, "status": result.status, "total_seconds": result.total_seconds,
            "skipped": False}


def evaluate(run_dir: str) -> dict:
    """Read every cell's result.json: time-to-accuracy, aggregates -> report/summary.json.

    Failed cells are part of the summary; a run where no cell wrote any result is an error
    (the data stage or every cell died before training: there is nothing to report).
    """
    from pipelines.evaluation import evaluate_run

    config, paths = _load(run_dir)
    if not paths.cell_results():
        raise RuntimeError(f"no training cell wrote a result under {paths.cells}: the data stage or "
                           "every cell failed before writing one; see the training logs")
    summary = evaluate_run(config, paths)
    return {"summary": str(paths.summary), "status": summary.status, "cells": len(summary.cells),
            "failed": [f.cell for f in summary.failed]}


def report(run_dir: str) -> dict:
    """Comparison table and plots -> report/report.{html,md}, *.png."""
    from pipelines.report import build_report

    return build_report(*_load(run_dir))


def track(run_dir: str, tracking_uri: str | None = None) -> dict:
    """Log the run folder to MLflow (parent + nested runs). Idempotent; files stay the truth."""
    from pipelines.tracking import log_benchmark

    return log_benchmark(*_load(run_dir, tracking_uri))


def check_regression(run_dir: str, tracking_uri: str | None = None) -> dict:
    """Compare with the baseline run in MLflow; raise on a regression or on failed cells."""
    from pipelines.regression import check_regression as _check

    return _check(*_load(run_dir, tracking_uri))
