"""The shared training loop: every backend runs exactly this code in every rank.

Started through ``pipelines.training.worker`` (torchrun, also where a platform starts it) or a
platform's own training entry (in its package, with its own ``Distributed`` seam); a platform
whose own Trainer owns the loop (a trial) shares its building blocks (``pipelines.training.steps``:
data, loaders, optimizer, training step, evaluation), its engine hooks and, with every rank of
every platform, ``RankProcess`` (``pipelines.training.process``: pid file, heartbeat, record, result).
Reads the token shards of the run folder, trains with DistributedSampler + AdamW (torch's fused kernel) + linear
warm-up, all-reduces per-epoch train loss/accuracy, evaluates on the validation split (carved
from train at ingest) each epoch, checkpoints every epoch to ``<cell>/checkpoints`` and resumes
from the newest one; the test split is evaluated once, at the end.

Distributed contract: the ``Distributed`` seam (``pipelines.training.distributed``) joins the
process group and wraps the model; by default torchrun's RANK / LOCAL_RANK / WORLD_SIZE with
gloo on CPU, nccl on GPU (with bf16 autocast) and DistributedDataParallel. Rank 0 alone logs,
checkpoints and writes ``<cell>/worker_result.json``. Phase timings come from ``TrainingRecord``
(``pipelines.training.record``), the one definition shared with a platform's own trial.

Engine: backward, the optimizer and scheduler steps and the model / optimizer / scheduler part
of each checkpoint are the seam's engine's (``pipelines.training.engine``; plain torch by
default), so a platform's engine that owns them plugs in here instead of a second loop.

Strategies: what a cell's training strategy changes (a DistributedDataParallel comm hook, local
SGD averaging, FSDP2 sharding, weighted loss) is the ``pipelines.training.runtime`` object the
loop calls at fixed points; the loop itself is the same for all of them.

Extension point: ``PIPELINES_EPOCH_END_HOOK=module:function`` is called on every rank after
each epoch's checkpoint with ``epoch``, ``rank`` and ``cell_dir`` (tests use it to inject
faults at a known point: tests/fault_injection.py); a platform's own trial resolves it here too.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.data import DataLoader, TensorDataset

from pipelines.config import BenchmarkConfig
from pipelines.training import checkpoint as ckpt
from pipelines.training.cell import EPOCH_END_HOOK_ENV, CellSpec, epoch_end_hook
from pipelines.training.distributed import DistEnv, TorchDistributed, all_reduce_sum
from pipelines.training.host import link_tx_bytes
from pipelines.training.engine import TorchEngine
from pipelines.training.model import build_model
from pipelines.training.outcome import all_gather_json, step_link_bytes
from pipelines.training.process import RankProcess
from pipelines.training.record import TrainingRecord
from pipelines.training.runtime import Replicated
from pipelines.training.steps import (build_optimizer, eval_loader, evaluate, load_split, train_class_counts,
                                      train_loader, train_step)

__all__ = ["EPOCH_END_HOOK_ENV", "epoch_end_hook", "run_training"]

log = logging.getLogger("pipelines.training")


# --- the loop ------------------------------------------------------------------------------
def run_training(spec: CellSpec, launch_time: float, distributed: TorchDistributed | None = None) -> None:
    """Train one cell in this rank; rank 0 writes worker_result.json at the end.

    ``distributed`` decides who owns the process group, wraps the model and runs its optimizer
    work (the default: torchrun's environment, DistributedDataParallel, plain torch); it is torn down here whatever
    happens.
    """
    distributed = distributed or TorchDistributed()
    torch.set_num_threads(spec.config.training.threads_per_worker)  # torchrun sets OMP threads only sometimes
    env = distributed.setup()
    try:
        process = RankProcess(spec, env, launch_time, epoch_end=epoch_end_hook())  # its pid file
        _train(process, distributed)
    finally:
        distributed.teardown()


def _resume_state(spec: CellSpec, env: DistEnv) -> tuple[dict | None, str | None]:
    """The newest good checkpoint of the cell (checksum and load verified; damaged ones are
    moved aside by rank 0), checked against this cell's training config. Its world size may
    differ from this one (an elastic launcher lost or regained a node): ``_resume_at``."""
    last, state = ckpt.latest_good_checkpoint(spec.cell.checkpoints, move_aside=env.is_main)
    if last is None:
        return None, None
    written_by = BenchmarkConfig.model_validate_json(state["config"]).training_identity()
    if written_by != spec.config.training_identity():
        raise RuntimeError(f"{last} was written by a different training config; "
                           f"delete {spec.cell.checkpoints} to start this cell over")
    return state, str(last)


def _resume_at(run: "_Run", state: dict, steps_per_epoch: int) -> None:
    """After the engine loaded the optimizer and scheduler state: this rank's RNG streams, and at
    another world size than the checkpoint's the scheduler at the same fraction of training."""
    env, seed = run.env, run.spec.config.training.seed
    ckpt.rank_rng(state["rng"], env.rank, seed)
    if state["world_size"] != env.world_size:
        step = run.record.epochs_done * steps_per_epoch
        rates = ckpt.place_scheduler(run.scheduler, step)
        if env.is_main:
            log.warning("resuming at world size %d from a checkpoint written at %d: scheduler at step %d "
                        "(%d per epoch), learning rate %.2e", env.world_size, state["world_size"], step,
                        steps_per_epoch, rates[0])


@dataclass
class _Run:
    """One rank's training of one cell: what the steps of ``_train`` share."""

    process: RankProcess  # pid file, heartbeat, record, result (pipelines.training.process)
    distributed: TorchDistributed
    runtime: Replicated  # the strategy's part (pipelines.training.runtime)
    engine: TorchEngine  # backward, optimizer and scheduler steps, checkpoint state
    loader: DataLoader
    held_out: DataLoader
    eval_batches: int | None  # FSDP: evaluation forwards every rank runs
    model: torch.nn.Module  # the model itself (FSDP: sharded in place)
    wrapped: torch.nn.Module  # what the training steps call (DDP, FSDP, a framework's wrapper)
    scheduler: object
    record: TrainingRecord
    checkpoint_path: str | None
    model_source: str
    train_samples: int
    test_set: TensorDataset
    step_tx_bytes: int | None = None  # this host's link bytes sent during this attempt's steps
    steps_trained: int = 0  # optimizer steps of this attempt

    @property
    def spec(self) -> CellSpec:
        return self.process.spec

    @property
    def env(self) -> DistEnv:
        return self.process.env


def _prepare(process: RankProcess, distributed: TorchDistributed) -> _Run:
    """Data, model, strategy runtime, engine, optimizer and record of this rank, resumed from the
    newest good checkpoint of the cell if there is one."""
    spec, env = process.spec, process.env
    cfg = spec.config
    train_set, test_set = load_split(spec.paths, "train"), load_split(spec.paths, "test")
    validation_set = load_split(spec.paths, "validation")  # per-epoch eval, time-to-target
    model, model_source = build_model(cfg.training.model_source, cfg.training.seed, spec.num_labels)  # same on every rank
    model.to(env.device)
    runtime = distributed.runtime(cfg.strategy(), env, lambda: train_class_counts(spec))
    engine = distributed.engine(env)
    loader = runtime.prepare_loader(train_loader(train_set, cfg, env, runtime.counts))
    held_out = eval_loader(validation_set, cfg.training.batch_size, env)
    eval_batches = runtime.eval_batches(len(validation_set), cfg.training.batch_size)
    steps_per_epoch = len(loader)

    state, checkpoint_path = _resume_state(spec, env)
    if state is not None:
        engine.load_model_state(model, state)  # full weights, before any wrapping or sharding
    runtime.shard(model)  # FSDP2: the optimizer below is built over the shards
    optimizer, scheduler = build_optimizer(model, cfg, steps_per_epoch * cfg.training.epochs,
                                           **distributed.optimizer_options(env))
    torch.manual_seed(cfg.training.seed + env.rank)  # dropout stream: distinct per rank, reproducible
    samples_per_epoch = runtime.samples_per_epoch(loader)  # padded rows included: they are trained
    record = process.start_record(state and state["record"], samples_per_epoch)
    wrapped = runtime.wrap(model, steps_done=record.epochs_done * steps_per_epoch)
    wrapped = engine.attach(model, wrapped, optimizer, scheduler, runtime)
    run = _Run(process, distributed, runtime, engine, loader, held_out, eval_batches, model, wrapped,
               scheduler, record, checkpoint_path, model_source, len(train_set), test_set)
    if state is not None:
        engine.load_state(state)  # optimizer and scheduler
        _resume_at(run, state, steps_per_epoch)
        if env.is_main:
            log.info("resuming from %s at epoch %d", checkpoint_path, int(state["epoch"]) + 1)
    wrapped.train()
    return run


class _Progress:
    """Rank 0's heartbeat (so a killed attempt's end is known) and a log line 4 times an epoch."""

    def __init__(self, run: _Run, total_steps: int) -> None:
        self.run, self.total_steps = run, total_steps
        self.steps_per_epoch = len(run.loader)
        self.done = 0

    def step(self, epoch: int, i: int, loss: torch.Tensor) -> None:
        """After step ``i`` (0-based) of ``epoch``."""
        self.done += 1
        run = self.run
        if self.done == 1 and run.env.is_main:  # this start's world size, and when it trained again
            ckpt.note_world_size(run.spec.cell_dir, run.record.epochs_done, run.env.world_size, time.time())
        run.process.beat(epoch + 1, i + 1, self.steps_per_epoch)  # rank 0: where training is
        if run.env.is_main and (i + 1) % max(1, self.steps_per_epoch // 4) == 0:
            rate = (time.time() - run.record.first_step) / self.done
            log.info("epoch %d/%d step %d/%d loss %.4f lr %.2e eta %.0fs", epoch + 1,
                     run.spec.config.training.epochs, i + 1, self.steps_per_epoch, loss.item(),
                     run.scheduler.get_last_lr()[0], rate * (self.total_steps - self.done))


def _train_epoch(run: _Run, epoch: int, progress: _Progress) -> tuple[float, float]:
    """One epoch's steps (inside the train phase) -> (loss, accuracy) summed over the batches of
    every rank; the train metrics are the mean over batches of the global batch mean."""
    env, record, runtime = run.env, run.record, run.runtime
    loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    acc_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    after_step = partial(runtime.after_step, record)  # local SGD: periodic parameter averaging
    tx_before = link_tx_bytes()  # on a launch host: what the steps alone move over the link
    for i, batch in enumerate(record.timed_batches(run.loader)):
        loss, logits, labels = train_step(run.engine, run.wrapped, batch, env.device, runtime.loss_weights,
                                          after_step)
        loss_sum += loss.detach()
        acc_sum += (logits.argmax(-1) == labels).double().mean()
        progress.step(epoch, i, loss)
    run.steps_trained += len(run.loader)
    if tx_before is not None and (tx_after := link_tx_bytes()) is not None:
        run.step_tx_bytes = (run.step_tx_bytes or 0) + tx_after - tx_before
    runtime.at_epoch_end(record)  # local SGD: one model for evaluation and the checkpoint
    loss_sum, acc_sum = loss_sum.item(), acc_sum.item()  # waits for the device, not the network
    with record.communicating() if env.world_size > 1 else nullcontext():
        loss_total, acc_total = all_reduce_sum([loss_sum, acc_sum], env)
    record.add("communication", run.distributed.comm_timer.take())
    return loss_total, acc_total


def _checkpoint(run: _Run, epoch: int, metrics: dict) -> None:
    """The checkpoint phase of ``epoch`` (0-based): every rank's RNG gathered, rank 0 writes."""
    env, cfg = run.env, run.spec.config
    rngs = [rng_from_json(m) for m in all_gather_json(rng_to_json(ckpt.rng_state()), env)]
    state = run.engine.state_dict(epoch + 1, run.spec.cell.checkpoints)  # every rank (FSDP: collective)
    if env.is_main:
        run.checkpoint_path = str(ckpt.save_checkpoint({
            **state, "epoch": epoch + 1, "rng": rngs, "config": cfg.to_json(),
            "world_size": env.world_size, "record": run.record.state(),
        }, run.spec.cell.checkpoints, epoch + 1))
    run.distributed.on_epoch_end(env, epoch + 1, run.checkpoint_path if env.is_main else None, metrics)


def rng_to_json(state: dict) -> dict:
    """A rank's RNG streams (``checkpoint.rng_state``) as JSON types, to gather them as JSON
    (``all_gather_json``: nothing a peer sends is unpickled); ``rng_from_json`` restores the same."""
    name, keys, pos, has_gauss, gauss = state["numpy"]
    out = {"torch": state["torch"].tolist(), "python": state["python"],
           "numpy": [name, keys.tolist(), pos, has_gauss, gauss]}
    if "cuda" in state:
        out["cuda"] = state["cuda"].tolist()
    return out


def rng_from_json(message: dict) -> dict:
    """``rng_to_json``'s message back as ``checkpoint.rng_state`` gives it: byte tensors, tuples."""
    version, internal, gauss_next = message["python"]
    name, keys, pos, has_gauss, gauss = message["numpy"]
    state = {"torch": torch.tensor(message["torch"], dtype=torch.uint8),
             "python": (int(version), tuple(int(k) for k in internal),
                        None if gauss_next is None else float(gauss_next)),
             "numpy": (str(name), torch.tensor(keys, dtype=torch.int64), int(pos), int(has_gauss), float(gauss))}
    if "cuda" in message:
        state["cuda"] = torch.tensor(message["cuda"], dtype=torch.uint8)
    return state


def _train(process: RankProcess, distributed: TorchDistributed) -> None:
    env, cfg = process.env, process.spec.config
    run = _prepare(process, distributed)
    record, steps_per_epoch = run.record, len(run.loader)
    start_epoch = record.epochs_done
    progress = _Progress(run, total_steps=steps_per_epoch * (cfg.training.epochs - start_epoch))

    for epoch in range(start_epoch, cfg.training.epochs):
        run.loader.sampler.set_epoch(epoch)
        record.training_started()
        with record.phase("train"):
            loss_total, acc_total = _train_epoch(run, epoch, progress)
        with record.phase("eval"):
            e_loss, e_correct, e_count, _, _ = evaluate(run.wrapped, run.held_out, env.device,
                                                        pad_to_batches=run.eval_batches)
            e_loss, e_correct, e_count = all_reduce_sum([e_loss, e_correct, e_count], env)
        denom = steps_per_epoch * env.world_size
        m = record.end_epoch(train_loss=loss_total / denom, train_accuracy=acc_total / denom,
                             eval_loss=e_loss / e_count, eval_accuracy=e_correct / e_count,
                             learning_rate=run.scheduler.get_last_lr()[0])
        if env.is_main:
            log.info("epoch %d: train loss %.4f acc %.3f | eval loss %.4f acc %.3f | %.1f samples/s",
                     m.epoch, m.train_loss, m.train_accuracy, m.eval_loss, m.eval_accuracy,
                     m.samples_per_second)
        with record.phase("checkpoint"):
            _checkpoint(run, epoch, m.model_dump())
        process.epoch_ended(epoch + 1)
    _finish(run)


def _finish(run: _Run) -> None:
    """Every rank: the link bytes, the final model and the device labels (collectives);
    rank 0: final test, export, result (``RankProcess.finish``)."""
    spec, cfg = run.spec, run.spec.config
    step_link = step_link_bytes(run.env, run.step_tx_bytes, run.steps_trained)
    model = run.runtime.final_model(  # FSDP: one unsharded copy on rank 0 (a collective)
        run.model, lambda: build_model(cfg.training.model_source, cfg.training.seed, spec.num_labels)[0])
    run.process.finish(model, model_source=run.model_source, test_set=run.test_set,
                       train_samples=run.train_samples, checkpoint_path=run.checkpoint_path,
                       steps_per_epoch=len(run.loader), comm_bytes_per_step=run.runtime.comm_bytes_per_step,
                       link_bytes_per_train_step=step_link,
                       strategy_fields=getattr(run.runtime, "result_fields", dict)())  # async: staleness
