"""Synthetic training-cell results for the evaluation, report, tracking and regression tests.

Unit tests of those mechanics need many cells with controlled values (slower, less accurate,
failed); the values are shaped like real results (times from shared/notes/engines.md). The
real training path is tested with real runs in tests/platforms and tests/airflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from pipelines import platforms
from pipelines.config import BenchmarkConfig, save_config
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import Attempt, CellResult, EpochMetrics, HostUsage, ResourceUsage
from pipelines.runfolder.results import TestMetrics as HeldOutMetrics

STARTUP = {"ddp": 6.5, "spark": 14.0, "determined": 7.5, "spark_dataframe": 20.0,  # launcher + imports, s
           "spark_per_job": 26.0, "ray": 15.0, "ray_per_job": 24.0}  # per job: + the cluster's start
TRAIN_1W = {"ddp": 14.0, "spark": 14.5, "determined": 15.0, "spark_dataframe": 14.5,  # training loop, 1 worker
            "spark_per_job": 14.5, "ray": 15.5, "ray_per_job": 15.5}
GRADIENT_BYTES = 4.4e6 * 4  # BERT-tiny's fp32 gradients: what the default strategy all-reduces per step
UNSHAPED_BPS = 9e9  # an unshaped veth link (bench/RESULTS.md: ~9.4 Gbit/s measured)


def _link_fields(network: str, workers: int, epochs: int, payload: float | None,
                 codec_seconds_per_step: float) -> dict[str, Any]:
    """On an emulated cluster: the time the link adds per step (a ring all-reduce moves
    2(W-1)/W of the payload out of every host) plus the codec's, and the bytes the links moved."""
    from pipelines.cluster.emulated import NetworkSpec

    steps = 400 // (16 * workers)  # per epoch: 400 training rows, 16 per worker and step
    payload = GRADIENT_BYTES if payload is None else payload
    wire = 2 * (workers - 1) / workers * payload  # out of each host per step
    bits = NetworkSpec.parse(network).bits_per_second or UNSHAPED_BPS
    link_seconds = steps * epochs * wire * 8 / bits if workers > 1 else 0.0
    tx = int(wire * steps * epochs)
    return {"steps": steps, "link_seconds": link_seconds, "codec_seconds": codec_seconds_per_step * steps * epochs,
            "link_bytes": {f"h{i}": {"tx": tx, "rx": tx} for i in range(workers)},
            "link_bytes_per_step": tx * workers / (steps * epochs) if workers > 1 else 0.0}


def make_result(backend: str, workers: int, repeat: int = 0, *, slow: float = 1.0,
                accuracy_shift: float = 0.0, epochs: int = 2, status: str = "ok",
                model_source: str = "random_init", slow_total: float = 1.0, network: str = "local",
                comm_bytes_per_step: float | None = None, codec_seconds_per_step: float = 0.0) -> CellResult:
    """A plausible CellResult: per-repeat jitter, sub-linear scaling, rising accuracy.
    ``slow`` stretches training; ``slow_total`` every phase (start-up and evaluation too).
    ``network`` other than "local": the cell ran on an emulated cluster whose links take
    ``comm_bytes_per_step`` (default: BERT-tiny's fp32 gradients) at the network's rate, plus
    ``codec_seconds_per_step`` of compression compute: its communication grows as bandwidth shrinks."""
    jitter = (1.0 + 0.03 * repeat) * slow_total
    training = TRAIN_1W[backend] / workers * (1.0 + 0.2 * (workers - 1)) * jitter * slow
    link = None if network == "local" else _link_fields(network, workers, epochs, comm_bytes_per_step,
                                                        codec_seconds_per_step)
    base_training = training
    if link is not None:
        training += link["link_seconds"] + link["codec_seconds"]
    per_epoch = training / epochs
    accuracies = [min(0.5 + 0.08 * (e + 1) + 0.01 * workers + accuracy_shift, 0.99) for e in range(epochs)]
    samples = 400 * epochs / training
    evaluation = 1.2 * slow_total
    if status == "failed":
        return CellResult(backend=platforms.check_name(backend), world_size=workers, repeat=repeat, status="failed",
                          error=f"{backend}: worker exited with code 1 (synthetic)", host="bench-host",
                          network=network, cluster="local" if link is None else "emulated")
    result = CellResult(
        backend=platforms.check_name(backend), world_size=workers, repeat=repeat, device="cpu",
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
        phases={"launch": STARTUP[backend] * jitter, "data": 0.1 * base_training,
                "compute": base_training * (0.9 if workers == 1 else 0.75),
                "communication": 0.0 if workers == 1 else 0.15 * base_training, "checkpoint": 0.0,
                "evaluation": evaluation, "teardown": 0.0},
        samples_per_second=samples, peak_memory_mb=610.0 + 40 * workers,
        checkpoint_path="checkpoints/final/model.pt", comm_bytes_per_step=comm_bytes_per_step,
        versions={"torch": "2.13.0+cpu", "transformers": "5.24.0", backend: "x.y"}, host="bench-host",
    )
    if link is None:
        return result
    phases = {**result.phases, "communication": result.phases["communication"] + link["link_seconds"],
              "compute": result.phases["compute"] + link["codec_seconds"]}
    return result.model_copy(update={
        "network": network, "cluster": "emulated", "phases": phases, "steps_per_epoch": link["steps"],
        "link_bytes": link["link_bytes"], "link_bytes_per_step": link["link_bytes_per_step"],
        "placements": [f"h{i} 10.213.0.{i + 1}" for i in range(workers)]})


