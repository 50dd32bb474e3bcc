"""Ray Train across several hosts by Ray's own multi-node path: a Ray cluster built on them.

``run_cell(config, paths, "ray", N, hosts=cluster.hosts)`` (e.g. the hosts of
``pipelines.cluster.EmulatedCluster``) calls ``RayBackend.launch_on_hosts`` -> ``launch`` here:

1. a Ray **head on hosts[0]** (``ray start --head --block``, its GCS on hosts[0]'s address and a
   port free there) and, once it says it started, **one node per other host** (``ray start
   --address=<head> --block``), each through ``host.run`` so every Ray process (GCS, raylet,
   agents, the workers a raylet starts) lives in its host: its namespace and cgroups. Each node
   has ``N / len(hosts)`` x ``threads_per_worker`` CPUs, a small object store and its own
   ``--temp-dir``, ``<scratch>/<host>``: the launch's private scratch folder
   (``pipelines.runfolder.scratch``: 0700, an unguessable short name in ``/tmp``, which the hosts
   share; Ray's socket paths must stay under ~107 characters). Token authentication is on, with a
   token made for the launch (``<scratch>/auth``, 0600, ``RAY_AUTH_TOKEN_PATH``). Their output goes
   to ``<cell>/ray-hosts/<host>.log``;
2. the **driver on hosts[0]** (the launching process may not reach the hosts):
   ``python -m pipelines.platforms.ray.hosts --cell-dir ... --launch-time ... --address <head> --nodes k``,
   its output teed to the cell's ``train.log``. It joins the cluster, waits until all ``k`` nodes
   are alive, and runs the local path's ``TorchTrainer`` (``pipelines.platforms.ray.adapter.torch_trainer``)
   with ``placement_strategy="STRICT_SPREAD"`` when there is one worker per host; gloo and
   TensorPipe use the hosts' ``eth0`` (the workers' runtime env). A node that exits meanwhile
   fails the launch at once, and so does a driver still running after ``DRIVE_DEADLINE_S`` or
   a process whose output is no longer read (``Unread``: it would block on a full pipe);
3. afterwards (success, failure, exception, KeyboardInterrupt) the driver is stopped if still
   running, every ``ray start --block`` gets SIGTERM (it stops its node's processes, without
   Ray's drain; no ``ray stop``, which would kill every Ray process of the machine), then
   ``host.stop_processes`` takes whatever is left on each host, and the scratch folder is
   removed (a failed launch first copies Ray's logs to ``<cell>/ray-hosts/<host>-logs``). That
   happens after rank 0 wrote its result, so it is the cell's teardown phase.

``fault=host_return`` (``pipelines.measure.faults``): each non-head host's ``ray start`` is offered
to be run again when the host comes back (``offer_return``; the standing cluster's too); the node
joins the head and an elastic worker group (``engines.ray.elastic_min_workers``) grows back.

Each rank reports its own host (``pipelines.training.distributed.placement``): the raylets get
``BENCHMARK_HOST`` from ``host.run`` and the workers they start inherit it.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.measure import faults, signals
from pipelines.platforms.ray import trainer
from pipelines.platforms.ray.logs import job_runtime_env
from pipelines.platforms.ray.worker import DRIVER_LOG_ENV
from pipelines.training.cell import CellSpec
from pipelines.cluster.processes import Tee, free_port_on, stop_tree
from pipelines.platforms.torchrun import HOST_IFNAME, execute_on_hosts, host_nproc
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.runfolder.scratch import make_scratch, remove_scratch

log = logging.getLogger(__name__)
DAEMON_DIR = "ray-hosts"  # in the cell folder: each node's `ray start` output, Ray's logs of a failed launch
READY = "Ray runtime started."  # `ray start` prints it once its node runs
OBJECT_STORE_BYTES = 150 * 10**6  # per node (Ray's minimum is 75 MB): the loop passes paths, not data
NODE_START_S = 180.0  # the head on one loaded core
NODE_WAIT_S = 180.0  # the driver, until every node is alive
NODE_STOP_S = 15.0  # `ray start --block` on SIGTERM stops its node's processes (graceful, then SIGKILL)
# its drain first would wait for the node to go idle, which a head never does (Ray Train's detached
# actors live there): 30 s of nothing after every cell. The driver is gone by then: no drain.
NO_DRAIN = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
# Token authentication, always on with a token of the launch's own: left unset, `ray start --head`
# turns it on whenever ~/.ray/auth_token exists (a local ray.init writes one) and a joining driver
# does not, so the driver is refused ("InvalidAuthToken").
OWN_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
STOP_GRACE_S = 3.0  # SIGTERM -> SIGKILL for what the nodes' shutdown left on a host
DRIVER_STOP_S = 10.0
# The longest a cell's driver may run on the hosts before it is taken for hung and the cell fails
# saying so (the config has no cell timeout). Far above any cell here (the study's full run: 499 s
# on 2 GPUs; a CPU smoke cell on emulated hosts: under a minute); PIPELINES_RAY_DRIVE_DEADLINE_S
# sets another.
DRIVE_DEADLINE_S = float(os.environ.get("PIPELINES_RAY_DRIVE_DEADLINE_S", str(12 * 3600)))
UNREAD_GRACE_S = 2.0  # a process whose output reader stopped, still running this long after: it will block
# the driver's output (workers' lines included, Ray prefixes them) is the cell's train.log: the
# workers then add no file handler of their own (pipelines.platforms.ray.worker)


def node_temp_dir(scratch: str | Path, host: Any) -> str:
    """A node's own Ray temp folder, in the cluster's private scratch folder (which stays 0700 when
    Ray makes this one 0777): short (socket paths) and one per host."""
    return f"{scratch}/{host.name}"


def node_argv(hosts: Sequence[Any], k: int, port: int, cpus: int, temp_dir: str,
              python: str = sys.executable) -> list[str]:
    """``ray start --block`` for host ``k``: the head (GCS on ``port``) for k = 0, else a node joining
    it; ``temp_dir``: its Ray temp folder (``node_temp_dir``)."""
    host = hosts[k]
    common = [f"--node-ip-address={host.address}", f"--num-cpus={cpus}",
              f"--temp-dir={temp_dir}", f"--object-store-memory={OBJECT_STORE_BYTES}",
              "--disable-usage-stats", "--block"]
    ray = [python, "-m", "ray.scripts.scripts", "start"]
    if k == 0:
        return [*ray, "--head", f"--port={port}", "--include-dashboard=false", *common]
    return [*ray, f"--address={hosts[0].address}:{port}", *common]


def driver_argv(cell_dir: Path, launch_time: float, address: str, nodes: int,
                python: str = sys.executable) -> list[str]:
    return [python, "-m", "pipelines.platforms.ray.hosts", "--cell-dir", str(cell_dir),
            "--launch-time", repr(launch_time), "--address", address, "--nodes", str(nodes)]


def placement_strategy(world_size: int, n_hosts: int) -> str:
    """One worker per host: STRICT_SPREAD (each on its own node, or none starts); else SPREAD."""
    return "STRICT_SPREAD" if world_size == n_hosts else "SPREAD"


def process_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of the nodes and the driver: this project first on PYTHONPATH; none of the
    launch's own Ray settings (``OWN_ENV``: the address is explicit, the token the launch's)."""
    worker_env_vars = trainer.worker_env_vars
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in OWN_ENV}
    env["PYTHONPATH"] = worker_env_vars(env)["PYTHONPATH"]
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"  # the tee shows each line as it comes
    env["RAY_COLOR_PREFIX"] = "0"  # the workers' lines in the driver's output (train.log): no ANSI codes
    return env


