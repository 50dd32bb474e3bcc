"""The contract between a backend adapter (the driver) and the workers it launches.

The adapter writes ``CellSpec`` to ``<cell>/cell.json`` before launching; every rank reads it
(launchers pass only the cell folder, a string, so the same call goes through torchrun,
Spark's cloudpickle, Determined and Ray alike); rank 0 writes its ``CellResult`` to
``<cell>/worker_result.json``, which the adapter reads back and completes into
``<cell>/result.json``. Both ``pipelines.backends`` and ``pipelines.training`` import this
module; it imports neither.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pipelines.config import Backend, BenchmarkConfig
from pipelines.fileio import atomic_write_text
from pipelines.paths import CellPaths, RunPaths


class CellSpec(BaseModel):
    """What a worker needs to know about its cell."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: BenchmarkConfig
    run_root: Path
    cell_dir: Path
    backend: Backend
    world_size: int
    repeat: int
    labels: list[int]  # the task's label set, from the snapshot manifest (0..K-1)

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.run_root)

    @property
    def cell(self) -> CellPaths:
        return CellPaths(self.cell_dir)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def write(self) -> Path:
        return atomic_write_text(self.cell.spec, self.model_dump_json(indent=2))

    @classmethod
    def read(cls, cell_dir: str | Path) -> "CellSpec":
        path = CellPaths(Path(cell_dir)).spec
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: a worker must be started by a backend adapter")
        return cls.model_validate_json(path.read_text())
