"""A run's cluster: started once, shared by its cells, stopped at the end (``cluster.kind``).

``local`` (default): nothing to start; cells run on this host (``hosts_for_cell`` -> None).
``emulated``: ``start`` launches the keeper (``pipelines.cluster.keeper``), which builds the
``EmulatedCluster`` and records it in ``<run>/cluster/cluster.json``; every cell reaches its
hosts through that file (``attach``), from whatever process trains it (the CLI, an Airflow
task), and the links are shaped to the cell's network under the host's timing lock
(``ClusterHosts.prepare``), so two cells never see each other's rate. ``stop`` ends the keeper,
which kills every process on the hosts and deletes namespaces and cgroups.
``ssh``: real machines (``cluster.ssh_hosts``, ``pipelines.cluster.ssh``): nothing to start.

    start(paths, config); ...; stop(paths)    # through pipelines.run.stages.start_cluster / stop_cluster:
                                              # the DAG's setup / teardown tasks and the CLI's `run` /
                                              # `train` (stages.run_clusters)
    with run_cluster(paths, config):          # the same for a block, from a config in hand (tests)
        ...

Started by the CLI, the keeper also dies with it (``PR_SET_PDEATHSIG`` + ``--owner-pid``): a
SIGKILLed CLI leaves no cluster behind, and a SIGKILLed keeper's leftovers are swept by the next
start (``leftovers.sweep``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from pipelines.cluster.emulated import EmulatedCluster, EmulatedHost, NetworkSpec
from pipelines.cluster.leftovers import _cmd, sweep
from pipelines.cluster.processes import start_session, still, stop_tree
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import RunPaths

log = logging.getLogger(__name__)
STARTUP_S = 60.0
STOP_S = 30.0


def state_file(paths: RunPaths) -> Path:
    return paths.cluster / "cluster.json"


def _read(paths: RunPaths) -> dict | None:
    try:
        return json.loads(state_file(paths).read_text())
    except (FileNotFoundError, ValueError):
        return None


class ClusterGone(RuntimeError):
    """The run's emulated cluster is not running: no cell can train on it until it is started
    again, so a cell is not retried and the remaining cells are not tried (``stages``)."""


def why_not_running(paths: RunPaths) -> str:
    """What became of the run's cluster, for the message: never started, or its keeper died (with
    the end of the keeper's log)."""
    state = _read(paths)
    if state is None:
        return f"no cluster state ({state_file(paths)}): the CLI starts it, the DAG's start_cluster task does"
    log_file = paths.cluster / "keeper.log"
    tail = log_file.read_text(errors="replace").strip().splitlines()[-5:] if log_file.exists() else []
    return (f"its keeper (pid {state.get('keeper_pid')}, status {state.get('status')!r}) is not running: the hosts "
            f"went with it; start the cluster again (the CLI: run --run-dir; the DAG: clear start_cluster). "
            f"{log_file}: " + (" | ".join(tail) if tail else "empty"))


def is_running(paths: RunPaths) -> bool:
    state = _read(paths)
    return bool(state and state.get("status") == "ready" and _keeper_alive(state))


def _keeper_alive(state: dict) -> bool:
    """The keeper the state names still runs: its pid and start time (a pid alone may be reused)."""
    return still(state["keeper"]) if state.get("keeper") else psutil.pid_exists(state["keeper_pid"])


