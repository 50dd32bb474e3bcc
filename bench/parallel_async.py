"""The table of ``bench/parallel_async.sh``: per cell, time by phase, bytes per step, accuracy, staleness.

    python bench/parallel_async.py RUN_DIR [RUN_DIR ...]

One row per finished cell (result.json) of the runs: backend, strategy, network, workers; total and
training seconds; the phases that make the training time (data / compute / communication); bytes each
rank handed to its collectives or the parameter server per step (``comm_bytes_per_step``: DDP's gradient
all-reduce payload, the pipeline's activations and their gradients, async's gradients up and weights
down) and every host's link bytes per training step; test accuracy; async's staleness (mean / max,
pushes dropped). A failed cell is listed with its error.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipelines.runfolder.results import CellResult

HEADER = ("backend", "strategy", "network", "workers", "total s", "training s", "data / compute / comm s",
          "payload MB/step", "link MB/step", "test acc", "staleness mean / max, dropped")


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.2f}"


def row(result: CellResult) -> list[str]:
    if result.status != "ok":
        return [result.backend, result.strategy, result.network, str(result.world_size), "failed", "",
                "", "", "", "", (result.error or "")[:80]]
    p = result.phases
    s = result.staleness
    staleness = "" if not s else f"{s.get('mean')} / {s.get('max')}, {s.get('dropped')} of {s['updates'] + s['dropped']}"
    return [result.backend, result.strategy, result.network, str(result.world_size), f"{result.total_seconds:.1f}",
            f"{result.training_seconds:.1f}",
            " / ".join(f"{p.get(k, 0.0):.1f}" for k in ("data", "compute", "communication")),
            _mb(result.comm_bytes_per_step), _mb(result.link_bytes_per_train_step),
            f"{result.test.accuracy:.3f}" if result.test else "n/a", staleness]


def main(runs: list[str]) -> None:
    rows = []
    for run in runs:
        for path in sorted(Path(run, "cells").glob("*/result.json")):
            rows.append(row(CellResult.read(path)))
    order = {"default": 0, "pipeline-4": 1, "async": 2}
    rows.sort(key=lambda r: (r[0], {"local": 0, "unshaped": 1}.get(r[2], 2), order.get(r[1], 9)))
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
