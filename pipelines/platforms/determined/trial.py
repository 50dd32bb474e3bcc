"""The benchmark as a Determined ``PyTorchTrial``, trained by ``det.pytorch.Trainer``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m pipelines.platforms.determined.trial --cell-dir <cell> --launch-time <epoch s>

Same model factory, token shards, sampler, optimizer, schedule, evaluation and timing record
(``TrainingRecord``) as the shared loop (``pipelines.training.loop``); Determined drives the
loop (its own batching, DDP wrapping, validation and checkpoint schedule) and
``EpochRecorder`` turns its callbacks into the record's phases (data: the batches' wait, as
the loop times it; communication: the same DDP hook timer on Determined's DDP wrapper). Local mode (no master): we
join the gloo/nccl group ourselves (USE_TORCH_DISTRIBUTED=1) and hand Determined
``DistributedContext.from_torch_distributed()`` (across nodes, with the chief's address:
``DET_CHIEF_IP`` as the adapter sets it, else torchrun's ``MASTER_ADDR``, which the static
rendezvous sets to node 0). On a cluster (launched by
``determined.launch.torch_distributed``) Determined initialises everything itself.
The experiment config is the adapter's (``<cell>/determined/experiment.json``, written by
``pipelines.platforms.determined.adapter``). Determined's checkpoints go to
``<cell>/determined/determined/<uuid>`` (XDG_DATA_HOME) and it copies the working directory
into each one, so the worker runs in an empty folder. Rank 0 writes
``<cell>/worker_result.json`` like every other backend.

Why this is a second loop and not the shared one with Determined's engine hooks: a
``PyTorchTrial`` inverts control. ``Trainer.fit`` iterates the batches and decides the epoch,
validation and checkpoint boundaries; it calls ``train_batch`` per batch and ``evaluate_batch``
per validation batch (reduced by its own reducers), steps the wrapped scheduler after each
``train_batch`` and checkpoints the trial itself (``state_dict()`` of ``context.models``,
``optimizers`` and ``lr_schedulers``, its own RNG and trial state, on its own schedule). The
shared loop cannot run inside that, and running the shared loop instead would no longer
benchmark Determined's Trainer (the Core API, ``det.core``, would: a different platform). What
the hooks do allow is shared: each batch is the loop's step (``steps.train_step``) with
``DeterminedEngine`` (``context.backward`` / ``context.step_optimizer``; Determined zeroes the
gradients and steps the scheduler), and what every rank owes its adapter (pid file, heartbeat,
record, epoch-end hook, final test, export, result) is ``RankProcess``
(``pipelines.training.process``), as in the shared loop. The engine's checkpoint hooks are not
used: Determined's Trainer checkpoints the trial (``EpochRecorder`` writes the resume marker).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import determined as det
import determined.pytorch  # noqa: F401  (`import determined` alone does not expose it)
import torch
from determined import pytorch as dtorch

from pipelines.platforms.determined import storage
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths
from pipelines.training import strategies
from pipelines.training.cell import CellSpec
from pipelines.training.distributed import DistEnv, pin_cpu_cores
from pipelines.training.engine import TorchEngine
from pipelines.training.loop import epoch_end_hook
from pipelines.training.model import build_model
from pipelines.training.phases import CommTimer, time_ddp_communication
from pipelines.training.process import RankProcess, setup_logging
from pipelines.training.record import TrainingRecord
from pipelines.training.steps import (build_optimizer, eval_loader, forward, load_split, train_class_counts,
                                      train_loader, train_step)

log = logging.getLogger("pipelines.training.determined")


def read_marker(cell: CellPaths) -> dict | None:
    """Rank 0's marker: the newest Determined checkpoint uuid and the training record."""
    path = storage.marker(cell)
    return json.loads(path.read_text()) if path.exists() else None


class RepeatingLoader:
    """Endless batches with ``len`` = batches per epoch, as Determined's loop expects from a
    non-Determined loader; the sampler gets ``set_epoch`` each pass, as in the shared loop."""

    def __init__(self, loader, start_epoch: int, record: TrainingRecord):
        self.loader, self.start_epoch, self.record = loader, start_epoch, record

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        epoch = self.start_epoch
        while True:
            self.loader.sampler.set_epoch(epoch)
            yield from self.record.timed_batches(self.loader)  # the "data" phase, as in the loop
            epoch += 1


