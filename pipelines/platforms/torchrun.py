"""Launching the shared worker with torchrun: what every torchrun-based platform uses.

The DDP backend (``pipelines.training.worker``) and the Determined backend (its trial module
under ``det.pytorch.Trainer``) start their ranks the same way, so both see identical start-up.
The command and environment are built by pure functions (``nproc_per_node``, ``torchrun_args``,
``worker_command``, ``launch_env``) and executed second by ``execute``, which tees the output
to the cell's log and raises with its tail when torchrun exits non-zero.

One node (default): ``--standalone --nproc-per-node <workers>``. Several nodes
(``ddp_nnodes`` > 1): torchrun's *static* rendezvous at ``ddp_rdzv_endpoint``, so global
rank = node_rank * nproc_per_node + local_rank and rank 0 always runs on node 0.

Several hosts driven from here (``TrainingBackend.launch_on_hosts``, e.g. the hosts of
``pipelines.cluster.EmulatedCluster``): ``host_torchrun_commands`` builds one torchrun per host
(node rank = host index, the static rendezvous on host 0), ``host_placements`` says which host
each global rank runs on, ``host_env`` pins gloo to the hosts' interface, and
``execute_on_hosts`` starts them all, tees each node's output to its own log and takes the
others down when one fails.

``gpu_count`` / ``has_gpus`` probe the host's GPUs with nvidia-smi (no torch import: adapters
and preflight stay cheap).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.config import BenchmarkConfig

log = logging.getLogger(__name__)
WORKER_MODULE = "pipelines.training.worker"
TAIL_LINES = 40  # of the launcher's output, in the error when it fails
HOST_IFNAME = "eth0"  # the interface of a launch host (EmulatedHost: its veth to the switch)


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
            # the platform's own recovery (matrix.platform_retries; 0: a failure ends the attempt)
            "--max-restarts", str(config.matrix.platform_retries), "--monitor-interval", "0.1"]
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


# A private network namespace with only loopback, up: unshare(1) makes it, sh brings lo up, then
# execs the launcher (same PID), so everything the cell starts lives in it.
_ISOLATE = ["unshare", "--net", "--", "/bin/sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


@functools.lru_cache(maxsize=1)
def isolation_available() -> bool:
    """Can a cell get a private network namespace here? Tried once (root in a container without
    CAP_SYS_ADMIN cannot: the cell then runs as before, with a warning)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run([*_ISOLATE, "true"], capture_output=True, check=False, timeout=30)
    return probe.returncode == 0


def isolated(cmd: list[str]) -> list[str]:
    """``cmd`` in a private network namespace of its own (loopback only), where possible: a
    one-node torchrun's rendezvous store listens on every interface, Determined's local mode on
    ``tcp://*:12360`` / ``12365``; in the namespace nothing outside the cell reaches them."""
    if not isolation_available():
        log.warning("no private network namespace for the cell (needs root, unshare and ip): its "
                    "rendezvous port is reachable on this host's interfaces")
        return list(cmd)
    return [*_ISOLATE, *cmd]


