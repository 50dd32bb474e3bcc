"""PyTorch DDP through torchrun: ``python -m torch.distributed.run ... -m pipelines.training.worker``.

One node (default): ``--standalone --nproc-per-node <world size>``. Several nodes: set
``ddp_nnodes``, ``ddp_node_rank`` and ``ddp_rdzv_endpoint`` (host:port of node 0) and run the
same cell on every node; each node then starts <world size> processes (c10d rendezvous) and
the run folder must be on storage every node sees at the same path.

The command and environment are built by pure functions (``torchrun_args``, ``launch_env``,
``worker_command``) and executed second by ``execute``, which tees the output to
``<cell>/train.log`` and raises with its tail when torchrun exits non-zero. The Determined
backend reuses the same launcher with its own entry module.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from pipelines.backends.base import LOG_FILE, TrainingBackend
from pipelines.config import Backend, BenchmarkConfig
from pipelines.spark_session import PROJECT_ROOT
from pipelines.training.worker import CellSpec

log = logging.getLogger(__name__)
WORKER_MODULE = "pipelines.training.worker"


def torchrun_args(config: BenchmarkConfig, world_size: int, rdzv_id: str = "pipelines") -> list[str]:
    """torchrun options: standalone on one node, c10d rendezvous across ``ddp_nnodes`` nodes."""
    args = ["--nproc-per-node", str(world_size), "--max-restarts", "0", "--monitor-interval", "0.1"]
    if config.ddp_nnodes == 1 and not config.ddp_rdzv_endpoint:
        return ["--standalone", "--nnodes", "1", *args]
    if not config.ddp_rdzv_endpoint:
        raise ValueError(f"ddp_nnodes={config.ddp_nnodes} needs ddp_rdzv_endpoint=host:port (node 0)")
    if config.ddp_node_rank >= config.ddp_nnodes:
        raise ValueError(f"ddp_node_rank={config.ddp_node_rank} must be < ddp_nnodes={config.ddp_nnodes}")
    return ["--nnodes", str(config.ddp_nnodes), "--node-rank", str(config.ddp_node_rank),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", config.ddp_rdzv_endpoint,
            "--rdzv-id", rdzv_id, *args]


def worker_command(config: BenchmarkConfig, world_size: int, cell_dir: Path, launch_time: float,
                   module: str = WORKER_MODULE, python: str = sys.executable) -> list[str]:
    """The full torchrun command line for one cell (rendezvous id = cell folder name)."""
    return [python, "-m", "torch.distributed.run",
            *torchrun_args(config, world_size, rdzv_id=Path(cell_dir).name),
            "-m", module, "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time)]


def launch_env(config: BenchmarkConfig, base: Mapping[str, str]) -> dict[str, str]:
    """Environment of the launched processes: project importable, one thread budget per rank."""
    env = dict(base)
    pythonpath = env.get("PYTHONPATH", "")
    if str(PROJECT_ROOT) not in pythonpath.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), pythonpath) if p)
    env["OMP_NUM_THREADS"] = str(config.threads_per_worker)  # torchrun would force 1 otherwise
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def execute(cmd: list[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None) -> None:
    """Run the launcher to completion, teeing its output; raise with the tail on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("launching: %s", " ".join(cmd))
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with open(log_path, "a") as log_file, subprocess.Popen(
        cmd, env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True,
    ) as proc:
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                log_file.write(line)
                sys.stdout.write(line)
                tail.append(line)
            proc.wait()
        finally:
            if proc.poll() is None:  # we are being interrupted: take torchrun (and ranks) down
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode} (full log: {log_path}); "
                           f"last lines:\n{''.join(tail)}")


class DDPBackend(TrainingBackend):
    name = Backend.DDP

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        cmd = worker_command(spec.config, spec.world_size, spec.cell_dir, launch_time)
        execute(cmd, launch_env(spec.config, os.environ), spec.cell_dir / LOG_FILE)

    def versions(self) -> dict[str, str]:
        return {"launcher": "torchrun"}
