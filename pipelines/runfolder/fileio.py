"""Crash-safe writes: every file the run folder holds appears whole or not at all.

``atomic_write_text(path, text)`` writes a temporary file next to ``path``, fsyncs it and
renames it over ``path`` (``os.replace`` is atomic on one file system), then fsyncs the folder
so the rename itself survives a power cut. A reader never sees half a file, and a crash leaves
at most a ``.<name>.tmp-<where>-<pid>-<start>-*`` file: the next write of the same path removes it
once that writer is gone (same pid namespace: pid and start time no longer match). A live writer's
temp file, in this process or another, is never touched; one written elsewhere (another container or
machine on shared storage) only when a day old.

    atomic_write_json(paths.summary, summary.model_dump(mode="json"))
    atomic_write(path, lambda fh: torch.save(state, fh))      # any writer of a binary file
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FOREIGN_STALE_S = 86400.0  # a temp file of another pid namespace is left alone this long


def _process_start(pid: int) -> int | None:
    """A process's start in clock ticks after boot (/proc/<pid>/stat field 22); None if it is gone.
    (A copy of pipelines.cluster.leftovers.process_start: this module sits below the cluster.)"""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _where() -> str:
    """This boot and pid namespace: where a pid and start time name one process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
        return f"{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return "unknown"


def writer_tag() -> str:
    """``<where>-<pid>-<start>``: the writing process, put in its temp files' names."""
    pid = os.getpid()
    return f"{_where()}-{pid}-{_process_start(pid)}"


def is_stale_temp(temp: Path, prefix: str) -> bool:
    """Is ``temp`` (``<prefix><where>-<pid>-<start>-<random>``) a leftover of a writer that is gone?"""
    parts = temp.name[len(prefix):].split("-")
    if len(parts) == 1:  # written before temps named their writer: that writer is gone
        return True
    if len(parts) == 4 and parts[0] == _where() and parts[1].isdigit():
        return str(_process_start(int(parts[1]))) != parts[2]  # gone, or its pid now another process's
    try:  # its writer cannot be looked up from here (or it is another file's temp): only when old
        return time.time() - temp.stat().st_mtime > FOREIGN_STALE_S
    except FileNotFoundError:
        return False


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(fh)`` on a temporary binary file, fsync, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.tmp-"
    for temp in path.parent.glob(f"{prefix}*"):
        if is_stale_temp(temp, prefix):  # left by a writer that was killed; a live one's is its own
            temp.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{prefix}{writer_tag()}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def atomic_write_json(path: Path, data: Any) -> Path:
    """JSON with indent 2; NaN/Infinity are refused (they are not JSON)."""
    return atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False))


def read_json_list(path: Path) -> list:
    """The list a JSON file holds, or [] when it is missing or not whole JSON (never written yet)."""
    try:
        return list(json.loads(Path(path).read_text()))
    except (FileNotFoundError, ValueError):
        return []
