"""Benchmark history: a cached index of the run folders, trend series, links, asset-event extra.

The Benchmarks page (``pipelines.web.view``) asks this module for every run under the output
root on each request. Reading 200 run folders' JSON files takes 0.2-0.5 s on a 2-core machine
(bench/webview_page.py, the cold request), so ``RunIndex`` keeps one compact ``RunRecord`` per folder in memory and re-reads a
folder only when one of its files changed (key: mtime and size of config.json, mlflow.json,
airflow.json, report/summary.json, report/regression.json). Folders without summary.json
(training in progress) are re-read on every request; they are few.

    index = RunIndex()
    runs = index.runs(Path("runs"))                     # newest first
    trends = trend_series(runs, "nightly", window_days=30)
    diff = compare_runs(runs[1], runs[0])               # pipelines.web.comparison

Every file of a run folder is read by ``read_run_files`` alone (config.json, mlflow.json,
airflow.json, report/summary.json, report/regression.json, cells/*/result.json), so a typed
summary model only changes that function. Nothing here imports Airflow; the one writer is
``record_dag_run`` (airflow.json, called by the DAG's prepare_run).

Reading (``read_run_files``, ``RunRecord``, ``RunIndex``) is ``pipelines.runfolder.index``; this module
turns records into trend series, links and the asset event's extra.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pipelines import platforms
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.index import (AIRFLOW_RUN_PREFIXES, RunFiles, RunIndex, RunRecord, dag_run_link,
                                       latest_per_profile, load_record, mlflow_links, read_run_files,
                                       record_dag_run, run_started)

# what the page, the DAG, comparison and tests import from here (defined in pipelines.runfolder.index)
__all__ = ["AIRFLOW_RUN_PREFIXES", "METRICS", "WINDOWS", "RunFiles", "RunIndex", "RunRecord",
           "asset_extra", "dag_run_link", "latest_per_profile", "load_record", "mlflow_links",
           "read_run_files", "record_dag_run", "run_started", "trend_series"]

WINDOWS = {"7d": 7, "30d": 30, "90d": 90, "365d": 365, "all": None}


# --- trend series --------------------------------------------------------------------------

# id, chart title, y-axis label, unit, scale (value * scale is shown), band kind
METRICS = (
    ("total_seconds", "Total time per cell", "total time per cell (s, median)", "s", 1, "time"),
    ("samples_per_second", "Training throughput", "training samples/s (median)", "samples/s", 1, None),
    # against the reference platform ({reference}: its name, filled in by trend_series)
    ("overhead_vs_reference_total", "Overhead vs {reference}", "total time over {reference}'s (%)", "%", 100, None),
    ("test_accuracy", "Test accuracy", "test accuracy (%, median)", "%", 100, "accuracy"),
)


def _series_label(agg: dict[str, Any]) -> str:
    workers = agg.get("workers")
    strategy = f" ({agg['strategy']})" if agg.get("strategy") not in (None, "", "default") else ""
    network = f" over {agg['network']}" if agg.get("network") not in (None, "", "local") else ""
    return f"{agg.get('backend')}{strategy}, {workers} worker{'s' if workers != 1 else ''}{network}"


def _band(metric: str, kind: str | None, scale: float, reg: dict[str, Any] | None, key: str):
    """(low, high) of the regression check's allowed range for this run and cell, or None."""
    cell = (reg or {}).get("cells", {}).get(key)
    if not cell or kind is None:
        return None
    if kind == "time" and cell["old_total_seconds"] is not None and reg["time_limit"] is not None:
        old = cell["old_total_seconds"]
        return [old * scale, old * (1 + reg["time_limit"]) * scale]
    if kind == "accuracy" and cell["old_test_accuracy"] is not None and reg["drop_limit"] is not None:
        old = cell["old_test_accuracy"]
        return [(old - reg["drop_limit"]) * scale, old * scale]
    return None


def _network_order(agg: dict[str, Any]) -> tuple[int, float]:
    """Local first, then the links fastest first (unshaped, 10gbit, 1gbit, 100mbit), unknown last."""
    from pipelines.config.links import NetworkSpec

    network = agg.get("network") or "local"
    if network == "local":
        return (0, 0.0)
    try:
        bits = NetworkSpec.parse(network).bits_per_second
    except ValueError:
        return (2, 0.0)
    return (1, -float(bits if bits is not None else float("inf")))


