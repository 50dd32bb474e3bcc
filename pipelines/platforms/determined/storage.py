"""Where a Determined cell keeps its own files, inside the cell folder: ``<cell>/determined/``.

The Trainer's checkpoints (``XDG_DATA_HOME``), the trial's marker of the newest one (and the
training record), the experiment config the adapter hands the trial, and the empty working
directory the ranks run in (Determined copies the working directory into every checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from pipelines.runfolder.paths import CellPaths


def folder(cell: CellPaths) -> Path:  # Determined's own storage (XDG_DATA_HOME) and marker
    return cell.root / "determined"


def marker(cell: CellPaths) -> Path:  # rank 0's: the newest checkpoint's uuid and the record
    return folder(cell) / "latest.json"


def experiment(cell: CellPaths) -> Path:  # the experiment config the adapter hands the trial
    return folder(cell) / "experiment.json"


def workdir(cell: CellPaths) -> Path:  # the ranks' working directory, copied into every checkpoint
    return folder(cell) / "code"
