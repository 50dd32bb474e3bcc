"""The "Benchmarks" web page: benchmark runs, their comparison table, plots and MLflow links.

A small FastAPI app that reads run folders (``<output_root>/<run_id>/``, see ``pipelines.paths``)
and renders plain server-side HTML (Jinja2, no JavaScript build). Airflow mounts it through
``plugins/benchmarks_plugin.py`` at ``/benchmarks`` behind Airflow's login; this module never
imports Airflow: the caller passes the authentication dependency.

    app = create_app(auth=some_fastapi_dependency)   # every route requires it

Routes (relative to the mount point):
    GET /                               runs, latest per profile, the selected run (``?run=<id>``)
    GET /runs/{run_id}/report/{name}    a file of that run's report/ folder (PNG, HTML, MD, JSON)
    GET /api/runs                       the runs as JSON

Reads: env ``BENCHMARK_OUTPUT_ROOT`` (default ``<project>/runs``) at every request, so the page
follows new runs without a restart; ``MLFLOW_UI_URL`` (e.g. http://127.0.0.1:5000) for links to
the MLflow UI. Writes nothing. A missing output root shows an empty page that names the folder;
unknown runs or files are 404; names that leave the run folder are refused (404).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from pipelines.paths import PROJECT_ROOT, RunPaths

REPORT_FILE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".html": "text/html",
                     ".md": "text/markdown", ".json": "application/json", ".csv": "text/csv"}
# Columns of the per-cell table built from cells/*/result.json (the shared result contract).
CELL_COLUMNS = ("cell", "status", "test accuracy", "test F1", "total s", "startup s", "training s",
                "samples/s", "peak MB")


def output_root() -> Path:
    return Path(os.environ.get("BENCHMARK_OUTPUT_ROOT") or PROJECT_ROOT / "runs").resolve()


@dataclass
class RunInfo:
    """What the page shows of one run folder; every field tolerates missing files."""

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
    errors: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.summary is not None:  # evaluation's verdict: success, or failed (some cell failed)
            return f"reported: {self.summary.get('status', '?')}"
        if any(c["status"] == "failed" for c in self.cells):
            return "failed cells"
        return f"{len(self.cells)} cell(s) trained" if self.cells else "in progress"


def _read_json(path: Path, errors: list[str]) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # half-written or corrupt: show it, keep the page up
        errors.append(f"{path.name}: cannot read ({err})")
        return None


def _cell_row(name: str, data: dict[str, Any]) -> dict[str, Any]:
    test = data.get("test") or {}
    return {
        "cell": name, "status": data.get("status", "?"),
        "test accuracy": test.get("accuracy"), "test F1": test.get("f1"),
        "total s": data.get("total_seconds"), "startup s": data.get("startup_seconds"),
        "training s": data.get("training_seconds"), "samples/s": data.get("samples_per_second"),
        "peak MB": data.get("peak_memory_mb"), "error": data.get("error"),
    }


def load_run(root: Path, details: bool = True) -> RunInfo:
    """Read one run folder. ``details=False`` reads only config.json (for the run list)."""
    paths = RunPaths(root)
    info = RunInfo(run_id=root.name, root=root)
    info.config = _read_json(paths.config, info.errors) or {}
    info.profile = str(info.config.get("profile", "?"))
    info.started = datetime.fromtimestamp(paths.config.stat().st_mtime, tz=timezone.utc)
    info.summary = _read_json(paths.summary, info.errors)
    if not details:
        return info
    for result in paths.cell_results():
        data = _read_json(result, info.errors)
        if isinstance(data, dict):
            info.cells.append(_cell_row(result.parent.name, data))
    if paths.report.is_dir():
        info.plots = sorted(p.name for p in paths.report.glob("*.png"))
        info.has_html_report = paths.report_html.is_file()
    info.mlflow = _read_json(paths.mlflow_parent, info.errors) or {}
    return info


def list_runs(root: Path | None = None) -> list[RunInfo]:
    """Every folder with a config.json under the output root, newest first."""
    root = root or output_root()
    if not root.is_dir():
        return []
    runs = [load_run(d, details=False) for d in root.iterdir() if RunPaths.is_run_folder(d)]
    return sorted(runs, key=lambda r: (r.started, r.run_id), reverse=True)


def latest_per_profile(runs: list[RunInfo]) -> dict[str, RunInfo]:
    latest: dict[str, RunInfo] = {}
    for run in runs:  # newest first, so the first one seen wins
        latest.setdefault(run.profile, run)
    return latest


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
    return {k: v for k, v in (summary or {}).items() if isinstance(v, (str, int, float, bool))}


def mlflow_links(info: RunInfo, ui_url: str | None = None) -> list[tuple[str, str | None]]:
    """(label, url) per MLflow parent run of the run; url None when no MLflow UI is known.

    mlflow.json (pipelines.tracking) maps tracking URI -> {experiment_id, parent_run_id}; a
    flat {parent_run_id, experiment_id} record is read too.
    """
    data = info.mlflow
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


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):  # 4 significant digits; no decimals from 100 up
        return f"{value:.4g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Benchmarks</title>
<style>
 body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2933;max-width:80rem}
 table{border-collapse:collapse;margin:.5rem 0 1.2rem;font-size:.9rem}
 caption{text-align:left;font-weight:600;padding:.2rem 0}
 th,td{border:1px solid #cbd2d9;padding:.2rem .5rem;text-align:right;white-space:nowrap}
 th{background:#f0f4f8;font-weight:600}
 td:first-child,th:first-child{text-align:left} .bad{color:#b42318} .muted{color:#616e7c}
 img{max-width:46%;margin:.3rem;border:1px solid #e4e7eb} a{color:#1d4ed8}
</style></head><body>
<h1>Distributed-training benchmarks</h1>
<p class="muted">Output root: <code>{{ root }}</code> &middot; {{ runs|length }} run(s)</p>
{% if not runs %}<p>No benchmark runs yet: trigger the <code>imdb_benchmark</code> DAG.</p>{% endif %}
{% if latest %}<h2>Latest run per profile</h2>
<table><tr><th>profile</th><th>run</th><th>started (UTC)</th><th>state</th></tr>
{% for profile, r in latest.items() %}<tr><td>{{ profile }}</td>
<td><a href="?run={{ r.run_id|urlencode }}">{{ r.run_id }}</a></td>
<td>{{ r.started.strftime('%Y-%m-%d %H:%M:%S') }}</td><td>{{ r.state }}</td></tr>{% endfor %}
</table>{% endif %}
{% if run %}<h2 id="run">Run {{ run.run_id }}</h2>
<p>Profile <b>{{ run.profile }}</b>, backends {{ run.config.get('backends') }}, workers
{{ run.config.get('worker_counts') }}, epochs {{ run.config.get('epochs') }}, state <b>{{ run.state }}</b>.
{% if run.has_html_report %}<a href="runs/{{ run.run_id|urlencode }}/report/report.html">Full report</a>{% endif %}</p>
{% for label, url in mlflow %}<p>{% if url %}<a href="{{ url }}" target="_blank">{{ label }}</a>
{% else %}{{ label }} <span class="muted">(set MLFLOW_UI_URL for a link)</span>{% endif %}</p>{% endfor %}
{% for e in run.errors %}<p class="bad">{{ e }}</p>{% endfor %}
{% for title, columns, rows in tables %}<table class="summary"><caption>{{ titles.get(title, title) }}</caption>
<tr>{% for c in columns %}<th>{{ c.replace('_', ' ') }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for c in columns %}<td>{{ fmt(row.get(c)) }}</td>{% endfor %}</tr>{% endfor %}
</table>{% endfor %}
{% if scalars %}<table><caption>Summary</caption>{% for k, v in scalars.items() %}
<tr><th>{{ k }}</th><td>{{ fmt(v) }}</td></tr>{% endfor %}</table>{% endif %}
{% if run.cells %}<table class="cells"><caption>Training cells</caption>
<tr>{% for c in cell_columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in run.cells %}<tr>{% for c in cell_columns %}
<td{% if c == 'status' and row.status != 'ok' %} class="bad" title="{{ row.error or '' }}"{% endif %}>{{ fmt(row[c]) }}</td>
{% endfor %}</tr>{% endfor %}</table>
{% else %}<p class="muted">No training cell has finished yet.</p>{% endif %}
{% if run.plots %}<h3>Plots</h3>{% for p in run.plots %}
<a href="runs/{{ run.run_id|urlencode }}/report/{{ p|urlencode }}"><img alt="{{ p }}"
 src="runs/{{ run.run_id|urlencode }}/report/{{ p|urlencode }}"></a>{% endfor %}{% endif %}
{% endif %}
{% if runs|length > 1 %}<h2>All runs</h2><table><tr><th>run</th><th>profile</th><th>started (UTC)</th>
<th>state</th></tr>{% for r in runs %}<tr><td><a href="?run={{ r.run_id|urlencode }}">{{ r.run_id }}</a></td>
<td>{{ r.profile }}</td><td>{{ r.started.strftime('%Y-%m-%d %H:%M:%S') }}</td><td>{{ r.state }}</td></tr>
{% endfor %}</table>{% endif %}
</body></html>
"""