def trend_series(runs: list[RunRecord], profile: str, window_days: int | None = None,
                 now: datetime | None = None) -> dict[str, Any]:
    """Per (backend, strategy, network, workers): each metric over the profile's evaluated runs, oldest first,
    with the regression band each run was judged against, its alarms and failed cells.

    Per series and metric: ``values`` aligned with ``runs`` (None where a run has no value, 5
    significant digits); ``bands`` ([low, high] or None per run; total time and accuracy only);
    ``alarms``: indices of the runs whose regression check alarmed on it; ``failed``: run index ->
    error of the cell's failed repeats. Compact on purpose: 200 runs are ~0.1 MB of JSON."""
    now = now or datetime.now(timezone.utc)
    reference = platforms.reference()
    since = now - timedelta(days=window_days) if window_days else None
    chosen = [r for r in runs if r.profile == profile and r.status is not None
              and (since is None or r.started >= since)]
    chosen.sort(key=lambda r: (r.started, r.run_id))
    keys: dict[str, dict[str, Any]] = {}
    for run in chosen:
        for key, agg in run.aggregates.items():
            keys.setdefault(key, agg)
    place = {name: i for i, name in enumerate(platforms.names())}  # the registry's order, the reference first
    ordered = sorted(keys, key=lambda k: (place.get(keys[k]["backend"], len(place)), str(keys[k]["backend"]),
                                          str(keys[k].get("strategy") or ""), _network_order(keys[k]),
                                          keys[k]["workers"] or 0))
    series = []
    for key in ordered:
        agg0 = keys[key]
        out: dict[str, Any] = {"key": key, "label": _series_label(agg0), "backend": agg0["backend"],
                               "strategy": agg0.get("strategy"), "network": agg0.get("network") or "local",
                               "workers": agg0["workers"], "metrics": {}}
        for metric, _, _, _, scale, band_kind in METRICS:
            if metric == "overhead_vs_reference_total" and agg0["backend"] == reference:
                continue  # the reference itself: always 0
            values, bands, alarms, failed = [], [], [], {}
            kind = {"total_seconds": "time", "test_accuracy": "accuracy"}.get(metric)
            for i, run in enumerate(chosen):
                value = (run.aggregates.get(key) or {}).get(metric)
                values.append(None if value is None else float(f"{value * scale:.5g}"))
                if band_kind:
                    band = _band(metric, band_kind, scale, run.regression, key)
                    bands.append(band and [float(f"{b:.5g}") for b in band])
                if kind and kind in (run.regression or {}).get("cells", {}).get(key, {}).get("alarms", []):
                    alarms.append(i)
                errors = [f["error"][:200] for f in run.failed if f["key"] == key]
                if errors:
                    failed[i] = "; ".join(errors)
            out["metrics"][metric] = {"values": values, "alarms": alarms, "failed": failed,
                                      **({"bands": bands} if band_kind else {})}
        series.append(out)
    return {
        "profile": profile, "window_days": window_days,
        "runs": [{"run_id": r.run_id, "t": int(r.started.timestamp() * 1000),
                  "started": r.started.strftime("%Y-%m-%d %H:%M"), "status": r.status,
                  "regression": (r.regression or {}).get("status"),
                  "baseline": (r.regression or {}).get("baseline")} for r in chosen],
        "metrics": [{"id": m, "title": t.format(reference=reference), "y_label": y.format(reference=reference),
                     "unit": u, "band": b is not None} for m, t, y, u, _, b in METRICS],
        "platforms": platforms.styles(),  # label and colour of each platform (pipelines.platforms)
        "reference": reference,  # the platform the overhead is measured against
        "series": series,
        "alarms": [{"run_id": r.run_id, "message": r.regression["message"]} for r in chosen if r.alarm],
    }


# --- links and the asset event ---------------------------------------------------------------

def asset_extra(run_dir: str | Path, dag_run_id: str | None = None) -> dict[str, Any]:
    """The extra of the DAG's 'benchmark summary' asset event: enough to find and read the run."""
    run_dir = Path(run_dir).resolve()
    files = read_run_files(run_dir)
    summary = files.summary or {}
    return {"run_id": dag_run_id or run_dir.name, "run_folder": str(run_dir),
            "summary": str(RunPaths(run_dir).summary),
            "profile": files.config.get("profile"), "status": summary.get("status"),
            "cells_failed": len(summary.get("failed") or [])}
