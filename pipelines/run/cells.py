"""A cell's entry point: ``run_cell`` trains one cell through its platform's adapter.

    from pipelines.run.cells import run_cell
    result = run_cell(config, paths, platforms.reference(), workers=2, repeat=0)

``run_cell`` writes ``cells/<backend>[-<strategy>][-<network>]-w<N>-r<repeat>/result.json``; on
failure it writes a result with ``status="failed"`` and the reason, then re-raises. The adapter
is the class the platform's declaration names (``pipelines.platforms``), imported when a cell
runs: heavy libraries (torch, a platform's own library) are never imported to read the registry.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipelines import platforms
from pipelines.cluster import isolation
from pipelines.run import services
from pipelines.measure import attempts, faults, signals
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import DEFAULT_NETWORK, DEFAULT_STRATEGY, RunPaths
from pipelines.runfolder.results import CellResult

if TYPE_CHECKING:
    from pipelines.platforms.contract import TrainingBackend

log = logging.getLogger(__name__)


def get_backend(backend: str) -> "TrainingBackend":
    """The adapter of ``backend``: the class its declaration names (``pipelines.platforms``),
    imported here, when a cell runs, so reading the registry stays cheap (and the registry, which
    the config reads, never imports an adapter, which imports the config)."""
    module, _, cls = platforms.get(backend).adapter.partition(":")
    return getattr(importlib.import_module(module), cls)()


def run_cell(config: BenchmarkConfig, paths: RunPaths, backend: str, workers: int,
             repeat: int = 0, strategy: str = DEFAULT_STRATEGY, hosts: list | None = None,
             network: str = DEFAULT_NETWORK, cluster: str = "local",
             before_window: Callable[[], None] | None = None) -> CellResult:
    """Train one cell; always leaves a result.json (ok or failed) in the cell folder.

    ``strategy`` names one of ``config.matrix.strategies``; a strategy the backend cannot run at this
    worker count is refused (``UnsupportedStrategy``, recorded as the cell's failure) before
    the cell starts. ``hosts``: the machines the ranks run on (``pipelines.cluster``), linked by
    ``network``; None = this host. ``before_window``: called under the host's timing lock right
    before the cell's window; by default the run's standing clusters are brought up or stopped for
    it (``pipelines.run.services.before_cell``: a standing cluster then stays up after the cell
    until another platform's cell, or ``services.stop``)."""
    cell = paths.cell(backend, workers, repeat, strategy, network)
    where = {"network": network, "cluster": cluster}
    placed: list[str] = []  # where its processes went (isolation.isolating): the result's isolation
    try:
        adapter = get_backend(backend)
        adapter.before_window = before_window or (lambda: services.before_cell(config, paths, backend))
        # a namespace that cannot be made fails the cell (isolation.NotIsolated), unless allowed
        with isolation.isolating(config.cluster.allow_unisolated_cells) as placed:
            result = adapter.run(config, workers, paths=paths, cell=cell, repeat=repeat, strategy=strategy,
                                 hosts=hosts)
        update = {**where, "isolation": _isolation(placed, cluster)}
        if any(getattr(result, key) != value for key, value in update.items()):
            result = result.model_copy(update=update)
            result.write(cell.result)
        return result
    except BaseException as err:  # KeyboardInterrupt / task kill too: record why, then re-raise
        reason = f"{type(err).__name__}: {err}".strip()
        terminated = signals.cause_of(err)
        if terminated is not None and terminated is not err:  # a signal a library wrapped (py4j, Ray)
            reason = f"CellTerminated: {terminated} (behind {reason})"
        log.error("cell %s failed: %s\n%s", cell.name, reason, traceback.format_exc())
        history = attempts.read(cell)
        known = {s.name: s for s in config.matrix.strategies}
        CellResult(backend=backend, world_size=workers, repeat=repeat, status="failed",
                   **(known[strategy].result_fields() if strategy in known else {"strategy": strategy}),
                   error=reason[-4000:], model_name=config.training.model_source,
                   seed=config.training.seed + repeat, max_seq_len=config.data.max_seq_len, **where,
                   isolation=_isolation(placed, cluster),
                   attempts=history, **attempts.totals(history),
                   fault=faults.record(cell, history, 0)).write(cell.result)
        raise


def _isolation(placed: list[str], cluster: str) -> str | None:
    """The result's ``isolation``: where its processes on this host went, else its hosts' kind."""
    return isolation.isolation_of(placed) or {"emulated": "emulated hosts", "ssh": "none (ssh hosts)"}.get(cluster)


def preflight_problems(config: BenchmarkConfig, cells: list[tuple[str, str, int]] | None = None) -> list[str]:
    """What each platform finds wrong with its (backend, strategy, workers) cells, before any
    work; ``cells`` None = every cell of the run."""
    wanted = cells if cells is not None else sorted({(b, s, n) for b, s, _, n, _ in config.cells()})
    out = []
    for backend in dict.fromkeys(b for b, _, _ in wanted):
        out += get_backend(backend).preflight(config, [(s, n) for b, s, n in wanted if b == backend])
    return out


__all__ = ["get_backend", "preflight_problems", "run_cell"]
