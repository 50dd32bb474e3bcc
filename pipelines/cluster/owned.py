"""Processes a component started and stops later, from another process maybe: each recorded as it
starts (pid, start time, uid), and signalled only while proved to be that process, so a pid that
names another process by then (as root, any process, whatever its command line says) is left alone.

    daemons = [record(proc.pid)]             # right after the start; kept in the component's state file
    ours(daemons[0])                         # still that process?
    stop_groups(daemons, grace_s=20.0)       # its process group (start_session): SIGTERM, then SIGKILL
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from pipelines.cluster.leftovers import process_start
from pipelines.cluster.processes import running


def _uid(pid: int) -> int | None:
    """Its real uid (/proc/<pid>/status): unlike the owner of /proc/<pid>, the same while nsenter
    enters a user namespace."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def record(pid: int) -> dict:
    """What names a process for good, read as it starts: pid, start (clock ticks after boot), uid."""
    return {"pid": pid, "start": process_start(pid), "uid": _uid(pid)}


def ours(recorded: dict) -> bool:
    """The recorded process still runs: same pid, start and uid (a reused pid has another start)."""
    pid = recorded["pid"]
    return (recorded["start"] is not None and process_start(pid) == recorded["start"]
            and _uid(pid) == recorded["uid"] and running(pid))


def stop_groups(recorded: list[dict], grace_s: float, kill_wait_s: float = 5.0) -> list[int]:
    """SIGTERM the process group of each recorded process (a ``start_session`` leader: it and what it
    started), SIGKILL the groups of those still running after ``grace_s``; each proved ``ours`` right
    before its signal. Our own children are reaped. -> the pids signalled."""
    signalled: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        live = [r for r in recorded if ours(r)]
        for leader in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader["pid"], sig)  # a live leader's group id is its pid: not another's
                signalled.add(leader["pid"])
        deadline = time.monotonic() + wait_s
        while any(ours(r) for r in live) and time.monotonic() < deadline:
            time.sleep(0.2)
    for pid in signalled:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    return sorted(signalled)
