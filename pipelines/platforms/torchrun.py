"""Launching the shared worker with torchrun: what every torchrun-based platform uses.

The platforms whose ranks torchrun starts (the shared worker, ``pipelines.training.worker``, or a
platform's own training module) start them the same way, so all see identical start-up.
The command and environment are built by pure functions (``torchrun_command`` from explicit
values, ``worker_command`` for a cell, ``launch_env``) and executed second by ``execute``, which
tees the output to the cell's log and raises with its tail when torchrun exits non-zero. Which
nodes a launch spans is the caller's (an adapter, from its ``engines.<name>`` settings); nothing
here reads a platform's settings.

One node (default): ``--standalone --nproc-per-node <workers>``. Several nodes (``nnodes`` > 1):
torchrun's *static* rendezvous at ``rdzv_endpoint``, so global rank = node_rank *
nproc_per_node + local_rank and rank 0 always runs on node 0.

Several hosts driven from here (``TrainingBackend.launch_on_hosts``, e.g. the hosts of
``pipelines.cluster.EmulatedCluster``): ``host_torchrun_commands`` builds one torchrun per host
(node rank = host index, the static rendezvous on host 0), ``host_placements`` says which host
each global rank runs on, ``host_env`` pins gloo to the hosts' interface, and
``execute_on_hosts`` starts them all, tees each node's output to its own log and takes the
others down when one fails. Elastic (``elastic_host_commands``, where a platform's
settings ask for it): ``--nnodes MIN:MAX`` with torchrun's c10d rendezvous (its store on host
0), so the surviving agents restart their workers at a smaller world size when a node is lost and
at the full size when it comes back; ``execute_on_hosts(elastic=True)`` lets the survivors finish. Starting, stopping and teeing processes, and free ports, are
``pipelines.cluster.processes``'.

``gpu_count`` / ``has_gpus`` probe the host's GPUs with nvidia-smi (no torch import: adapters
and preflight stay cheap).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.cluster import netns
from pipelines.cluster.processes import Tee, run_to_end, stop_tree
from pipelines.config import BenchmarkConfig

log = logging.getLogger(__name__)
WORKER_MODULE = "pipelines.training.worker"
HOST_IFNAME = "eth0"  # the interface of a launch host (EmulatedHost: its veth to the switch)
# the longest a launch across hosts may run before its cell fails (no poll loop waits for ever)
LAUNCH_DEADLINE_ENV = "PIPELINES_LAUNCH_DEADLINE_S"
LAUNCH_DEADLINE_S = float(os.environ.get(LAUNCH_DEADLINE_ENV) or 12 * 3600)
STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL for a launcher (torchrun takes its ranks down meanwhile)


def gpu_count() -> int:
    """GPUs on this host (nvidia-smi; no torch import in the adapter)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def has_gpus() -> bool:
    """CUDA GPUs on this host (``gpu_count`` > 0)."""
    return gpu_count() > 0


def nproc_per_node(world_size: int, nnodes: int = 1) -> int:
    """Processes each node starts: the cell's total world size split evenly over ``nnodes``."""
    if world_size < 1 or nnodes < 1 or world_size % nnodes:
        raise ValueError(
            f"workers={world_size} cannot be split over nnodes={nnodes}: workers is the total number of "
            f"processes across all nodes and must be a positive multiple of nnodes")
    return world_size // nnodes


def torchrun_args(nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str = "",
                  rdzv_id: str = "pipelines", max_restarts: int = 0) -> list[str]:
    """torchrun options: standalone on one node, static rendezvous at ``rdzv_endpoint`` across
    ``nnodes`` nodes; ``max_restarts``: the platform's own recovery (0: a failure ends the attempt)."""
    args = ["--nproc-per-node", str(nproc_per_node), "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.1"]
    if nnodes == 1 and not rdzv_endpoint:
        # --local-addr: the store's address is loopback, not this host's name, which in a cell's own
        # network namespace (``isolated``) may resolve to an address that is not there (a container's)
        return ["--standalone", "--nnodes", "1", "--local-addr", "127.0.0.1", *args]
    if not rdzv_endpoint:
        raise ValueError(f"nnodes={nnodes} needs rdzv_endpoint=host:port (node 0)")
    if node_rank >= nnodes:
        raise ValueError(f"node_rank={node_rank} must be < nnodes={nnodes}")
    # static: the node rank fixes the ranks (rank 0 on node 0, which reads the result back)
    return ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "static",
            "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id, *args]


# torchrun's c10d rendezvous, tuned for a cell: a dead agent is dropped after 3 missed 1-s
# keep-alives; once MIN nodes are there the round waits LAST_CALL_S for the rest (both agents
# start at once: they meet well within it), so a survivor goes on LAST_CALL_S after a loss.
ELASTIC_LAST_CALL_S = 8
ELASTIC_JOIN_TIMEOUT_S = 300


