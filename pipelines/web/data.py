"""What the Benchmarks page shows, without HTML: run folders in full, summary.json's tables,
the trends data (also /api/trends), and the safe lookup of report and static files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths
from pipelines.web.trends import WINDOWS, RunIndex, RunRecord, read_run_files, run_started, trend_series

STATIC_DIR = PROJECT_ROOT / "plugins" / "static"
REPORT_FILE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".html": "text/html",
                     ".md": "text/markdown", ".json": "application/json", ".csv": "text/csv"}
STATIC_TYPES = {".js": "text/javascript", ".md": "text/markdown", ".css": "text/css"}
# Columns of the per-cell table built from cells/*/result.json (the shared result contract).
CELL_COLUMNS = ("cell", "status", "test accuracy", "test F1", "total s", "startup s", "training s",
                "samples/s", "rank 0 peak MB")
# summary.json scalars the page does not list: the file format's version, and what the header says.
HIDDEN_SCALARS = {"version", "run", "profile"}
DEFAULT_WINDOW = "30d"
INDEX = RunIndex()  # one per process (the API server's worker): re-reads changed run folders only


def output_root() -> Path:
    return Path(os.environ.get("BENCHMARK_OUTPUT_ROOT") or PROJECT_ROOT / "runs").resolve()


@dataclass
class RunInfo:
    """One run folder in full (the run view): its record plus cells, plots and summary."""

    run_id: str
    root: Path
    profile: str = "?"
    started: datetime | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    cells: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    has_html_report: bool = False
    mlflow: dict[str, Any] = field(default_factory=dict)
    regression: dict[str, Any] | None = None
    dag_run: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None  # report/verdict.json: what the run found, shown first
    errors: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.summary is not None:  # evaluation's verdict: success, or failed (some cell failed)
            return f"reported: {self.summary.get('status', '?')}"
        if any(c["status"] == "failed" for c in self.cells):
            return "failed cells"
        return f"{len(self.cells)} cell(s) trained" if self.cells else "in progress"


def _cell_row(name: str, data: dict[str, Any]) -> dict[str, Any]:
    test = data.get("test") or {}
    return {
        "cell": name, "status": data.get("status", "?"),
        "test accuracy": test.get("accuracy"), "test F1": test.get("f1"),
        "total s": data.get("total_seconds"), "startup s": data.get("startup_seconds"),
        "training s": data.get("training_seconds"), "samples/s": data.get("samples_per_second"),
        # rank 0's own peak (RSS, or CUDA memory allocated); the cell's scopes: the report's costs section
        "rank 0 peak MB": data.get("peak_memory_mb"), "error": data.get("error"),
    }


def load_run(root: Path) -> RunInfo:
    """Read one run folder in full (pipelines.web.trends.read_run_files reads every file)."""
    paths = RunPaths(root)
    files = read_run_files(root, cells=True)
    info = RunInfo(run_id=root.name, root=root, config=files.config, summary=files.summary,
                   mlflow=files.mlflow, regression=files.regression, dag_run=files.dag_run,
                   errors=files.errors)
    info.profile = str(info.config.get("profile", "?"))
    info.started = run_started(root, files)
    info.cells = [_cell_row(name, data) for name, data in files.cells.items()]
    if paths.report.is_dir():
        info.plots = sorted(p.name for p in paths.report.glob("*.png"))
        info.has_html_report = (paths.report / "report.html").is_file()
        info.verdict = read_verdict(paths, info.errors, info.regression)
    return info


def read_verdict(paths: RunPaths, errors: list[str],
                 regression: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """report/verdict.json as the report wrote it (pipelines.report.verdict): ``lead``, ``findings``
    (``kind``, ``text``), ``chart``; None if absent (a report from before verdicts); a file of
    another shape is an error shown on the page, not a crash. The regression check runs after the
    report: its outcome (``regression``: regression.json) is added when the file has none."""
    from pipelines.report.verdict import VERDICT_FILE, regression_finding

    path = paths.report / VERDICT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        findings = [{"kind": "".join(c for c in str(f.get("kind", "")) if c.isalpha()),
                     "text": str(f["text"])} for f in data["findings"]]
        chart = data.get("chart")
        shown = isinstance(chart, str) and Path(chart).name == chart and (paths.report / chart).is_file()
        checked = regression_finding(regression)
        if checked and not any(f["kind"] in ("regression", "regressed") for f in findings):
            findings.append(checked)
        return {"lead": str(data.get("lead") or ""), "findings": findings, "chart": chart if shown else None}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        errors.append(f"{VERDICT_FILE}: unreadable ({type(err).__name__}: {err})")
        return None


def list_runs(root: Path | None = None) -> list[RunRecord]:
    """Every folder with a config.json under the output root, newest first (cached index)."""
    return INDEX.runs(root or output_root())


def _flat(value: Any) -> Any:
    """Nested statistics ({"median", "min", "max"}) show as their median; other nesting hides."""
    if isinstance(value, dict):
        return value.get("median")
    return None if isinstance(value, list) else value


def summary_tables(summary: dict[str, Any] | None) -> list[tuple[str, list[str], list[dict]]]:
    """Tables found in report/summary.json: every list of records, with its key as title.

    pipelines.evaluation owns summary.json's layout (``aggregates``: one record per backend and
    worker count, ``failed``, ...); any such list shows as a table, so new columns appear
    without changing this module. ``cells`` is left out: the page reads result.json itself.
    Columns that are empty in every row are dropped.
    """
    tables = []
    items = sorted((summary or {}).items(), key=lambda kv: kv[0] != "aggregates")  # comparison first
    for key, value in items:
        if key == "cells" or not (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            continue
        rows = [{k: _flat(v) for k, v in row.items()} for row in value]
        hidden = {"backend", "workers", "repeats"} if all("key" in r for r in rows) else set()
        columns: list[str] = []
        for row in rows:  # "key" (backend-wN) already names backend and workers
            columns += [k for k, v in row.items() if k not in columns and k not in hidden and v is not None]
        tables.append((key, columns, rows))
    return tables


def summary_scalars(summary: dict[str, Any] | None) -> dict[str, Any]:
    """summary.json's single values (status, cost, ...), without its format version ("version 1")
    and the run and profile names the page's header already shows."""
    return {k: v for k, v in (summary or {}).items()
            if isinstance(v, (str, int, float, bool)) and k not in HIDDEN_SCALARS}