def execute(cmd: list[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None) -> None:
    """Run the launcher to completion, teeing its output; raise with the tail on failure. A
    one-node (``--standalone``) torchrun runs ``isolated``: it needs no network beyond loopback."""
    if "--standalone" in cmd:
        cmd = isolated(cmd)
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


def host_config(config: BenchmarkConfig, hosts: Sequence[Any], node_rank: int, port: int) -> BenchmarkConfig:
    """``config`` as node ``node_rank`` of ``hosts`` sees it: ``engines.ddp`` nnodes = the host
    count, its node rank, the rendezvous at ``hosts[0].address:port``."""
    return config.model_copy(update={"engines.ddp.nnodes": len(hosts), "engines.ddp.node_rank": node_rank,
                                     "engines.ddp.rdzv_endpoint": f"{hosts[0].address}:{port}"})


def host_nproc(world_size: int, n_hosts: int) -> int:
    """Processes per host: the cell's world size split evenly over the hosts."""
    if n_hosts < 1 or world_size < 1 or world_size % n_hosts:
        raise ValueError(f"workers={world_size} cannot be split evenly over {n_hosts} host(s): workers is the "
                         "total number of processes across all hosts and must be a positive multiple of the "
                         "host count")
    return world_size // n_hosts


def host_torchrun_commands(config: BenchmarkConfig, world_size: int, cell_dir: Path, launch_time: float,
                           hosts: Sequence[Any], port: int, module: str = WORKER_MODULE,
                           python: str = sys.executable) -> list[list[str]]:
    """One torchrun command line per host (index = node rank), static rendezvous on host 0."""
    host_nproc(world_size, len(hosts))
    return [worker_command(host_config(config, hosts, k, port), world_size, cell_dir, launch_time,
                           module=module, python=python) for k in range(len(hosts))]


def host_placements(world_size: int, hosts: Sequence[Any]) -> list[dict]:
    """Which host each global rank runs on under the static rendezvous
    (rank = node_rank * nproc_per_node + local_rank, node rank = host index)."""
    per_host = host_nproc(world_size, len(hosts))
    return [{"rank": k * per_host + local, "host": host.name, "address": host.address}
            for k, host in enumerate(hosts) for local in range(per_host)]


def host_env(config: BenchmarkConfig, base: Mapping[str, str], local_processes: int,
             gpus: int | None = None, ifname: str = HOST_IFNAME) -> dict[str, str]:
    """``launch_env`` plus gloo (and TensorPipe) bound to the host's network interface: left to
    itself gloo picks the interface the host name resolves to, which a launch host may not reach."""
    env = launch_env(config, base, local_processes, gpus=gpus)
    env["GLOO_SOCKET_IFNAME"] = ifname
    env["TP_SOCKET_IFNAME"] = ifname
    env["NCCL_SOCKET_IFNAME"] = ifname  # NCCL's bootstrap, should the hosts have GPUs
    return env


_FREE_PORT = ("import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); "
              "print(s.getsockname()[1]); s.close()")


def free_port_on(host: Any, python: str = sys.executable, timeout_s: float = 30.0) -> int:
    """A TCP port free on ``host`` right now (its own kernel picks it, inside its namespace)."""
    proc = host.run([python, "-c", _FREE_PORT, host.address], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"could not find a free port on {host.name}: {err.strip()}")
    return int(out.strip())


def _stop_tree(procs: Sequence[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM each launcher (torchrun takes its ranks down), then SIGKILL what is left of the trees."""
    import psutil

    trees = []
    for proc in procs:
        if proc.poll() is not None:
            continue
        try:
            parent = psutil.Process(proc.pid)
            trees += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        proc.terminate()
    _, alive = psutil.wait_procs(trees, timeout=grace_s)
    for leftover in alive:
        try:
            leftover.kill()
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def execute_on_hosts(cmds: Sequence[list[str]], env: Mapping[str, str], hosts: Sequence[Any],
                     log_paths: Sequence[Path], poll_s: float = 0.1) -> None:
    """Run ``cmds[k]`` on ``hosts[k]`` at once, tee each one's output to ``log_paths[k]``; when one
    exits non-zero, stop the others and raise with its tail (as ``execute`` does for one)."""
    if not len(cmds) == len(hosts) == len(log_paths):
        raise ValueError("execute_on_hosts: one command and one log per host")
    echo = threading.Lock()
    tails = [collections.deque(maxlen=TAIL_LINES) for _ in hosts]

    def tee(proc: subprocess.Popen, log_path: Path, tail: collections.deque, label: str) -> None:
        with open(log_path, "a") as log_file:
            for line in proc.stdout:  # type: ignore[union-attr]
                log_file.write(line)
                log_file.flush()
                tail.append(line)
                with echo:
                    sys.stdout.write(f"[{label}] {line}")

    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    try:
        for cmd, host, log_path, tail in zip(cmds, hosts, log_paths, tails):
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log.info("launching on %s (%s): %s", host.name, host.address, " ".join(cmd))
            proc = host.run(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
            procs.append(proc)
            thread = threading.Thread(target=tee, args=(proc, log_path, tail, host.name), daemon=True)
            thread.start()
            threads.append(thread)
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((k for k, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is None:
                time.sleep(poll_s)
        if failed is None:  # all exited: the first non-zero, if any
            failed = next((k for k, p in enumerate(procs) if p.returncode != 0), None)
    finally:
        _stop_tree(procs)  # nothing when all exited; on failure or interruption: the others
        for thread in threads:
            thread.join(10)
    if failed is not None:
        raise RuntimeError(f"torchrun on {hosts[failed].name} (node {failed}) exited with "
                           f"{procs[failed].returncode} (full log: {log_paths[failed]}); the other node(s) "
                           f"were stopped; last lines:\n{''.join(tails[failed])}")
