"""Synthetic training-cell results for the evaluation, report, tracking and regression tests.

Unit tests of those mechanics need many cells with controlled values (slower, less accurate,
failed); the values are shaped like real results (times from shared/notes/engines.md). The
real training path is tested with real runs in tests/backends and tests/airflow.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.config import Backend, BenchmarkConfig, save_config
from pipelines.paths import RunPaths
from pipelines.results import CellResult, EpochMetrics
from pipelines.results import TestMetrics as HeldOutMetrics

STARTUP = {"ddp": 6.5, "spark": 14.0, "determined": 7.5, "spark_dataframe": 20.0}  # launcher + imports, s
TRAIN_1W = {"ddp": 14.0, "spark": 14.5, "determined": 15.0, "spark_dataframe": 14.5}  # training loop, 1 worker


def make_result(backend: str, workers: int, repeat: int = 0, *, slow: float = 1.0,
                accuracy_shift: float = 0.0, epochs: int = 2, status: str = "ok",
                model_source: str = "random_init", slow_total: float = 1.0) -> CellResult:
    """A plausible CellResult: per-repeat jitter, sub-linear scaling, rising accuracy.
    ``slow`` stretches training; ``slow_total`` every phase (start-up and evaluation too)."""
    jitter = (1.0 + 0.03 * repeat) * slow_total
    training = TRAIN_1W[backend] / workers * (1.0 + 0.2 * (workers - 1)) * jitter * slow
    per_epoch = training / epochs
    accuracies = [min(0.5 + 0.08 * (e + 1) + 0.01 * workers + accuracy_shift, 0.99) for e in range(epochs)]
    samples = 400 * epochs / training
    evaluation = 1.2 * slow_total
    if status == "failed":
        return CellResult(backend=Backend(backend), world_size=workers, repeat=repeat, status="failed",
                          error=f"{backend}: worker exited with code 1 (synthetic)", host="bench-host")
    return CellResult(
        backend=Backend(backend), world_size=workers, repeat=repeat, device="cpu",
        platform_mode={"ddp": "torchrun"}.get(backend, "local"),
        model_source=model_source, model_name="bert-tiny", train_samples=400, test_samples=200,
        max_seq_len=64, batch_size_per_worker=16, seed=42,
        epochs=[EpochMetrics(epoch=e + 1, train_loss=0.69 - 0.05 * e, train_accuracy=acc + 0.02,
                             eval_loss=0.68 - 0.04 * e, eval_accuracy=acc, train_seconds=per_epoch, epoch_seconds=per_epoch,
                             elapsed_seconds=per_epoch * (e + 1), samples_per_second=samples)
                for e, acc in enumerate(accuracies)],
        test=HeldOutMetrics(accuracy=accuracies[-1] - 0.01, f1=accuracies[-1] - 0.02,
                         precision=accuracies[-1], recall=accuracies[-1] - 0.03, loss=0.6,
                         confusion_matrix=[[70, 30], [35, 65]]),
        startup_seconds=STARTUP[backend] * jitter, training_seconds=training,
        evaluation_seconds=evaluation, total_seconds=STARTUP[backend] * jitter + training + evaluation,
        phases={"launch": STARTUP[backend] * jitter, "data": 0.1 * training,
                "compute": training * (0.9 if workers == 1 else 0.75),
                "communication": 0.0 if workers == 1 else 0.15 * training, "checkpoint": 0.0,
                "evaluation": evaluation, "teardown": 0.0},
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
    for backend, strategy, workers, repeat in config.cells():
        cell = paths.cell(backend, workers, repeat, strategy)
        if cell.name in skip:
            continue
        result = make_result(backend.value, workers, repeat,
                             status="failed" if cell.name in failed else "ok", **kwargs)
        result = result.model_copy(update=config.strategy(strategy).result_fields())
        if result.status == "ok":
            (cell.checkpoints / "final").mkdir(parents=True, exist_ok=True)
            (cell.checkpoints / "final/model.pt").write_bytes(b"weights" * 64)
        result.write(cell.result)
        results[cell.name] = result
    return paths, results
