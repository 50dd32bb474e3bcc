"""A cell's outcome: every rank's device and placement, and rank 0's exported model and
``worker_result.json``, the same fields under every backend (every rank's
``pipelines.training.process.RankProcess`` writes it through here, in the shared loop and in a
platform's own trial alike)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import shutil
import socket
import time
from pathlib import Path

import torch

from pipelines import platforms
from pipelines.training.cell import CellSpec
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import CellResult, TestMetrics
from pipelines.training.distributed import DistEnv, device_name
from pipelines.training.host import placement
from pipelines.training.messages import MAX_GATHERED_BYTES as MAX_GATHERED_BYTES, all_gather_json
from pipelines.training.record import TrainingRecord

def worker_devices(env: DistEnv, backend: str) -> tuple[list[str], list[str]]:
    """Every rank's device label (``cuda:0``, ``cpu:cores 1``) and placement (its host, and where
    ``backend``'s launcher put it: ``distributed.placement``), gathered to every rank."""
    known = platforms.find(backend)
    labels = all_gather_json([env.device_label, placement(workdir=known.workdir_placement if known else ())], env)
    return [d for d, _ in labels], [p for _, p in labels]


def step_link_bytes(env: DistEnv, tx_bytes: int | None, steps: int) -> float | None:
    """Bytes all hosts' links sent per training step (gathered: one rank per host reports its
    host's counter), or None off launch hosts."""
    gathered = all_gather_json([tx_bytes if env.local_rank == 0 else 0, tx_bytes is not None], env)
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

    Loadable with ``AutoModelForSequenceClassification.from_pretrained``. Written whole beside it
    (``model.new``) and then swapped in (``swap_folders``): a reader never sees half a model, and a
    crash at any point leaves the previous model (a retried cell's) readable at <cell>/model until the
    new one is there (where the file system cannot exchange two names, at <cell>/model.old for an instant).
    """
    target = cell.model
    new = target.with_name(target.name + ".new")
    shutil.rmtree(new, ignore_errors=True)  # a crashed export's
    model.save_pretrained(new)
    if target.is_symlink():
        target.unlink()  # never write through a link planted at the model's path
    if target.is_dir():
        swap_folders(new, target)
        shutil.rmtree(new)  # now the old model
    else:
        new.rename(target)
    return str(target)


_RENAME_EXCHANGE = 2  # linux/fs.h


def swap_folders(a: Path, b: Path) -> None:
    """Exchange two folders' names in one step where the file system can (``exchange``: both
    names exist throughout). Where it cannot (e.g. NFS), ``b`` is moved aside, ``a`` renamed to
    ``b``, then the old one moved to ``a``: only between those two renames is ``b`` missing."""
    if exchange(a, b):
        return
    aside = b.with_name(b.name + ".old")
    shutil.rmtree(aside, ignore_errors=True)
    b.rename(aside)
    a.rename(b)
    aside.rename(a)


def exchange(a: Path, b: Path) -> bool:
    """Linux ``renameat2(RENAME_EXCHANGE)`` of two existing paths (not in Python's ``os``): True when
    done, False where this system or file system has no such call."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_cwd = -100  # AT_FDCWD: the paths as they are
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


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
