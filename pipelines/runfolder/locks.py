"""An exclusive lock on a file of the run folder, for a step two processes must not take at once
(starting the run's network namespace: ``pipelines.cluster.netns.ensure_run``).

    with locked(run_folder / "lock", wait_s=120):
        ...

``flock``: released by the kernel when the holder exits, killed or not. The file is opened with
O_NOFOLLOW (a link planted in its place is refused, never followed) and created 0600.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path, wait_s: float) -> Iterator[None]:
    """Hold ``path``'s lock for the block; TimeoutError when another process holds it ``wait_s``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} is still locked by another process after {wait_s:.0f}s") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # the lock goes with it
