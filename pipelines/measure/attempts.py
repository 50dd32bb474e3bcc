"""Every attempt at a cell counted, and one timed cell per host at a time.

``host_lock()``: an exclusive ``flock`` on a file every runner on the host shares (the CLI, every
Airflow worker process, bench/), so the timed part of two cells never overlaps, whoever
started them. ``BENCHMARK_HOST_LOCK`` names the file (default ``/tmp/pipelines-benchmark-<uid>/host.lock``, in a folder only that user can write;
point every runner on a host at the same one). The data stage does not take it.

``begin`` / ``end`` keep ``<cell>/attempts.json``: an attempt starts when the adapter holds the
lock and ends ok or failed; an attempt whose process was killed outright (SIGKILL, a lost
Airflow worker) never ended, and the next ``begin`` closes it as "killed" at its last sign of
life (the heartbeat rank 0 touches while training). For each attempt: the newest checkpointed
epoch, the work lost since that checkpoint, and the recovery time from the failure to the
next attempt's first training step.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.runfolder.fileio import atomic_write_text
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import Attempt

# in a folder only this user can write (another user could otherwise replace the file with a link)
DEFAULT_LOCK_DIR = f"/tmp/pipelines-benchmark-{os.getuid()}"
DEFAULT_LOCK = f"{DEFAULT_LOCK_DIR}/host.lock"


def private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can write: made 0700, or refused (with why) when it exists
    owned by someone else or writable by others."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"{path}: must be a folder of uid {os.getuid()} that no one else can write "
                              f"(found uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); remove it")
    return path
_EPOCH_FILE = re.compile(r"epoch-(\d+)\.pt$")


@contextlib.contextmanager
def host_lock(path: str | None = None) -> Iterator[float]:
    """Hold the host's timing lock; yields the seconds waited for it."""
    lock_file = Path(path or os.environ.get("BENCHMARK_HOST_LOCK") or DEFAULT_LOCK)
    if lock_file == Path(DEFAULT_LOCK):
        private_dir(lock_file.parent)
    else:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    fd = os.open(lock_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)  # never a link
    with os.fdopen(fd, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released by the kernel even if this process is killed
        try:
            yield time.monotonic() - start
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read(cell: CellPaths) -> list[Attempt]:
    if not cell.attempts.exists():
        return []
    return [Attempt.model_validate(a) for a in json.loads(cell.attempts.read_text())]


def _write(cell: CellPaths, attempts: list[Attempt]) -> None:
    atomic_write_text(cell.attempts, json.dumps([a.model_dump() for a in attempts], indent=2))


def checkpoint_state(cell: CellPaths) -> tuple[int, float | None]:
    """(newest checkpointed epoch, its write time) of either checkpoint layout, without torch."""
    best, mtime = 0, None
    for path in cell.checkpoints.glob("epoch-*.pt"):
        match = _EPOCH_FILE.search(path.name)
        complete = path.with_name(path.name + ".sha256").exists()  # its checksum is written last
        if match and complete and int(match.group(1)) >= best:
            best, mtime = int(match.group(1)), path.stat().st_mtime
    if cell.platform_checkpoint.exists():  # a platform's own checkpoints (Determined's): its marker follows them
        epochs = int(json.loads(cell.platform_checkpoint.read_text()).get("epochs", 0))
        if epochs >= best:
            best, mtime = epochs, cell.platform_checkpoint.stat().st_mtime
    return best, mtime


def _lost(failed_at: float, attempt_start: float, cell: CellPaths) -> float:
    """Training since the last checkpoint (of this attempt) up to the failure."""
    _, saved = checkpoint_state(cell)
    since = max(attempt_start, saved or attempt_start)
    return max(0.0, failed_at - since)


def beat(cell: CellPaths, epoch: int | None = None, step: int | None = None, steps: int | None = None) -> None:
    """Rank 0 while training: the newest sign of life of this attempt, and where it is
    (``"<epoch> <step> <steps per epoch>"``, 1-based: what ``pipelines.measure.faults`` waits for)."""
    if epoch is None:
        cell.heartbeat.touch()
    else:
        cell.heartbeat.write_text(f"{epoch} {step} {steps}\n")


def progress(cell: CellPaths) -> tuple[int, int, int] | None:
    """(epoch, step, steps per epoch) of rank 0's newest heartbeat, or None."""
    try:
        epoch, step, steps = (int(v) for v in cell.heartbeat.read_text().split())
    except (FileNotFoundError, ValueError):
        return None
    return epoch, step, steps


def begin(cell: CellPaths, lock_wait_seconds: float = 0.0) -> Attempt:
    """Close an attempt left running by a killed process; open a new one (which waited
    ``lock_wait_seconds`` for the host lock)."""
    attempts = read(cell)
    if attempts and attempts[-1].outcome == "running":
        last = attempts[-1]
        alive = cell.heartbeat.stat().st_mtime if cell.heartbeat.exists() else last.start
        end = max(last.start, alive)
        attempts[-1] = last.model_copy(update={
            "end": end, "outcome": "killed", "error": "the process ended without a word (killed)",
            "epoch_reached": checkpoint_state(cell)[0], "lost_seconds": _lost(end, last.start, cell)})
    cell.root.mkdir(parents=True, exist_ok=True)
    cell.heartbeat.unlink(missing_ok=True)
    attempt = Attempt(attempt=len(attempts) + 1, start=time.time(), lock_wait_seconds=lock_wait_seconds)
    _write(cell, [*attempts, attempt])
    return attempt


def end(cell: CellPaths, outcome: str, *, error: str | None = None,
        startup_seconds: float | None = None) -> list[Attempt]:
    """Close the running attempt; returns every attempt of the cell."""
    attempts = read(cell)
    current = attempts[-1]
    now = time.time()
    update: dict = {"end": now, "outcome": outcome, "error": error, "epoch_reached": checkpoint_state(cell)[0],
                    "startup_seconds": startup_seconds}
    if outcome == "failed":
        update["lost_seconds"] = _lost(now, current.start, cell)
    if len(attempts) > 1 and startup_seconds is not None and attempts[-2].end is not None:
        update["recovery_seconds"] = current.start + startup_seconds - attempts[-2].end
    attempts[-1] = current.model_copy(update=update)
    _write(cell, attempts)
    return attempts


def totals(attempts: list[Attempt]) -> dict[str, float]:
    """The cell's times over all its attempts."""
    return {
        "total_seconds": sum((a.end or a.start) - a.start for a in attempts),
        "lost_seconds": sum(a.lost_seconds for a in attempts),
        "recovery_seconds": sum(a.recovery_seconds or 0.0 for a in attempts),
    }