# what each platform runs beside its ranks, peak RSS MB (the shape of pipelines.measure.resources' kinds)
PLATFORM_KINDS = {"ddp": {"driver": 310.0, "torchrun": 95.0},
                  "determined": {"driver": 330.0, "torchrun": 95.0},
                  "spark": {"java": 520.0, "driver": 340.0, "pyspark_worker": 60.0},
                  "spark_dataframe": {"java": 610.0, "driver": 350.0, "pyspark_worker": 70.0},
                  "ray": {"driver": 360.0, "raylet": 140.0, "gcs_server": 110.0, "ray_other": 180.0}}
RANK_RSS_MB, RANK_CPU_PERCENT = 420.0, 95.0  # one rank while training


def synthetic_usage(result: CellResult, samples: int = 24) -> tuple[ResourceUsage, list[dict]]:
    """A plausible ``ResourceUsage`` of ``result`` and its timeline (``pipelines.measure.resources``' shape):
    the platform alone until the first training step, the ranks at ~one core each while training,
    the platform's processes by kind beside them; across hosts, one HostUsage per placement."""
    kinds, n = PLATFORM_KINDS.get(str(result.backend), {"driver": 300.0}), result.world_size
    wall, start = result.total_seconds, 1_700_000_000.0
    first, end = result.startup_seconds, result.total_seconds - result.phases.get("teardown", 0.0)
    timeline = []
    for i in range(samples):
        t = wall * i / (samples - 1)
        training = first <= t <= end
        timeline.append({"t": round(t, 3), "ranks_cpu_percent": RANK_CPU_PERCENT * n if training else 0.0,
                         "platform_cpu_percent": 60.0 if t < first else 8.0,
                         "ranks_rss_mb": (RANK_RSS_MB if training else 120.0) * n,
                         "platform_rss_mb": sum(kinds.values())})
    ranks_cpu, platform_cpu = RANK_CPU_PERCENT / 100 * n * (end - first), 0.6 * first + 0.08 * (wall - first)
    ranks_mb, platform_mb = RANK_RSS_MB * n, sum(kinds.values())
    hosts = [p.split(" ", 1)[0] for p in result.placements] if result.link_bytes else []
    per_host = {h: HostUsage(cpus=1, cpu_seconds=ranks_cpu / n, cpu_utilisation=ranks_cpu / n / wall,
                             peak_memory_mb=RANK_RSS_MB + 80.0, ranks_cpu_seconds=ranks_cpu / n,
                             ranks_peak_rss_mb=RANK_RSS_MB, platform_cpu_seconds=0.0,
                             platform_peak_rss_mb=20.0,
                             platform_processes={"python": 20.0}, bytes_sent=result.link_bytes[h]["tx"],
                             bytes_received=result.link_bytes[h]["rx"]) for h in hosts}
    cpus = len(per_host) or 2
    usage = ResourceUsage(
        source="hosts" if per_host else "process tree", started=start, wall_seconds=wall, interval_s=0.5,
        samples=samples, cpus=cpus, cpu_seconds=ranks_cpu + platform_cpu,
        cpu_utilisation=(ranks_cpu + platform_cpu) / (wall * cpus), peak_rss_mb=ranks_mb + platform_mb,
        ranks=n, ranks_cpu_seconds=ranks_cpu, ranks_peak_rss_mb=ranks_mb, platform_cpu_seconds=platform_cpu,
        platform_peak_rss_mb=platform_mb, platform_processes=kinds, per_host=per_host,
        bytes_sent=sum(h.bytes_sent for h in per_host.values()) if per_host else None,
        bytes_received=sum(h.bytes_received for h in per_host.values()) if per_host else None)
    return usage, timeline