class EpochRecorder(dtorch.PyTorchCallback):
    """Determined's callbacks -> the phases of the shared ``TrainingRecord``.

    train = epoch start -> training workload end; eval = validation start -> end;
    checkpoint = validation end -> checkpoint uploaded (Determined checkpoints right after
    validating, both every epoch).
    """

    def __init__(self, record: TrainingRecord, cell: CellPaths, is_main: bool,
                 comm_timer: CommTimer | None = None, scheduler=None, epoch_ended=None):
        self.record, self.cell, self.is_main = record, cell, is_main
        self.comm_timer = comm_timer or CommTimer()
        self.scheduler = scheduler  # for the epoch's learning rate
        self.epoch_ended = epoch_ended  # RankProcess.epoch_ended: the epoch-end hook
        self.train_metrics: dict = {}

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.record.training_started()
        self.record.begin("train")

    def on_training_workload_end(self, avg_metrics, batch_metrics) -> None:
        self.record.end("train")
        self.record.add("communication", self.comm_timer.take())
        self.train_metrics = avg_metrics

    def on_validation_start(self) -> None:
        self.record.begin("eval")

    def on_validation_end(self, metrics) -> None:
        self.record.end("eval")
        n = float(metrics["count"])
        m = self.record.end_epoch(
            train_loss=float(self.train_metrics["loss"]), train_accuracy=float(self.train_metrics["accuracy"]),
            eval_loss=float(metrics["loss_sum"]) / n, eval_accuracy=float(metrics["correct"]) / n,
            learning_rate=self.scheduler.get_last_lr()[0] if self.scheduler is not None else None)
        if self.is_main:
            log.info("epoch %d: train loss %.4f acc %.3f | eval loss %.4f acc %.3f",
                     m.epoch, m.train_loss, m.train_accuracy, m.eval_loss, m.eval_accuracy)
        self.record.begin("checkpoint")

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        if self.record.is_open("checkpoint"):
            self.record.end("checkpoint")
        if self.is_main:
            atomic_write_json(storage.marker(self.cell), {"uuid": uuid, "record": self.record.state()})
            # what the attempts' book-keeping reads of a platform's own checkpoints (any platform's)
            atomic_write_json(self.cell.platform_checkpoint, {"epochs": self.record.epochs_done})
        if self.epoch_ended is not None:
            self.epoch_ended(self.record.epochs_done)


class DeterminedEngine(TorchEngine):
    """The shared step's engine hooks as Determined's trial context runs them: ``context.backward``
    and ``context.step_optimizer`` (which zeroes the gradients after the step); the Trainer steps
    the wrapped scheduler after each ``train_batch`` and checkpoints model, optimizer and
    scheduler itself, so those hooks are not Determined's to call."""

    def __init__(self, context: dtorch.PyTorchTrialContext) -> None:
        self.context = context

    def zero_grad(self) -> None:
        """Nothing: ``step_optimizer`` zeroes the gradients after each step."""

    def backward(self, loss: torch.Tensor) -> None:
        self.context.backward(loss)

    def step(self) -> None:
        self.context.step_optimizer(self.optimizer)

    def scheduler_step(self) -> None:
        """Nothing: the Trainer steps the wrapped scheduler (STEP_EVERY_BATCH) after ``train_batch``."""

    def _trainer_checkpoints(self, *args, **kwargs):
        raise NotImplementedError("Determined's Trainer checkpoints and restores the trial itself")

    load_model_state = load_state = state_dict = _trainer_checkpoints


