"""The "Benchmarks" web page: trends of the nightly runs, one run's details, two runs compared.

A small FastAPI app that reads run folders (``<output_root>/<run_id>/``, see ``pipelines.runfolder.paths``)
through the cached index of ``pipelines.web.trends`` and renders server-side HTML (Jinja2 templates
in ``pipelines/templates/``); the trend charts are drawn in the browser by Chart.js, vendored in
``plugins/static/chartjs/`` (see its README) with the page's own ``plugins/static/benchmarks.js``.
Airflow mounts the app through ``plugins/benchmarks_plugin.py`` at ``/benchmarks`` behind
Airflow's login and the benchmark DAG's read permission; this module never imports Airflow: the
caller passes the access dependency.

    app = create_app(auth=some_fastapi_dependency)   # every route requires it

HTML views carry ``PAGE_CSP`` (scripts from ``/static`` only: no inline script or handler, no
plugins, no <base>, framed by the same origin only); report files carry ``REPORT_HEADERS``
(sandboxed). Text from run folders is escaped by the templates (Jinja autoescape, ``tojson``
for the chart data) and only reaches the DOM as text in ``benchmarks.js``.

Routes (relative to the mount point):
    GET /  (or /trends)   trends per (backend, strategy, workers) of one profile:
                          ``?profile=nightly&window=30d|7d|90d|365d|all&cell=<backend>-w2``
    GET /runs             latest run per profile and one run (``?run=<id>``; default newest);
                          ``/?run=<id>`` shows the same (old links)
    GET /compare          two runs side by side: ``?a=<older id>&b=<newer id>``
    GET /runs/{run_id}/report/{name}    a file of that run's report/ folder (PNG, HTML, MD, JSON)
    GET /static/{path}    Chart.js and the page's script
    GET /api/runs, /api/trends?profile=&window=     the same data as JSON

Reads: env ``BENCHMARK_OUTPUT_ROOT`` (default ``<project>/runs``) at every request, so the page
follows new runs without a restart; ``MLFLOW_UI_URL`` (e.g. http://127.0.0.1:5000) for links to
the MLflow UI; ``AIRFLOW_UI_URL`` for links to DAG runs (default: relative to the mount point,
right when the page is served by Airflow). Writes nothing. A missing output root shows an empty
page that says what to run; unknown runs or files are 404; names that leave the run folder are
refused (404).

The data (run folders, tables, trends, file lookup) is ``pipelines.web.data``; this module
renders it and serves it.
"""

from __future__ import annotations

import os
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from pipelines.web.comparison import compare_runs
from pipelines.web.trends import RunRecord, dag_run_link, latest_per_profile, mlflow_links
from pipelines.web.data import (CELL_COLUMNS, DEFAULT_WINDOW, INDEX, STATIC_DIR, NotFound, RunInfo,
                                    _previous_runs, _run_dir, list_runs, load_run, output_root,
                                    report_file, static_file, summary_scalars, summary_tables,
                                    trends_data)

