"""The run's standing Ray cluster (``pipelines.run.services``): a head on this host, or a head on
hosts[0] and a node on every other emulated host, started once before the first standing Ray
cell and kept for the next ones (as teams keep a Ray cluster and submit jobs to it); stopped
before a cell of another platform and at the run's end. Each cell's driver joins it
(``address``), with the cluster's own auth token. A per-job cell starts its own instead
(``ray_per_job``: a local cluster per cell, or ``hosts.launch``).

Ownership: Ray's temp folders are inside a private scratch folder (``pipelines.runfolder.scratch``,
0700, an unguessable name) recorded in the state file; whoever uses it later checks it first. The
stop signals only what it can prove the cluster's: the recorded node processes (pid, start time
and uid: never a reused pid), their descendants seen before the stop, and this user's processes
that name the scratch folder, or a path inside it, as a whole argument (never a path that only
starts with the same characters: ``/tmp/bm-rs-ab`` is not ``/tmp/bm-rs-abc``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from pipelines.cluster import netns
from pipelines.cluster.leftovers import process_start
from pipelines.cluster.processes import start_session, stop_tree
from pipelines.config import BenchmarkConfig
from pipelines.platforms.ray.trainer import node_env, ray_temp_dir
from pipelines.platforms.ray.hosts import (NO_DRAIN, NODE_START_S, NODE_STOP_S, OBJECT_STORE_BYTES, READY,
                                           STOP_GRACE_S, node_argv, node_temp_dir, process_env)
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.scratch import check_scratch, make_scratch, remove_scratch

log = logging.getLogger(__name__)
# a loopback address Ray does not rewrite: it replaces "127.0.0.1" in an address to join with this
# machine's outward address (ray._private.services.resolve_ip_for_localhost), where nothing listens
LOCAL_IP = "127.0.0.2"


def folder(paths: RunPaths) -> Path:
    return paths.root / "ray-standing"


def state(paths: RunPaths) -> dict | None:
    try:
        return json.loads((folder(paths) / "state.json").read_text())
    except (OSError, ValueError):
        return None


def token_env(found: dict) -> dict[str, str]:
    """What a driver joining the standing cluster needs: its token (Ray's token auth). On this
    host it is Ray's default token file (~/.ray/auth_token, which a per-job ``ray.init`` uses
    too: one token per process, which Ray loads once); on the hosts, the cluster's own."""
    if found["kind"] == "local":
        return {"RAY_AUTH_MODE": "token"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": found["token"]}


def init_options(found: dict) -> dict:
    """``ray.init`` keyword arguments of a driver on this host joining the standing cluster (whose
    sockets are in its scratch folder: checked first)."""
    check_scratch(found["scratch"])
    return {"address": found["address"], **({"_node_ip_address": found["node_ip"]} if found.get("node_ip") else {})}


def daemon_pids(paths: RunPaths) -> list[int]:
    """The standing cluster's node processes (the resource split counts them as the cell's platform)."""
    found = state(paths)
    return list(found["pids"]) if found else []


def _wait_ready(log_file: Path, proc: subprocess.Popen, timeout_s: float = NODE_START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while READY not in (log_file.read_text(errors="replace") if log_file.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray: the standing head did not start (exit code {proc.poll()}); "
                               f"{log_file}:\n{log_file.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


def _token(path: Path, fresh: bool) -> str:
    """A token file (0600): ``fresh`` a new one (the hosts' cluster), else Ray's default one,
    made if missing (as `ray get-auth-token --generate`)."""
    if fresh:
        path.unlink(missing_ok=True)
    elif path.exists():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(secrets.token_hex(32))
    return str(path)


def namespace(found: dict) -> netns.Namespace:
    """Where the standing cluster runs, for a driver joining it: the run's network namespace (the
    head on this host), else this host's (the emulated hosts' nodes, or no namespace could be made)."""
    return netns.enter(found["netns"]) if found.get("netns") else netns.host(found.get("not_isolated"))


def _start_local(paths: RunPaths, config: BenchmarkConfig, env: dict, tied: bool, scratch: Path) -> dict:
    """The head on this host, in the run's network namespace (with every driver that joins it)."""
    from pipelines.cluster.processes import free_port

    port, temp_dir = free_port(), ray_temp_dir(scratch)
    cpus = max(os.cpu_count() or 1, max(config.matrix.worker_counts) * config.training.threads_per_worker)
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", f"--node-ip-address={LOCAL_IP}",
            f"--num-cpus={cpus}", "--include-dashboard=false", f"--temp-dir={temp_dir}",
            f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats", "--block"]
    log_file = folder(paths) / "head.log"
    where = netns.ensure_run(paths, tied_to_caller=tied, allow_unisolated=config.cluster.allow_unisolated_cells)
    with open(log_file, "w") as out:
        head = start_session([*where.prefix, *argv], die_with_parent=tied, env=env, stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _wait_ready(log_file, head)
    return {"address": f"{LOCAL_IP}:{port}", "node_ip": LOCAL_IP, "pids": [head.pid], "kind": "local",
            "netns": netns.run_state(paths) if where.kind == "run" else None,
            "not_isolated": where.not_isolated}  # its cells record it (results' isolation)


def _start_hosts(paths: RunPaths, config: BenchmarkConfig, env: dict, scratch: Path) -> dict:
    from pipelines.cluster import lifecycle
    from pipelines.cluster.processes import free_port_on

    hosts = lifecycle.attach(lifecycle._read(paths)).hosts
    cpus = max(max(1, w // len(hosts)) for w in config.matrix.worker_counts) * config.training.threads_per_worker
    port, pids, argvs = free_port_on(hosts[0]), [], {}
    for k, host in enumerate(hosts):
        host.stop_processes(STOP_GRACE_S)  # what an earlier cell or a failed start left
        argv = argvs[host.name] = node_argv(hosts, k, port, cpus, node_temp_dir(scratch, host))
        log_file = folder(paths) / f"{host.name}.log"
        with open(log_file, "w") as out:  # a file, not a pipe: the nodes outlive the process starting them
            proc = host.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        pids.append(proc.pid)
        if k == 0:
            _wait_ready(log_file, proc)
    return {"address": f"{hosts[0].address}:{port}", "pids": pids, "kind": "hosts",
            "nodes": len(hosts), "argvs": argvs}


def _node_env(config: BenchmarkConfig, token: str) -> dict[str, str]:
    return {**process_env(), **NO_DRAIN, **node_env(config), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token}


def node_command(found: dict, config: BenchmarkConfig, host_name: str) -> tuple[list[str], dict] | None:
    """The ``ray start`` that put the standing cluster's node on ``host_name`` there, and its
    environment: what that host runs again when it comes back (``fault=host_return``); None for a
    local cluster or the head (a lost head takes the cluster with it)."""
    argvs = found.get("argvs") or {}
    if found.get("kind") != "hosts" or host_name not in argvs or argvs[host_name] == next(iter(argvs.values())):
        return None
    if found.get("scratch"):  # the node's temp folder is in it
        check_scratch(found["scratch"])
    return list(argvs[host_name]), _node_env(config, found["token"])


class StandingRay:
    name = "standing Ray cluster"

    def at_setup(self, config: BenchmarkConfig) -> bool:
        return False

    def wanted(self, config: BenchmarkConfig) -> bool:  # an engines.ray.address is someone else's cluster
        return config.engine("ray").address is None and config.cluster.kind in ("local", "emulated")

    def running(self, paths: RunPaths) -> bool:
        found = state(paths)
        return bool(found) and _scratch_ok(found) and all(_proved(mark) for mark in found.get("owned", []))

    def start(self, paths: RunPaths, config: BenchmarkConfig, tied_to_caller: bool = False) -> str:
        self.stop(paths)  # a dead one's leftovers
        folder(paths).mkdir(parents=True, exist_ok=True)
        folder(paths).chmod(0o700)  # the token
        hosts = config.cluster.kind == "emulated"
        token = (_token(folder(paths) / "auth", fresh=True) if hosts
                 else _token(Path.home() / ".ray" / "auth_token", fresh=False))
        env = _node_env(config, token)
        scratch = make_scratch("rs")  # Ray's temp folders, never a predictable name in /tmp
        try:
            found = (_start_hosts(paths, config, env, scratch) if hosts
                     else _start_local(paths, config, env, tied_to_caller, scratch))
        except BaseException:  # a half-started cluster: whatever names its private folder is its
            stop_tree(_naming(str(scratch)), NODE_STOP_S)
            remove_scratch(scratch)
            raise
        # pid, start time and uid of each node: running() and stop() never mistake a reused pid for it
        atomic_write_json(folder(paths) / "state.json", {**found, "token": token, "scratch": str(scratch),
                                                         "owned": [_mark(p) for p in found["pids"]]})
        return found["address"]

    def stop(self, paths: RunPaths) -> list[int]:
        found = state(paths)
        if found is None:
            return []
        (folder(paths) / "state.json").unlink(missing_ok=True)
        nodes = [proc for mark in found.get("owned", []) if (proc := _proved(mark))]
        family = _descendants(nodes)  # seen now, while they still hang from their node
        stop_tree(nodes, NODE_STOP_S, tree=False)  # `ray start --block` stops its node on SIGTERM
        scratch = found.get("scratch")
        left = [p for p in family if p.is_running()] + (_naming(scratch) if scratch else [])
        left = list({p.pid: p for p in left}.values())
        stop_tree(left, STOP_GRACE_S, tree=False)
        remove_scratch(scratch)  # only a checked one: a link or a stranger's folder is left alone
        if found["kind"] == "hosts":  # the cluster's own; Ray's default one stays
            Path(found["token"]).unlink(missing_ok=True)
        return [p.pid for p in [*nodes, *left]]


def _mark(pid: int) -> dict:
    """What proves a process is the one started here: its pid, start (clock ticks after boot) and uid."""
    return {"pid": pid, "start": process_start(pid), "uid": os.getuid()}


def _proved(mark: dict):
    """The live ``psutil.Process`` that ``mark`` names, else None (gone, a zombie, or the pid now
    another process: another start time or owner)."""
    import psutil

    try:
        proc = psutil.Process(mark["pid"])  # bound to this process: psutil signals no later reuse of the pid
        same = (mark["start"] is not None and process_start(mark["pid"]) == mark["start"]
                and proc.uids().real == mark["uid"] and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return None
    return proc if same else None


def _scratch_ok(found: dict) -> bool:
    try:
        check_scratch(found["scratch"])
        return True
    except (KeyError, OSError) as err:
        log.warning("ray: the standing cluster's scratch folder cannot be trusted: %s", err)
        return False


def _descendants(procs: list) -> list:
    import psutil

    out = []
    for proc in procs:
        try:
            out += proc.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return out


def names_folder(arg: str, folder_path: str) -> bool:
    """``arg`` is ``folder_path`` or a path inside it, alone or as an option's value
    (``--temp-dir=<folder>/ray``): a whole path component, never a longer name that starts the same."""
    value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
    return value == folder_path or value.startswith(folder_path.rstrip("/") + "/")


def _naming(scratch: str) -> list:
    """This user's processes that name ``scratch`` in an argument: Ray's processes of the cluster
    that outlived their node (orphans no longer under it), and nothing of another user."""
    import psutil

    out = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            uids = proc.info["uids"]
            if (proc.pid != os.getpid() and uids.real == uids.effective == os.getuid()
                    and any(names_folder(arg, scratch) for arg in proc.info["cmdline"] or [])):
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError):
            pass
    return out


STANDING_SERVICE = StandingRay()
