"""The contract between a backend adapter (the driver) and the workers it launches.

The adapter writes ``CellSpec`` to ``<cell>/cell.json`` before launching; every rank reads it
(launchers pass only the cell folder, a string, so the same call goes through every launcher
alike: a command line, a function pickled to a platform's workers, a platform's own trial); rank 0
writes its ``CellResult`` to
``<cell>/worker_result.json``, which the adapter reads back and completes into
``<cell>/result.json``. Both ``pipelines.run.cells`` and ``pipelines.training`` import this
module; it imports neither.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from pipelines.config import BenchmarkConfig
from pipelines.runfolder.fileio import atomic_write_text
from pipelines.runfolder.paths import CellPaths, RunPaths


def platform_modules(config: BenchmarkConfig) -> list[tuple[str, str]]:
    """(package, file) of each platform the config names that does not come with the project:
    the module that declares it (a plug-in, a test's platform folder)."""
    from pipelines import platforms

    named = {*config.matrix.backends, *(config.engines.__pydantic_extra__ or {})}
    return sorted({(p.package, sys.modules[p.package].__file__) for p in platforms.all_platforms()
                   if p.name in named and not platforms.is_builtin(p)})


def import_platform(module: str, file: str) -> None:
    """Import the module declaring a platform: by name, else from its file (a platform folder
    under tests/, seen from a rank whose path does not hold it)."""
    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        folder = [str(Path(file).parent)] if Path(file).name == "__init__.py" else None
        spec = importlib.util.spec_from_file_location(module, file, submodule_search_locations=folder)
        if spec is None or spec.loader is None:
            raise
        sys.modules[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module])


EPOCH_END_HOOK_ENV = "PIPELINES_EPOCH_END_HOOK"


def epoch_end_hook():
    """The callable named by PIPELINES_EPOCH_END_HOOK (``module:function``), or None: called by every
    platform's ranks after each epoch's checkpoint (tests inject faults through it). Here, torch-free,
    for the ranks of a platform whose framework is not torch."""
    import os

    target = os.environ.get(EPOCH_END_HOOK_ENV)
    if not target:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class CellSpec(BaseModel):
    """What a worker needs to know about its cell."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: BenchmarkConfig
    run_root: Path
    cell_dir: Path
    backend: str
    world_size: int
    repeat: int
    labels: list[int]  # the task's label set, from the snapshot manifest (0..K-1)
    # (name, file) of the modules that register the config's platforms defined outside
    # pipelines/backends (a plug-in, a test): a rank imports them before it reads the config
    platform_modules: list[tuple[str, str]] = []

    @model_validator(mode="before")
    @classmethod
    def _register_platforms(cls, values: Any) -> Any:
        if isinstance(values, dict):
            for module, file in values.get("platform_modules") or []:
                import_platform(module, file)
        return values

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