__all__ = ["PAGE_CSP", "create_app", "list_runs", "load_run", "mlflow_links", "relay_allow_list", "render_page",
           "render_trends", "render_compare", "report_file", "latest_per_profile",
           # defined in pipelines.web.data, importable from here as before
           "CELL_COLUMNS", "DEFAULT_WINDOW", "INDEX", "STATIC_DIR", "NotFound", "RunInfo", "output_root",
           "static_file", "summary_scalars", "summary_tables", "trends_data"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
REPORT_HEADERS = {
    "Content-Security-Policy": "sandbox; default-src 'none'; img-src data: 'self'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}
# The page's own views: scripts only from its static folder (Chart.js, benchmarks.js; no inline
# script or handler runs), no plugins, no <base>, framed only by Airflow's UI (same origin).
PAGE_CSP = ("default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
            "frame-ancestors 'self'; form-action 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'")
PAGE_HEADERS = {"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "same-origin"}
WINDOW_LABELS = {"7d": "in the last 7 days", "30d": "in the last 30 days", "90d": "in the last 90 days",
                 "365d": "in the last year", "all": "all time"}


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):  # 4 significant digits; no decimals from 100 up
        return f"{value:.4g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


@lru_cache(maxsize=1)
def _templates():
    from jinja2 import Environment, FileSystemLoader

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True)
    env.globals.update(fmt=fmt, mlflow_links=mlflow_links, relay_allow_list=relay_allow_list,
                       static_version=_static_version)
    return env


def _static_version(name: str) -> str:
    try:
        return str(int((STATIC_DIR / name).stat().st_mtime))
    except OSError:
        return "0"


def _airflow_ui_url() -> str:
    # Relative to /benchmarks/<page>: right wherever Airflow serves the page (any base path).
    return os.environ.get("AIRFLOW_UI_URL", "..")


def relay_allow_list() -> list[str]:
    """URL prefixes the page's click relay (plugins/static/benchmarks.js) may open from Airflow's
    window, in the page as JSON (<script id="link-relay">): the page's own folder ("./"), the
    Airflow UI (AIRFLOW_UI_URL; default "..": the origin's root, where Airflow serves it) and the
    MLflow UI (MLFLOW_UI_URL, when set). Relative ones resolve against the page's URL; only http(s)
    links under one of them are relayed."""
    mlflow = os.environ.get("MLFLOW_UI_URL", "").strip()
    return ["./", _airflow_ui_url(), *([mlflow] if mlflow else [])]


def render_page(root: Path, selected: str | None = None, mlflow_ui_url: str | None = None) -> str:
    """The run view as HTML. ``selected`` names a run; default: the newest one."""
    runs = list_runs(root)
    run = None
    if selected:
        run = load_run(_run_dir(root, selected))
    elif runs:
        run = load_run(runs[0].root)
    record = next((r for r in runs if run and r.run_id == run.run_id), None)
    return _templates().get_template("run.html").render(
        view="runs", root=root, runs=runs, latest=latest_per_profile(runs), run=run,
        tables=summary_tables(run.summary if run else None),
        scalars=summary_scalars(run.summary if run else None),
        mlflow=mlflow_links(run, mlflow_ui_url) if run else [], cell_columns=CELL_COLUMNS,
        titles={"aggregates": "Comparison (median over repeats)", "failed": "Failed cells",
                "what_it_takes": "What it takes to run each platform (the report says how each is measured)"},
        regression=record.regression if record else None,
        dag_run=dag_run_link(record, _airflow_ui_url()) if record else None,
        previous=_previous_runs(runs).get(run.run_id) if run else None,
    )


def render_trends(root: Path, profile: str | None = None, window: str = DEFAULT_WINDOW,
                  cell: str | None = None, now: datetime | None = None) -> str:
    data = trends_data(root, profile, window, cell, now)
    runs, trends = data["runs"], data["trends"]
    shown = {r["run_id"] for r in trends["runs"]}
    mine = [r for r in runs if r.profile == data["profile"]]
    config = next((r.config for r in mine if r.config), {})
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.profile] = counts.get(r.profile, 0) + 1
    ui = _airflow_ui_url()
    from pipelines.config import PROFILES

    profiles = list(PROFILES) + sorted(set(counts) - set(PROFILES))
    return _templates().get_template("trends.html").render(
        view="trends", root=root, **data, profiles=profiles, counts=counts,
        windows=list(WINDOW_LABELS.items()), window_label=WINDOW_LABELS[data["window"]],
        newest=mine[0] if mine else None,
        window_runs=[r for r in mine if r.run_id in shown],
        previous=_previous_runs(runs), dag_links={r.run_id: dag_run_link(r, ui) for r in mine},
        time_limit=fmt(config.get("regression_time_threshold", 0.25) * 100),
        drop_limit=fmt(config.get("regression_accuracy_drop", 0.05) * 100),
        chartjs_version=_static_version("chartjs/chart.umd.min.js"),
    )


def _judge(metric: dict[str, Any], config: dict[str, Any]) -> str:
    """CSS class of a compare delta: worse for B = bad; beyond the regression limits = strong."""
    delta = metric["delta"]
    if delta is None or delta == 0:
        return ""
    higher_is_worse = metric["metric"] in ("total_seconds", "training_seconds", "overhead_vs_reference_total")
    worse = delta > 0 if higher_is_worse else delta < 0
    if not worse:
        return "good"
    if metric["metric"] == "total_seconds" and (metric["pct"] or 0) > config.get("regression_time_threshold", 0.25):
        return "bad alarm"
    if metric["metric"] == "test_accuracy" and -delta > config.get("regression_accuracy_drop", 0.05) * 100:
        return "bad alarm"
    return "bad"


