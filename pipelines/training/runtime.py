"""What a cell's training strategy does inside the shared loop, as one object the loop calls.

``runtime_for`` picks the object for the cell's strategy; the loop
(``pipelines.training.loop``) calls the same methods for every strategy, in this order:

    runtime = runtime_for(strategy, distributed, env, class_counts)
    loader = runtime.prepare_loader(train_loader(..., runtime.counts))
    runtime.shard(model)                        # before the optimizer is built over the parameters
    runtime.load_optimizer_state(model, optimizer, state)      # resume
    wrapped = runtime.wrap(model, steps_done)   # after the resume; what the training steps call
    runtime.samples_per_epoch(loader)           # the rows one epoch trains, every rank's
    train_step(engine, wrapped, batch, device, runtime.loss_weights, after_step)  # steps; runtime.after_step
    runtime.at_epoch_end(record)                # before the epoch's metrics and evaluation
    evaluate(..., pad_to_batches=runtime.eval_batches(rows, batch_size))
    runtime.checkpoint_state(model, optimizer)  # every rank (collective when sharded)
    runtime.final_model(model, rebuild)         # every rank; rank 0 gets the model to test
    runtime.comm_bytes_per_step                 # for the result

- ``Replicated``: the distributed seam's ``wrap_model`` (DistributedDataParallel) with the
  strategy's comm hook registered on it (``strategies.apply_strategy``); also every one-process cell;
- ``LocalSGD``: replicated, plus the periodic parameter averaging after steps and at epoch end,
  timed as communication; on resume it continues its averaging period;
- ``Sharded``: FSDP2 (the seam's ``shard_model``, before the optimizer), full state dicts for
  checkpoints and the final model, padded evaluation so every rank joins the same all-gathers;
- ``Pipelined`` (``pipelines.training.pipeline``): the model's layers split over the ranks, a
  training step the pipeline schedule's forward and backward of the global batch;
- ``Asynchronous`` (``pipelines.training.parameter_server``): no wrapper, every rank pushes its
  gradient to a parameter server in rank 0's process and pulls its weights, without a barrier.

Class imbalance (weighted sampler or weighted loss) works the same under each of them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pipelines.config import TrainingStrategy
from pipelines.training import parameter_server, strategies
from pipelines.training.record import TrainingRecord

if TYPE_CHECKING:  # the seam calls runtime_for: annotations only here
    from pipelines.training.distributed import DistEnv, TorchDistributed
    from pipelines.training.pipeline import Pipelined

log = logging.getLogger("pipelines.training")


class Replicated:
    """DistributedDataParallel (or the seam's own wrapper) with the strategy's comm hook; one
    process: the model."""

    sharded = False

    def __init__(self, strategy: TrainingStrategy, distributed: TorchDistributed, env: DistEnv,
                 class_counts: Callable[[], list[int]]) -> None:
        self.strategy, self.distributed, self.env = strategy, distributed, env
        # train rows per label (the manifest's), read only when an imbalance strategy needs them
        self.counts = class_counts() if strategy.imbalance != "none" else None
        self.loss_weights = strategies.class_weights(self.counts) if strategy.imbalance == "weighted_loss" else None
        self.hooks: strategies.StrategyRuntime | None = None  # set by ``wrap``

    # --- data -----------------------------------------------------------------------------
    def prepare_loader(self, loader):
        """The seam's loader preparation, refused when it replaced the weighted sampler."""
        loader = self.distributed.prepare_loader(loader, self.env)
        if self.strategy.imbalance == "weighted_sampler" and \
                not isinstance(loader.sampler, strategies.DistributedWeightedSampler):
            # a framework's loader preparation replaced the sampler: refuse rather than train unweighted
            raise RuntimeError(f"strategy {self.strategy.name!r}: {type(self.distributed).__name__}.prepare_loader "
                               f"replaced the weighted sampler with {type(loader.sampler).__name__}; "
                               "keep the loop's sampler")
        return loader

    def eval_batches(self, rows: int, batch_size: int) -> int | None:
        """Evaluation forwards every rank must run (None: as many as its own share needs)."""
        return None

    # --- model ----------------------------------------------------------------------------
    def shard(self, model: torch.nn.Module) -> None:
        """Before the optimizer is built: nothing to do for a replicated model."""

    def wrap(self, model: torch.nn.Module, steps_done: int) -> torch.nn.Module:
        """The module the training steps call, with the strategy's comm hook registered on it
        (``steps_done``: optimizer steps of the epochs already trained, on resume)."""
        wrapped = self._wrapped(model)
        self.hooks = strategies.apply_strategy(wrapped, self.strategy, self.env.world_size,
                                               timer=self.distributed.comm_timer)
        if self.env.is_main and not self.strategy.is_default:
            log.info("strategy %s (%s)", self.strategy.name, self.strategy.model_dump())
        return wrapped

    def _wrapped(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.distributed.wrap_model(model, self.env)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer, state: dict) -> None:
        strategies.load_optimizer_state(model, optimizer, state, self.sharded)

    # --- steps ----------------------------------------------------------------------------
    def samples_per_epoch(self, loader) -> int:
        """The rows one epoch trains on all ranks together (padded rows included: they are trained)."""
        return len(loader.sampler) * self.env.world_size

    def after_step(self, record: TrainingRecord) -> None:
        """After ``optimizer.step()``: count the step (bytes per step)."""
        self.hooks.after_step()

    def at_epoch_end(self, record: TrainingRecord) -> None:
        """After the epoch's last step: every replica already holds the same model."""

    # --- checkpoint and result ------------------------------------------------------------
    def checkpoint_state(self, model: torch.nn.Module, optimizer) -> tuple[dict, dict]:
        """(model, optimizer) state dicts as one process would have them."""
        return strategies.full_state_dicts(model, optimizer, self.sharded)

    def final_model(self, model: torch.nn.Module, rebuild: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """The trained model for rank 0's final test and export (call on every rank)."""
        return model

    @property
    def comm_bytes_per_step(self) -> float | None:
        return self.hooks.comm_bytes_per_step if self.hooks is not None else None

    def result_fields(self) -> dict:
        """CellResult fields only this strategy records (async: its staleness); rank 0's are the result's."""
        return {}


class LocalSGD(Replicated):
    """``sync_every`` > 1 on several ranks: no gradient all-reduce; parameters averaged after
    every ``sync_every``-th step and at each epoch's end (one model to evaluate and save)."""

    def wrap(self, model: torch.nn.Module, steps_done: int) -> torch.nn.Module:
        wrapped = super().wrap(model, steps_done)
        self.hooks.averager.step += steps_done  # resumes its averaging period where it was
        return wrapped

    def after_step(self, record: TrainingRecord) -> None:
        with record.communicating():  # the periodic parameter averaging
            self.hooks.after_step()

    def at_epoch_end(self, record: TrainingRecord) -> None:
        with record.communicating():
            self.hooks.synchronise()


class Sharded(Replicated):
    """``sharding=fsdp`` on several ranks: FSDP2 shards in place before the optimizer is built."""

    sharded = True

    def shard(self, model: torch.nn.Module) -> None:
        # FSDP2 replaces the parameters: shard first, then build the optimizer over the shards
        self._sharded = self.distributed.shard_model(model, self.env)

    def _wrapped(self, model: torch.nn.Module) -> torch.nn.Module:
        return self._sharded

    def eval_batches(self, rows: int, batch_size: int) -> int | None:
        # every rank runs as many evaluation forwards as the rank with the largest share
        return math.ceil(math.ceil(rows / self.env.world_size) / batch_size)

    def final_model(self, model: torch.nn.Module, rebuild: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """One unsharded copy on rank 0 (the full state dict is a collective: every rank)."""
        return strategies.whole_model_on_main(model, strategies.full_model_state(model, sharded=True), rebuild, self.env)


class Asynchronous(Replicated):
    """``asynchronous`` on several ranks (``pipelines.training.parameter_server``): no DDP wrapper (nothing
    all-reduced); the engine leaves the optimizer step to this runtime (``steps_the_weights``), whose
    ``after_step`` pushes the gradient to the server and loads the weights it answers with."""

    steps_the_weights = True  # pipelines.training.engine.TorchEngine.step leaves the update to us

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # every rank joins new_group, in the same order: the server's own channel
        self.group = dist.new_group(backend="gloo")
        self.server: parameter_server.ParameterServer | None = None  # rank 0
        self.thread: threading.Thread | None = None
        self.version = 0  # of the weights this rank holds
        self.params: list[torch.nn.Parameter] = []
        self.optimizer: torch.optim.Optimizer | None = None  # never steps: its scheduler sets the lr we send

    def _wrapped(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # no DistributedDataParallel: the server is where the ranks' gradients meet

    def wrap(self, model: torch.nn.Module, steps_done: int) -> torch.nn.Module:
        self.params = list(model.parameters())
        if self.env.is_main:
            log.info("strategy %s: parameter server in rank 0's process, staleness bound %d",
                     self.strategy.name, self.strategy.staleness_bound)
        return model

    def bind_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """From the engine's ``attach``: the worker's learning rate is its optimizer's (the loop's scheduler
        sets it each step); rank 0's server updates a copy of the weights with a copy of this optimizer."""
        self.optimizer = optimizer
        # the local optimizer never steps (the server's does): tell its scheduler it did, the mark torch's
        # own step wrapper sets, so it warns of no "scheduler.step() before optimizer.step()" each cell
        optimizer._opt_called = True
        if self.env.is_main:
            self.server = parameter_server.ParameterServer(model, optimizer, self.strategy.staleness_bound)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer, state: dict) -> None:
        super().load_optimizer_state(model, optimizer, state)
        if self.server is not None:
            self.server.optimizer.load_state_dict(state)

    # --- steps ----------------------------------------------------------------------------
    def after_step(self, record) -> None:
        """Push this step's gradient, pull the server's weights (rank 0: a call, the others: the group)."""
        gradient = parameter_server.flat_gradient(self.params)
        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        if self.server is not None:
            if self.thread is None:
                self._start_serving()
            weights, self.version, _, _ = self.server.apply(gradient, self.version, learning_rate)
        else:
            with record.communicating():
                weights, self.version = parameter_server.push_and_pull(self.group, gradient, self.version, learning_rate)
        parameter_server.load_flat(self.params, weights)

    def _start_serving(self) -> None:
        self.thread = threading.Thread(target=self.server.serve, args=(self.group, self.env.world_size - 1),
                                       name="parameter-server", daemon=True)
        self.thread.start()

    def at_epoch_end(self, record) -> None:
        """Every rank: done with the epoch's pushes; then one model, the server's, on every rank."""
        with record.communicating():
            if self.server is None:
                parameter_server.done_with_epoch(self.group)
            elif self.thread is not None:
                self.thread.join()
                self.thread = None
            weights = self.server.weights() if self.server is not None else torch.empty(sum(p.numel() for p in self.params))
            dist.broadcast(weights, src=0, group=self.group)  # gloo: CPU tensors whatever the default backend
            versions = torch.tensor([float(self.server.version if self.server is not None else 0)])
            dist.broadcast(versions, src=0, group=self.group)
            self.version = int(versions.item())
        parameter_server.load_flat(self.params, weights)

    # --- checkpoint and result ------------------------------------------------------------
    def checkpoint_state(self, model: torch.nn.Module, optimizer) -> tuple[dict, dict]:
        """The model every rank holds after ``at_epoch_end`` (the server's) and the server's optimizer."""
        model_state, optimizer_state = super().checkpoint_state(model, optimizer)
        return model_state, (self.server.optimizer.state_dict() if self.server is not None else optimizer_state)

    @property
    def comm_bytes_per_step(self) -> float | None:
        if self.server is None or not self.server.version + self.server.dropped:
            return None
        return self.server.remote_bytes / (self.server.version + self.server.dropped)

    def result_fields(self) -> dict:
        return {"staleness": self.server.summary()} if self.server is not None else {}


def runtime_for(strategy: TrainingStrategy, distributed: TorchDistributed, env: DistEnv,
                class_counts: Callable[[], list[int]]) -> Replicated | Pipelined:
    """The runtime of ``strategy`` for this rank (``class_counts``: the train split's rows per
    label, called only for an imbalance strategy)."""
    if strategy.pipeline_microbatches:  # one worker: refused there, with the reason
        from pipelines.training.pipeline import Pipelined

        return Pipelined(strategy, distributed, env, class_counts)
    if env.world_size > 1 and strategy.asynchronous:
        return Asynchronous(strategy, distributed, env, class_counts)
    if env.world_size > 1 and strategy.sharding == "fsdp":
        return Sharded(strategy, distributed, env, class_counts)
    if env.world_size > 1 and strategy.sync_every > 1:
        return LocalSGD(strategy, distributed, env, class_counts)
    return Replicated(strategy, distributed, env, class_counts)
