"""Regression check against the last successful run of the same profile in a real MLflow store."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from pipelines.evaluation import evaluate_run
from pipelines.regression import FailedCellsError, RegressionError, check_regression
from pipelines.tracking import log_benchmark
from tests.synthetic_results import write_synthetic_run


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module (a new one takes ~5 s); each test its own experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow-regression') / 'mlflow.db'}"


def _finished_run(config, name, **synthetic):
    """A run folder that went through evaluate and track, as in the DAG."""
    paths, _ = write_synthetic_run(config, name=name, **synthetic)
    summary = evaluate_run(config, paths).model_dump()
    log_benchmark(config, paths)
    return paths, {a["key"]: a for a in summary["aggregates"]}


def test_first_successful_run_sets_baseline_and_equal_run_passes(make_config, store):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], mlflow_tracking_uri=store,
                         mlflow_experiment="regression-baseline")
    broken, _ = _finished_run(config, "night-0", failed=("spark-w2-r0",))
    with pytest.raises(FailedCellsError, match="spark-w2-r0"):  # a run with broken cells ends red
        check_regression(config, broken)
    first = json.loads((broken.report / "regression.json").read_text())
    assert first["status"] == "baseline" and "does not set the baseline" in first["message"]

    night1, _ = _finished_run(config, "night-1")
    out = check_regression(config, night1)
    assert out["status"] == "baseline" and out["baseline_run_id"] is None
    assert "this run sets the baseline" in out["message"]
    assert json.loads((night1.report / "regression.json").read_text())["status"] == "baseline"

    night2, _ = _finished_run(config, "night-2")
    out = check_regression(config, night2)
    client = MlflowClient(tracking_uri=store)
    assert out["status"] == "passed" and out["regressions"] == []
    assert client.get_run(out["baseline_run_id"]).info.run_name == "night-1"  # not the broken one
    assert {c["cell"] for c in out["cells"]} == {"ddp-w1", "ddp-w2", "spark-w1", "spark-w2"}
    assert all(c["slowdown"] == 0.0 and c["accuracy_drop"] == 0.0 for c in out["cells"])


def test_slowdown_and_accuracy_drop_fail_naming_cell_and_values(make_config, store):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], mlflow_tracking_uri=store,
                         mlflow_experiment="regression-fires", regression_time_threshold=0.25,
                         regression_accuracy_drop=0.05)
    base, old = _finished_run(config, "night-1")
    check_regression(config, base)
    client = MlflowClient(tracking_uri=store)

    slow, new = _finished_run(config, "night-2-slow", slow=2.0)  # training twice as long
    with pytest.raises(RegressionError) as err:
        check_regression(config, slow)
    message = str(err.value)
    for key in ("ddp-w1", "spark-w2"):
        old_t, new_t = old[key]["total_seconds"]["median"], new[key]["total_seconds"]["median"]
        assert new_t / old_t - 1 > 0.25
        assert f"{key}: median total time {old_t:.2f} s -> {new_t:.2f} s" in message
    assert "night-1" in message
    written = json.loads((slow.report / "regression.json").read_text())
    assert written["status"] == "failed" and len(written["regressions"]) == 4
    own = json.loads((slow.root / "mlflow.json").read_text())[store]["parent_run_id"]
    assert client.get_run(own).data.tags["benchmark.regression"] == "failed"

    worse, new = _finished_run(config, "night-3-worse", accuracy_shift=-0.1)
    with pytest.raises(RegressionError) as err:
        check_regression(config, worse)  # compared with night-1: a regressed run is no baseline
    old_a, new_a = old["ddp-w2"]["test_accuracy"]["median"], new["ddp-w2"]["test_accuracy"]["median"]
    assert f"ddp-w2: median test accuracy {old_a:.4f} -> {new_a:.4f}" in str(err.value)
    assert "night-1" in str(err.value) and "total time" not in str(err.value)

    within, _ = _finished_run(config, "night-4-noise", slow=1.1, accuracy_shift=-0.02)
    out = check_regression(config, within)
    assert out["status"] == "passed"
    assert client.get_run(out["baseline_run_id"]).info.run_name == "night-1"
    assert all(0 < c["slowdown"] < 0.25 for c in out["cells"])