def render_compare(root: Path, a: str | None = None, b: str | None = None) -> str:
    """Two runs side by side; default B = the newest run, A = the evaluated run before it."""
    from markupsafe import Markup, escape

    runs = list_runs(root)
    by_id = {r.run_id: r for r in runs}
    for run_id in (a, b):
        if run_id and run_id not in by_id:
            _run_dir(root, run_id)  # 404 with the reason
    cmp = None
    if len(runs) >= 2 or (a and b):
        rb = by_id[b] if b else runs[0]
        ra = by_id[a] if a else by_id.get(_previous_runs(runs).get(rb.run_id, ""),
                                           next((r for r in runs if r is not rb), rb))
        cmp = compare_runs(ra, rb)
    facts = []
    if cmp:
        ui = _airflow_ui_url()

        def links(r: RunRecord) -> Markup:
            out = []
            dag = dag_run_link(r, ui)
            if dag:
                out.append(Markup('<a class="dag-run" href="{}" target="_top">Airflow DAG run</a>').format(dag[1]))
            for label, url in mlflow_links(r):
                out.append(Markup('<a class="mlflow" href="{}" target="_blank">MLflow parent run</a>').format(url)
                           if url else escape(label))
            return Markup(" &middot; ").join(out) if out else Markup("")

        def reg(r: RunRecord) -> str:
            return f"{r.regression['status']} (baseline {r.regression.get('baseline') or '-'})" if r.regression else ""

        ra, rb = cmp["a"], cmp["b"]
        facts = [("profile", escape(ra.profile), escape(rb.profile)),
                 ("started (UTC)", ra.started.strftime("%Y-%m-%d %H:%M"), rb.started.strftime("%Y-%m-%d %H:%M")),
                 ("state", escape(ra.state), escape(rb.state)),
                 ("regression check", escape(reg(ra)), escape(reg(rb))),
                 ("links", links(ra), links(rb))]
    config = cmp["b"].config if cmp else {}
    return _templates().get_template("compare.html").render(
        view="compare", root=root, runs=runs, cmp=cmp, a=a, b=b, facts=facts,
        judge=lambda m: _judge(m, config))


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

    def _html(render: Callable[[], str]) -> HTMLResponse:
        try:
            return HTMLResponse(render(), headers=PAGE_HEADERS)
        except NotFound as err:
            raise HTTPException(status_code=404, detail=str(err)) from None

    @app.get("/", response_class=HTMLResponse)
    @app.get("/trends", response_class=HTMLResponse)
    def trends(profile: str | None = None, window: str = DEFAULT_WINDOW, cell: str | None = None,
               run: str | None = None) -> HTMLResponse:
        if run:  # links from before the trends view existed
            return _html(lambda: render_page(_root(), run))
        return _html(lambda: render_trends(_root(), profile, window, cell or None))

    @app.get("/runs", response_class=HTMLResponse)
    def runs_page(run: str | None = None) -> HTMLResponse:
        return _html(lambda: render_page(_root(), run))

    @app.get("/compare", response_class=HTMLResponse)
    def compare(a: str | None = None, b: str | None = None) -> HTMLResponse:
        return _html(lambda: render_compare(_root(), a or None, b or None))

    @app.get("/runs/{run_id}/report/{name}")
    def report(run_id: str, name: str) -> FileResponse:
        try:
            path, media = report_file(_root(), run_id, name)
        except NotFound as err:
            raise HTTPException(status_code=404, detail=str(err)) from None
        # The report is user-influenced content (errors, sources) on Airflow's origin: no scripts,
        # no plugins, no same-origin access, only its inline styles and embedded images.
        return FileResponse(path, media_type=media, headers=REPORT_HEADERS)

    @app.get("/static/{name:path}")
    def static(name: str) -> FileResponse:
        try:
            path, media = static_file(name)
        except NotFound as err:
            raise HTTPException(status_code=404, detail=str(err)) from None
        return FileResponse(path, media_type=media, headers={"Cache-Control": "private, max-age=86400"})

    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        return [{"run_id": r.run_id, "profile": r.profile, "state": r.state,
                 "started": r.started.isoformat() if r.started else None,
                 "regression": (r.regression or {}).get("status")} for r in list_runs(_root())]

    @app.get("/api/trends")
    def trends_api(profile: str | None = None, window: str = DEFAULT_WINDOW) -> dict[str, Any]:
        return trends_data(_root(), profile, window)["trends"]

    return app
