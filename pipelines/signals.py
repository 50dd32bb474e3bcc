"""SIGTERM / SIGINT end a training cell cleanly: its whole process tree goes, then it fails.

``timeout``, systemd, Kubernetes and Airflow stop a task with SIGTERM (Ctrl-C is SIGINT). The
launchers start process trees of their own (torchrun and its ranks, Spark's JVM and Python
workers, Determined's trial processes); left alone they would keep training and writing
checkpoints into the cell folder after the task is gone. While a cell trains,
``terminate_tree_on_signal`` turns either signal into: terminate every descendant process
(SIGTERM, then SIGKILL after ``GRACE_S``), then raise ``CellTerminated`` in the training
thread, so the cell's result is written as failed with the signal's name and its MLflow run
ends FAILED (both handle any exception on the way out).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

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
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [c.pid for c in children]


@contextlib.contextmanager
def raise_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises ``CellTerminated`` (as Ctrl-C raises KeyboardInterrupt),
    so ``finally`` clean-up runs (e.g. stopping the run's embedded Spark cluster); main thread only."""
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