def workers_runtime_env(base: Mapping[str, str] | None = None, ifname: str = HOST_IFNAME) -> dict:
    """The Ray Train workers' runtime env: the local path's, plus gloo / TensorPipe / NCCL on the
    hosts' interface (left to itself gloo picks the one the host name resolves to)."""
    env = trainer.worker_env_vars(dict(os.environ if base is None else base))
    env.update(GLOO_SOCKET_IFNAME=ifname, TP_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
    env[DRIVER_LOG_ENV] = "1"
    return job_runtime_env(env)


def _start(host: Any, argv: list[str], env: dict[str, str], log_path: Path, label: str,
           marker: str | None = None) -> Tee:
    """``argv`` on ``host``, its output teed to ``log_path`` and stdout (``[label]``); ``ready``
    once a line contains ``marker``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("ray: starting on %s (%s): %s", host.name, host.address, " ".join(argv))
    proc = host.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    text=True, cwd=str(PROJECT_ROOT))
    return Tee(proc, log_path, prefix=label, marker=marker).start()


class RayOnHosts:
    """The cell's Ray cluster on ``hosts``: ``start`` (head, then the other nodes), ``drive``
    (the driver on hosts[0], supervised), ``stop`` (everything, always)."""

    def __init__(self, spec: CellSpec, hosts: Sequence[Any]):
        self.spec, self.hosts = spec, list(hosts)
        self.cpus = host_nproc(spec.world_size, len(self.hosts)) * spec.config.training.threads_per_worker
        self.folder = spec.cell_dir / DAEMON_DIR
        self.scratch: Path | None = None  # the launch's private folder: the nodes' temp folders, the token
        self.env: dict[str, str] = {}
        self.nodes: list[Tee] = []
        self.driver: Tee | None = None

    def start(self, timeout_s: float = NODE_START_S) -> str:
        """Start the head, wait until it runs, start the other nodes (the driver waits for those);
        returns the head's GCS address."""
        self.scratch = make_scratch("rh")  # new for each launch: nothing an earlier one left is reused
        token = self.scratch / "auth"
        with os.fdopen(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))  # as `ray get-auth-token --generate`
        self.env = {**process_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        port = free_port_on(self.hosts[0])
        env = {**self.env, **NO_DRAIN, **trainer.node_env(self.spec.config)}
        head = _start(self.hosts[0], self._node_argv(0, port), env,
                      self.folder / f"{self.hosts[0].name}.log", f"{self.hosts[0].name} ray", READY)
        self.nodes.append(head)
        deadline = time.monotonic() + timeout_s
        while not head.ready.wait(0.2):
            if head.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray: the head on {self.hosts[0].name} did not start within "
                                   f"{timeout_s:.0f}s (exit code {head.proc.poll()}); last lines:\n"
                                   f"{head.text()}")
        for k, host in enumerate(self.hosts[1:], start=1):
            argv = self._node_argv(k, port)
            self.nodes.append(_start(host, argv, env, self.folder / f"{host.name}.log", f"{host.name} ray", READY))
            # a lost node comes back as an operator's supervisor would start it: the same `ray start`
            offer_return(self.spec.cell, host, argv, env, self.folder / f"{host.name}-returned.log")
        return f"{self.hosts[0].address}:{port}"

    def _node_argv(self, k: int, port: int) -> list[str]:
        return node_argv(self.hosts, k, port, self.cpus, node_temp_dir(self.scratch, self.hosts[k]))

    def drive(self, launch_time: float, address: str, poll_s: float = 0.2,
              deadline_s: float = DRIVE_DEADLINE_S) -> None:
        """Run the driver on hosts[0] to completion; raise with its tail when it fails, or with a
        node's when one exits first, or when it is still running after ``deadline_s`` or its or a
        node's output is no longer read (it would block on a full pipe)."""
        argv = driver_argv(self.spec.cell_dir, launch_time, address, len(self.hosts))
        head = self.hosts[0]
        elastic = self.spec.config.engine("ray").elastic_min_workers is not None
        self.driver = _start(head, argv, self.env, self.spec.cell.log, f"{head.name} driver")
        gone: set[str] = set()
        deadline, unread = time.monotonic() + deadline_s, Unread()
        while self.driver.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray: the driver on {head.name} was still running after {deadline_s:.0f}s "
                                   f"(DRIVE_DEADLINE_S, PIPELINES_RAY_DRIVE_DEADLINE_S): taken for hung; "
                                   f"last lines:\n{self.driver.text()}")
            unread.check({f"driver on {head.name}": self.driver,
                          **{f"node on {h.name}": n for h, n in zip(self.hosts, self.nodes)}})
            for k, (host, node) in enumerate(zip(self.hosts, self.nodes)):
                if node.proc.poll() is not None and elastic and k > 0:  # Ray Train shrinks the group
                    if host.name not in gone:
                        gone.add(host.name)
                        log.warning("ray: the node on %s exited with %s; the elastic worker group goes on "
                                    "without it", host.name, node.proc.returncode)
                elif node.proc.poll() is not None:
                    raise RuntimeError(f"ray: the node on {host.name} exited with {node.proc.returncode} "
                                       f"while the driver ran (log: {self.folder / host.name}.log); last "
                                       f"lines:\n{node.text()}")
            time.sleep(poll_s)
        self.driver.thread.join(10)
        if self.driver.proc.returncode != 0:
            raise RuntimeError(f"ray: the driver on {head.name} exited with {self.driver.proc.returncode} "
                               f"(full log: {self.spec.cell.log}); last lines:\n{self.driver.text()}")

    def stop(self, keep_logs: bool = False) -> dict[str, list[int]]:
        """Stop the driver and every node, then whatever is left on each host; remove the launch's
        scratch folder. Returns, per host, the pids that outlived the nodes' own shutdown."""
        start = time.perf_counter()
        faults.withdraw_restarts(self.spec.cell)
        if self.driver is not None and self.driver.proc.poll() is None:
            stop_tree([self.driver.proc], DRIVER_STOP_S, tree=False)
        stop_tree([n.proc for n in self.nodes], NODE_STOP_S, tree=False)  # each stops its own node
        left = {h.name: h.stop_processes(STOP_GRACE_S) for h in self.hosts
                if hasattr(h, "stop_processes")}  # what outlived its node's shutdown
        for out in [*self.nodes, *([self.driver] if self.driver else [])]:
            out.thread.join(5)
        for host in self.hosts:
            if keep_logs and self.scratch:
                _copy_logs(Path(node_temp_dir(self.scratch, host)), self.folder / f"{host.name}-logs")
        remove_scratch(self.scratch)  # the nodes' temp folders and the token
        log.info("ray: nodes on %d host(s) stopped in %.1fs%s", len(self.hosts), time.perf_counter() - start,
                 f"; killed what outlived them: {left}" if any(left.values()) else "")
        return left