def with_resources(result: CellResult, cell_dir: Path | None = None, **kwargs) -> CellResult:
    """``result`` with a synthetic usage (its attempt starting where the timeline does); its
    timeline written to ``<cell_dir>/resources.json`` when a folder is given."""
    from pipelines.measure.resources import RESOURCES_FILE

    usage, timeline = synthetic_usage(result, **kwargs)
    if cell_dir is not None:
        Path(cell_dir).mkdir(parents=True, exist_ok=True)
        doc = {"usage": usage.model_dump(), "timeline": timeline}
        (Path(cell_dir) / RESOURCES_FILE).write_text(json.dumps(doc))
    attempt = Attempt(attempt=1, start=usage.started, end=usage.started + usage.wall_seconds, outcome="ok",
                      startup_seconds=result.startup_seconds)
    work_end = usage.started + result.total_seconds - result.phases.get("teardown", 0.0)
    return result.model_copy(update={"resources": usage, "attempts": [attempt], "work_end": work_end})


def write_synthetic_run(config: BenchmarkConfig, name: str = "run-a", skip: tuple[str, ...] = (),
                        failed: tuple[str, ...] = (),
                        cell_kwargs: Callable[[str, str, str, int, int], dict[str, Any]] | None = None,
                        resources: bool = False, **kwargs) -> tuple[RunPaths, dict[str, CellResult]]:
    """A run folder with config, manifest and one result.json (+ checkpoint) per cell.

    ``skip``: cell names left without result.json; ``failed``: cells with status failed;
    ``cell_kwargs(backend, strategy, network, workers, repeat)``: more make_result arguments
    for one cell (a strategy's payload and codec time, say). Each cell runs on its configured network.
    ``resources=True``: every finished cell also gets a synthetic usage and timeline (``with_resources``).
    """
    paths = RunPaths(Path(config.tracking.output_root) / name)
    save_config(config, paths.config)
    paths.snapshot.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(json.dumps({  # the shape pipelines.data.ingest writes
        "source": config.data.dataset_source, "source_kind": "parquet", "seed": config.training.seed,
        "splits": {split: {"file": f"{split}.parquet", "rows": 2 * n, "source_rows": 25000,
                           "rows_per_label": {"0": n, "1": n}, "sha256": c * 64}
                   for split, n, c in (("train", 200, "a"), ("test", 100, "b"))},
    }))
    results = {}
    for backend, strategy, network, workers, repeat in config.cells():
        cell = paths.cell(backend, workers, repeat, strategy, network)
        if cell.name in skip:
            continue
        more = cell_kwargs(str(backend), strategy, network, workers, repeat) if cell_kwargs else {}
        result = make_result(backend, workers, repeat, network=network,
                             status="failed" if cell.name in failed else "ok", **{**kwargs, **more})
        result = result.model_copy(update=config.strategy(strategy).result_fields())
        if resources and result.status == "ok":
            result = with_resources(result, cell.root)
        if result.status == "ok":
            (cell.checkpoints / "final").mkdir(parents=True, exist_ok=True)
            (cell.checkpoints / "final/model.pt").write_bytes(b"weights" * 64)
        result.write(cell.result)
        results[cell.name] = result
    return paths, results
