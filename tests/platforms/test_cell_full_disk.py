"""A cell whose folder fills up (a real 2 MiB tmpfs mounted as the cell folder: its first checkpoint,
some MB, cannot be written) fails with ENOSPC named, within a bounded time: nothing hangs, and the
failed result.json (a few KB, written once the half-written checkpoint's temp file is gone) says why."""

from __future__ import annotations

import subprocess
import time

import pytest

from pipelines.run.cells import run_cell
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult

BOUND_S = 600  # a 2-epoch tiny cell takes ~30 s here; a hang would run into pytest's timeout instead


@pytest.fixture
def small_cell_folder(run_paths, tmp_path):
    """A run folder whose ddp-w1 cell folder is a 2 MiB tmpfs (the token shards: the session's)."""
    paths = RunPaths(tmp_path / "full-disk-run")
    paths.root.mkdir(parents=True)
    for name in ("tokens", "snapshot"):  # the session's data (and manifest), read only by the cell
        (paths.root / name).symlink_to(run_paths.root / name)
    cell = paths.cell("ddp", 1, 0)
    cell.root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(cell.root)], check=True)
    try:
        yield paths, cell
    finally:
        subprocess.run(["umount", "-l", str(cell.root)], check=False)


def test_a_cell_whose_disk_is_full_fails_naming_enospc(bench_config, small_cell_folder):
    paths, cell = small_cell_folder
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        run_cell(bench_config, paths, "ddp", 1, 0)
    assert time.monotonic() - start < BOUND_S
    failed = CellResult.read(cell.result)
    assert failed.status == "failed"
    assert "no space left on device" in failed.error.lower(), failed.error
