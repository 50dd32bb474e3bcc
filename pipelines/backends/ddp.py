"""PyTorch DDP through torchrun: ``python -m torch.distributed.run ... -m pipelines.training.worker``.

``workers`` (the cell's world size) is the TOTAL number of processes, over all nodes.

One node (default): ``--standalone --nproc-per-node <workers>``. Several nodes: set
``ddp_nnodes``, ``ddp_node_rank`` and ``ddp_rdzv_endpoint`` (host:port on node 0, where the
rendezvous store listens) and run the same cell of the same run folder on every node, each
with its own node rank (tests/scaleout/test_multinode_ddp.py does it on loopback):

    cfg = read_config(paths.config).model_copy(update=dict(
        ddp_nnodes=2, ddp_node_rank=K, ddp_rdzv_endpoint="node0:29400"))
    run_cell(cfg, paths, Backend.DDP, workers=4)          # on node K = 0, 1: 2 processes each

Each node starts ``workers / ddp_nnodes`` processes (not divisible -> ``ValueError``). The
rendezvous is torchrun's *static* one, so global rank = node_rank * nproc_per_node +
local_rank and rank 0 always runs on node 0 (the c10d rendezvous would order nodes by host
name/pid instead, and rank 0 could land anywhere). The run folder must be on storage every
node sees at the same path. Node 0 does what a single node does (writes ``cell.json``, reads
rank 0's ``worker_result.json``, writes ``result.json``). A node with rank > 0 writes
nothing but its own log ``train-node<k>.log``: after its processes exit it waits (at most
``SECONDARY_RESULT_WAIT_S``) until node 0 has (re)written ``result.json`` and returns that
result, so every node's ``run_cell`` returns the same record. Should a node > 0 fail,
``run_cell`` records the failure in ``result.json`` as for any cell; node 0 finishing later
writes its own result over it.

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
import time
from collections.abc import Mapping
from pathlib import Path

from pipelines.backends.base import TrainingBackend
from pipelines.cell import CellSpec
from pipelines.config import Backend, BenchmarkConfig
from pipelines.paths import CellPaths, RunPaths
from pipelines.results import CellResult

log = logging.getLogger(__name__)
WORKER_MODULE = "pipelines.training.worker"
# How long a node > 0 waits, after its own processes exit, for node 0's result.json: rank 0
# still runs the final test evaluation then (seconds on the smoke profile, minutes on paper).
SECONDARY_RESULT_WAIT_S = 1800.0


def nproc_per_node(config: BenchmarkConfig, world_size: int) -> int:
    """Processes this node starts: the cell's total world size split evenly over the nodes."""
    if world_size < 1 or world_size % config.ddp_nnodes:
        raise ValueError(
            f"workers={world_size} cannot be split over ddp_nnodes={config.ddp_nnodes}: workers is the "
            f"total number of processes across all nodes and must be a positive multiple of ddp_nnodes")
    return world_size // config.ddp_nnodes


def torchrun_args(config: BenchmarkConfig, world_size: int, rdzv_id: str = "pipelines") -> list[str]:
    """torchrun options: standalone on one node, static rendezvous across ``ddp_nnodes`` nodes."""
    args = ["--nproc-per-node", str(nproc_per_node(config, world_size)),
            "--max-restarts", "0", "--monitor-interval", "0.1"]
    if config.ddp_nnodes == 1 and not config.ddp_rdzv_endpoint:
        return ["--standalone", "--nnodes", "1", *args]
    if not config.ddp_rdzv_endpoint:
        raise ValueError(f"ddp_nnodes={config.ddp_nnodes} needs ddp_rdzv_endpoint=host:port (node 0)")
    if config.ddp_node_rank >= config.ddp_nnodes:
        raise ValueError(f"ddp_node_rank={config.ddp_node_rank} must be < ddp_nnodes={config.ddp_nnodes}")
    # static: the node rank fixes the ranks (rank 0 on node 0, which reads the result back)
    return ["--nnodes", str(config.ddp_nnodes), "--node-rank", str(config.ddp_node_rank),
            "--rdzv-backend", "static", "--rdzv-endpoint", config.ddp_rdzv_endpoint,
            "--rdzv-id", rdzv_id, *args]


