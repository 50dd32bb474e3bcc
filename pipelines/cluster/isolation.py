"""How a cell's processes on this host were kept off its interfaces, and what happens where they
cannot be: ``pipelines.cluster.netns`` makes the namespaces, this module says whether a cell may run
without one and records where its processes went.

At launch isolation fails closed: where ``netns.own()`` / ``netns.ensure_run()`` cannot make a
namespace (a worker set up unlike the task that ran preflight, a probe that failed or timed out)
they raise ``NotIsolated`` with the reason, unless ``cluster.allow_unisolated_cells`` is given to
them or to the cell being run (``isolating``). Every place a cell's processes are put is recorded:

    with isolating(config.cluster.allow_unisolated_cells) as placed:
        adapter.run(...)                       # netns.own(), netns.enter(), netns.host() ...
    result.isolation = isolation_of(placed)    # "own-netns", "run-netns", "none (allow_unisolated_cells)"
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)
# a loopback-only namespace of the cell's own, the run's (with its standing cluster), this host's on
# purpose (a driver reaching a cluster elsewhere), or this host's because none could be made
OWN, RUN, HOST, NONE = "own-netns", "run-netns", "host-netns", "none (allow_unisolated_cells)"
_CELLS: list[tuple[bool, list[str]]] = []  # the cells being run in this process: may run exposed, placed


class NotIsolated(RuntimeError):
    """No loopback-only namespace could be made for a cell's processes, and running them exposed
    was not allowed (``cluster.allow_unisolated_cells``)."""


@contextlib.contextmanager
def isolating(allow_unisolated: bool) -> Iterator[list[str]]:
    """For a cell run inside the block (``pipelines.run.cells.run_cell``): a namespace that cannot be
    made fails it unless ``allow_unisolated``; yields where its processes were put (``place``)."""
    placed: list[str] = []
    _CELLS.append((allow_unisolated, placed))
    try:
        yield placed
    finally:
        _CELLS.pop()


def place(isolation: str) -> None:
    """Record that a process of the cell being run (if any) goes to ``isolation`` (OWN, RUN, ...)."""
    if _CELLS:
        _CELLS[-1][1].append(isolation)


def isolation_of(placed: list[str]) -> str | None:
    """One value for a cell's result: NONE when anything of it ran exposed, else each distinct place
    in order ("own-netns", "run-netns, host-netns"); None: nothing was placed."""
    return NONE if NONE in placed else ", ".join(dict.fromkeys(placed)) or None


def unless_allowed(what: str, problem: str, allow_unisolated: bool | None) -> None:
    """``what`` gets no namespace (``problem``: why): ``NotIsolated`` unless allowed, by the argument
    or else by the cell being run; warned when it is."""
    allowed = allow_unisolated if allow_unisolated is not None else bool(_CELLS and _CELLS[-1][0])
    if not allowed:
        raise NotIsolated(f"no loopback-only network namespace for {what}: {problem}. Fix this host (or worker) so "
                          "that it can make one, or set cluster.allow_unisolated_cells=true "
                          "(BENCHMARK_ALLOW_UNISOLATED_CELLS=1) to run it with its ports on every interface of this host")
    log.warning("no private network namespace for %s (%s): its ports are reachable on this host's interfaces "
                "(cluster.allow_unisolated_cells)", what, problem)
