"""Private scratch folders for the engines that want a short local path (a platform's session
folder and Unix sockets, an engine's work and local dirs): never a predictable name in ``/tmp``.

``make_scratch("<purpose>")`` creates ``/tmp/bm-<purpose>-<random>`` with ``mkdtemp``: mode 0700,
made by this call (so never one planted beforehand, nor a link), short enough for a Unix socket path
(108 bytes) several levels below it. Whoever reuses a recorded scratch path (a standing cluster's
stop, a later task of the run) checks it with ``check_scratch`` first: a folder of this user
that no one else can enter, not a link.

    scratch = make_scratch("cluster")        # record str(scratch) in the run folder
    start_the_cluster(temp_dir=str(check_scratch(scratch)))  # e.g. a platform's session folder
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

SCRATCH_ROOT_ENV = "BENCHMARK_SCRATCH_ROOT"  # where scratch folders go (default: the system's temp, /tmp)
PREFIX = "bm-"


def scratch_root() -> Path:
    return Path(os.environ.get(SCRATCH_ROOT_ENV) or tempfile.gettempdir())


def make_scratch(purpose: str) -> Path:
    """A new 0700 folder of this user, with an unguessable name, made by this call."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{purpose}-", dir=scratch_root()))


def check_scratch(path: str | Path) -> Path:
    """``path`` if it is a folder (not a link) of this user that no one else can read or enter;
    PermissionError naming what is wrong otherwise (FileNotFoundError when it is gone)."""
    path = Path(path)
    info = path.lstat()
    problem = ("is a link" if stat.S_ISLNK(info.st_mode) else
               "is not a folder" if not stat.S_ISDIR(info.st_mode) else
               f"belongs to uid {info.st_uid}, not {os.getuid()}" if info.st_uid != os.getuid() else
               f"has mode {stat.filemode(info.st_mode)}, not drwx------" if info.st_mode & 0o077 else None)
    if problem:
        raise PermissionError(f"scratch folder {path} {problem}: refusing to use it")
    return path


def remove_scratch(path: str | Path | None) -> None:
    """Remove a scratch folder this user owns (a checked one only; a link or a stranger's is left)."""
    if not path:
        return
    try:
        check_scratch(path)
    except (FileNotFoundError, PermissionError):
        return
    shutil.rmtree(path, ignore_errors=True)
