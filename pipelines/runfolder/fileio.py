"""Crash-safe writes: every file the run folder holds appears whole or not at all.

``atomic_write_text(path, text)`` writes a temporary file next to ``path``, fsyncs it and
renames it over ``path`` (``os.replace`` is atomic on one file system), then fsyncs the folder
so the rename itself survives a power cut. A reader never sees half a file, and a crash leaves
at most a ``.<name>.tmp-*`` file, which the next write of the same path removes.

    atomic_write_json(paths.summary, summary.model_dump(mode="json"))
    atomic_write(path, lambda fh: torch.save(state, fh))      # any writer of a binary file
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(fh)`` on a temporary binary file, fsync, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a writer that was killed
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
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