def _previous_runs(runs: list[RunRecord]) -> dict[str, str]:
    """run id -> the evaluated run of the same profile just before it (runs: newest first)."""
    out: dict[str, str] = {}
    newer: dict[str, list[str]] = {}
    for run in runs:
        for waiting in newer.pop(run.profile, []) if run.status is not None else []:
            out[waiting] = run.run_id
        newer.setdefault(run.profile, []).append(run.run_id)
    return out


def _default_profile(runs: list[RunRecord]) -> str | None:
    profiles = [r.profile for r in runs]
    return "nightly" if "nightly" in profiles else (profiles[0] if profiles else None)


def trends_data(root: Path, profile: str | None = None, window: str = DEFAULT_WINDOW,
                cell: str | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Everything the trends view shows (also /api/trends)."""
    runs = list_runs(root)
    profile = profile or _default_profile(runs)
    window = window if window in WINDOWS else DEFAULT_WINDOW
    trends = trend_series(runs, profile or "", WINDOWS[window], now=now)
    all_series = [{"key": s["key"], "label": s["label"]} for s in trends["series"]]
    if cell:
        trends["series"] = [s for s in trends["series"] if s["key"] == cell]
    return {"runs": runs, "profile": profile, "window": window, "cell": cell, "trends": trends,
            "all_series": all_series}


class NotFound(LookupError):
    """A run or file the request named does not exist (or is outside the output root)."""


def _run_dir(root: Path, run_id: str) -> Path:
    run_dir = (root / run_id).resolve()
    if run_dir.parent != root or not RunPaths.is_run_folder(run_dir):
        raise NotFound(f"no benchmark run {run_id!r} in {root}")
    return run_dir


def report_file(root: Path, run_id: str, name: str) -> tuple[Path, str]:
    """(path, media type) of ``<run>/report/<name>``; refuses other folders and file types."""
    report_dir = RunPaths(_run_dir(root, run_id)).report
    path = (report_dir / name).resolve()
    media = REPORT_FILE_TYPES.get(path.suffix.lower())
    if path.parent != report_dir.resolve() or media is None or not path.is_file():
        raise NotFound(f"no report file {name!r} in run {run_id!r}")
    return path, media


def static_file(name: str, static_dir: Path = STATIC_DIR) -> tuple[Path, str]:
    """(path, media type) of a file under the static folder (Chart.js, the page's script)."""
    path = (static_dir / name).resolve()
    media = STATIC_TYPES.get(path.suffix.lower())
    if not path.is_relative_to(static_dir.resolve()) or media is None or not path.is_file():
        raise NotFound(f"no static file {name!r}")
    return path, media
