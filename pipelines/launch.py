"""Launching the shared worker with torchrun: what every torchrun-based platform uses.

The DDP backend (``pipelines.training.worker``) and the Determined backend (its trial module
under ``det.pytorch.Trainer``) start their ranks the same way, so both see identical start-up.
The command and environment are built by pure functions (``nproc_per_node``, ``torchrun_args``,
``worker_command``, ``launch_env``) and executed second by ``execute``, which tees the output
to the cell's log and raises with its tail when torchrun exits non-zero.

One node (default): ``--standalone --nproc-per-node <workers>``. Several nodes
(``ddp_nnodes`` > 1): torchrun's *static* rendezvous at ``ddp_rdzv_endpoint``, so global
rank = node_rank * nproc_per_node + local_rank and rank 0 always runs on node 0.

``gpu_count`` / ``has_gpus`` probe the host's GPUs with nvidia-smi (no torch import: adapters
and preflight stay cheap).
"""

from __future__ import annotations

import collections
import logging
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from pipelines.config import BenchmarkConfig

log = logging.getLogger(__name__)
WORKER_MODULE = "pipelines.training.worker"
TAIL_LINES = 40  # of the launcher's output, in the error when it fails


def gpu_count() -> int:
    """GPUs on this host (nvidia-smi; no torch import in the adapter)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def has_gpus() -> bool:
    """CUDA GPUs on this host (``gpu_count`` > 0)."""
    return gpu_count() > 0


def nproc_per_node(config: BenchmarkConfig, world_size: int) -> int:
    """Processes this node starts: the cell's total world size split evenly over the nodes."""
    if world_size < 1 or world_size % config.engine("ddp").nnodes:
        raise ValueError(
            f"workers={world_size} cannot be split over ddp_nnodes={config.engine('ddp').nnodes}: workers is the "
            f"total number of processes across all nodes and must be a positive multiple of ddp_nnodes")
    return world_size // config.engine("ddp").nnodes


def torchrun_args(config: BenchmarkConfig, world_size: int, rdzv_id: str = "pipelines") -> list[str]:
    """torchrun options: standalone on one node, static rendezvous across ``ddp_nnodes`` nodes."""
    args = ["--nproc-per-node", str(nproc_per_node(config, world_size)),
            "--max-restarts", "0", "--monitor-interval", "0.1"]
    if config.engine("ddp").nnodes == 1 and not config.engine("ddp").rdzv_endpoint:
        return ["--standalone", "--nnodes", "1", *args]
    if not config.engine("ddp").rdzv_endpoint:
        raise ValueError(f"ddp_nnodes={config.engine('ddp').nnodes} needs ddp_rdzv_endpoint=host:port (node 0)")
    if config.engine("ddp").node_rank >= config.engine("ddp").nnodes:
        raise ValueError(f"ddp_node_rank={config.engine('ddp').node_rank} must be < ddp_nnodes={config.engine('ddp').nnodes}")
    # static: the node rank fixes the ranks (rank 0 on node 0, which reads the result back)
    return ["--nnodes", str(config.engine("ddp").nnodes), "--node-rank", str(config.engine("ddp").node_rank),
            "--rdzv-backend", "static", "--rdzv-endpoint", config.engine("ddp").rdzv_endpoint,
            "--rdzv-id", rdzv_id, *args]


def worker_command(config: BenchmarkConfig, world_size: int, cell_dir: Path, launch_time: float,
                   module: str = WORKER_MODULE, python: str = sys.executable) -> list[str]:
    """The full torchrun command line for one cell (rendezvous id = cell folder name)."""
    return [python, "-m", "torch.distributed.run",
            *torchrun_args(config, world_size, rdzv_id=Path(cell_dir).name),
            "-m", module, "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time)]


def launch_env(config: BenchmarkConfig, base: Mapping[str, str], local_processes: int | None = None,
               gpus: int | None = None) -> dict[str, str]:
    """Environment of the launched processes (``pipelines`` is installed in the same Python):
    one thread budget per rank, and on GPU hosts the cell's own GPUs (CUDA_VISIBLE_DEVICES =
    the first ``local_processes``; the host lock keeps other timed cells off them)."""
    env = dict(base)
    gpus = gpu_count() if gpus is None else gpus
    if gpus and local_processes and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(min(gpus, local_processes)))
    env["OMP_NUM_THREADS"] = str(config.training.threads_per_worker)  # torchrun would force 1 otherwise
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def execute(cmd: list[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None) -> None:
    """Run the launcher to completion, teeing its output; raise with the tail on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("launching: %s", " ".join(cmd))
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
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
