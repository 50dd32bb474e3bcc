"""Nightly regression check against baselines of like runs in MLflow.

A run is compared only with runs that did the same work on the same kind of hardware: parent
runs in ``config.tracking.mlflow_experiment`` with the same config fingerprint (``benchmark.fingerprint``:
every field that changes the work or the result) and hardware class
(``benchmark.hardware_class``: device kind and count, CPU model, hosts), that succeeded
(``benchmark.status=success``: no failed cell), whose data contract was not relaxed
(``benchmark.baseline_eligible``), did not fail the check themselves and started
before this run (``benchmark.started_at``, the run folder's birth: a re-report is not a new run).
Two references, each the median over its runs of the per-cell medians (parent metrics
``<backend>-w<N>/total_seconds_median`` and ``.../test_accuracy_median``):

- recent: the last ``regression_baseline_runs`` (K, default 5) such runs;
- long-term: the run the team pinned (``regression_pinned_baseline``), else the oldest K such runs
  within ``regression_window_days`` (30): a slow creep that never trips the night-to-night
  comparison still trips this one.

A cell fails on a slowdown (new - old) / old > ``regression_time_threshold`` against either
reference, provided the slowdown is beyond the run's own noise (with 2+ repeats: the low end of
the 95 % bootstrap interval of the new median is above the reference too), or on a median test
accuracy drop > ``regression_accuracy_drop``. Failures raise ``RegressionError`` naming the cell,
old and new values and the reference runs; failed cells raise ``FailedCellsError`` after the
comparison is written, so a nightly run with broken cells ends red (its report lists them).
With no reference the check passes and says this run sets one. ``report/regression.json`` is
written either way and the parent gets ``benchmark.regression`` = passed | failed | baseline.
    python -c "from pipelines.run.stages import check_regression as c; print(c('runs/<run>'))"
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from pipelines.config import BenchmarkConfig
from pipelines.evaluation import summary_metrics
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.summary import RunSummary, read_summary
from pipelines.tracking.runs import (TAG_BASELINE_ELIGIBLE, TAG_FINGERPRINT, TAG_HARDWARE, TAG_REGRESSION, TAG_ROLE, TAG_RUN_DIR,
                                TAG_STARTED, TAG_STATUS, client_for, parent_run_id, run_started_at)

log = logging.getLogger(__name__)

TIME_KEY = "total_seconds_median"
ACCURACY_KEY = "test_accuracy_median"
DAY_S = 86400.0


class RegressionError(RuntimeError):
    """This run is slower or less accurate than the baseline beyond the configured bounds."""


class FailedCellsError(RuntimeError):
    """Some training cells failed: reported and logged, but the run must not look green."""


def _started(run) -> float:
    try:
        return float(run.data.tags.get(TAG_STARTED, "nan"))
    except ValueError:
        return float("nan")


def comparable_runs(client, config: BenchmarkConfig, paths: RunPaths, hardware: str) -> list:
    """Earlier successful parent runs of the same fingerprint, hardware class and fault, oldest first."""
    exp = client.get_experiment_by_name(config.tracking.mlflow_experiment)
    if exp is None:
        return []
    own, own_dir, started = parent_run_id(config, paths), str(paths.root.resolve()), run_started_at(paths)
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=(f"tags.`{TAG_FINGERPRINT}` = '{config.fingerprint()}' AND tags.`{TAG_STATUS}` = 'success' "
                       f"AND tags.`{TAG_ROLE}` = 'parent'"),
        max_results=1000,
    )
    eligible = [r for r in runs
                if r.info.run_id != own and r.data.tags.get(TAG_RUN_DIR) != own_dir  # not this run
                and r.data.tags.get(TAG_HARDWARE) == hardware
                # a run under an injected fault (slow host, lost host) is no yardstick for a healthy one, nor
                # the other way round: the fault is not in the fingerprint (a straggler run finds its healthy
                # twin by it), so it is compared here
                and r.data.params.get("fault", "none") == config.matrix.fault
                and r.data.tags.get(TAG_REGRESSION) != "failed"  # a regressed run is no yardstick
                and r.data.tags.get(TAG_BASELINE_ELIGIBLE) != "false"  # relaxed data contract
                and _started(r) < started]
    return sorted(eligible, key=_started)


def references(client, config: BenchmarkConfig, paths: RunPaths, hardware: str) -> dict[str, list]:
    """{"recent": the last K comparable runs, "long_term": pinned run or the oldest K in the window}."""
    runs = comparable_runs(client, config, paths, hardware)
    k = config.tracking.regression_baseline_runs
    if config.tracking.regression_pinned_baseline:
        long_term = [client.get_run(config.tracking.regression_pinned_baseline)]
    else:
        since = run_started_at(paths) - config.tracking.regression_window_days * DAY_S
        long_term = [r for r in runs if _started(r) >= since][:k]
    return {"recent": runs[-k:], "long_term": long_term}


def _reference_metrics(runs: list) -> dict[str, float]:
    """Per metric, the median over the runs that have it."""
    keys = {k for r in runs for k in r.data.metrics}
    return {k: statistics.median(r.data.metrics[k] for r in runs if k in r.data.metrics) for k in keys}


def _names(runs: list) -> list[str]:
    return [r.data.tags.get("mlflow.runName", r.info.run_id) for r in runs]


def compare(config: BenchmarkConfig, summary: RunSummary, reference: dict[str, float], label: str):
    """Per (backend, workers): reference vs new median total time and test accuracy."""
    new = summary_metrics(summary)
    cells, regressions = [], []
    for agg in summary.aggregates:
        key = agg.key
        old_t, new_t = reference.get(f"{key}/{TIME_KEY}"), new.get(f"{key}/{TIME_KEY}")
        old_a, new_a = reference.get(f"{key}/{ACCURACY_KEY}"), new.get(f"{key}/{ACCURACY_KEY}")
        ci = agg.total_seconds_ci
        row: dict[str, Any] = {"cell": key, "reference": label, "old_total_seconds": old_t,
                               "new_total_seconds": new_t, "new_total_seconds_ci": [ci.low, ci.high, ci.n],
                               "old_test_accuracy": old_a, "new_test_accuracy": new_a,
                               "slowdown": None, "accuracy_drop": None, "alarms": [], "problems": []}
        if old_t is None or new_t is None:
            where = "the reference" if old_t is None else "this run"
            row["problems"].append(f"not compared: no finished repeat in {where}")
        else:
            row["slowdown"] = (new_t - old_t) / old_t if old_t else None
            beyond_noise = ci.n < 2 or (ci.low is not None and ci.low > old_t)
            if row["slowdown"] is not None and row["slowdown"] > config.tracking.regression_time_threshold \
                    and beyond_noise:
                row["alarms"].append("time")
                regressions.append(
                    f"{key}: median total time {old_t:.2f} s -> {new_t:.2f} s "
                    f"({row['slowdown'] * 100:+.1f} %, allowed +{config.tracking.regression_time_threshold * 100:.0f} %"
                    f"; vs {label})")
        if old_a is not None and new_a is not None:
            row["accuracy_drop"] = old_a - new_a
            if row["accuracy_drop"] > config.tracking.regression_accuracy_drop:
                row["alarms"].append("accuracy")
                regressions.append(
                    f"{key}: median test accuracy {old_a:.4f} -> {new_a:.4f} "
                    f"(drop {row['accuracy_drop']:.4f}, allowed {config.tracking.regression_accuracy_drop}; vs {label})")
        cells.append(row)
    return cells, regressions


def check_regression(config: BenchmarkConfig, paths: RunPaths) -> dict[str, Any]:
    """Compare with the references; raise RegressionError on a slowdown or accuracy drop."""
    summary = read_summary(paths)
    client = client_for(config)
    refs = references(client, config, paths, summary.hardware.hardware_class)
    out: dict[str, Any] = {"profile": config.profile, "fingerprint": config.fingerprint(),
                           "hardware_class": summary.hardware.hardware_class,
                           "tracking_uri": config.resolved_tracking_uri(),
                           "thresholds": {"time": config.tracking.regression_time_threshold,
                                          "accuracy_drop": config.tracking.regression_accuracy_drop},
                           "baseline_runs": _names(refs["recent"]), "long_term_runs": _names(refs["long_term"])}
    if not refs["recent"]:
        verdict = ("this run sets the baseline" if summary.status == "success"
                   else "this run has failed cells, so it does not set the baseline")
        out.update(status="baseline", baseline_run_id=None, cells=[], regressions=[],
                   message=f"no earlier successful run with fingerprint {config.fingerprint()} on "
                           f"{summary.hardware.hardware_class} in {config.resolved_tracking_uri()}: {verdict}")
    else:
        recent = f"the median of runs {', '.join(_names(refs['recent']))}"
        cells, regressions = compare(config, summary, _reference_metrics(refs["recent"]), recent)
        same = {r.info.run_id for r in refs["long_term"]} == {r.info.run_id for r in refs["recent"]}
        if refs["long_term"] and not same:
            long_term = f"the long-term reference {', '.join(_names(refs['long_term']))}"
            more_cells, more = compare(config, summary, _reference_metrics(refs["long_term"]), long_term)
            cells, regressions = cells + more_cells, regressions + more
        newest = refs["recent"][-1]
        out.update(status="failed" if regressions else "passed", baseline_run_id=newest.info.run_id,
                   baseline_run_name=_names([newest])[0], cells=cells, regressions=regressions,
                   message=("regression: " + "; ".join(regressions)) if regressions
                   else f"no regression against {recent}")
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