def elastic_torchrun_args(nproc_per_node: int, *, min_nodes: int, max_nodes: int, rdzv_endpoint: str,
                          rdzv_id: str, local_addr: str, is_host: bool, max_restarts: int) -> list[str]:
    """torchrun options for an elastic node: ``--nnodes MIN:MAX`` and the c10d rendezvous whose
    store the agent at ``rdzv_endpoint`` hosts (``is_host``: this node). No node rank: the
    rendezvous orders the nodes, so rank 0 may run on any of them. ``local_addr``: the address
    the other nodes reach this one at (the workers' store is on rank 0's node)."""
    if not 1 <= min_nodes <= max_nodes:
        raise ValueError(f"elastic_min_nodes={min_nodes} must be between 1 and the nodes ({max_nodes})")
    if not rdzv_endpoint:
        raise ValueError("an elastic torchrun needs rdzv_endpoint=host:port (the c10d store's node)")
    conf = (f"join_timeout={ELASTIC_JOIN_TIMEOUT_S},last_call_timeout={ELASTIC_LAST_CALL_S},close_timeout=10,"
            f"keep_alive_interval=1,keep_alive_max_attempt=3,is_host={str(is_host).lower()}")
    return ["--nnodes", f"{min_nodes}:{max_nodes}", "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
            "--rdzv-id", rdzv_id, "--rdzv-conf", conf, "--local-addr", local_addr,
            "--nproc-per-node", str(nproc_per_node), "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.1"]


