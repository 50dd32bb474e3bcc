"""SIGTERM / SIGINT end a training cell cleanly: its whole process tree goes, then it fails.

``timeout``, systemd, Kubernetes and Airflow stop a task with SIGTERM (Ctrl-C is SIGINT). The
launchers start process trees of their own (torchrun and its ranks, a platform's JVM, agents,
Python workers or trial processes); left alone they would keep training and writing
checkpoints into the cell folder after the task is gone. While a cell trains,
``terminate_tree_on_signal`` turns either signal into: terminate every descendant process
(SIGTERM, then SIGKILL after ``GRACE_S``), then raise ``CellTerminated`` in the training
thread, so the cell's result is written as failed with the signal's name and its MLflow run
ends FAILED (both handle any exception on the way out).

For launchers that install handlers of their own (a platform's client library may replace
SIGTERM's with one that exits at once: see its package), ``RaiseOnceHandlers`` saves and restores
the project's and, meanwhile, only raises ``CellTerminated`` (once, remembered if the library
swallows it); ``cause_of`` finds that exception behind the library's wrapping; ``stop_leftovers``
waits for a stopped cluster's processes, then SIGKILLs the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

from pipelines.cluster.processes import kill_after, stop_tree

log = logging.getLogger(__name__)
GRACE_S = 5.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class CellTerminated(BaseException):
    """The cell was stopped by a signal (not an error of the cell itself)."""

    def __init__(self, signum: int, what: str = "the cell's processes were terminated"):
        super().__init__(f"stopped by {signal.Signals(signum).name}: {what}")
        self.signum = signum


def terminate_descendants(grace: float = GRACE_S) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL those still alive after ``grace``."""
    import psutil

    children = psutil.Process().children(recursive=True)
    stop_tree(children, grace, kill_wait_s=grace, tree=False)  # each one is signalled itself
    return [c.pid for c in children]


def stop_leftovers(processes: list, grace_s: float = GRACE_S, owner: str = "cell") -> list:
    """After a platform shut its processes down (its own shutdown call): give them ``grace_s``
    to exit (workers may notice their daemon is gone only by polling, seconds on a loaded
    host), then SIGKILL the rest, so none outlives its cell. Returns those that were killed."""
    alive = kill_after(processes, grace_s, 5.0)
    if alive:
        log.warning("%s: %d process(es) still running %.0f s after shutdown were killed", owner, len(alive), grace_s)
    return alive


def cause_of(err: BaseException | None) -> CellTerminated | None:
    """The ``CellTerminated`` behind ``err`` (itself, or in its chain of causes / contexts): a
    library may wrap what a signal handler raised (a native core may make it a ``SystemError``)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CellTerminated):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class RaiseOnceHandlers:
    """Keep the project's SIGTERM/SIGINT handlers across a library that replaces them.

    Built before the library starts: saves the current handlers (main thread only; elsewhere
    every method does nothing). ``raise_once`` then installs handlers that only raise
    ``CellTerminated(signum, what)``, once (a second signal is remembered, not raised), so the
    caller's ``finally`` can shut the library down in order; ``terminated`` answers the signal
    also when the library swallowed the exception; ``restore`` puts the saved handlers back."""

    def __init__(self, what: str = "the cell's platform shut down") -> None:
        self.what = what
        self.main = threading.current_thread() is threading.main_thread()  # handlers live there
        self.saved = {s: signal.getsignal(s) for s in SIGNALS} if self.main else {}
        self.stopped: int | None = None  # the signal received (raise_once)

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)

    def raise_once(self) -> None:
        if not self.main:
            return

        def handler(signum, frame):
            first = self.stopped is None
            self.stopped = self.stopped or signum
            if first:
                raise CellTerminated(signum, self.what)

        for s in SIGNALS:
            signal.signal(s, handler)

    def terminated(self) -> CellTerminated | None:
        """The signal that stopped the cell, also when the library swallowed the handler's exception."""
        return None if self.stopped is None else CellTerminated(self.stopped, self.what)


@contextlib.contextmanager
def raise_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises ``CellTerminated`` (as Ctrl-C raises KeyboardInterrupt),
    so ``finally`` clean-up runs (e.g. stopping a cluster the run started); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        raise CellTerminated(signum, "stopping what the run started")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def end_tree_on_signal() -> None:
    """For a process whose whole job is its process tree (a cell's driver process,
    ``pipelines.platforms.driver``): SIGTERM/SIGINT terminate every descendant (SIGTERM, SIGKILL
    after ``GRACE_S``), then the process exits with 128 + the signal at once. No exception is
    raised, so no library can swallow it (a blocking client call may). Its runner records the failure."""

    def handler(signum, frame):
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        pids = terminate_descendants()
        log.warning("%s: terminated %d process(es) of the driver: %s", signal.Signals(signum).name, len(pids), pids)
        os._exit(128 + signum)

    for s in SIGNALS:
        signal.signal(s, handler)


@contextlib.contextmanager
def terminate_tree_on_signal() -> Iterator[None]:
    """Within the block, SIGTERM/SIGINT take the process tree down and raise CellTerminated.

    Signal handlers can only be set from the main thread; elsewhere this does nothing (the
    launchers' own clean-up still runs when their caller is interrupted)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}

    def handler(signum, frame):
        for s in SIGNALS:  # a second signal during the clean-up must not interrupt it
            signal.signal(s, signal.SIG_IGN)
        pids = terminate_descendants()
        log.warning("%s: terminated %d process(es) of the cell: %s", signal.Signals(signum).name, len(pids), pids)
        raise CellTerminated(signum)

    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
