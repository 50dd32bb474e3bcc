"""Nightly regression check against the last successful run of the same profile in MLflow.

The baseline is the newest parent run in ``config.mlflow_experiment`` tagged
``profile=<profile>``, ``benchmark.status=success`` and ``benchmark.role=parent`` that is
not this run and did not itself fail the regression check (its ``benchmark.regression`` tag).
Its per-cell medians (parent metrics ``<backend>-w<N>/total_seconds_median`` and
``.../test_accuracy_median``, written by ``pipelines.tracking.log_benchmark``) are compared
with this run's ``report/summary.json``:

- slowdown: (new - old) / old median total time > ``config.regression_time_threshold``;
- accuracy drop: old - new median test accuracy > ``config.regression_accuracy_drop``.

Any of them raises ``RegressionError`` naming the cell, the old and the new value; failed
training cells raise ``FailedCellsError`` after the comparison is written, so a nightly run
with broken cells ends red (its report already lists them). With no
baseline the check passes and says this run sets it. The comparison is written to
``report/regression.json`` either way and this run's parent gets a ``benchmark.regression``
tag (passed | failed | baseline). Run after the track stage:
    python -c "from pipelines.stages import check_regression as c; print(c('runs/<run>'))"
"""

from __future__ import annotations

import logging
from typing import Any

from pipelines.config import BenchmarkConfig
from pipelines.evaluation import summary_metrics
from pipelines.fileio import atomic_write_json
from pipelines.paths import RunPaths
from pipelines.summary import RunSummary, read_summary
from pipelines.tracking import (TAG_REGRESSION, TAG_ROLE, TAG_RUN_DIR, TAG_STATUS, client_for,
                                parent_run_id)

log = logging.getLogger(__name__)

TIME_KEY = "total_seconds_median"
ACCURACY_KEY = "test_accuracy_median"


class RegressionError(RuntimeError):
    """This run is slower or less accurate than the baseline beyond the configured bounds."""


class FailedCellsError(RuntimeError):
    """Some training cells failed: reported and logged, but the run must not look green."""


def find_baseline(client, config: BenchmarkConfig, paths: RunPaths):
    """The newest successful parent run of the same profile, other than this run (or None)."""
    exp = client.get_experiment_by_name(config.mlflow_experiment)
    if exp is None:
        return None
    own = parent_run_id(config, paths)
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=(f"tags.profile = '{config.profile}' AND tags.`{TAG_STATUS}` = 'success' "
                       f"AND tags.`{TAG_ROLE}` = 'parent'"),
        order_by=["attributes.start_time DESC"],
        max_results=100,
    )
    for run in runs:
        if run.info.run_id == own:
            continue
        if run.data.tags.get(TAG_RUN_DIR) == str(paths.root.resolve()):
            continue  # this run folder logged under another id (e.g. lost mlflow.json)
        if run.data.tags.get(TAG_REGRESSION) == "failed":
            continue  # a regressed run never becomes the yardstick
        return run
    return None


def compare(config: BenchmarkConfig, summary: RunSummary, baseline_metrics: dict[str, float]):
    """Per (backend, workers): old/new median total time and test accuracy, and what fails."""
    new = summary_metrics(summary)
    cells, regressions = [], []
    for agg in summary.aggregates:
        key = agg.key
        old_t, new_t = baseline_metrics.get(f"{key}/{TIME_KEY}"), new.get(f"{key}/{TIME_KEY}")
        old_a, new_a = baseline_metrics.get(f"{key}/{ACCURACY_KEY}"), new.get(f"{key}/{ACCURACY_KEY}")
        row: dict[str, Any] = {"cell": key, "old_total_seconds": old_t, "new_total_seconds": new_t,
                               "old_test_accuracy": old_a, "new_test_accuracy": new_a,
                               "slowdown": None, "accuracy_drop": None, "problems": []}
        if old_t is None or new_t is None:
            where = "the baseline" if old_t is None else "this run"
            row["problems"].append(f"not compared: no finished repeat in {where}")
        else:
            row["slowdown"] = (new_t - old_t) / old_t if old_t else None
            if row["slowdown"] is not None and row["slowdown"] > config.regression_time_threshold:
                regressions.append(
                    f"{key}: median total time {old_t:.2f} s -> {new_t:.2f} s "
                    f"({row['slowdown'] * 100:+.1f} %, "
                    f"allowed +{config.regression_time_threshold * 100:.0f} %)")
        if old_a is not None and new_a is not None:
            row["accuracy_drop"] = old_a - new_a
            if row["accuracy_drop"] > config.regression_accuracy_drop:
                regressions.append(
                    f"{key}: median test accuracy {old_a:.4f} -> {new_a:.4f} "
                    f"(drop {row['accuracy_drop']:.4f}, allowed {config.regression_accuracy_drop})")
        cells.append(row)
    return cells, regressions


def check_regression(config: BenchmarkConfig, paths: RunPaths) -> dict[str, Any]:
    """Compare with the baseline; raise RegressionError on a slowdown or accuracy drop."""
    summary = read_summary(paths)
    client = client_for(config)
    baseline = find_baseline(client, config, paths)
    out: dict[str, Any] = {"profile": config.profile, "tracking_uri": config.resolved_tracking_uri(),
                           "thresholds": {"time": config.regression_time_threshold,
                                          "accuracy_drop": config.regression_accuracy_drop}}
    if baseline is None:
        verdict = ("this run sets the baseline" if summary.status == "success"
                   else "this run has failed cells, so it does not set the baseline")
        out.update(status="baseline", baseline_run_id=None, cells=[], regressions=[],
                   message=f"no earlier successful run of profile {config.profile!r} in "
                           f"{config.resolved_tracking_uri()}: {verdict}")
    else:
        cells, regressions = compare(config, summary, baseline.data.metrics)
        name = baseline.data.tags.get("mlflow.runName", baseline.info.run_id)
        against = f"baseline run {name} ({baseline.info.run_id})"
        out.update(status="failed" if regressions else "passed", baseline_run_id=baseline.info.run_id,
                   baseline_run_name=name, cells=cells, regressions=regressions,
                   message=(f"regression against {against}: " + "; ".join(regressions)) if regressions
                   else f"no regression against {against}")
    atomic_write_json(paths.regression, out)
    own = parent_run_id(config, paths)
    if own:
        client.set_tag(own, TAG_REGRESSION, out["status"])
    log.info(out["message"])
    if out["status"] == "failed":
        raise RegressionError(out["message"])
    if summary.failed:  # the report is out; now make the nightly run itself go red
        raise FailedCellsError("training cells failed: " + "; ".join(
            f"{f.cell}: {f.error[:300]}" for f in summary.failed))
    return out
