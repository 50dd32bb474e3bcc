"""Reading the benchmark history: the one reader of a run folder's files (``read_run_files``),
one compact ``RunRecord`` per folder, and ``RunIndex``, the cache that re-reads changed folders only."""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipelines.config import flat_view
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.summary import RunSummary


def _watched(paths: RunPaths) -> tuple[Path, ...]:
    """Files whose change invalidates a cached record; the summary first."""
    return (paths.summary, paths.config, paths.mlflow_parent, paths.dag_run, paths.regression)


# --- the one reader of a run folder's files ------------------------------------------------

@dataclass
class RunFiles:
    """The JSON files of one run folder as plain dicts (None / {} when missing)."""

    config: dict[str, Any]
    summary: dict[str, Any] | None
    regression: dict[str, Any] | None
    mlflow: dict[str, Any]
    dag_run: dict[str, Any] | None
    cells: dict[str, dict[str, Any]]  # cell folder name -> result.json (only when asked for)
    errors: list[str]


def _json(path: Path, errors: list[str]) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # half-written or corrupt: report it, keep going
        errors.append(f"{path.name}: cannot read ({err})")
        return None


def read_run_files(run_dir: Path, cells: bool = False) -> RunFiles:
    """Read a run folder's files. The only place that parses them (summary.json's layout is
    pipelines.evaluation's; when it becomes a pydantic model, validate and ``model_dump`` here).
    ``cells=True`` also reads every cells/*/result.json."""
    errors: list[str] = []
    paths = RunPaths(run_dir)
    results: dict[str, dict[str, Any]] = {}
    if cells:
        for result in paths.cell_results():
            data = _json(result, errors)
            if isinstance(data, dict):
                results[result.parent.name] = data
    summary = _json(paths.summary, errors)
    if summary is not None:  # the typed summary (pipelines.runfolder.summary), as plain JSON for the page
        try:
            summary = RunSummary.model_validate(summary).model_dump(mode="json")
        except ValueError as err:
            errors.append(f"{paths.summary.name}: not a summary this version reads ({err})")
            summary = None
    return RunFiles(
        config=flat_view(_json(paths.config, errors) or {}),  # flat names, whatever the file's layout
        summary=summary,
        regression=_json(paths.regression, errors),
        mlflow=_json(paths.mlflow_parent, errors) or {},
        dag_run=_json(paths.dag_run, errors),
        cells=results, errors=errors)


def record_dag_run(run_dir: str | Path, dag_id: str, run_id: str, started: datetime | None = None) -> Path:
    """Write ``<run_dir>/airflow.json`` so the page can link the run to its Airflow DAG run
    (the folder name is a sanitised run id and cannot be turned back into it)."""
    started = started or datetime.now(timezone.utc)
    return atomic_write_json(RunPaths(Path(run_dir)).dag_run,
                             {"dag_id": dag_id, "run_id": run_id, "started": started.isoformat()})


# --- one record per run folder -------------------------------------------------------------

def _median(stat: Any) -> Any:
    return stat.get("median") if isinstance(stat, dict) else stat


def _cell_key(name: str) -> str:
    """Repeat-level cell name (<backend>-w2-r0, <backend>-100mbit-w2-r0) -> its aggregate key
    (<backend>-w2, <backend>-100mbit-w2): the trend key, which names the network only when it is not "local"."""
    return re.sub(r"-r\d+$", "", name)


@dataclass
class RunRecord:
    """What the page needs of one run folder: small, JSON-friendly, cached by RunIndex."""

    run_id: str
    root: Path
    profile: str
    started: datetime
    config: dict[str, Any]
    status: str | None = None  # summary.json's verdict: success | failed; None before evaluation
    aggregates: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> flat medians
    failed: list[dict[str, Any]] = field(default_factory=list)  # [{cell, error}]
    regression: dict[str, Any] | None = None  # see _regression()
    mlflow: dict[str, Any] = field(default_factory=dict)
    dag_run: dict[str, Any] | None = None
    cells_done: int = 0  # result.json files, counted only before evaluation
    errors: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.status is not None:
            return f"reported: {self.status}"
        return f"{self.cells_done} cell(s) trained" if self.cells_done else "in progress"

    @property
    def alarm(self) -> bool:
        return bool(self.regression and self.regression["status"] == "failed")


