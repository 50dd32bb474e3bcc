"""Regression check against baselines of like runs (same config fingerprint and hardware class)
in a real MLflow store: the median of the last K runs and a long-term reference."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from pipelines.evaluation import evaluate_run
from pipelines.tracking.regression import FailedCellsError, RegressionError, check_regression
from pipelines.tracking.runs import log_benchmark
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


def test_a_changed_config_never_becomes_the_baseline(make_config, store):
    config = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=store,
                         mlflow_experiment="regression-fingerprint")
    _finished_run(config, "night-1")
    other = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=store,
                        mlflow_experiment="regression-fingerprint", learning_rate=5e-4)  # a manual try
    assert other.fingerprint() != config.fingerprint()
    manual, _ = _finished_run(other, "manual-lr", slow=3.0)
    assert check_regression(other, manual)["status"] == "baseline"  # nothing comparable before it
    night2, _ = _finished_run(config, "night-2")
    out = check_regression(config, night2)
    assert out["status"] == "passed" and out["baseline_runs"] == ["night-1"]  # not the manual run


def test_a_slow_creep_fires_against_the_long_term_reference(make_config, store):
    """+4 % a night for 8 nights (37 % in all): no night is 25 % slower than the median of the
    last 5, but the last one is 25 % slower than the oldest runs of the window."""
    config = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=store,
                         mlflow_experiment="regression-creep")
    verdicts = []
    for night in range(9):
        paths, _ = _finished_run(config, f"night-{night}", slow_total=1.04 ** night)
        try:
            verdicts.append(check_regression(config, paths)["status"])
        except RegressionError as err:
            verdicts.append("failed")
            message = str(err)
    assert verdicts[0] == "baseline" and verdicts[-1] == "failed", verdicts
    assert "long-term reference night-0, night-1, night-2, night-3, night-4" in message
    out = json.loads((paths.report / "regression.json").read_text())
    assert out["baseline_runs"] == ["night-3", "night-4", "night-5", "night-6", "night-7"]
    recent = [c for c in out["cells"] if "median of runs" in c["reference"]][0]
    assert recent["slowdown"] < 0.25  # night to night it never looked alarming


def test_a_re_report_is_not_a_new_run(make_config, store, tmp_path):
    config = make_config(backends=["ddp"], worker_counts=[1], mlflow_tracking_uri=store,
                         mlflow_experiment="regression-rereport")
    old, _ = _finished_run(config, "night-1")
    _finished_run(config, "night-2")
    log_benchmark(config, old)  # night-1 logged again (e.g. after a lost store): still the older run
    night3, _ = _finished_run(config, "night-3")
    out = check_regression(config, night3)
    assert out["baseline_runs"] == ["night-1", "night-2"] and out["baseline_run_name"] == "night-2"


def test_a_run_under_a_fault_is_compared_only_with_runs_under_the_same_fault(make_config, store):
    """A straggler run shares its healthy twin's fingerprint (the report finds the twin by it) but is
    never its baseline, nor is the twin the straggler run's: a 3x slower slow_host run passes as the
    first of its kind, and the next healthy run is judged against the healthy one only."""
    common = dict(backends=["ddp"], worker_counts=[2], mlflow_tracking_uri=store,
                  mlflow_experiment="regression-fault", cluster={"kind": "emulated", "hosts": 2})
    healthy = make_config(**common)
    slow = make_config(**common, fault="slow_host")
    assert slow.fingerprint() == healthy.fingerprint()
    _finished_run(healthy, "night-1")
    straggler, _ = _finished_run(slow, "slow-1", slow=3.0)
    out = check_regression(slow, straggler)
    assert out["status"] == "baseline" and out["baseline_run_id"] is None
    night2, _ = _finished_run(healthy, "night-2")
    out = check_regression(healthy, night2)
    assert out["status"] == "passed" and out["baseline_runs"] == ["night-1"]
