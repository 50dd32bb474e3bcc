"""Which process is what: the ranks' pid files, a process's kind, one read of /proc (the sampler's per-process accounting)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

RANKS_DIR = "ranks"
DRIVER_PROCESS = "pipelines.run.driver"  # a platform's driver process (pipelines.platforms.driver): kind "driver" too
_TICK, _PAGE = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
_JVM_ROLES = (("deploy.master.Master", "java_master"), ("deploy.worker.Worker", "java_worker"),
              ("CoarseGrainedExecutorBackend", "java_executor"))


def _boot_id() -> str:  # a pid names a process of this machine only while this stays the same
    path = Path("/proc/sys/kernel/random/boot_id")
    return path.read_text().strip() if path.exists() else ""


def write_rank_pid(cell_dir, rank: int) -> None:
    """Mark this process as rank ``rank`` of the cell (``<cell>/ranks/rank-<k>.pid``: pid and this
    machine's boot id). Never raises: a measure must not stop training."""
    try:
        folder = Path(cell_dir) / RANKS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank-{int(rank)}.pid").write_text(f"{os.getpid()} {_boot_id()}\n")
    except (OSError, ValueError) as err:
        log.warning("rank %s: no pid file for the resource split: %s", rank, err)


def rank_pids(cell_dir) -> set[int]:
    """The cell's ranks on this machine (a pid file from another machine is left out)."""
    texts = [p.read_text().strip().partition(" ") for p in (Path(cell_dir) / RANKS_DIR).glob("rank-*.pid")]
    return {int(pid) for pid, _, boot in texts if pid.isdigit() and boot in ("", _boot_id())}


def process_kind(name: str, cmdline: list[str]) -> str:
    """What a platform process is, from its name and command line: a platform's driver process,
    a JVM by its main class (``_JVM_ROLES``: a standalone cluster's master, worker, executor), else
    the first platform rule that matches (``Platform.process_kinds``: a marker found in the command
    line, or "=name" for the process's own name), else python or its name."""
    from pipelines import platforms

    text, first = " ".join(cmdline), Path(cmdline[0]).name if cmdline else ""
    if DRIVER_PROCESS in text:  # a platform's driver process
        return "driver"
    if "java" in (name, first):  # SparkSubmit (the session's driver JVM) is plain "java"
        return next((kind for marker, kind in _JVM_ROLES if marker in text), "java")
    for marker, kind in platforms.process_kind_rules():
        if (marker[1:] in (name, first)) if marker.startswith("=") else (marker in text):
            return kind
    return "python" if name.startswith("python") or first.startswith("python") else (name or "other")


def _kind_of(pid: int, name: str) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        return process_kind(name, cmdline)
    except OSError:
        return process_kind(name, [])


def _proc_table() -> dict[int, tuple]:
    """pid -> (ppid, name, user + system CPU seconds, start (ticks after boot), RSS bytes) of every live
    process: one read of /proc/<pid>/stat each (proc(5): fields 4, 2, 14 + 15, 22, 24)."""
    out = {}
    for entry in os.scandir("/proc"):
        try:
            data = Path(entry.path, "stat").read_bytes() if entry.name.isdigit() else None
        except OSError:
            continue
        if data:
            close = data.rindex(b")")
            f = data[close + 2:].split()
            if f[0] == b"Z":  # exited, not yet reaped by its parent: nothing of it runs any more
                continue
            out[int(entry.name)] = (int(f[1]), data[data.index(b"(") + 1:close].decode(errors="replace"),
                                    (int(f[11]) + int(f[12])) / _TICK, int(f[19]), int(f[21]) * _PAGE)
    return out


@dataclass
class _Proc:
    ctime: int  # its start (ticks after boot): a reused pid is a new process
    where: str  # a host's name, or DRIVER: this machine outside the hosts
    name: str
    kind: str
    cpu: float  # user + system at its last sample
    before: bool = False  # alive when the cell began: a standing cluster's process, not the cell's
    listens: set = field(default_factory=set)  # "address:port"s it listened on (TCP)


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _ns_bytes(pid: int) -> tuple[int, int]:
    """(tx, rx) bytes of every interface in ``pid``'s network namespace (0, 0 once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    except OSError:
        return 0, 0
    cols = [line.split(":", 1)[1].split() for line in lines if ":" in line]
    return sum(int(c[8]) for c in cols), sum(int(c[0]) for c in cols)
