"""The one worker entry point every launcher runs: torchrun, TorchDistributor, Determined.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m pipelines.training.worker --cell-dir runs/<id>/cells/ddp-w2-r0 --launch-time <epoch s>

Reads ``<cell-dir>/cell.json`` (written by the backend adapter: resolved config, run folder,
backend, world size, repeat) and the RANK/LOCAL_RANK/WORLD_SIZE env that torchrun sets, runs
the shared loop, and rank 0 writes ``<cell-dir>/worker_result.json``. Pass paths, not data:
every argument is a string, so the same call works through Spark's cloudpickle as well.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pipelines.config import BenchmarkConfig
from pipelines.paths import RunPaths

SPEC_FILE = "cell.json"
WORKER_RESULT_FILE = "worker_result.json"


@dataclass(frozen=True)
class CellSpec:
    """What a worker needs to know about its cell, handed over as a file."""

    config: BenchmarkConfig
    run_root: Path
    cell_dir: Path
    backend: str
    world_size: int
    repeat: int

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.run_root)

    def write(self) -> Path:
        self.cell_dir.mkdir(parents=True, exist_ok=True)
        path = self.cell_dir / SPEC_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({
            "config": json.loads(self.config.to_json()), "run_root": str(self.run_root),
            "backend": self.backend, "world_size": self.world_size, "repeat": self.repeat,
        }, indent=2))
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, cell_dir: str | Path) -> "CellSpec":
        path = Path(cell_dir) / SPEC_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: a worker must be started by a backend adapter")
        raw = json.loads(path.read_text())
        return cls(BenchmarkConfig.model_validate(raw["config"]), Path(raw["run_root"]),
                   Path(cell_dir), raw["backend"], int(raw["world_size"]), int(raw["repeat"]))


def setup_logging() -> None:
    """Rank 0 logs at INFO, the others only warnings (one readable log per cell)."""
    level = logging.INFO if int(os.environ.get("RANK", "0")) == 0 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s rank%(process)d: %(message)s")


def train_worker(cell_dir: str, launch_time: float) -> None:
    """Train one cell in this process (one rank). Called by torchrun and TorchDistributor."""
    setup_logging()
    from pipelines.training.loop import run_training

    run_training(CellSpec.read(cell_dir), float(launch_time))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True,
                        help="time.time() when the adapter started; start-up is measured from it")
    args = parser.parse_args(argv)
    train_worker(args.cell_dir, args.launch_time)


if __name__ == "__main__":
    main()
