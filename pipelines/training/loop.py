"""The shared training loop: every backend runs exactly this code in every rank.

Started through ``pipelines.training.worker`` (torchrun, TorchDistributor); the Determined
trial reuses its pieces (data, loaders, optimizer, evaluation, result) and its timing record.
Reads the token shards of the run folder, trains with DistributedSampler + AdamW + linear
warm-up, all-reduces per-epoch train loss/accuracy, evaluates on the validation split (carved
from train at ingest) each epoch, checkpoints every epoch to ``<cell>/checkpoints`` and resumes
from the newest one; the test split is evaluated once, at the end.

Distributed contract: the ``Distributed`` seam (``pipelines.training.distributed``) joins the
process group and wraps the model; by default torchrun's RANK / LOCAL_RANK / WORLD_SIZE with
gloo on CPU, nccl on GPU (with bf16 autocast) and DDP. Rank 0 alone logs, checkpoints and
writes ``<cell>/worker_result.json``. Phase timings come from ``TrainingRecord``
(``pipelines.training.record``), the one definition shared with the Determined trial.

Extension point: ``PIPELINES_EPOCH_END_HOOK=module:function`` is called on every rank after
each epoch's checkpoint with ``epoch``, ``rank`` and ``cell_dir`` (tests use it to inject
faults at a known point: tests/fault_injection.py).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import platform
import resource
import shutil
import socket
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from pipelines import attempts
from pipelines.cell import CellSpec
from pipelines.config import BenchmarkConfig
from pipelines.data.tokens import read_token_split
from pipelines.metrics import classification_metrics
from pipelines.paths import CellPaths, RunPaths
from pipelines.results import CellResult, TestMetrics
from pipelines.training import checkpoint as ckpt
from pipelines.training import strategies
from pipelines.training.distributed import (
    DistEnv,
    TorchDistributed,
    all_reduce_sum,
    autocast,
    device_name,
    placement,
)
from pipelines.training.model import build_model
from pipelines.training.record import TrainingRecord

log = logging.getLogger("pipelines.training")
EPOCH_END_HOOK_ENV = "PIPELINES_EPOCH_END_HOOK"


# --- data ---------------------------------------------------------------------------------
def load_split(paths: RunPaths, split: str) -> TensorDataset:
    ids, mask, labels = read_token_split(paths.token_split(split))
    return TensorDataset(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels))


def train_loader(dataset: TensorDataset, config: BenchmarkConfig, env: DistEnv,
                 counts: list[int] | None = None) -> DataLoader:
    """Seeded shuffling identical under every launcher; call ``sampler.set_epoch`` per epoch.

    Strategy ``imbalance=weighted_sampler``: rows drawn with probability 1 / class count
    (``counts``: train rows per label, from the manifest), each rank its share."""
    if config.strategy().imbalance == "weighted_sampler":
        if counts is None:
            raise ValueError("imbalance=weighted_sampler needs the train split's class counts")
        sampler = strategies.DistributedWeightedSampler(
            strategies.row_weights(dataset.tensors[2], counts), env.world_size, env.rank, config.seed)
    else:
        sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank,
                                     shuffle=True, seed=config.seed)
    return DataLoader(dataset, batch_size=config.batch_size, sampler=sampler)


def loss_weights(spec: CellSpec) -> torch.Tensor | None:
    """Strategy ``imbalance=weighted_loss``: class weights N / (K * count) from the manifest."""
    if spec.config.strategy().imbalance != "weighted_loss":
        return None
    return strategies.class_weights(train_class_counts(spec))


def train_class_counts(spec: CellSpec) -> list[int]:
    from pipelines.data.manifest import read_manifest

    return strategies.class_counts(read_manifest(spec.paths), spec.labels)


def eval_loader(dataset: TensorDataset, batch_size: int, env: DistEnv | None = None) -> DataLoader:
    """Rank r evaluates rows r, r+W, ... (no padding: every test row counted once)."""
    if env is not None and env.world_size > 1:
        dataset = Subset(dataset, range(env.rank, len(dataset), env.world_size))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


# --- model steps -----------------------------------------------------------------------------
def build_optimizer(model: torch.nn.Module, config: BenchmarkConfig, total_steps: int, **adamw_options):
    """AdamW (no decay on biases/LayerNorm) + linear warm-up then linear decay, per batch.

    ``adamw_options`` go to ``torch.optim.AdamW`` as they are (e.g. ``fused=True``); none by default.
    """
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for _, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate, **adamw_options,
    )
    warmup = int(config.warmup_ratio * total_steps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def forward(model, batch, device: torch.device, class_weights: torch.Tensor | None = None):
    """-> (mean loss, logits, labels) for one batch; the loss is computed in fp32
    (``class_weights``: the weighted_loss strategy's per-class weights, training only)."""
    ids, mask, labels = (t.to(device, non_blocking=True) for t in batch)
    with autocast(device):
        logits = model(input_ids=ids, attention_mask=mask).logits
    weight = None if class_weights is None else class_weights.to(device)
    return F.cross_entropy(logits.float(), labels, weight=weight), logits, labels


@torch.no_grad()
def evaluate(model, loader: DataLoader, device: torch.device, keep_predictions: bool = False,
             pad_to_batches: int | None = None):
    """-> (loss_sum, correct, count, predictions, labels) over one loader.

    ``pad_to_batches`` (FSDP): repeat uncounted forwards of the last batch up to that many,
    so every rank joins the same number of all-gathers even when its share is a batch shorter."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count, preds, labels = 0.0, 0, 0, [], []
    batch = None
    for batch in loader:
        loss, logits, y = forward(model, batch, device)
        pred = logits.argmax(-1)
        loss_sum += loss.item() * len(y)
        correct += int((pred == y).sum())
        count += len(y)
        if keep_predictions:
            preds.append(pred.cpu())
            labels.append(y.cpu())
    for _ in range(max(0, (pad_to_batches or 0) - len(loader))):
        if batch is not None:
            forward(model, batch, device)
    model.train(was_training)
    if keep_predictions:
        return loss_sum, correct, count, torch.cat(preds).numpy(), torch.cat(labels).numpy()
    return loss_sum, correct, count, None, None


def worker_devices(env: DistEnv) -> tuple[list[str], list[str]]:
    """Every rank's device label (``cuda:0``, ``cpu:cores 1``) and placement (host, Spark
    executor: ``distributed.placement``), gathered to every rank."""
    mine = (env.device_label, placement())
    labels = [mine] * env.world_size
    if env.world_size > 1:
        dist.all_gather_object(labels, mine)
    return [d for d, _ in labels], [p for _, p in labels]


def final_test(model, test_set: TensorDataset, spec: CellSpec, device: torch.device) -> tuple[TestMetrics, float]:
    """Rank 0: every test row, predictions kept -> classification metrics and its wall time."""
    start = time.perf_counter()
    loss_sum, _, count, preds, labels = evaluate(
        model, eval_loader(test_set, spec.config.batch_size), device, keep_predictions=True)
    metrics = classification_metrics(labels, preds, loss_sum / count, spec.labels)
    return metrics, time.perf_counter() - start


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
                  export_seconds: float = 0.0, comm_bytes_per_step: float | None = None) -> CellResult:
    """Rank 0's result: the same fields, from the same record, under every backend."""
    cfg = spec.config  # the cell's config: seed + repeat, per-worker batch, scaled lr
    return CellResult(
        backend=spec.backend, world_size=env.world_size, repeat=spec.repeat,
        device=device_name(env.device), model_source=model_source, model_name=cfg.model_source,
        train_samples=train_samples, test_samples=test_samples, max_seq_len=cfg.max_seq_len,
        num_labels=spec.num_labels, batch_size_per_worker=cfg.batch_size,
        global_batch_size=cfg.batch_size * env.world_size, batch_policy=cfg.batch_policy,
        lr_scaling=cfg.lr_scaling, learning_rate=cfg.learning_rate, seed=cfg.seed, devices=devices,
        placements=placements or [],
        epochs=record.history, test=test, **record.timings(launch_time, test_seconds),
        phases=record.cell_phases(launch_time, final_test_seconds=test_seconds, export_seconds=export_seconds),
        work_end=time.time(),
        peak_memory_mb=peak_memory_mb(env.device), checkpoint_path=checkpoint_path,
        model_path=model_path, resumed_from_epoch=record.resumed_from_epoch, versions=versions(),
        host=socket.gethostname(), **cfg.strategy().result_fields(), comm_bytes_per_step=comm_bytes_per_step,
    )


