"""The benchmark's steps as plain functions of a run folder (Kedro-style nodes).

The Airflow DAG runs one task per function and passes only the run folder (a path) between
them; ``python -m pipelines run`` calls the same functions in order. Every step reads the
resolved config from ``<run_dir>/config.json``, so any step can be retried on its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipelines.config import Backend, BenchmarkConfig, load_config, read_config, save_config
from pipelines.paths import RunPaths, safe_run_id

log = logging.getLogger(__name__)


def _load(run_dir: str | Path) -> tuple[BenchmarkConfig, RunPaths]:
    paths = RunPaths(Path(run_dir))
    return read_config(paths.config), paths


def prepare_run(profile: str, overrides: dict[str, Any] | None, run_id: str) -> str:
    """Resolve the config and create ``<output_root>/<run_id>/config.json``. Returns run_dir.

    Idempotent for the same inputs (a retried task writes the same file).
    """
    config = load_config(profile, overrides)
    paths = RunPaths(Path(config.output_root).resolve() / safe_run_id(run_id))
    if paths.config.exists() and read_config(paths.config) != config:
        raise FileExistsError(f"{paths.root} already holds a run with a different config")
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
