"""Training backends behind one interface, and ``run_cell``, the entry point of a cell.

    from pipelines.backends import run_cell
    result = run_cell(config, paths, Backend.DDP, workers=2, repeat=0)

``run_cell`` writes ``cells/<backend>[-<strategy>]-w<N>-r<repeat>/result.json``; on failure it writes a
result with ``status="failed"`` and the reason, then re-raises. Adding a backend (Ray Train)
= one member in ``pipelines.config.Backend`` (the registration) + the module
``pipelines/backends/<member value>.py`` defining one ``TrainingBackend`` subclass. Heavy
libraries (torch, pyspark, determined) are imported only when a backend is built, so
importing this package is cheap (Airflow DAG parsing).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import traceback
from typing import TYPE_CHECKING

from pipelines import attempts
from pipelines.config import Backend, BenchmarkConfig
from pipelines.paths import DEFAULT_STRATEGY, RunPaths
from pipelines.results import CellResult

if TYPE_CHECKING:
    from pipelines.backends.base import TrainingBackend

log = logging.getLogger(__name__)


def get_backend(backend: Backend) -> "TrainingBackend":
    """The adapter of ``backend``: the TrainingBackend subclass in pipelines.backends.<value>."""
    from pipelines.backends.base import TrainingBackend

    module = importlib.import_module(f"{__name__}.{Backend(backend).value}")
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if issubclass(cls, TrainingBackend) and cls.__module__ == module.__name__ and cls.name == backend:
            return cls()
    raise LookupError(f"{module.__name__} defines no TrainingBackend with name = Backend.{backend.name}")


def run_cell(config: BenchmarkConfig, paths: RunPaths, backend: Backend, workers: int,
             repeat: int = 0, strategy: str = DEFAULT_STRATEGY) -> CellResult:
    """Train one cell; always leaves a result.json (ok or failed) in the cell folder.

    ``strategy`` names one of ``config.strategies``; a strategy the backend cannot run at this
    worker count is refused (``UnsupportedStrategy``, recorded as the cell's failure) before
    the cell starts."""
    cell = paths.cell(backend, workers, repeat, strategy)
    try:
        return get_backend(backend).run(config, workers, paths=paths, cell=cell, repeat=repeat,
                                        strategy=strategy)
    except BaseException as err:  # KeyboardInterrupt / task kill too: record why, then re-raise
        reason = f"{type(err).__name__}: {err}".strip()
        log.error("cell %s failed: %s\n%s", cell.name, reason, traceback.format_exc())
        history = attempts.read(cell)
        known = {s.name: s for s in config.strategies}
        CellResult(backend=backend, world_size=workers, repeat=repeat, status="failed",
                   **(known[strategy].result_fields() if strategy in known else {"strategy": strategy}),
                   error=reason[-4000:], model_name=config.model_source,
                   seed=config.seed + repeat, max_seq_len=config.max_seq_len,
                   attempts=history, **attempts.totals(history)).write(cell.result)
        raise


def strategy_refusals(config: BenchmarkConfig) -> list[str]:
    """Why each (backend, strategy, workers) cell of the run cannot run, before any work."""
    out = []
    for backend in config.backends:
        adapter = get_backend(backend)
        for strategy in config.strategies:
            for workers in sorted({n for b, s, n, _ in config.cells() if b == backend and s == strategy.name}):
                reason = adapter.strategy_refusal(strategy, workers)
                if reason:
                    out.append(reason)
    return out


__all__ = ["Backend", "get_backend", "run_cell", "strategy_refusals"]
