"""The small interface every training backend implements, and the part they all share.

A backend only knows how to *launch* the shared worker on ``world_size`` processes
(``launch``); ``run`` around it writes the cell spec, times the whole launch (start-up is
"adapter entry -> first training step", measured by the worker), reads back the result file
rank 0 wrote and completes it into ``<cell>/result.json``. Results never travel through a
launcher's return value (TorchDistributor's is unreliable in local mode).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from pipelines.config import Backend, BenchmarkConfig
from pipelines.paths import RunPaths
from pipelines.results import CellResult
from pipelines.training.worker import WORKER_RESULT_FILE, CellSpec

log = logging.getLogger(__name__)
RESULT_FILE = "result.json"
LOG_FILE = "train.log"


class TrainingBackend(ABC):
    """``run(config, world_size, paths=..., cell_dir=...) -> CellResult``."""

    name: ClassVar[Backend]

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths,
            cell_dir: Path | None = None, repeat: int = 0) -> CellResult:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        cell_dir = Path(cell_dir or paths.cell(self.name, world_size, repeat))
        launch_time = time.time()
        spec = CellSpec(config, Path(paths.root), cell_dir, self.name.value, world_size, repeat)
        spec.write()
        worker_file = cell_dir / WORKER_RESULT_FILE
        worker_file.unlink(missing_ok=True)  # never mistake a previous attempt's file for ours
        log.info("%s: training %s on %d worker(s)", self.name.value, cell_dir.name, world_size)
        self.launch(spec, launch_time)
        if not worker_file.exists():
            raise RuntimeError(f"{self.name.value}: the launcher returned but rank 0 wrote no "
                               f"{worker_file}; see the launcher output / {cell_dir / LOG_FILE}")
        result = CellResult.read(worker_file)
        result = result.model_copy(update={
            "backend": self.name, "repeat": repeat, "total_seconds": time.time() - launch_time,
            "versions": {**result.versions, **self.versions()},
        })
        result.write(cell_dir / RESULT_FILE)
        log.info("%s: %s done in %.1fs (start-up %.1fs, training %.1fs), test accuracy %.3f",
                 self.name.value, cell_dir.name, result.total_seconds, result.startup_seconds,
                 result.training_seconds, result.test.accuracy if result.test else float("nan"))
        return result

    @abstractmethod
    def launch(self, spec: CellSpec, launch_time: float) -> None:
        """Run ``pipelines.training.worker`` (or an equivalent) on spec.world_size processes."""

    def versions(self) -> dict[str, str]:
        """Versions of the backend's own libraries, recorded in the result."""
        return {}