def torchrun_command(*, nproc_per_node: int, cell_dir: Path, launch_time: float, nnodes: int = 1,
                     node_rank: int = 0, rdzv_endpoint: str = "", rdzv_id: str | None = None,
                     max_restarts: int = 0, module: str = WORKER_MODULE, python: str = sys.executable) -> list[str]:
    """The full torchrun command line of one node from explicit values (``torchrun_args``);
    the rendezvous id defaults to the cell folder's name."""
    return [python, "-m", "torch.distributed.run",
            *torchrun_args(nproc_per_node, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                           rdzv_id=rdzv_id or Path(cell_dir).name, max_restarts=max_restarts),
            "-m", module, "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time)]


def worker_command(config: BenchmarkConfig, world_size: int, cell_dir: Path, launch_time: float,
                   module: str = WORKER_MODULE, python: str = sys.executable, *, nnodes: int = 1,
                   node_rank: int = 0, rdzv_endpoint: str = "") -> list[str]:
    """This node's torchrun command for a cell of ``world_size`` processes over ``nnodes`` nodes
    (one by default); torchrun's restarts = ``matrix.platform_retries``."""
    return torchrun_command(nproc_per_node=nproc_per_node(world_size, nnodes), cell_dir=cell_dir,
                            launch_time=launch_time, nnodes=nnodes, node_rank=node_rank,
                            rdzv_endpoint=rdzv_endpoint, max_restarts=config.matrix.platform_retries,
                            module=module, python=python)


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


def isolated(cmd: list[str]) -> list[str]:
    """``cmd`` in a loopback-only network namespace of its own (``pipelines.cluster.netns.own``),
    where possible: a one-node torchrun's rendezvous store listens on every interface, and so may what
    a platform's training module starts (see its package); in the namespace nothing outside the cell reaches them."""
    return [*netns.own("the cell's torchrun").prefix, *cmd]


def execute(cmd: list[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None) -> None:
    """Run the launcher to completion, teeing its output; raise with the tail on failure. A
    one-node (``--standalone``) torchrun runs ``isolated``: it needs no network beyond loopback.
    Interrupted (a signal's exception, KeyboardInterrupt), it stops the launcher's tree."""
    if "--standalone" in cmd:
        cmd = isolated(cmd)
    run_to_end(cmd, env, log_path, what="torchrun", grace_s=STOP_GRACE_S, cwd=cwd)


def host_nproc(world_size: int, n_hosts: int) -> int:
    """Processes per host: the cell's world size split evenly over the hosts."""
    if n_hosts < 1 or world_size < 1 or world_size % n_hosts:
        raise ValueError(f"workers={world_size} cannot be split evenly over {n_hosts} host(s): workers is the "
                         "total number of processes across all hosts and must be a positive multiple of the "
                         "host count")
    return world_size // n_hosts


def host_torchrun_commands(world_size: int, cell_dir: Path, launch_time: float, hosts: Sequence[Any], port: int,
                           *, max_restarts: int = 0, module: str = WORKER_MODULE,
                           python: str = sys.executable) -> list[list[str]]:
    """One torchrun command line per host (index = node rank), static rendezvous on
    ``hosts[0].address:port``."""
    per_host = host_nproc(world_size, len(hosts))
    return [torchrun_command(nproc_per_node=per_host, cell_dir=cell_dir, launch_time=launch_time,
                             nnodes=len(hosts), node_rank=k, rdzv_endpoint=f"{hosts[0].address}:{port}",
                             max_restarts=max_restarts, module=module, python=python)
            for k in range(len(hosts))]


def elastic_host_commands(world_size: int, cell_dir: Path, launch_time: float, hosts: Sequence[Any], port: int,
                          *, min_nodes: int, max_restarts: int, module: str = WORKER_MODULE,
                          python: str = sys.executable) -> list[list[str]]:
    """One elastic torchrun per host (``elastic_torchrun_args``), the c10d store on
    ``hosts[0].address:port``; the same line started again on a host brings it back in."""
    per_host = host_nproc(world_size, len(hosts))
    endpoint = f"{hosts[0].address}:{port}"
    return [[python, "-m", "torch.distributed.run",
             *elastic_torchrun_args(per_host, min_nodes=min_nodes, max_nodes=len(hosts), rdzv_endpoint=endpoint,
                                    rdzv_id=Path(cell_dir).name, local_addr=host.address, is_host=k == 0,
                                    max_restarts=max_restarts),
             "-m", module, "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time)]
            for k, host in enumerate(hosts)]


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


def _check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what} across hosts still ran after {LAUNCH_DEADLINE_S:.0f} s "
                           f"({LAUNCH_DEADLINE_ENV}): stopped")


def _first_failure(procs: Sequence[subprocess.Popen], poll_s: float, deadline: float = float("inf"),
                   what: str = "torchrun") -> int | None:
    """Wait until one exits non-zero (its index) or all exited (the first non-zero, if any)."""
    while any(p.poll() is None for p in procs):
        _check_deadline(deadline, what)
        failed = next((k for k, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        if failed is not None:
            return failed
        time.sleep(poll_s)
    return next((k for k, p in enumerate(procs) if p.returncode != 0), None)


def _all_exited(procs: Sequence[subprocess.Popen], poll_s: float, deadline: float = float("inf"),
                what: str = "torchrun") -> int | None:
    """Elastic: a node that fails is the others' to survive (their agents re-rendezvous without
    it). Wait for every node; None if any finished (the survivors trained to the end), else the
    index of the last one to fail (the survivor's error says why the cell could not go on)."""
    order: list[int] = []
    while len(order) < len(procs):
        _check_deadline(deadline, what)
        order += [k for k, p in enumerate(procs) if p.poll() is not None and k not in order]
        time.sleep(poll_s)
    if any(p.returncode == 0 for p in procs):
        for k in order:
            if procs[k].returncode != 0:
                log.warning("node %d's agent exited with %d; the other node(s) went on without it", k,
                            procs[k].returncode)
        return None
    return order[-1]


def execute_on_hosts(cmds: Sequence[list[str]], env: Mapping[str, str], hosts: Sequence[Any],
                     log_paths: Sequence[Path], poll_s: float = 0.1, what: str = "torchrun",
                     elastic: bool = False) -> None:
    """Run ``cmds[k]`` on ``hosts[k]`` at once, tee each one's output to ``log_paths[k]``; when one
    exits non-zero, stop the others and raise with its tail (as ``execute`` does for one);
    ``what``: the program, for the message. ``elastic``: a node's failure is not the end: the
    launch succeeds when any node's agent finishes (``_all_exited``)."""
    if not len(cmds) == len(hosts) == len(log_paths):
        raise ValueError("execute_on_hosts: one command and one log per host")
    procs: list[subprocess.Popen] = []
    tees: list[Tee] = []
    failed = None
    try:
        for cmd, host, log_path in zip(cmds, hosts, log_paths):
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log.info("launching on %s (%s): %s", host.name, host.address, " ".join(cmd))
            proc = host.run(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
            procs.append(proc)
            tees.append(Tee(proc, log_path, prefix=host.name).start())
        deadline = time.monotonic() + LAUNCH_DEADLINE_S
        failed = (_all_exited if elastic else _first_failure)(procs, poll_s, deadline, what)
    finally:
        stop_tree(procs, STOP_GRACE_S)  # nothing when all exited; on failure or interruption: the others
        for tee in tees:
            tee.join(10)
    unwritten = next((k for k, tee in enumerate(tees) if tee.error), None)
    if failed is None and unwritten is not None:  # exited 0, but its log is not whole
        raise RuntimeError(f"{what} on {hosts[unwritten].name}: {tees[unwritten].error}")
    if failed is not None:
        others = "every other node failed too" if elastic else "the other node(s) were stopped"
        raise RuntimeError(f"{what} on {hosts[failed].name} (node {failed}) exited with "
                           f"{procs[failed].returncode} (full log: {log_paths[failed]}); {others}; "
                           f"last lines:\n{tees[failed].text()}")