class Unread:
    """Fails the launch when a process's output stopped being read (its Tee's thread ended, e.g.
    writing the log hit a full disk) while it still runs for ``UNREAD_GRACE_S``: its pipe would fill
    and it would block for good."""

    def __init__(self, grace_s: float = UNREAD_GRACE_S):
        self.grace_s, self.since = grace_s, {}

    def check(self, tees: Mapping[str, Tee]) -> None:
        now = time.monotonic()
        for what, tee in tees.items():
            if tee.thread is None or tee.thread.is_alive() or tee.proc.poll() is not None:
                self.since.pop(what, None)
            elif now - self.since.setdefault(what, now) > self.grace_s:
                why = getattr(tee, "error", None) or f"writing {tee.log_path} stopped, e.g. the disk is full"
                raise RuntimeError(f"ray: the output of the {what} is no longer read ({why}): it would "
                                   "block on a full pipe; stopped")


def _copy_logs(temp_dir: Path, target: Path) -> None:
    logs = temp_dir / "session_latest" / "logs"
    try:
        shutil.copytree(logs, target, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    except (OSError, shutil.Error) as err:
        log.warning("ray: could not keep %s: %s", logs, err)


def offer_return(cell, host: Any, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
    """``fault=host_return``: what ``host`` runs when it comes back (``pipelines.measure.faults``
    starts it): its node's ``ray start --address=<head> --block`` again, which joins the cluster;
    an elastic worker group then grows back within ``engines.ray.elastic_resize_interval_s``."""
    faults.offer_restart(cell, host, argv, dict(env), log_path, grace_s=0.0)  # a Ray node never leaves by itself


def launch(spec: CellSpec, launch_time: float, hosts: Sequence[Any]) -> None:
    """The cell across ``hosts`` on a cluster of its own (per job: its start is the cell's
    ``provision`` phase); every node is stopped whatever happens."""
    from pipelines.platforms.contract import provisioning

    host_nproc(spec.world_size, len(hosts))  # a bad split, before anything starts
    cluster = RayOnHosts(spec, hosts)
    failed = True
    try:
        with provisioning(spec.cell):
            address = cluster.start()
        cluster.drive(launch_time, address)
        failed = False
    finally:
        cluster.stop(keep_logs=failed)


def drive_standing(spec: CellSpec, launch_time: float, hosts: Sequence[Any], address: str,
                   joined: Mapping[str, str], nodes: int,
                   returns: Mapping[str, tuple[list[str], dict, Path]] | None = None) -> None:
    """The cell's driver on hosts[0] joining the run's standing cluster at ``address`` (``nodes``
    nodes; ``joined``: its token), teed to train.log; the cluster stays. ``returns``: per host
    name, the standing node's ``ray start`` (argv, env, log) to run again should the host come back
    (``fault=host_return``; the caller reads them from the standing cluster's state)."""
    host_nproc(spec.world_size, len(hosts))
    argv = driver_argv(spec.cell_dir, launch_time, address, nodes)
    for host in hosts[1:]:
        if returns and host.name in returns:
            offer_return(spec.cell, host, *returns[host.name])
    try:
        execute_on_hosts([argv], {**process_env(), **joined}, hosts[:1], [spec.cell.log], what="the Ray driver")
    except RuntimeError as err:
        raise RuntimeError(f"ray driver on {hosts[0].name}: {err}") from None
    finally:
        faults.withdraw_restarts(spec.cell)


def wait_for_nodes(count: int, timeout_s: float = NODE_WAIT_S, poll_s: float = 0.5) -> list[dict]:
    """The cluster's alive nodes once there are ``count`` (in the driver, after ``ray.init``)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= count:
            log.info("ray: %d node(s) alive: %s", len(alive), sorted(n["NodeManagerAddress"] for n in alive))
            return alive
        if time.monotonic() > deadline:
            raise TimeoutError(f"ray: only {len(alive)} of {count} node(s) alive after {timeout_s:.0f}s "
                               f"({sorted(n['NodeManagerAddress'] for n in alive)}); see the nodes' logs in "
                               f"<cell>/{DAEMON_DIR}/")
        time.sleep(poll_s)


def drive(cell_dir: str, launch_time: float, address: str, nodes: int,
          node_wait_s: float = NODE_WAIT_S) -> None:
    """The driver on hosts[0]: join the cluster, wait for its nodes, run the cell's TorchTrainer."""
    import ray

    spec = CellSpec.read(cell_dir)
    os.environ.update(trainer.driver_env(spec.config))  # this process is the cell's driver alone
    runtime_env = workers_runtime_env()
    handlers = signals.RaiseOnceHandlers("Ray's cluster shut down")  # as in RayBackend.launch
    try:
        log.info("ray: joining the cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env)
        handlers.raise_once()
        wait_for_nodes(nodes, node_wait_s)
        strategy = placement_strategy(spec.world_size, nodes)
        trainer.fit(trainer.torch_trainer(spec, launch_time, runtime_env, placement_strategy=strategy), handlers)
    finally:
        ray.shutdown()
        handlers.restore()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    parser.add_argument("--address", required=True, help="the head's GCS, host:port")
    parser.add_argument("--nodes", type=int, required=True, help="wait until this many nodes are alive")
    parser.add_argument("--node-wait-s", type=float, default=NODE_WAIT_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s driver: %(message)s")
    drive(args.cell_dir, args.launch_time, args.address, args.nodes, args.node_wait_s)


if __name__ == "__main__":
    main()
