"""Fault injection for tests, through the training loop's epoch-end hook (never in production).

    PIPELINES_EPOCH_END_HOOK=tests.fault_injection:hold FAULT_HOLD_AFTER_EPOCH=1 \\
        PYTHONPATH=<project root> python -m pipelines train ...

makes rank 0 stall right after the checkpoint of epoch 1 is written, so a test can kill the
process tree at a known point and check that a retry resumes from that checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

HOOK = "tests.fault_injection:hold"
HOLD_AFTER_EPOCH_ENV = "FAULT_HOLD_AFTER_EPOCH"
HOLD_CELL_ENV = "FAULT_HOLD_CELL"  # optional: only this cell folder name holds
MAX_HOLD_S = 300  # bounded: a missed kill cannot hang a test run forever
HOLD_SECONDS_ENV = "FAULT_HOLD_SECONDS"  # optional: a shorter stall, after which training goes on
HOLD_RELEASE_ENV = "FAULT_HOLD_RELEASE_FILE"  # optional: the stall ends as soon as this file exists


def hold(epoch: int, rank: int, cell_dir, **_) -> None:
    only = os.environ.get(HOLD_CELL_ENV)
    if only and Path(cell_dir).name != only:
        return
    if rank == 0 and str(epoch) == os.environ.get(HOLD_AFTER_EPOCH_ENV):
        logging.getLogger(__name__).warning("%s=%d: stalling for a test kill", HOLD_AFTER_EPOCH_ENV, epoch)
        deadline = time.monotonic() + min(float(os.environ.get(HOLD_SECONDS_ENV, MAX_HOLD_S)), MAX_HOLD_S)
        release = os.environ.get(HOLD_RELEASE_ENV)
        while time.monotonic() < deadline and not (release and Path(release).exists()):
            time.sleep(0.2)


def env(epoch: int, project_root, cell: str | None = None) -> dict[str, str]:
    """Environment variables that arm the hold after ``epoch`` (of ``cell`` only, if given);
    tests importable from anywhere."""
    pythonpath = os.pathsep.join(p for p in (str(project_root), os.environ.get("PYTHONPATH", "")) if p)
    out = {"PIPELINES_EPOCH_END_HOOK": HOOK, HOLD_AFTER_EPOCH_ENV: str(epoch), "PYTHONPATH": pythonpath}
    if cell:
        out[HOLD_CELL_ENV] = cell
    return out


FAIL_HOOK = "tests.fault_injection:fail_first_tries"
FAIL_TRIES_ENV = "FAULT_FAIL_TRIES"  # try k of the first N tries fails at the end of epoch k


def fail_first_tries(epoch: int, rank: int, cell_dir, **_) -> None:
    """Rank 0 raises at the end of epoch k on try k (attempts.json counts them) for the first N
    tries: each retry resumes from the checkpoint the try before wrote and fails one epoch later,
    so a retry policy can be watched doing its work (the cell needs at least N epochs)."""
    from pipelines.measure import attempts
    from pipelines.runfolder.paths import CellPaths

    only = os.environ.get(HOLD_CELL_ENV)
    if only and Path(cell_dir).name != only:
        return
    tries = int(os.environ.get(FAIL_TRIES_ENV, "0"))
    current = len(attempts.read(CellPaths(Path(cell_dir))))
    if rank == 0 and epoch == current <= tries:
        raise RuntimeError(f"fault injection: try {current} of {Path(cell_dir).name} fails ({FAIL_TRIES_ENV}={tries})")


def fail_env(tries: int, project_root, cell: str | None = None) -> dict[str, str]:
    """Environment variables that make the first ``tries`` tries of ``cell`` (or every cell) fail."""
    pythonpath = os.pathsep.join(p for p in (str(project_root), os.environ.get("PYTHONPATH", "")) if p)
    out = {"PIPELINES_EPOCH_END_HOOK": FAIL_HOOK, FAIL_TRIES_ENV: str(tries), "PYTHONPATH": pythonpath}
    if cell:
        out[HOLD_CELL_ENV] = cell
    return out
