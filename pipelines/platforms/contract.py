"""The small interface every training backend implements, and the part they all share.

A backend only knows how to *launch* the shared worker on ``world_size`` processes
(``launch``); ``run`` around it takes the host's timing lock (one timed cell per host at a
time), records the attempt (``pipelines.measure.attempts``), writes the cell spec
(``pipelines.training.cell.CellSpec``, with the cell's seed, batch and learning rate), times the whole
launch (start-up is "adapter entry -> first training step", measured by the worker's
``TrainingRecord``; every phase: ``pipelines.training.phases``), reads back the result file rank 0 wrote and completes it into
``<cell>/result.json`` with every attempt, the timed window and the totals over attempts.
Results never travel through a launcher's return value (TorchDistributor's is unreliable in
local mode).
"""

from __future__ import annotations

import logging
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Protocol

from pipelines.measure import attempts, counters, faults, resources, stragglers, tensorboard
from pipelines.training.cell import CellSpec, platform_modules
from pipelines.config import BenchmarkConfig, TrainingStrategy
from pipelines.data.manifest import read_manifest, task_labels
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.runfolder.results import CellResult, TimedWindow
from pipelines.training import phases

log = logging.getLogger(__name__)


def cell_phases(result: CellResult, history: list, cell: CellPaths) -> dict[str, float]:
    """The worker's phases completed with teardown (its result -> the attempt's end) and the
    earlier, failed attempts (``pipelines.training.phases``)."""
    if not result.phases or result.work_end is None:
        return result.phases
    return phases.complete(result.phases, work_end=result.work_end, attempt_end=history[-1].end,
                           earlier_attempts_seconds=sum((a.end or a.start) - a.start for a in history[:-1]),
                           provision_seconds=provision_seconds(cell))


@contextmanager
def provisioning(cell: CellPaths) -> Iterator[None]:
    """Time the platform's cluster coming up inside the cell (its ``provision`` phase)."""
    import time

    start = time.perf_counter()
    try:
        yield
    finally:
        atomic_write_json(cell.provision, {"seconds": round(time.perf_counter() - start, 3)})


def provision_seconds(cell: CellPaths) -> float:
    """What this attempt spent bringing up its platform's cluster (0: none, or a standing one)."""
    import json

    try:
        return float(json.loads(cell.provision.read_text())["seconds"])
    except (OSError, ValueError, KeyError):
        return 0.0


class UnsupportedStrategy(ValueError):
    """A training strategy this backend cannot run (or that does not apply at this worker count)."""


def pipeline_refusal(cell_config: BenchmarkConfig, world_size: int) -> str | None:
    """Why a pipeline cell (its config: ``for_cell``'s, one strategy) cannot split its model over
    ``world_size`` workers: its stages against the model's encoder layers (when its config.json is
    on disk) and its microbatches against the global batch (``TrainingStrategy.pipeline_refusal``)."""
    strategy = cell_config.strategy()
    if not strategy.pipeline_microbatches:
        return None
    from pipelines.training.model import encoder_layers

    return strategy.pipeline_refusal(world_size, cell_config.training.batch_size * world_size,
                                     encoder_layers(cell_config.training.model_source))


