"""The shared loop inside Ray Train: ``TorchTrainer(train_loop_per_worker, ...)`` runs this in
every Ray Train worker (one rank each).

``RayTrainDistributed`` is the loop seam for Ray (``pipelines.training.distributed``):

- ranks, world size and local world size come from ``ray.train.get_context()``; the GPU from
  ``ray.train.torch.get_device()`` (Ray assigns the workers' GPUs);
- the process group is Ray Train's (it creates it before this function runs and destroys it
  after): the seam joins nothing and destroys nothing;
- the model is wrapped by the project's own ``DistributedDataParallel`` (the base class), not
  ``ray.train.torch.prepare_model``, and the loaders keep the project's ``DistributedSampler``
  instead of ``prepare_data_loader``: every backend then trains the same rows in the same
  order with the same wrapper (recorded as ``versions["ray_model_wrapper"] = "project-ddp"``);
- each epoch's checkpoint, written by the loop to ``<cell>/checkpoints``, is reported through
  ``ray.train.report(metrics, checkpoint=Checkpoint)`` on every rank (rank 0 with the
  checkpoint), so Ray's run in ``<cell>/ray/<run name>`` lists every epoch's checkpoint
  (hard links of the loop's file, no second copy of ~50 MB per epoch);
- resume: the loop resumes from ``<cell>/checkpoints`` as under every backend; should that
  folder lack the checkpoint Ray restored for this run (``ray.train.get_checkpoint()``,
  e.g. the cell folder was cleaned but Ray's storage kept), rank 0 puts it back first.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from pipelines.training import checkpoint as ckpt
from pipelines.training.distributed import DistEnv, TorchDistributed

log = logging.getLogger("pipelines.training")
DRIVER_LOG_ENV = "PIPELINES_RAY_DRIVER_LOG"  # set by hosts.py: the driver on hosts[0] logs the ranks already
MODEL_WRAPPER = "project-ddp"  # the project's DistributedDataParallel, not ray.train.torch.prepare_model


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link (no second copy of the checkpoint); a copy across file systems."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def link_upload(checkpoint, checkpoint_dir_name: str):
    """``checkpoint_upload_fn`` for ``ray.train.report``: put the checkpoint's files into Ray's
    run folder (``<cell>/ray/<run name>/<checkpoint_dir_name>``) as hard links (storage is a
    folder of the cell, on the same file system)."""
    import ray.train

    target = Path(ray.train.get_context().get_storage().experiment_fs_path) / checkpoint_dir_name
    target.mkdir(parents=True, exist_ok=True)
    for source in Path(checkpoint.path).iterdir():
        _link_or_copy(source, target / source.name)
    return ray.train.Checkpoint.from_directory(str(target))


class RayTrainDistributed(TorchDistributed):
    """Ray Train's worker context, its process group, the project's DDP; checkpoints reported to Ray."""

    def __init__(self, cell_dir: str | Path) -> None:
        super().__init__()
        self.cell_dir = Path(cell_dir)

    def ranks(self) -> tuple[int, int, int, int | None]:
        import ray.train

        context = ray.train.get_context()
        return (context.get_world_rank(), context.get_world_size(), context.get_local_rank(),
                context.get_local_world_size())

    def cuda_device(self, local_rank: int) -> torch.device:
        import ray.train.torch

        return ray.train.torch.get_device()

    def setup(self) -> DistEnv:
        env = super().setup()  # the group is Ray Train's: created_group stays False
        if env.world_size > 1 and not dist.is_initialized():
            raise RuntimeError("Ray Train did not set up a torch process group for a world of "
                               f"{env.world_size}; is this running under TorchTrainer?")
        self._restore_ray_checkpoint(env)
        return env

    def _restore_ray_checkpoint(self, env: DistEnv) -> None:
        """Rank 0 copies the checkpoint Ray restored for this run into ``<cell>/checkpoints``
        when the folder lacks it; the other ranks wait so that all resume from the same file."""
        import ray.train

        restored = ray.train.get_checkpoint()
        if restored is not None and env.is_main:
            folder = self.cell_dir / "checkpoints"
            folder.mkdir(parents=True, exist_ok=True)
            newest_here = ckpt.latest_checkpoint(folder)
            with restored.as_directory() as directory:
                for source in sorted(Path(directory).glob(ckpt.PATTERN)):
                    if newest_here is not None and newest_here.name >= source.name:
                        continue  # the loop's own folder is as new: it resumes from there
                    for path in (source, source.with_name(source.name + ".sha256")):
                        if path.exists():
                            shutil.copy2(path, folder / path.name)
                    log.warning("%s was missing from %s: restored from Ray's checkpoint %s",
                                source.name, folder, restored.path)
        if env.world_size > 1:
            dist.barrier()

    def on_epoch_end(self, env: DistEnv, epoch: int, checkpoint_path: str | None, metrics: dict) -> None:
        """``ray.train.report`` on every rank (Ray's barrier); rank 0 hands over the epoch's checkpoint."""
        import ray.train

        report = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if checkpoint_path is None:
            ray.train.report(report)
            return
        staging = self.cell_dir / "ray" / "staging" / f"epoch-{epoch:04d}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for source in (Path(checkpoint_path), Path(checkpoint_path + ".sha256")):
            _link_or_copy(source, staging / source.name)
        ray.train.report(report, checkpoint=ray.train.Checkpoint.from_directory(str(staging)),
                         checkpoint_dir_name=f"epoch-{epoch:04d}", checkpoint_upload_fn=link_upload,
                         delete_local_checkpoint_after_upload=True)


def setup_logging(cell_dir: Path) -> None:
    """The project's worker logging, also appended to ``<cell>/train.log`` (Ray prints the
    workers' output in the driver's, prefixed with the actor), unless the driver's output is
    that log already (across hosts: ``pipelines.platforms.ray.hosts`` sets ``DRIVER_LOG_ENV``)."""
    from pipelines.training.process import setup_logging as worker_logging

    worker_logging()
    if os.environ.get(DRIVER_LOG_ENV):
        return
    handler = logging.FileHandler(Path(cell_dir) / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s rank%(process)d: %(message)s"))
    logging.getLogger().addHandler(handler)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train's entry point in every worker: ``config`` = {"cell_dir", "launch_time"} (paths,
    not data; the cell's spec is read from ``<cell_dir>/cell.json`` as under every launcher)."""
    from pipelines.training.cell import CellSpec
    from pipelines.training.loop import run_training

    setup_logging(config["cell_dir"])
    spec = CellSpec.read(config["cell_dir"])
    run_training(spec, float(config["launch_time"]), distributed=RayTrainDistributed(spec.cell_dir))
