"""What one finished cell says about its platform's costs: an ``Observation`` per cell result.

A cell's wall time is cut into the terms the what-if model fits (``pipelines.whatif.model``):

- fixed, paid once: provision, launch, teardown (``pipelines.training.phases``), the first epoch's
  warm-up over the steady state, and what no phase owns (``other``);
- per optimizer step: compute, communication and data wait (the phases over the last attempt's
  steps, the warm-up taken out of compute);
- per epoch: the held-out evaluation and the checkpoint (``EpochMetrics``, one row per epoch);
- at the end: the final test and the model export (what the evaluation and checkpoint phases hold
  beyond their epochs).

With what the model scales them by: the hosts a cell spread over, its ranks per host, its link's
rate, the payload its strategy hands to the gradient all-reduce, its per-rank batch and the share of
a core each rank had (``rank_share``: on CPU the device speed; a 0.5-core host is a device twice as
slow). A retried cell teaches by its last attempt.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from pipelines.runfolder.results import CellResult

LOOPBACK = "local"  # one host: ranks talk over loopback
UNSHAPED = "unshaped"  # emulated hosts whose links are not shaped: veth at memory speed


def rate_bps(network: str) -> float | None:
    """A network's rate in bit/s ("1gbit" -> 1e9); None for loopback, unshaped links or SSH hosts."""
    from pipelines.config.links import NetworkSpec

    if network in (LOOPBACK, UNSHAPED, "ssh"):
        return None
    rate = NetworkSpec.parse(network).bits_per_second
    return None if rate is None else float(rate)


def ring_factor(ranks: int) -> float:
    """Bytes a ring all-reduce moves over each rank's link per byte of payload: 2(N-1)/N."""
    return 2.0 * (ranks - 1) / ranks if ranks > 1 else 0.0


@dataclass(frozen=True)
class Observation:
    cell: str
    platform: str
    strategy: str
    workers: int
    hosts: int
    network: str
    rate_bps: float | None  # None: loopback or unshaped (no shaping between the hosts)
    rank_share: float  # share of one core each rank had (1.0: a core or more; a GPU: 1.0)
    host_cores: float  # cores of one host x its CPU quota (pipelines.whatif.observe.host_cores)
    epochs: int  # of the last attempt
    steps_per_epoch: int
    batch_per_worker: int
    train_samples: int
    test_samples: int
    payload_bytes: float | None  # per rank and optimizer step (CellResult.comm_bytes_per_step)
    provision: float
    launch: float
    teardown: float
    warmup: float | None  # first epoch over the steady state; None for a 1-epoch cell
    other: float  # wall time no phase owns
    compute: float  # phase totals over the last attempt, warm-up taken out of compute
    communication: float
    data: float
    eval_epochs: tuple[float, ...]  # each epoch's held-out evaluation
    checkpoint_epochs: tuple[float, ...]  # each epoch's checkpoint
    final_test: float  # the final test (evaluation beyond the epochs)
    export: float  # the model export (checkpoint beyond the epochs)
    total: float
    device: str = "cpu"

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def workers_per_host(self) -> int:
        return max(1, math.ceil(self.workers / self.hosts))

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Observation":
        data = {**data, "eval_epochs": tuple(data["eval_epochs"]),
                "checkpoint_epochs": tuple(data["checkpoint_epochs"])}
        return cls(**data)


def hosts_of(result: CellResult) -> int:
    """The machines the cell's ranks ran on: distinct hosts of its placements; 1 on this host."""
    if result.cluster == "local" or not result.placements:
        return 1
    return len({p.split()[0] for p in result.placements if p.strip()}) or 1


def host_cores(result: CellResult, cpu_share: float | None = None) -> float:
    """The cores one host of the cell had: on this host, those the cell could use; an emulated
    host's one core at its CPU quota (``cpu_share``); a GPU host: 1 device per rank."""
    if result.cluster == "local":
        cores = result.resources.cpus if result.resources and result.resources.cpus else result.world_size
    else:
        cores = 1.0
    return float(cores) * (cpu_share if cpu_share else 1.0)


def rank_share(result: CellResult, cpu_share: float | None = None) -> float:
    """The share of one core (or one device) each rank had: a GPU rank has its device; CPU ranks
    share their host's cores (``host_cores``), at most one core each (a rank is pinned to one)."""
    if not result.device.startswith("cpu"):
        return 1.0
    per_host = math.ceil(result.world_size / hosts_of(result))
    return min(1.0, host_cores(result, cpu_share) / per_host)


def observe(name: str, result: CellResult, cpu_share: float | None = None) -> Observation | None:
    """The cell's observation, or None where it cannot teach the model: failed, no epochs in its last
    attempt, or written before phases were recorded. A retried cell teaches by its last attempt
    (its phases; earlier attempts are ``retries``, which the model leaves out: it predicts a cell
    that does not fail)."""
    if result.status != "ok" or not result.phases or result.steps_per_epoch <= 0 or result.train_samples <= 0:
        return None
    phases = {k: v for k, v in result.phases.items() if k != "retries"}
    epochs = sorted((e for e in result.epochs if e.epoch > result.resumed_from_epoch), key=lambda e: e.epoch)
    if not epochs:
        return None
    seconds = [e.epoch_seconds for e in epochs]
    warmup = max(0.0, seconds[0] - statistics.median(seconds[1:])) if len(seconds) > 1 else None
    eval_epochs = tuple(e.eval_seconds for e in epochs)
    checkpoint_epochs = tuple(e.checkpoint_seconds for e in epochs)
    steady_compute = max(0.0, phases.get("compute", 0.0) - (warmup or 0.0))
    total = result.total_seconds - result.phases.get("retries", 0.0)
    return Observation(
        cell=name, platform=result.backend, strategy=result.strategy, workers=result.world_size,
        hosts=hosts_of(result), network=result.network, rate_bps=rate_bps(result.network),
        rank_share=rank_share(result, cpu_share),
        host_cores=host_cores(result, cpu_share), epochs=len(epochs), steps_per_epoch=result.steps_per_epoch,
        batch_per_worker=result.batch_size_per_worker, train_samples=result.train_samples,
        test_samples=result.test_samples, payload_bytes=result.comm_bytes_per_step,
        provision=phases.get("provision", 0.0), launch=phases.get("launch", 0.0),
        teardown=phases.get("teardown", 0.0), warmup=warmup, other=total - sum(phases.values()),
        compute=steady_compute, communication=phases.get("communication", 0.0), data=phases.get("data", 0.0),
        eval_epochs=eval_epochs, checkpoint_epochs=checkpoint_epochs,
        final_test=max(0.0, phases.get("evaluation", 0.0) - sum(eval_epochs)),
        export=max(0.0, phases.get("checkpoint", 0.0) - sum(checkpoint_epochs)),
        total=total, device=result.device.split(":")[0])
