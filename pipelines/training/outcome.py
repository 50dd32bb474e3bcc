"""A cell's outcome: every rank's device and placement, and rank 0's exported model and
``worker_result.json``, the same fields under every backend (every rank's
``pipelines.training.process.RankProcess`` writes it through here, in the shared loop and the
Determined trial alike)."""

from __future__ import annotations

import platform
import resource
import shutil
import socket
import time

import torch
import torch.distributed as dist

from pipelines.training.cell import CellSpec
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import CellResult, TestMetrics
from pipelines.training.distributed import DistEnv, device_name, placement
from pipelines.training.record import TrainingRecord


def worker_devices(env: DistEnv) -> tuple[list[str], list[str]]:
    """Every rank's device label (``cuda:0``, ``cpu:cores 1``) and placement (host, Spark
    executor: ``distributed.placement``), gathered to every rank."""
    mine = (env.device_label, placement())
    labels = [mine] * env.world_size
    if env.world_size > 1:
        dist.all_gather_object(labels, mine)
    return [d for d, _ in labels], [p for _, p in labels]


def step_link_bytes(env: DistEnv, tx_bytes: int | None, steps: int) -> float | None:
    """Bytes all hosts' links sent per training step (gathered: one rank per host reports its
    host's counter), or None off launch hosts."""
    mine = (tx_bytes if env.local_rank == 0 else 0, tx_bytes is not None)
    gathered = [mine] * env.world_size
    if env.world_size > 1:
        dist.all_gather_object(gathered, mine)
    if not steps or not all(known for _, known in gathered):
        return None
    return sum(tx for tx, _ in gathered) / steps


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def versions() -> dict[str, str]:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def export_model(model, cell: CellPaths) -> str:
    """Rank 0: the trained model in Hugging Face format (config + safetensors) -> <cell>/model.

    Loadable with ``AutoModelForSequenceClassification.from_pretrained``; written to a temporary
    folder first so a reader never sees half a model.
    """
    target = cell.model
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return str(target)


def timed_export(model, cell: CellPaths) -> tuple[str, float]:
    start = time.perf_counter()
    path = export_model(model, cell)
    return path, time.perf_counter() - start


def worker_result(spec: CellSpec, env: DistEnv, record: TrainingRecord, *, launch_time: float,
                  model_source: str, test: TestMetrics, test_seconds: float, train_samples: int,
                  test_samples: int, checkpoint_path: str | None, model_path: str | None,
                  devices: list[str], placements: list[str] | None = None,
                  export_seconds: float = 0.0, comm_bytes_per_step: float | None = None,
                  steps_per_epoch: int = 0, link_bytes_per_train_step: float | None = None) -> CellResult:
    """Rank 0's result: the same fields, from the same record, under every backend."""
    cfg = spec.config  # the cell's config: seed + repeat, per-worker batch, scaled lr
    return CellResult(
        backend=spec.backend, world_size=env.world_size, repeat=spec.repeat,
        device=device_name(env.device), model_source=model_source, model_name=cfg.training.model_source,
        train_samples=train_samples, test_samples=test_samples, max_seq_len=cfg.data.max_seq_len,
        num_labels=spec.num_labels, batch_size_per_worker=cfg.training.batch_size,
        global_batch_size=cfg.training.batch_size * env.world_size, batch_policy=cfg.training.batch_policy,
        lr_scaling=cfg.training.lr_scaling, learning_rate=cfg.training.learning_rate, seed=cfg.training.seed, devices=devices,
        placements=placements or [],
        epochs=record.history, test=test, **record.timings(launch_time, test_seconds),
        phases=record.cell_phases(launch_time, final_test_seconds=test_seconds, export_seconds=export_seconds),
        work_end=time.time(),
        peak_memory_mb=peak_memory_mb(env.device), checkpoint_path=checkpoint_path,
        model_path=model_path, resumed_from_epoch=record.resumed_from_epoch, versions=versions(),
        host=socket.gethostname(), **cfg.strategy().result_fields(), comm_bytes_per_step=comm_bytes_per_step,
        steps_per_epoch=steps_per_epoch, link_bytes_per_train_step=link_bytes_per_train_step,
    )


def write_worker_result(result: CellResult, spec: CellSpec) -> None:
    result.write(spec.cell.worker_result)