class BenchmarkTrial(dtorch.PyTorchTrial):
    def __init__(self, context: dtorch.PyTorchTrialContext, launch_time: float) -> None:
        self.context = context
        self.spec = CellSpec.read(context.get_hparams()["cell_dir"])
        cfg = self.spec.config
        dist_ctx = context.distributed
        cores = tuple(sorted(os.sched_getaffinity(0))) if context.device.type == "cpu" else ()
        self.env = DistEnv(dist_ctx.rank, dist_ctx.size, dist_ctx.local_rank, context.device, cores)
        self.process = RankProcess(self.spec, self.env, launch_time, epoch_end=epoch_end_hook())  # its pid file
        self.train_set = load_split(self.spec.paths, "train")
        self.test_set = load_split(self.spec.paths, "test")
        self.validation_set = load_split(self.spec.paths, "validation")
        model, self.model_source = build_model(cfg.training.model_source, cfg.training.seed, self.spec.num_labels)
        self.raw_model = model
        # Determined wraps the model in its DDP subclass (world > 1): time its all-reduce with
        # the same hook timer as the shared loop (the "communication" phase)
        self.comm_timer = CommTimer()
        self.model = time_ddp_communication(context.wrap_model(model), self.comm_timer)
        # imbalance strategies (the only ones Determined's Trainer can take: pipelines.platforms.determined.adapter)
        imbalance = cfg.strategy().imbalance
        counts = train_class_counts(self.spec) if imbalance != "none" else None
        self.class_weights = strategies.class_weights(counts) if imbalance == "weighted_loss" else None
        self.loader = train_loader(self.train_set, cfg, self.env, counts)
        optimizer, scheduler = build_optimizer(model, cfg, len(self.loader) * cfg.training.epochs)
        self.optimizer = context.wrap_optimizer(optimizer)
        self.scheduler = context.wrap_lr_scheduler(
            scheduler, step_mode=dtorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        self.engine = DeterminedEngine(context)
        self.engine.attach(model, self.model, self.optimizer, self.scheduler, runtime=None)
        # Our loaders are plain torch ones with the shared loop's sampler (same batches).
        context.experimental.disable_dataset_reproducibility_checks()
        marker = read_marker(self.spec.cell)
        self.record = self.process.start_record(
            marker and marker["record"], len(self.loader.sampler) * self.env.world_size)
        self.recorder = EpochRecorder(self.record, self.spec.cell, self.env.is_main, self.comm_timer,
                                      scheduler=scheduler, epoch_ended=self.process.epoch_ended)
        torch.manual_seed(cfg.training.seed + self.env.rank)  # dropout stream, as in the shared loop

    def build_training_data_loader(self):
        return RepeatingLoader(self.loader, start_epoch=self.record.epochs_done, record=self.record)

    def build_validation_data_loader(self):
        return eval_loader(self.validation_set, self.spec.config.training.batch_size, self.env)

    def build_callbacks(self) -> dict:
        return {"epoch_recorder": self.recorder}

    def train_batch(self, batch, epoch_idx: int, batch_idx: int) -> dict:
        loss, logits, labels = train_step(self.engine, self.model, batch, self.env.device, self.class_weights)
        steps = len(self.loader)
        self.process.beat(epoch_idx + 1, batch_idx % steps + 1, steps)  # rank 0: where training is
        return {"loss": loss, "accuracy": (logits.argmax(-1) == labels).float().mean()}

    def evaluate_batch(self, batch, batch_idx: int) -> dict:
        loss, logits, labels = forward(self.model, batch, self.env.device)
        return {"loss_sum": loss * len(labels), "correct": (logits.argmax(-1) == labels).sum(),
                "count": torch.tensor(len(labels))}

    def evaluation_reducer(self):
        return {k: dtorch.Reducer.SUM for k in ("loss_sum", "correct", "count")}


def allow_numpy_rng_globals() -> None:
    """Determined's checkpoints hold numpy RNG state; torch 2.6+ loads weights-only. Allow
    exactly those numpy globals rather than turning weights-only loading off."""
    import numpy as np

    torch.serialization.add_safe_globals(
        [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))])


def main(cell_dir: str, launch_time: float) -> None:
    setup_logging()
    spec = CellSpec.read(cell_dir)
    cfg = spec.config
    torch.set_num_threads(cfg.training.threads_per_worker)
    if not torch.cuda.is_available() and "LOCAL_WORLD_SIZE" in os.environ:  # as the shared loop does
        pin_cpu_cores(int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["LOCAL_WORLD_SIZE"]),
                      cfg.training.threads_per_worker, int(os.environ.get("WORLD_SIZE", 1)))
    distributed, created_group = None, False
    if det.get_cluster_info() is None:  # local mode under torchrun
        os.environ["USE_TORCH_DISTRIBUTED"] = "1"
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            created_group = True
        # several nodes: the other nodes' ranks reach the chief's ZMQ server at this address
        chief_ip = os.environ.get("DET_CHIEF_IP") or os.environ.get("MASTER_ADDR")
        distributed = det.core.DistributedContext.from_torch_distributed(chief_ip=chief_ip)
        os.environ["XDG_DATA_HOME"] = str(storage.folder(spec.cell))  # checkpoint storage
    marker = read_marker(spec.cell)
    if marker:
        allow_numpy_rng_globals()
    exp_conf = json.loads(storage.experiment(spec.cell).read_text())
    with dtorch.init(hparams=exp_conf["hyperparameters"], exp_conf=exp_conf,
                     distributed=distributed, enable_tensorboard_logging=False) as context:
        trial = BenchmarkTrial(context, launch_time)
        trainer = dtorch.Trainer(trial, context)
        trainer.fit(max_length=dtorch.Epoch(cfg.training.epochs), checkpoint_period=dtorch.Epoch(1),
                    validation_period=dtorch.Epoch(1), reporting_period=dtorch.Batch(sys.maxsize),
                    checkpoint_policy="none", latest_checkpoint=marker["uuid"] if marker else None)
        last = read_marker(spec.cell) if trial.env.is_main else None  # rank 0 wrote it
        ckpt_path = storage.folder(spec.cell) / "determined" / last["uuid"] if last else None
        trial.process.finish(  # every rank: its device and host; rank 0: test, export, result
            trial.raw_model, model_source=trial.model_source, test_set=trial.test_set,
            train_samples=len(trial.train_set), checkpoint_path=str(ckpt_path) if ckpt_path else None,
            steps_per_epoch=len(trial.loader))  # one optimizer step per batch
    if created_group and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Determined trial worker (see module docstring)")
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    args = parser.parse_args()
    main(args.cell_dir, args.launch_time)