def write_worker_result(result: CellResult, spec: CellSpec) -> None:
    result.write(spec.cell.worker_result)


def epoch_end_hook():
    """The callable named by PIPELINES_EPOCH_END_HOOK (``module:function``), or None."""
    target = os.environ.get(EPOCH_END_HOOK_ENV)
    if not target:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


# --- the loop ------------------------------------------------------------------------------
def run_training(spec: CellSpec, launch_time: float, distributed: TorchDistributed | None = None) -> None:
    """Train one cell in this rank; rank 0 writes worker_result.json at the end.

    ``distributed`` decides who owns the process group and wraps the model (the default:
    torchrun's environment and DDP); it is torn down here whatever happens.
    """
    distributed = distributed or TorchDistributed()
    torch.set_num_threads(spec.config.threads_per_worker)  # torchrun sets OMP threads only sometimes
    env = distributed.setup()
    try:
        _train(spec, env, distributed, launch_time)
    finally:
        distributed.teardown()


def _resume_state(spec: CellSpec, env: DistEnv) -> tuple[dict | None, str | None]:
    """The newest good checkpoint of the cell (checksum and load verified; damaged ones are
    moved aside by rank 0), checked against this cell's config and world size."""
    last, state = ckpt.latest_good_checkpoint(spec.cell.checkpoints, move_aside=env.is_main)
    if last is None:
        return None, None
    written_by = BenchmarkConfig.model_validate_json(state["config"]).training_identity()
    if written_by != spec.config.training_identity() or state["world_size"] != env.world_size:
        raise RuntimeError(f"{last} was written by a different training config or world size; "
                           f"delete {spec.cell.checkpoints} to start this cell over")
    return state, str(last)


