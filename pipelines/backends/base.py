"""The small interface every training backend implements, and the part they all share.

A backend only knows how to *launch* the shared worker on ``world_size`` processes
(``launch``); ``run`` around it takes the host's timing lock (one timed cell per host at a
time), records the attempt (``pipelines.attempts``), writes the cell spec
(``pipelines.cell.CellSpec``, with the cell's seed, batch and learning rate), times the whole
launch (start-up is "adapter entry -> first training step", measured by the worker's
``TrainingRecord``; every phase: ``pipelines.training.phases``), reads back the result file rank 0 wrote and completes it into
``<cell>/result.json`` with every attempt, the timed window and the totals over attempts.
Results never travel through a launcher's return value (TorchDistributor's is unreliable in
local mode).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from pipelines import attempts, tensorboard
from pipelines.cell import CellSpec
from pipelines.config import Backend, BenchmarkConfig
from pipelines.data.manifest import read_manifest, task_labels
from pipelines.paths import CellPaths, RunPaths
from pipelines.results import CellResult, TimedWindow
from pipelines.training import phases

log = logging.getLogger(__name__)


def cell_phases(result: CellResult, history: list) -> dict[str, float]:
    """The worker's phases completed with teardown (its result -> the attempt's end) and the
    earlier, failed attempts (``pipelines.training.phases``)."""
    if not result.phases or result.work_end is None:
        return result.phases
    return phases.complete(result.phases, work_end=result.work_end, attempt_end=history[-1].end,
                           earlier_attempts_seconds=sum((a.end or a.start) - a.start for a in history[:-1]))


class TrainingBackend(ABC):
    """``run(config, world_size, paths=..., cell=...) -> CellResult``."""

    name: ClassVar[Backend]
    # how the training rows reach the ranks, recorded as CellResult.data_feed: "files" = every rank
    # reads the token shards through the shared loop; "dataframe" = through Spark (spark_dataframe)
    data_feed: ClassVar[str] = "files"

    def spec(self, config: BenchmarkConfig, world_size: int, paths: RunPaths, cell: CellPaths,
             repeat: int) -> CellSpec:
        """The cell's contract: the config it trains with (``for_cell``: seed + repeat, batch
        policy, scaled learning rate); the label set comes from the snapshot manifest."""
        return CellSpec(config=config.for_cell(world_size, repeat), run_root=Path(paths.root),
                        cell_dir=cell.root, backend=self.name, world_size=world_size, repeat=repeat,
                        labels=task_labels(read_manifest(paths)))

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths,
            cell: CellPaths | None = None, repeat: int = 0) -> CellResult:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        cell = cell or paths.cell(self.name, world_size, repeat)
        spec = self.spec(config, world_size, paths, cell, repeat)  # bad input fails before the lock
        with attempts.host_lock() as waited:
            attempt = attempts.begin(cell, lock_wait_seconds=waited)
            launch_time = attempt.start
            try:
                spec.write()
                cell.worker_result.unlink(missing_ok=True)  # never mistake a previous attempt's file
                log.info("%s: training %s on %d worker(s) (attempt %d)", self.name, cell.name, world_size,
                         attempt.attempt)
                self.launch(spec, launch_time)
                if not cell.worker_result.exists():
                    raise RuntimeError(f"{self.name}: the launcher returned but rank 0 wrote no "
                                       f"{cell.worker_result}; see the launcher output / {cell.log}")
                result = CellResult.read(cell.worker_result)
            except BaseException as err:
                attempts.end(cell, "failed", error=f"{type(err).__name__}: {err}"[-2000:])
                raise
            history = attempts.end(cell, "ok", startup_seconds=result.startup_seconds)
        result = result.model_copy(update={
            "backend": self.name, "repeat": repeat, "attempts": history, **attempts.totals(history),
            "phases": cell_phases(result, history),
            "timed_window": TimedWindow(start=launch_time, end=history[-1].end, lock_wait_seconds=waited),
            "versions": {**result.versions, **self.versions()}, "data_feed": self.data_feed,
            **self.platform_fields(spec),
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

    def versions(self) -> dict[str, str]:
        """Versions of the backend's own libraries, recorded in the result."""
        return {}

    def platform_fields(self, spec: CellSpec) -> dict:
        """Backend-specific CellResult fields: ``platform_mode`` (how the platform ran, so a local
        mode is never read as a cluster's overhead) and e.g. how Spark's session was started."""
        return {}