def render_page(root: Path, selected: str | None = None, mlflow_ui_url: str | None = None) -> str:
    """The whole page as HTML. ``selected`` names a run; default: the newest one."""
    from jinja2 import Environment

    runs = list_runs(root)
    run = None
    if selected:
        run = load_run(_run_dir(root, selected))
    elif runs:
        run = load_run(runs[0].root)
    template = Environment(autoescape=True).from_string(PAGE)
    return template.render(
        root=root, runs=runs, latest=latest_per_profile(runs), run=run, fmt=fmt,
        tables=summary_tables(run.summary if run else None),
        scalars=summary_scalars(run.summary if run else None),
        mlflow=mlflow_links(run, mlflow_ui_url) if run else [], cell_columns=CELL_COLUMNS,
        titles={"aggregates": "Comparison (median over repeats)", "failed": "Failed cells"},
    )


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


def create_app(auth: Callable[..., Any], root: Path | None = None):
    """The FastAPI app; ``auth`` is a FastAPI dependency that every route runs first.

    ``root`` fixes the output root (tests); None reads BENCHMARK_OUTPUT_ROOT per request.
    """
    if auth is None:
        raise ValueError("create_app needs an authentication dependency; the page must not be public")
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import FileResponse, HTMLResponse

    app = FastAPI(title="Benchmarks", dependencies=[Depends(auth)], docs_url=None, redoc_url=None,
                  openapi_url=None)

    def _root() -> Path:
        return root.resolve() if root else output_root()

    @app.get("/", response_class=HTMLResponse)
    def page(run: str | None = None) -> HTMLResponse:
        try:
            return HTMLResponse(render_page(_root(), run))
        except NotFound as err:
            raise HTTPException(status_code=404, detail=str(err)) from None

    @app.get("/runs/{run_id}/report/{name}")
    def report(run_id: str, name: str) -> FileResponse:
        try:
            path, media = report_file(_root(), run_id, name)
        except NotFound as err:
            raise HTTPException(status_code=404, detail=str(err)) from None
        return FileResponse(path, media_type=media)

    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        return [{"run_id": r.run_id, "profile": r.profile, "state": r.state,
                 "started": r.started.isoformat() if r.started else None} for r in list_runs(_root())]

    return app