def worker_command(config: BenchmarkConfig, world_size: int, cell_dir: Path, launch_time: float,
                   module: str = WORKER_MODULE, python: str = sys.executable) -> list[str]:
    """The full torchrun command line for one cell (rendezvous id = cell folder name)."""
    return [python, "-m", "torch.distributed.run",
            *torchrun_args(config, world_size, rdzv_id=Path(cell_dir).name),
            "-m", module, "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time)]


def gpu_count() -> int:
    """GPUs on this host (nvidia-smi; no torch import in the adapter)."""
    import shutil

    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def launch_env(config: BenchmarkConfig, base: Mapping[str, str], local_processes: int | None = None,
               gpus: int | None = None) -> dict[str, str]:
    """Environment of the launched processes (``pipelines`` is installed in the same Python):
    one thread budget per rank, and on GPU hosts the cell's own GPUs (CUDA_VISIBLE_DEVICES =
    the first ``local_processes``; the host lock keeps other timed cells off them)."""
    env = dict(base)
    gpus = gpu_count() if gpus is None else gpus
    if gpus and local_processes and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(min(gpus, local_processes)))
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


def _file_version(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns  # CellResult.write replaces the file: a new inode


def wait_for_new_result(path: Path, before: tuple[int, int] | None, timeout: float,
                        interval: float = 0.5) -> CellResult:
    """Node 0's result.json once it differs from the version seen at launch (``before``)."""
    deadline = time.monotonic() + timeout
    while True:
        if _file_version(path) not in (None, before):
            return CellResult.read(path)
        if time.monotonic() > deadline:
            raise TimeoutError(f"node 0 wrote no new {path} within {timeout:.0f}s after this node's "
                               "processes finished; see node 0's train.log")
        time.sleep(interval)


class DDPBackend(TrainingBackend):
    name = Backend.DDP

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths,
            cell: CellPaths | None = None, repeat: int = 0, strategy: str | None = None) -> CellResult:
        nproc_per_node(config, world_size)  # refuse a bad split before anything is written
        strategy = strategy or config.strategies[0].name
        cell = cell or paths.cell(self.name, world_size, repeat, strategy)
        # every node: missing inputs and unsupported strategies fail before the rendezvous
        self.spec(config, world_size, paths, cell, repeat, strategy)
        if config.ddp_node_rank == 0:
            return super().run(config, world_size, paths=paths, cell=cell, repeat=repeat, strategy=strategy)
        return self._run_secondary_node(config, world_size, cell)

    def _run_secondary_node(self, config: BenchmarkConfig, world_size: int, cell: CellPaths) -> CellResult:
        """Node k > 0: start this node's ranks, then return the result node 0 writes."""
        node = config.ddp_node_rank
        cell.root.mkdir(parents=True, exist_ok=True)
        before = _file_version(cell.result)  # node 0 cannot finish before this node joined
        launch_time = time.time()
        log.info("ddp: node %d/%d of %s, %d process(es) here", node, config.ddp_nnodes, cell.name,
                 nproc_per_node(config, world_size))
        # cell.json is node 0's: its workers and ours read it only after the rendezvous.
        cmd = worker_command(config, world_size, cell.root, launch_time)
        execute(cmd, launch_env(config, os.environ, nproc_per_node(config, world_size)), cell.node_log(node))
        result = wait_for_new_result(cell.result, before, SECONDARY_RESULT_WAIT_S)
        if result.status != "ok":
            raise RuntimeError(f"node 0 reported the cell failed: {result.error}")
        log.info("ddp: node %d done; node 0 wrote %s", node, cell.result)
        return result

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        cmd = worker_command(spec.config, spec.world_size, spec.cell_dir, launch_time)
        env = launch_env(spec.config, os.environ, nproc_per_node(spec.config, spec.world_size))
        execute(cmd, env, spec.cell.log)

    def versions(self) -> dict[str, str]:
        return {"launcher": "torchrun"}

    def platform_fields(self, spec: CellSpec) -> dict:
        nodes = spec.config.ddp_nnodes
        return {"platform_mode": "torchrun" if nodes == 1 else f"torchrun-{nodes}-nodes"}
