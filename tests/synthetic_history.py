"""A synthetic nightly history: many well-formed run folders for the Benchmarks page's trends.

Each night is written as the pipeline writes it: config.json (BenchmarkConfig), one
result.json per cell (CellResult, shaped by tests/synthetic_results.make_result), then the
real ``evaluate_run`` writes report/summary.json and the real ``pipelines.tracking.regression.compare``
judges it against the previous good night (the baseline ``find_baseline`` would pick in
MLflow); report/regression.json, mlflow.json and airflow.json get the layout their writers use.
Used by tests/web/test_trends.py, the browser test and bench/webview_page.py.

    write_history(root, nights=200)    # ~200 folders, Spark's overhead creeping up night by night
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pipelines.config import load_config, save_config
from pipelines.evaluation import evaluate_run, summary_metrics
from pipelines.runfolder.paths import RunPaths, safe_run_id
from pipelines.tracking.regression import compare
from pipelines.web.trends import record_dag_run
from tests.synthetic_results import make_result

DAG_ID = "imdb_benchmark"


def _parent_id(run_name: str) -> str:
    """A stand-in for the MLflow parent run id of a run folder (stable, 16 hex digits)."""
    return hashlib.sha1(run_name.encode()).hexdigest()[:16]


def _regression_file(config, paths: RunPaths, summary, baseline: tuple[str, dict] | None) -> dict:
    """What pipelines.tracking.regression.check_regression writes, with the baseline from the folders."""
    out = {"profile": config.profile, "tracking_uri": config.resolved_tracking_uri(),
           "thresholds": {"time": config.tracking.regression_time_threshold,
                          "accuracy_drop": config.tracking.regression_accuracy_drop}}
    if baseline is None:
        out.update(status="baseline", baseline_run_id=None, cells=[], regressions=[],
                   message=f"no earlier successful run of profile {config.profile!r}: this run sets the baseline")
    else:
        name, metrics = baseline
        cells, regressions = compare(config, summary, metrics, f"the median of runs {name}")
        parent = _parent_id(name)
        against = f"baseline run {name} ({parent})"
        out.update(status="failed" if regressions else "passed", baseline_run_id=parent,
                   baseline_run_name=name, cells=cells, regressions=regressions,
                   message=(f"regression against {against}: " + "; ".join(regressions)) if regressions
                   else f"no regression against {against}")
    paths.regression.write_text(json.dumps(out, indent=2))
    return out


def write_history(root: Path, nights: int, profile: str = "nightly", *, now: datetime | None = None,
                  backends=("ddp", "spark", "determined"), worker_counts=(1, 2), repeats: int = 1,
                  slow_nights: dict[int, float] | None = None, failed_nights: dict[int, str] | None = None,
                  config_changes: dict[int, dict] | None = None, drift: float = 0.004) -> list[RunPaths]:
    """``nights`` run folders of ``profile`` under ``root``, one a night at 02:00 UTC up to ``now``.

    Spark gets ``drift`` slower every night (a creeping overhead); ``slow_nights`` {night: factor}
    makes DDP that much slower that night (an upgrade that regressed); ``failed_nights``
    {night: cell} fails that cell (e.g. "spark-w2-r0"); ``config_changes`` {night: {field: value}}
    changes config fields from that night on.
    """
    now = now or datetime.now(timezone.utc)
    slow_nights, failed_nights = slow_nights or {}, failed_nights or {}
    fields = {"output_root": str(root), "backends": list(backends), "worker_counts": list(worker_counts),
              "repeats": repeats}
    last_night = now.replace(hour=2, minute=0, second=0, microsecond=0)
    if last_night > now:
        last_night -= timedelta(days=1)
    baseline: tuple[str, dict] | None = None
    written = []
    for night in range(nights):
        started = last_night - timedelta(days=nights - 1 - night)
        dag_run_id = f"scheduled__{started.isoformat()}"
        paths = RunPaths(root / safe_run_id(dag_run_id))
        fields.update((config_changes or {}).get(night, {}))
        config = load_config(profile, fields)
        save_config(config, paths.config)
        for backend, _strategy, network, workers, repeat in config.cells():
            slow = 1.0 + (drift * night if backend == "spark" else 0.0)
            if backend == "ddp":
                slow *= slow_nights.get(night, 1.0)
            slow *= 1.0 + 0.02 * ((night * 7 + workers) % 5 - 2) / 2  # +-2 % night-to-night noise
            cell = paths.cell(backend, workers, repeat, network=network)
            status = "failed" if failed_nights.get(night) == cell.name else "ok"
            make_result(backend, workers, repeat, slow=slow, status=status, network=network,
                        accuracy_shift=0.002 * (night % 3)).write(cell.result)
        summary = evaluate_run(config, paths)
        regression = _regression_file(config, paths, summary, baseline)
        if summary.status == "success" and regression["status"] != "failed":
            baseline = (paths.root.name, summary_metrics(summary))
        paths.mlflow_parent.write_text(json.dumps(
            {config.resolved_tracking_uri(): {"experiment_id": "1", "parent_run_id": _parent_id(paths.root.name)}}))
        record_dag_run(paths.root, DAG_ID, dag_run_id, started)
        stamp = started.timestamp()
        os.utime(paths.config, (stamp, stamp))
        written.append(paths)
    return written
