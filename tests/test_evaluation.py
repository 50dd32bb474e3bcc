"""evaluate_run: time-to-target, aggregates over repeats, scaling, overhead, cost, failures.

The cells' result.json files are synthetic CellResults with realistic shapes (times from
the measurements in shared/notes/engines.md); ``write_synthetic_run`` is reused by the
report, tracking and regression tests.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from pipelines.config import Backend, BenchmarkConfig, save_config
from pipelines.evaluation import evaluate_run, time_to_target
from pipelines.paths import RunPaths
from pipelines.results import CellResult, EpochMetrics
from pipelines.results import TestMetrics as HeldOutMetrics  # a Test* name would be collected

STARTUP = {"ddp": 6.5, "spark": 14.0, "determined": 7.5}  # launcher + imports, seconds
TRAIN_1W = {"ddp": 14.0, "spark": 14.5, "determined": 15.0}  # training loop, 1 worker


def make_result(backend: str, workers: int, repeat: int = 0, *, slow: float = 1.0,
                accuracy_shift: float = 0.0, epochs: int = 2, status: str = "ok",
                model_source: str = "random_init") -> CellResult:
    """A plausible CellResult: per-repeat jitter, sub-linear scaling, rising accuracy."""
    jitter = 1.0 + 0.03 * repeat
    training = TRAIN_1W[backend] / workers * (1.0 + 0.2 * (workers - 1)) * jitter * slow
    per_epoch = training / epochs
    accuracies = [min(0.5 + 0.08 * (e + 1) + 0.01 * workers + accuracy_shift, 0.99) for e in range(epochs)]
    samples = 400 * epochs / training
    evaluation = 1.2
    if status == "failed":
        return CellResult(backend=Backend(backend), world_size=workers, repeat=repeat, status="failed",
                          error=f"{backend}: worker exited with code 1 (synthetic)", host="bench-host")
    return CellResult(
        backend=Backend(backend), world_size=workers, repeat=repeat, device="cpu",
        model_source=model_source, model_name="bert-tiny", train_samples=400, test_samples=200,
        max_seq_len=64, batch_size_per_worker=16, seed=42,
        epochs=[EpochMetrics(epoch=e + 1, train_loss=0.69 - 0.05 * e, train_accuracy=acc + 0.02,
                             eval_loss=0.68 - 0.04 * e, eval_accuracy=acc, epoch_seconds=per_epoch,
                             elapsed_seconds=per_epoch * (e + 1), samples_per_second=samples)
                for e, acc in enumerate(accuracies)],
        test=HeldOutMetrics(accuracy=accuracies[-1] - 0.01, f1=accuracies[-1] - 0.02,
                         precision=accuracies[-1], recall=accuracies[-1] - 0.03, loss=0.6,
                         confusion_matrix=[[70, 30], [35, 65]]),
        startup_seconds=STARTUP[backend] * jitter, training_seconds=training,
        evaluation_seconds=evaluation, total_seconds=STARTUP[backend] * jitter + training + evaluation,
        samples_per_second=samples, peak_memory_mb=610.0 + 40 * workers,
        checkpoint_path="checkpoints/final/model.pt",
        versions={"torch": "2.13.0+cpu", "transformers": "5.24.0", backend: "x.y"}, host="bench-host",
    )


def write_synthetic_run(config: BenchmarkConfig, name: str = "run-a", skip: tuple[str, ...] = (),
                        failed: tuple[str, ...] = (), **kwargs) -> tuple[RunPaths, dict[str, CellResult]]:
    """A run folder with config, manifest and one result.json (+ checkpoint) per cell.

    ``skip``: cell names left without result.json; ``failed``: cells with status failed.
    """
    paths = RunPaths(Path(config.output_root) / name)
    save_config(config, paths.config)
    paths.snapshot.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(json.dumps({  # the shape pipelines.data.ingest writes
        "source": config.dataset_source, "source_kind": "parquet", "seed": config.seed,
        "splits": {split: {"file": f"{split}.parquet", "rows": 2 * n, "source_rows": 25000,
                           "rows_per_label": {"0": n, "1": n}, "sha256": c * 64}
                   for split, n, c in (("train", 200, "a"), ("test", 100, "b"))},
    }))
    results = {}
    for backend, workers, repeat in config.cells():
        cell = paths.cell(backend, workers, repeat)
        if cell.name in skip:
            continue
        result = make_result(backend.value, workers, repeat,
                             status="failed" if cell.name in failed else "ok", **kwargs)
        if result.status == "ok":
            (cell / "checkpoints/final").mkdir(parents=True, exist_ok=True)
            (cell / "checkpoints/final/model.pt").write_bytes(b"weights" * 64)
        result.write(cell / "result.json")
        results[cell.name] = result
    return paths, results


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
    summary = evaluate_run(config, paths)

    assert json.loads((paths.report / "summary.json").read_text()) == summary
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
    assert aggs["spark-w2"]["overhead_vs_ddp_total"] == (spark - ddp) / ddp
    assert aggs["spark-w2"]["overhead_vs_ddp_total"] > 0  # spark's session start-up
    assert aggs["ddp-w1"]["overhead_vs_ddp_training"] == 0.0
    assert summary["model_sources"] == ["random_init"]
    assert summary["dataset"]["source"] == config.dataset_source


def test_no_single_worker_cell_means_no_scaling_efficiency(make_config):
    config = make_config(backends=["ddp"], worker_counts=[2], target_accuracy=0.99)
    paths, _ = write_synthetic_run(config)
    agg = evaluate_run(config, paths)["aggregates"][0]
    assert agg["scaling_efficiency"] is None
    assert agg["time_to_target_seconds"] is None and agg["reached_target"] == 0


def test_all_cells_missing_still_summarises(make_config):
    config = make_config(backends=["determined"], worker_counts=[1])
    paths, _ = write_synthetic_run(config, skip=("determined-w1-r0",))
    summary = evaluate_run(config, paths)
    assert summary["status"] == "failed"
    assert summary["aggregates"][0]["total_seconds"]["median"] is None
    assert summary["failed"][0]["cell"] == "determined-w1-r0"
