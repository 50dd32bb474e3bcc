"""Training strategies in the shared loop: DDP comm hooks, local SGD, FSDP2, class imbalance.

``pipelines.config.TrainingStrategy`` says what a cell does; this module does it with
PyTorch's own pieces, so every platform that runs the shared loop gets them:

- ``comm_hook``: ``DistributedDataParallel.register_comm_hook`` with
  ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook`` or ``powerSGD_hook``
  (``PowerSGDState``: rank ``powersgd_rank``, error feedback, compression from step
  ``POWERSGD_START_ITER``: before it PowerSGD all-reduces plainly, as the library requires);
- ``sync_every`` > 1: local SGD, ``post_localSGD_hook`` with ``post_local_gradient_allreduce``
  off (no gradient traffic at all) and ``PeriodicModelAverager`` averaging the parameters of
  every rank after every ``sync_every``-th optimizer step, and at each epoch's end (so
  evaluation and the checkpoint see one model);
- ``sharding=fsdp``: ``torch.distributed.fsdp.fully_shard`` on every transformer layer and the
  root; checkpoints and the final model go through the full (unsharded) state dict API
  (``torch.distributed.checkpoint.state_dict``), so they load like DDP's;
- ``imbalance``: ``DistributedWeightedSampler`` (rows drawn with probability 1 / class count,
  seeded per epoch, each rank its share) or class weights N / (K * count) in the loss, both from
  the snapshot manifest's train label counts.

``StrategyRuntime.comm_bytes_per_step``: the payload this rank hands to collectives per step
(hook buckets after compression, PowerSGD's P/Q factors and uncompressed tensors from its own
counters, local SGD's averaged parameters); for plain DDP the gradient bytes it all-reduces.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, Sampler

from pipelines.config import TrainingStrategy
from pipelines.training.phases import CommTimer

POWERSGD_START_ITER = 2  # the smallest start PowerSGD allows with error feedback (its docs)


# --- class imbalance -----------------------------------------------------------------------------
def class_counts(manifest: dict, labels: list[int]) -> list[int]:
    """Train rows per label of the task, from the snapshot manifest (written by ingest)."""
    per_label = manifest.get("splits", {}).get("train", {}).get("rows_per_label") or {}
    counts = [int(per_label.get(str(k), 0)) for k in labels]
    if any(c == 0 for c in counts):
        raise ValueError(f"the manifest's train split has no rows of some label ({per_label}); "
                         "imbalance strategies need every class in train")
    return counts


def class_weights(counts: list[int]) -> torch.Tensor:
    """Loss weights N / (K * count): 1.0 for every class of a balanced split (sklearn's 'balanced')."""
    total, k = sum(counts), len(counts)
    return torch.tensor([total / (k * c) for c in counts], dtype=torch.float32)


class DistributedWeightedSampler(Sampler[int]):
    """Rows drawn with replacement, probability proportional to ``weights``; every rank takes
    its own ``num_samples`` of one seeded draw (``set_epoch`` reseeds), so the ranks together
    cover one epoch's worth of rows, as ``DistributedSampler`` does for uniform shuffling."""

    def __init__(self, weights: torch.Tensor, num_replicas: int, rank: int, seed: int) -> None:
        self.weights = torch.as_tensor(weights, dtype=torch.double)
        self.num_replicas, self.rank, self.seed, self.epoch = num_replicas, rank, seed, 0
        self.num_samples = math.ceil(len(self.weights) / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        draw = torch.multinomial(self.weights, self.total_size, replacement=True, generator=generator)
        return iter(draw[self.rank:self.total_size:self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples


def row_weights(labels: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Per-row sampling weight 1 / (its class's count): every class equally likely per draw."""
    per_class = torch.tensor([1.0 / c for c in counts], dtype=torch.double)
    return per_class[labels.long()]


def train_sampler(strategy: TrainingStrategy, dataset, world_size: int, rank: int, seed: int,
                  counts: list[int] | None = None) -> Sampler[int]:
    """This rank's sampler of the train split: seeded ``DistributedSampler`` shuffling, or for
    ``imbalance=weighted_sampler`` a ``DistributedWeightedSampler`` over ``counts`` (train rows
    per label); either way ``set_epoch`` reseeds it."""
    if strategy.imbalance != "weighted_sampler":
        return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    if counts is None:
        raise ValueError("imbalance=weighted_sampler needs the train split's class counts")
    return DistributedWeightedSampler(row_weights(dataset.tensors[2], counts), world_size, rank, seed)


# --- communication -------------------------------------------------------------------------------
@dataclass
class StrategyRuntime:
    """What a strategy needs during training: the local SGD averager and the byte counters."""

    strategy: TrainingStrategy
    averager: object | None = None  # PeriodicModelAverager
    parameters: list[torch.nn.Parameter] = field(default_factory=list)
    plain_grad_bytes: int = 0  # DDP without a hook: every gradient all-reduced every step
    hook_bytes: int = 0
    averaged_bytes: int = 0
    steps: int = 0
    measured: bool = True

    def after_step(self) -> None:
        """After ``optimizer.step()``: local SGD's periodic averaging, and the step count."""
        self.steps += 1
        if self.averager is not None:
            if (self.averager.step - self.averager.warmup_steps) % self.averager.period == 0:
                self.averaged_bytes += _bytes(self.parameters)
            self.averager.average_parameters(self.parameters)

    def synchronise(self) -> None:
        """Local SGD: average every rank's parameters now (epoch end: one model to evaluate/save)."""
        if self.averager is not None:
            from torch.distributed.algorithms.model_averaging.utils import average_parameters

            average_parameters(iter(self.parameters), dist.group.WORLD)
            self.averaged_bytes += _bytes(self.parameters)

    @property
    def comm_bytes_per_step(self) -> float | None:
        if not self.measured or not self.steps:
            return None
        return (self.plain_grad_bytes * self.steps + self.hook_bytes + self.averaged_bytes) / self.steps


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _counting(hook, runtime: StrategyRuntime, compressed_element_size: int | None = None):
    """``hook`` with the bytes of each bucket it sends added to ``runtime.hook_bytes``."""

    def counted(state, bucket):
        buffer = bucket.buffer()
        if hasattr(state, "total_numel_after_compression"):  # PowerSGD keeps its own counts
            before = state.total_numel_after_compression
            future = hook(state, bucket)
            sent = state.total_numel_after_compression - before  # 0 before compression starts
            runtime.hook_bytes += (sent or buffer.numel()) * buffer.element_size()
            if dist.get_backend() == "gloo":
                # PowerSGD chains 3 all-reduces per bucket in future callbacks; with several
                # buckets in flight, two gloo ranks can issue them in different orders (measured:
                # "Received data size doesn't match expected size" on BERT-tiny's buckets). Finish
                # each bucket's chain before the next bucket starts: same order on every rank.
                future.wait()
            return future
        size = compressed_element_size or buffer.element_size()
        runtime.hook_bytes += 0 if compressed_element_size == 0 else buffer.numel() * size
        return hook(state, bucket)

    return counted


def apply_strategy(wrapped: torch.nn.Module, strategy: TrainingStrategy, world_size: int,
                   timer: CommTimer | None = None) -> StrategyRuntime:
    """Register the strategy's hook on the wrapped model (DDP's own all-reduce, as a hook, for
    the default), timed by ``timer`` (the "communication" phase); the runtime counts its traffic."""
    runtime = StrategyRuntime(strategy=strategy, parameters=[p for p in wrapped.parameters() if p.requires_grad])

    def register(state, hook) -> None:
        wrapped.register_comm_hook(state, timer.wrap(hook) if timer is not None else hook)

    if world_size == 1:
        runtime.measured = False
        return runtime
    if strategy.sharding == "fsdp":
        runtime.measured = False  # FSDP's all-gathers and reduce-scatters are not hooks
        return runtime
    if not isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        if strategy.comm_hook != "none" or strategy.sync_every > 1:
            raise TypeError(f"strategy {strategy.name!r} needs a DistributedDataParallel model to register "
                            f"its comm hook on; this backend wrapped the model as {type(wrapped).__name__}")
        runtime.measured = False
        return runtime
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if strategy.comm_hook == "fp16":
        register(None, _counting(default_hooks.fp16_compress_hook, runtime, 2))
    elif strategy.comm_hook == "bf16":
        register(None, _counting(default_hooks.bf16_compress_hook, runtime, 2))
    elif strategy.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=strategy.powersgd_rank,
                                            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True,
                                            warm_start=True)
        register(state, _counting(powerSGD_hook.powerSGD_hook, runtime))
    elif strategy.sync_every > 1:
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        # local from the first step: no gradient all-reduce at all, parameters averaged periodically
        state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=0,
                                                     post_local_gradient_allreduce=False)
        register(state, _counting(post_localSGD_hook.post_localSGD_hook, runtime, 0))
        runtime.averager = PeriodicModelAverager(period=strategy.sync_every, warmup_steps=0)
        runtime.averager.step = 1  # 1-based step numbers: average after steps p, 2p, ...
    else:
        runtime.plain_grad_bytes = _bytes(runtime.parameters)  # every gradient, every step
        if timer is not None:
            register(None, default_hooks.allreduce_hook)  # what DDP does built in, timed
    return runtime


# --- FSDP2 ---------------------------------------------------------------------------------------
def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard every transformer layer, then the root (the model itself becomes an FSDP module)."""
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if type(module).__name__.endswith("Layer") and hasattr(module, "attention"):  # BertLayer & co
            fully_shard(module)
    fully_shard(model)
    return model


def full_state_dicts(model: torch.nn.Module, optimizer, sharded: bool) -> tuple[dict, dict]:
    """(model, optimizer) state dicts as a single process would have them. Sharded: a
    collective (call on every rank); rank 0 receives the full tensors, on CPU."""
    if not sharded:
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_model_state(model: torch.nn.Module, sharded: bool) -> dict:
    """The model's full state dict (collective when sharded; rank 0 gets the tensors)."""
    if not sharded:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def whole_model_on_main(model: torch.nn.Module, full: dict, rebuild, env) -> torch.nn.Module:
    """Rank 0: a fresh model (``rebuild()``) holding the gathered ``full`` state, on its device;
    every other rank keeps ``model`` (the final test and the export run on rank 0 alone)."""
    if not env.is_main:
        return model
    whole = rebuild()
    whole.load_state_dict(full)
    whole.to(env.device)
    return whole

def load_optimizer_state(model: torch.nn.Module, optimizer, state: dict, sharded: bool) -> None:
    """Load a checkpoint's optimizer state (full, as ``full_state_dicts`` wrote it)."""
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