def _train(spec: CellSpec, env: DistEnv, distributed: TorchDistributed, launch_time: float) -> None:
    cfg = spec.config
    strategy = cfg.strategy()  # the cell's one strategy (pipelines.training.strategies)
    sharded = strategy.sharding == "fsdp" and env.world_size > 1
    train_set, test_set = load_split(spec.paths, "train"), load_split(spec.paths, "test")
    validation_set = load_split(spec.paths, "validation")  # per-epoch eval, time-to-target
    model, model_source = build_model(cfg.model_source, cfg.seed, spec.num_labels)  # same on every rank
    model.to(env.device)
    counts = train_class_counts(spec) if strategy.imbalance != "none" else None
    weights = strategies.class_weights(counts) if strategy.imbalance == "weighted_loss" else None
    loader = distributed.prepare_loader(train_loader(train_set, cfg, env, counts), env)
    if strategy.imbalance == "weighted_sampler" and not isinstance(loader.sampler, strategies.DistributedWeightedSampler):
        # a framework's loader preparation replaced the sampler: refuse rather than train unweighted
        raise RuntimeError(f"strategy {strategy.name!r}: {type(distributed).__name__}.prepare_loader replaced the "
                           f"weighted sampler with {type(loader.sampler).__name__}; keep the loop's sampler")
    held_out = eval_loader(validation_set, cfg.batch_size, env)
    # FSDP: every rank runs as many evaluation forwards as the rank with the largest share
    eval_batches = math.ceil(math.ceil(len(validation_set) / env.world_size) / cfg.batch_size) if sharded else None
    steps_per_epoch = len(loader)

    state, checkpoint_path = _resume_state(spec, env)
    if state is not None:
        model.load_state_dict(state["model"])  # full weights, before any wrapping or sharding
    if sharded:  # FSDP2 replaces the parameters: shard first, then build the optimizer over the shards
        wrapped = distributed.shard_model(model, env)
    optimizer, scheduler = build_optimizer(model, cfg, steps_per_epoch * cfg.epochs,
                                           **distributed.optimizer_options(env))
    torch.manual_seed(cfg.seed + env.rank)  # dropout stream: distinct per rank, reproducible
    samples_per_epoch = len(loader.sampler) * env.world_size  # padded rows included: they are trained

    if state is not None:
        strategies.load_optimizer_state(model, optimizer, state["optimizer"], sharded)
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"][env.rank])
        if env.is_main:
            log.info("resuming from %s at epoch %d", checkpoint_path, int(state["epoch"]) + 1)
    record = TrainingRecord.from_state(state and state["record"], samples_per_epoch)
    start_epoch = record.epochs_done

    if not sharded:
        wrapped = distributed.wrap_model(model, env)
    runtime = strategies.apply_strategy(wrapped, strategy, env.world_size, timer=distributed.comm_timer)
    if runtime.averager is not None:  # local SGD resumes its averaging period where it was
        runtime.averager.step += start_epoch * steps_per_epoch
    if env.is_main and not strategy.is_default:
        log.info("strategy %s (%s)", strategy.name, strategy.model_dump())
    wrapped.train()
    total_steps = steps_per_epoch * (cfg.epochs - start_epoch)
    hook = epoch_end_hook()
    step_done, last_beat = 0, 0.0

    for epoch in range(start_epoch, cfg.epochs):
        loader.sampler.set_epoch(epoch)
        record.training_started()
        with record.phase("train"):
            loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
            acc_sum = torch.zeros((), dtype=torch.float64, device=env.device)
            for i, batch in enumerate(record.timed_batches(loader)):
                loss, logits, labels = forward(wrapped, batch, env.device, weights)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                with record.communicating() if runtime.averager is not None else nullcontext():
                    runtime.after_step()  # local SGD: periodic parameter averaging
                scheduler.step()
                loss_sum += loss.detach()
                acc_sum += (logits.argmax(-1) == labels).double().mean()
                step_done += 1
                if env.is_main and time.time() - last_beat > 1.0:  # a killed attempt's end
                    attempts.beat(spec.cell)
                    last_beat = time.time()
                if env.is_main and (i + 1) % max(1, steps_per_epoch // 4) == 0:
                    rate = (time.time() - record.first_step) / step_done
                    log.info("epoch %d/%d step %d/%d loss %.4f lr %.2e eta %.0fs", epoch + 1,
                             cfg.epochs, i + 1, steps_per_epoch, loss.item(),
                             scheduler.get_last_lr()[0], rate * (total_steps - step_done))
            with record.communicating() if runtime.averager is not None else nullcontext():
                runtime.synchronise()  # local SGD: one model for evaluation and the checkpoint
            # train metrics = mean over batches of the global batch mean (as Determined reports)
            loss_sum, acc_sum = loss_sum.item(), acc_sum.item()  # waits for the device, not the network
            with record.communicating() if env.world_size > 1 else nullcontext():
                loss_total, acc_total = all_reduce_sum([loss_sum, acc_sum], env)
            record.add("communication", distributed.comm_timer.take())
        with record.phase("eval"):
            e_loss, e_correct, e_count, _, _ = evaluate(wrapped, held_out, env.device, pad_to_batches=eval_batches)
            e_loss, e_correct, e_count = all_reduce_sum([e_loss, e_correct, e_count], env)
        denom = steps_per_epoch * env.world_size
        m = record.end_epoch(train_loss=loss_total / denom, train_accuracy=acc_total / denom,
                             eval_loss=e_loss / e_count, eval_accuracy=e_correct / e_count,
                             learning_rate=scheduler.get_last_lr()[0])
        if env.is_main:
            log.info("epoch %d: train loss %.4f acc %.3f | eval loss %.4f acc %.3f | %.1f samples/s",
                     m.epoch, m.train_loss, m.train_accuracy, m.eval_loss, m.eval_accuracy,
                     m.samples_per_second)
        with record.phase("checkpoint"):
            # RNG of every rank gathered to rank 0, which alone writes
            rngs = [None] * env.world_size
            if env.world_size > 1:
                dist.all_gather_object(rngs, ckpt.rng_state())
            else:
                rngs = [ckpt.rng_state()]
            model_state, optimizer_state = strategies.full_state_dicts(model, optimizer, sharded)  # FSDP: collective
            if env.is_main:
                checkpoint_path = str(ckpt.save_checkpoint({
                    "model": model_state, "optimizer": optimizer_state,
                    "scheduler": scheduler.state_dict(), "epoch": epoch + 1, "rng": rngs,
                    "config": cfg.to_json(), "world_size": env.world_size, "record": record.state(),
                }, spec.cell.checkpoints, epoch + 1))
            distributed.on_epoch_end(env, epoch + 1, checkpoint_path if env.is_main else None, m.model_dump())
        if hook is not None:
            hook(epoch=epoch + 1, rank=env.rank, cell_dir=spec.cell_dir)

    devices, placements = worker_devices(env)
    if sharded:  # the final test and the export use one unsharded copy on rank 0
        full = strategies.full_model_state(model, sharded=True)  # collective: every rank
        if env.is_main:
            model, _ = build_model(cfg.model_source, cfg.seed, spec.num_labels)
            model.load_state_dict(full)
            model.to(env.device)
    if not env.is_main:
        return
    test, test_seconds = final_test(model, test_set, spec, env.device)
    log.info("test: accuracy %.3f macro-F1 %.3f loss %.4f", test.accuracy, test.f1, test.loss)
    model_path, export_seconds = timed_export(model, spec.cell)
    write_worker_result(worker_result(
        spec, env, record, launch_time=launch_time, model_source=model_source, test=test,
        test_seconds=test_seconds, train_samples=len(train_set), test_samples=len(test_set),
        checkpoint_path=checkpoint_path, model_path=model_path, devices=devices,
        placements=placements, export_seconds=export_seconds,
        comm_bytes_per_step=runtime.comm_bytes_per_step), spec)