def _aggregate(agg: dict[str, Any]) -> dict[str, Any]:
    total = agg.get("total_seconds") or {}
    return {
        "backend": agg.get("backend"), "strategy": agg.get("strategy"), "workers": agg.get("workers"),
        "network": agg.get("network") or "local",
        "total_seconds": _median(total), "total_min": total.get("min") if isinstance(total, dict) else None,
        "total_max": total.get("max") if isinstance(total, dict) else None,
        "training_seconds": _median(agg.get("training_seconds")),
        "startup_seconds": _median(agg.get("startup_seconds")),
        "samples_per_second": _median(agg.get("samples_per_second")),
        "overhead_vs_reference_total": agg.get("overhead_vs_reference_total"),  # RunSummary reads the older name
        "test_accuracy": _median(agg.get("test_accuracy")),
        "test_f1": _median(agg.get("test_f1")),
        "repeats_ok": agg.get("repeats_ok"), "repeats": agg.get("repeats"),
    }


def _regression(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """regression.json (pipelines.tracking.regression) -> status, baseline, per-cell old/new and alarms."""
    if not isinstance(data, dict) or "status" not in data:
        return None
    limits = data.get("thresholds") or {}
    time_limit, drop_limit = limits.get("time"), limits.get("accuracy_drop")
    cells = {}
    for row in data.get("cells") or []:
        alarms = list(row.get("alarms") or [])  # what the check decided (any reference)
        if row["cell"] in cells:  # a second reference (long-term): the band stays the recent one's
            cells[row["cell"]]["alarms"] = sorted(set(cells[row["cell"]]["alarms"]) | set(alarms))
            continue
        cells[row["cell"]] = {**{k: row.get(k) for k in ("old_total_seconds", "new_total_seconds",
                                                       "old_test_accuracy", "new_test_accuracy",
                                                       "slowdown", "accuracy_drop")}, "alarms": alarms}
    return {"status": data["status"], "baseline": data.get("baseline_run_name"),
            "message": data.get("message", ""), "time_limit": time_limit, "drop_limit": drop_limit,
            "cells": cells}


def run_started(run_dir: Path, files: RunFiles) -> datetime:
    """When the run started: airflow.json's time, else config.json's mtime (CLI runs)."""
    try:
        return datetime.fromisoformat(files.dag_run["started"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return datetime.fromtimestamp(RunPaths(run_dir).config.stat().st_mtime, tz=timezone.utc)


def load_record(run_dir: Path) -> RunRecord:
    files = read_run_files(run_dir)
    summary = files.summary if isinstance(files.summary, dict) else None
    record = RunRecord(run_id=run_dir.name, root=run_dir, profile=str(files.config.get("profile", "?")),
                       started=run_started(run_dir, files), config=files.config, mlflow=files.mlflow,
                       dag_run=files.dag_run, regression=_regression(files.regression),
                       errors=files.errors)
    if summary is None:
        record.cells_done = len(RunPaths(run_dir).cell_results())
        return record
    record.status = summary.get("status")
    record.aggregates = {a["key"]: _aggregate(a) for a in summary.get("aggregates") or [] if "key" in a}
    record.failed = [{"cell": f.get("cell", "?"), "key": _cell_key(str(f.get("cell", "?"))),
                      "error": f.get("error", "")} for f in summary.get("failed") or []]
    return record


def _stat_key(run_dir: Path) -> tuple | None:
    key = []
    for i, path in enumerate(_watched(RunPaths(run_dir))):
        try:
            st = os.stat(path)
            key.append((st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            if i == 0:
                return None  # no summary yet: cells change under it, never cache
            key.append(None)
    return tuple(key)


class RunIndex:
    """In-memory index of the run folders under output roots; thread-safe, re-reads changes only."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple, RunRecord]] = {}
        self._lock = threading.Lock()
        self.reads = 0  # folders (re)read so far: the cache's effect, for tests and the bench

    def runs(self, root: Path) -> list[RunRecord]:
        """Every folder with a config.json under ``root``, newest first."""
        try:
            dirs = [Path(e.path) for e in os.scandir(root) if e.is_dir() and RunPaths.is_run_folder(Path(e.path))]
        except FileNotFoundError:
            return []
        records = []
        with self._lock:
            for run_dir in dirs:
                key = _stat_key(run_dir)
                cached = self._cache.get(run_dir)
                if key is None or cached is None or cached[0] != key:
                    record = load_record(run_dir)
                    self.reads += 1
                    if key is not None:
                        self._cache[run_dir] = (key, record)
                else:
                    record = cached[1]
                records.append(record)
            present = set(dirs)
            for gone in [d for d in self._cache if d.parent == root and d not in present]:
                del self._cache[gone]
        return sorted(records, key=lambda r: (r.started, r.run_id), reverse=True)


def latest_per_profile(runs: list[RunRecord]) -> dict[str, RunRecord]:
    latest: dict[str, RunRecord] = {}
    for run in runs:  # newest first: the first one seen wins
        latest.setdefault(run.profile, run)
    return latest


AIRFLOW_RUN_PREFIXES = ("manual__", "scheduled__", "asset_triggered__", "dataset_triggered__",
                        "backfill__")


def dag_run_link(run: RunRecord, ui_url: str = "", dag_id: str = "imdb_benchmark") -> tuple[str, str] | None:
    """(label, url) of the Airflow DAG run that made the folder; its DAG's run list when the
    folder only looks like an Airflow run (made before airflow.json existed); None for CLI runs."""
    from urllib.parse import quote

    base = ui_url.rstrip("/")
    if run.dag_run and run.dag_run.get("run_id"):
        dag = run.dag_run.get("dag_id", dag_id)
        return (f"Airflow DAG run {run.dag_run['run_id']}",
                f"{base}/dags/{quote(dag, safe='')}/runs/{quote(run.dag_run['run_id'], safe='')}")
    if run.run_id.startswith(AIRFLOW_RUN_PREFIXES):
        return f"Airflow runs of {dag_id} (run id not recorded)", f"{base}/dags/{quote(dag_id, safe='')}/runs"
    return None


def mlflow_links(run: Any, ui_url: str | None = None) -> list[tuple[str, str | None]]:
    """(label, url) per MLflow parent run of a run (RunRecord or anything with ``.mlflow``);
    url None when no MLflow UI is known (env MLFLOW_UI_URL, e.g. http://127.0.0.1:5000).

    mlflow.json (pipelines.tracking.runs) maps tracking URI -> {experiment_id, parent_run_id}; a
    flat {parent_run_id, experiment_id} record is read too.
    """
    data = run.mlflow or {}
    entries = [data] if "parent_run_id" in data else [
        {**v, "tracking_uri": k} for k, v in data.items() if isinstance(v, dict)]
    ui_url = (ui_url if ui_url is not None else os.environ.get("MLFLOW_UI_URL", "")).rstrip("/")
    links: list[tuple[str, str | None]] = []
    for entry in entries:
        run_id, experiment = entry.get("parent_run_id"), entry.get("experiment_id")
        if not run_id:
            continue
        label = f"MLflow parent run {run_id}"
        if entry.get("tracking_uri"):
            label += f" ({entry['tracking_uri']})"
        path = f"#/experiments/{experiment}/runs/{run_id}" if experiment else f"#/runs/{run_id}"
        links.append((label, f"{ui_url}/{path}" if ui_url else None))
    return links
