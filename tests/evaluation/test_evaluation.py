"""evaluate_run: time-to-target, aggregates over repeats, scaling, overhead, cost, failures.

The cells' result.json files are synthetic CellResults (tests/synthetic_results.py).
"""

from __future__ import annotations

import json
import statistics

from pipelines.evaluation import evaluate_run, time_to_target
from pipelines.runfolder.summary import read_summary
from tests.synthetic_results import make_result, write_synthetic_run


def test_time_to_target_is_first_epoch_reaching_it():
    result = make_result("ddp", 1, epochs=3)  # accuracies 0.59, 0.67, 0.75
    epoch, seconds = time_to_target(result, 0.66)
    assert epoch == 2
    assert seconds == result.epochs[1].elapsed_seconds
    assert time_to_target(result, 0.99) == (None, None)


def test_evaluate_run_aggregates_and_failures(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], repeats=3,
                         price_per_worker_hour=0.5, target_accuracy=0.595)
    paths, results = write_synthetic_run(config, skip=("spark-w2-r2",), failed=("spark-w1-r1",))
    typed = evaluate_run(config, paths)
    assert read_summary(paths) == typed  # the typed summary round-trips through the file
    summary = typed.model_dump(mode="json")

    assert json.loads(paths.summary.read_text()) == summary
    assert summary["status"] == "failed"
    failed = {f["cell"]: f["error"] for f in summary["failed"]}
    assert set(failed) == {"spark-w2-r2", "spark-w1-r1"}
    assert "no result" in failed["spark-w2-r2"] and "exited with code 1" in failed["spark-w1-r1"]

    aggs = {a["key"]: a for a in summary["aggregates"]}
    for key, agg in aggs.items():
        ok = [r for n, r in results.items() if n.startswith(key + "-") and r.status == "ok"]
        assert agg["repeats_ok"] == len(ok)
        assert agg["total_seconds"]["median"] == statistics.median(r.total_seconds for r in ok)
        assert agg["total_seconds"]["min"] == min(r.total_seconds for r in ok)
        assert agg["training_seconds"]["max"] == max(r.training_seconds for r in ok)
        assert agg["samples_per_second"]["median"] == statistics.median(r.samples_per_second for r in ok)
        assert agg["test_accuracy"]["median"] == statistics.median(r.test.accuracy for r in ok)
        expected_cost = agg["workers"] * agg["total_seconds"]["median"] / 3600 * 0.5
        assert abs(agg["estimated_cost"] - expected_cost) < 1e-12
        # time to target: epoch 1 reaches 0.595 with 2 workers (0.60), epoch 2 with 1 worker (0.67)
        tta = statistics.median(r.epochs[0 if agg["workers"] == 2 else 1].elapsed_seconds for r in ok)
        assert agg["time_to_target_seconds"] == tta and agg["reached_target"] == len(ok)
    assert aggs["spark-w2"]["repeats_failed"] == 1 and aggs["spark-w1"]["repeats_failed"] == 1

    t1, t2 = aggs["ddp-w1"]["training_seconds"]["median"], aggs["ddp-w2"]["training_seconds"]["median"]
    assert aggs["ddp-w2"]["scaling_efficiency"] == t1 / (2 * t2)
    assert aggs["ddp-w1"]["scaling_efficiency"] == 1.0
    ddp, spark = aggs["ddp-w2"]["total_seconds"]["median"], aggs["spark-w2"]["total_seconds"]["median"]
    assert aggs["spark-w2"]["overhead_vs_reference_total"] == (spark - ddp) / ddp
    assert aggs["spark-w2"]["overhead_vs_reference_total"] > 0  # spark's session start-up
    assert aggs["ddp-w1"]["overhead_vs_reference_training"] == 0.0
    assert summary["model_sources"] == ["random_init"]
    assert summary["dataset"]["source"] == config.data.dataset_source


def test_no_single_worker_cell_means_no_scaling_efficiency(make_config):
    config = make_config(backends=["ddp"], worker_counts=[2], target_accuracy=0.99)
    paths, _ = write_synthetic_run(config)
    agg = evaluate_run(config, paths).model_dump()["aggregates"][0]
    assert agg["scaling_efficiency"] is None
    assert agg["time_to_target_seconds"] is None and agg["reached_target"] == 0


def test_all_cells_missing_still_summarises(make_config):
    config = make_config(backends=["determined"], worker_counts=[1])
    paths, _ = write_synthetic_run(config, skip=("determined-w1-r0",))
    summary = evaluate_run(config, paths).model_dump()
    assert summary["status"] == "failed"
    assert summary["aggregates"][0]["total_seconds"]["median"] is None
    assert summary["failed"][0]["cell"] == "determined-w1-r0"


def test_run_folders_written_before_the_neutral_names_are_still_read(make_config):
    """summary.json's overhead_vs_ddp_* and result.json's spark_session (the names before the reference and
    the driver's session were the registry's and the platform's) read as their neutral successors."""
    from pipelines.runfolder.index import load_record
    from pipelines.runfolder.results import CellResult

    config = make_config(backends=["ddp", "spark"], worker_counts=[2])
    paths, _ = write_synthetic_run(config)
    written = evaluate_run(config, paths)
    old = json.loads(paths.summary.read_text())
    for agg in old["aggregates"]:
        agg["overhead_vs_ddp_total"] = agg.pop("overhead_vs_reference_total")
        agg["overhead_vs_ddp_training"] = agg.pop("overhead_vs_reference_training")
    paths.summary.write_text(json.dumps(old))
    assert read_summary(paths) == written
    assert load_record(paths.root).aggregates["spark-w2"]["overhead_vs_reference_total"] > 0

    cell = paths.cell("spark", 2, 0)
    result = json.loads(cell.result.read_text())
    result.pop("platform_session", None)
    cell.result.write_text(json.dumps({**result, "spark_session": "fresh"}))
    assert CellResult.read(cell.result).platform_session == "fresh"