def start(paths: RunPaths, config: BenchmarkConfig, tied_to_caller: bool = False) -> dict | None:
    """Start the run's emulated cluster (idempotent: a running one is kept); its state, or None
    when ``cluster.kind`` is not ``emulated``. ``tied_to_caller``: the cluster stops when this
    process ends (the CLI); else it outlives it until ``stop`` (the DAG's setup task)."""
    if config.cluster.kind != "emulated":
        return None
    if is_running(paths):
        return _read(paths)
    from pipelines.cluster import why_unavailable

    reason = why_unavailable()
    if reason:
        raise RuntimeError(f"cluster.kind=emulated: no emulated cluster can be built here: {reason}")
    sweep()  # what SIGKILLed keepers left
    paths.cluster.mkdir(parents=True, exist_ok=True)
    state_file(paths).unlink(missing_ok=True)
    name = "r" + hashlib.sha1(str(paths.root.resolve()).encode()).hexdigest()[:6]  # names stay short
    argv = [sys.executable, "-m", "pipelines.cluster.keeper", "--state", str(state_file(paths)), "--name", name,
            "--hosts", str(config.cluster.hosts), "--network", config.networks()[0]]
    if config.cluster.memory_mb_per_host:
        argv += ["--memory-mb", str(config.cluster.memory_mb_per_host)]
    if config.cluster.cpu_per_host:
        argv += ["--cpu-fraction", str(config.cluster.cpu_per_host)]
    if tied_to_caller:
        argv += ["--owner-pid", str(os.getpid())]
    with open(paths.cluster / "keeper.log", "a") as out:
        keeper = start_session(argv, die_with_parent=tied_to_caller, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_S
    while (state := _read(paths)) is None or state.get("status") != "ready":
        if keeper.poll() is not None or time.monotonic() > deadline:
            keeper.kill()
            log_text = (paths.cluster / "keeper.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the emulated cluster did not start (keeper exit {keeper.poll()}); "
                               f"{paths.cluster / 'keeper.log'}:\n{log_text}")
        time.sleep(0.2)
    log.info("emulated cluster %s: %d hosts (%s)", state["prefix"], len(state["hosts"]),
             ", ".join(f"{h['name']} {h['address']}" for h in state["hosts"]))
    return state


def stop(paths: RunPaths) -> list[str]:
    """Stop the run's emulated cluster (idempotent); returns what a dead keeper left and was swept.
    A run that never had one (no state file: e.g. a local run, the compose stack) has nothing to stop."""
    state = _read(paths)
    if state is None:
        return []
    if state and _keeper_alive(state):  # proved ours before any signal
        if stop_tree([state["keeper_pid"]], STOP_S, kill_wait_s=5.0, tree=False):
            log.warning("the cluster keeper %d did not stop in %.0fs: killed, leftovers swept", state["keeper_pid"],
                        STOP_S)
    return sweep()


@contextlib.contextmanager
def run_cluster(paths: RunPaths, config: BenchmarkConfig) -> Iterator[dict | None]:
    """The cluster for the block (CLI): started before, stopped after, whatever happened."""
    try:
        yield start(paths, config, tied_to_caller=True)
    finally:
        if config.cluster.kind == "emulated":
            stop(paths)


def attach(state: dict) -> EmulatedCluster:
    """The cluster the keeper holds, as seen from another process: its hosts can run processes
    and be shaped; stopping it stays the keeper's."""
    cluster = EmulatedCluster.__new__(EmulatedCluster)
    cluster.name, cluster.n_hosts, cluster.memory_mb = state["name"], len(state["hosts"]), state["memory_mb"]
    cluster.cpu_fraction = state.get("cpu_fraction")
    cluster.network = NetworkSpec.parse(state["network"])
    cluster.prefix, cluster.switch_netns = state["prefix"], state["switch_netns"]
    cluster.processes, cluster.started = [], False  # not ours to stop
    cluster.cgroup_parents = {c: Path(p) for c, p in state["cgroup_parents"].items()}
    cluster.ip_binary = shutil.which("ip") or "ip"
    cluster.hosts = [EmulatedHost(cluster, k, h["core"]) for k, h in enumerate(state["hosts"])]
    return cluster


def shape(cluster: EmulatedCluster, network: str) -> None:
    """Set every host link of ``cluster`` to ``network`` (both ends, as at start)."""
    spec = NetworkSpec.parse(network)
    for host in cluster.hosts:
        for ns, dev in ((host.netns, "eth0"), (cluster.switch_netns, f"p{host.index}")):
            if spec.tbf_args():
                _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", *spec.tbf_args()])
            else:
                _cmd(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
    cluster.network = spec


class ClusterHosts(list):
    """The hosts of one cell, plus ``prepare``: what ``TrainingBackend.run`` calls under the
    host's timing lock before the launch (shape the links to the cell's network)."""

    def __init__(self, hosts: list, cluster: EmulatedCluster | None = None, network: str | None = None):
        super().__init__(hosts)
        self.cluster, self.network = cluster, network

    def prepare(self) -> None:
        if self.cluster is not None and self.network:
            shape(self.cluster, self.network)


def hosts_for_cell(paths: RunPaths, config: BenchmarkConfig, workers: int, network: str) -> ClusterHosts | None:
    """The hosts a cell's ranks run on: one rank per host while there are hosts enough, else
    ``workers / hosts`` per host; None for a local run."""
    kind = config.cluster.kind
    if kind == "local":
        return None
    if kind == "ssh":
        from pipelines.cluster.ssh import hosts_from_config

        return ClusterHosts(_pick(hosts_from_config(config), workers))
    state = _read(paths)
    if not is_running(paths) or state is None:
        raise ClusterGone(f"cluster.kind=emulated but the run's cluster is not running: {why_not_running(paths)}")
    cluster = attach(state)
    return ClusterHosts(_pick(cluster.hosts, workers), cluster, network)


def _pick(hosts: list, workers: int) -> list:
    if workers <= len(hosts):
        return hosts[:workers]
    if workers % len(hosts):
        raise ValueError(f"workers={workers} cannot be spread over the cluster's {len(hosts)} hosts: "
                         "at most one per host, or a multiple of the host count")
    return list(hosts)


def worker_count_problems(config: BenchmarkConfig) -> list[str]:
    """Preflight: worker counts the cluster cannot place."""
    if config.cluster.kind == "local":
        return []
    n = config.cluster.hosts if config.cluster.kind == "emulated" else len(config.cluster.ssh_hosts)
    return [f"worker_counts: {w} cannot be spread over {n} {config.cluster.kind} host(s) (at most one per host, "
            f"or a multiple of {n})" for w in config.matrix.worker_counts if w > n and w % n]