class Host(Protocol):
    """One machine a cell's ranks may run on (``TrainingBackend.launch_on_hosts``): e.g. a host
    of ``pipelines.cluster.EmulatedCluster``; ``run`` starts a process there."""

    name: str
    address: str

    def link_bytes(self) -> tuple[int, int]: ...  # (tx, rx) of its cluster interface

    def run(self, argv: list[str], env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen: ...


class TrainingBackend(ABC):
    """How a platform trains a cell: ``run(config, world_size, paths=..., cell=...) -> CellResult``.

    The platform's declaration (``pipelines.platforms.Platform``: label, settings, modes, ...)
    names its adapter, a subclass of this with the same ``name``; the adapter implements
    ``launch`` (and ``launch_on_hosts`` for several hosts) and may narrow the strategies,
    preflight, cleanup, versions and result fields. ``run`` is the same for every platform."""

    name: ClassVar[str]
    # how the training rows reach the ranks, recorded as CellResult.data_feed: "files" = every rank
    # reads the token shards through the shared loop; "dataframe" = through Spark (spark_dataframe)
    data_feed: ClassVar[str] = "files"
    # called under the host's timing lock right before the cell's timed window opens (the runner
    # brings up a standing cluster this cell uses, and stops one it does not: nothing of the run
    # beside the cell, yet the standing cluster's start outside its window)
    before_window: Callable[[], None] | None = None

    @property
    def lifetime(self) -> str | None:
        """How this platform's own cluster lives: "standing", "per_job" or None (its declaration)."""
        from pipelines import platforms

        return platforms.get(self.name).lifetime

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        """Why the run cannot train these (strategy, workers) cells here, checked in seconds before
        any data work: the strategy refusals, plus what a platform adds (e.g. a master it needs)."""
        out = []
        for strategy, workers in cells:
            chosen = config.strategy(strategy)
            reason = self.strategy_refusal(chosen, workers) or (
                pipeline_refusal(config.for_cell(workers, 0, strategy), workers) if chosen.pipeline_microbatches else None)
            if reason:
                out.append(reason)
        return out

    def cleanup(self) -> list[int]:
        """Stop what a failed or interrupted cell of this platform left running on this host;
        returns the pids stopped. The default has nothing to stop (the launchers wait for their
        process trees; ``pipelines.measure.signals`` takes them down on SIGTERM)."""
        return []

    def _hosts_by_cell(self) -> dict[Path, int]:
        """Cell folder -> hosts its latest launch used (a platform's ``platform_fields`` reads it:
        the cell's config says one node, the launch knows better)."""
        if not hasattr(self, "_hosts_used"):
            self._hosts_used: dict[Path, int] = {}
        return self._hosts_used

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list[Host]) -> None:
        """Start the cell's ranks across ``hosts`` by the platform's own multi-node path."""
        raise NotImplementedError(f"{self.name}: no multi-host launch yet")

    def strategy_refusal(self, strategy: TrainingStrategy, world_size: int) -> str | None:
        """Why this backend cannot run ``strategy`` on ``world_size`` workers, or None.

        The shared loop (``pipelines.training.loop``) runs every strategy; a backend whose
        framework wraps the model itself narrows this. bf16 compression needs NCCL (GPU hosts):
        gloo refuses it in the first step, so it is refused here instead."""
        if world_size == 1 and strategy.needs_process_group:
            return (f"strategy {strategy.name!r} on {self.name} with 1 worker: not applicable (comm hooks, "
                    "local SGD and FSDP shape how ranks communicate; a single worker has no one to talk to)")
        from pipelines.platforms.torchrun import has_gpus

        if strategy.comm_hook == "bf16" and not has_gpus():
            return (f"strategy {strategy.name!r} on {self.name}: bf16 gradient compression needs NCCL on GPUs "
                    "(torch's bf16_compress_hook refuses gloo); use fp16 on CPU hosts")
        return None

    def check_strategy(self, strategy: TrainingStrategy, world_size: int) -> None:
        reason = self.strategy_refusal(strategy, world_size)
        if reason:
            raise UnsupportedStrategy(reason)

    def spec(self, config: BenchmarkConfig, world_size: int, paths: RunPaths, cell: CellPaths,
             repeat: int, strategy: str | None = None) -> CellSpec:
        """The cell's contract: the config it trains with (``for_cell``: seed + repeat, batch
        policy, scaled learning rate, its one strategy); the label set comes from the snapshot
        manifest. A strategy this backend cannot run is refused here, before anything starts."""
        cell_config = config.for_cell(world_size, repeat, strategy)
        self.check_strategy(cell_config.strategy(), world_size)
        reason = pipeline_refusal(cell_config, world_size)
        if reason:
            raise UnsupportedStrategy(reason)
        return CellSpec(config=cell_config, run_root=Path(paths.root),
                        cell_dir=cell.root, backend=self.name, world_size=world_size, repeat=repeat,
                        labels=task_labels(read_manifest(paths)), platform_modules=platform_modules(cell_config))

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths,
            cell: CellPaths | None = None, repeat: int = 0, strategy: str | None = None,
            hosts: list[Host] | None = None) -> CellResult:
        """Train the cell; ``hosts``: across these machines (``launch_on_hosts``), else on this one."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        strategy = strategy or config.matrix.strategies[0].name
        cell = cell or paths.cell(self.name, world_size, repeat, strategy)
        spec = self.spec(config, world_size, paths, cell, repeat, strategy)  # bad input fails before the lock
        with attempts.host_lock() as waited:
            if self.before_window is not None:
                self.before_window()
            attempt = attempts.begin(cell, lock_wait_seconds=waited)
            launch_time = attempt.start
            oom_before = {h.name: counters.oom_kills(h) for h in hosts or ()}
            try:
                if hosts is not None and hasattr(hosts, "prepare"):
                    hosts.prepare()  # e.g. the links shaped to this cell's network, under the lock
                spec.write()
                cell.worker_result.unlink(missing_ok=True)  # never mistake a previous attempt's file
                cell.provision.unlink(missing_ok=True)
                log.info("%s: training %s on %d worker(s) (attempt %d)", self.name, cell.name, world_size,
                         attempt.attempt)
                # what the cell's processes use, ranks vs platform (pipelines.measure.resources; never fails the cell)
                with resources.sample(cell, hosts, self.daemons(paths)) as sampler:
                    if hosts:
                        with link_counters(hosts, cell.link_bytes), \
                                faults.inject(config, cell, hosts, attempt.attempt, self.name), \
                                stragglers.inject(config, cell, hosts, self.name):  # slow_host, slow_link
                            self.launch_on_hosts(spec, launch_time, hosts)
                    else:
                        self.launch(spec, launch_time)
                if not cell.worker_result.exists():
                    raise RuntimeError(f"{self.name}: the launcher returned but rank 0 wrote no "
                                       f"{cell.worker_result}; see the launcher output / {cell.log}")
                result = CellResult.read(cell.worker_result)
            except BaseException as err:
                oom = counters.memory_limit_kill(config, hosts, oom_before)  # said as such, not a generic failure
                attempts.end(cell, "failed", error=f"{type(oom or err).__name__}: {oom or err}"[-2000:])
                stopped = self.cleanup()
                if stopped:
                    log.warning("%s: stopped %d process(es) the failed cell left: %s", self.name, len(stopped), stopped)
                if oom is not None:
                    raise oom from err
                raise
            history = attempts.end(cell, "ok", startup_seconds=result.startup_seconds)
        result = result.model_copy(update={
            "backend": self.name, "repeat": repeat, "attempts": history, **attempts.totals(history),
            "phases": cell_phases(result, history, cell),
            **spec.config.strategy().result_fields(),
            "timed_window": TimedWindow(start=launch_time, end=history[-1].end, lock_wait_seconds=waited),
            "versions": {**result.versions, **self.versions()}, "data_feed": self.data_feed,
            **self.platform_fields(spec), **_host_records(cell, result), "resources": sampler.usage(),
            "fault": faults.record(cell, history, result.resumed_from_epoch), "straggler": stragglers.record(cell),
        })
        result.write(cell.result)
        tensorboard.write_events(result, cell)  # after the timed window: costs no cell any time
        log.info("%s: %s done in %.1fs (start-up %.1fs, training %.1fs), test accuracy %.3f",
                 self.name, cell.name, result.total_seconds, result.startup_seconds,
                 result.training_seconds, result.test.accuracy if result.test else float("nan"))
        return result

    @abstractmethod
    def launch(self, spec: CellSpec, launch_time: float) -> None:
        """Run ``pipelines.training.worker`` (or an equivalent) on spec.world_size processes."""

    def drive(self, spec: CellSpec, launch_time: float) -> None:
        """A platform whose driver is a library call (a session object, a cluster client's init) makes ``launch``
        start ``pipelines.platforms.driver`` in its cluster's network namespace; that process calls
        this: the driver's own work."""
        raise NotImplementedError(f"{self.name}: its launch starts its processes itself; no driver process")

    def daemons(self, paths: RunPaths) -> list[int]:
        """Pids of processes the cell uses but does not start (the declaration's ``daemons``)."""
        from pipelines import platforms

        declared = platforms.get(self.name).daemons
        return declared(paths) if declared else []

    def versions(self) -> dict[str, str]:
        """Versions of the backend's own libraries, recorded in the result."""
        return {}

    def platform_fields(self, spec: CellSpec) -> dict:
        """Backend-specific CellResult fields: ``platform_mode`` (how the platform ran, so a local
        mode is never read as a cluster's overhead) and e.g. how its driver session was started
        (``platform_session``)."""
        return {}


@contextmanager
def link_counters(hosts: list[Host], out: Path) -> Iterator[None]:
    """Write to ``out`` the bytes each host's interface sent and received while the block ran
    (the kernel's counters, ``host.link_bytes()``), also when the launch failed."""
    before = {h.name: h.link_bytes() for h in hosts}
    try:
        yield
    finally:
        moved = {}
        for h in hosts:
            try:
                tx, rx = h.link_bytes()
            except Exception as err:  # the host went away: say so, keep the cell's real error
                log.warning("link bytes of %s unreadable after the launch: %s", h.name, err)
                continue
            moved[h.name] = {"tx": tx - before[h.name][0], "rx": rx - before[h.name][1]}
        atomic_write_json(out, moved)


def _host_records(cell: CellPaths, result: CellResult) -> dict:
    """What a multi-host launch left in the cell folder: each rank's host (``placements.json``,
    "<host> <address>" by rank, where the platform wrote one; else the ranks' own report) and
    the bytes each host's link moved, in all and per optimizer step trained. None on one host."""
    import json

    out: dict = {}
    if cell.placements.exists():
        ranks = sorted(json.loads(cell.placements.read_text()), key=lambda p: p["rank"])
        out["placements"] = [f"{p['host']} {p['address']}" for p in ranks]
    if cell.link_bytes.exists():
        moved = json.loads(cell.link_bytes.read_text())
        out["link_bytes"] = moved
        steps = (len(result.epochs) - result.resumed_from_epoch) * result.steps_per_epoch
        if steps > 0:
            out["link_bytes_per_step"] = sum(m["tx"] for m in moved.values()) / steps
    return out
