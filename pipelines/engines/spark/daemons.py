"""This host's embedded-cluster daemons (the Spark Masters and Workers ``cluster.py`` starts),
found from ``/proc`` by the marks each carries in its environment: the state file of its cluster
(``ENV_STATE``) and, for a cluster tied to a process, that owner (``ENV_OWNER``, ``pid:start time``).

    secret_for(url)   # a cluster's secret by its URL: known to this process, or read through its
                      # master's state file (pipelines.engines.spark.session authenticates with it)
    sweep()           # kill the daemons (with their executors) of a dead owner, or of a finished or
                      # forgotten DAG-started cluster (see cluster.py); cluster.start() runs it first

By hand: ``python -c "from pipelines.engines.spark import daemons; print(daemons.sweep())"``.
Only this user's processes are read; what is signalled is what was read (``pipelines.cluster.owned``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.cluster import owned
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.scratch import remove_scratch

STOP_S = 20.0
SWEEP_MIN_AGE_S = 120.0  # a run-owned daemon younger than this may still be being recorded by start()
ENV_STATE, ENV_OWNER = "PIPELINES_SPARK_STATE", "PIPELINES_SPARK_OWNER"  # marks on every daemon
DAEMON_CLASSES = ("org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker")
SECRETS: dict[str, str] = {}  # url -> secret of the embedded clusters this process knows


def owner_mark(pid: int) -> str:
    """``pid:start time``: a recycled pid is not the owner."""
    import psutil

    return f"{pid}:{psutil.Process(pid).create_time():.2f}"


def _daemons() -> Iterator[tuple[dict, list[str], dict[str, str]]]:
    """(identity, argv, environment) of this user's embedded-cluster master/worker JVMs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            mark = owned.record(int(proc.name))  # before its marks: what is signalled is what was read
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not any(a in DAEMON_CLASSES for a in argv):
                continue
            raw = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw if "=" in item)
        if ENV_STATE in env:
            yield mark, argv, env


def secret_for(url: str) -> str | None:
    """The secret of the embedded cluster at ``url``; None when ``url`` is not one of them.
    Known once this process started or looked the cluster up; else found through its master."""
    if url in SECRETS:
        return SECRETS[url]
    if not url.startswith("spark://127.0.0.1:"):
        return None
    for _, argv, env in _daemons():
        if DAEMON_CLASSES[0] not in argv:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):  # someone else's, or stopping
            info = json.loads(Path(env[ENV_STATE]).read_text())
            if info["url"] == url:
                SECRETS[url] = info["secret"]
                return info["secret"]
    return None


def _owner_dead(mark: str) -> bool:
    import psutil

    pid, _, started = mark.partition(":")
    try:
        return abs(psutil.Process(int(pid)).create_time() - float(started)) > 1.0
    except (psutil.NoSuchProcess, ValueError):
        return True


def _orphaned(pid: int, state_file: Path) -> bool:
    """A run-owned daemon nothing records any more, or whose run has finished."""
    try:
        info = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return True
    if pid not in info.get("pids", []):
        return True
    summary = RunPaths(state_file.parent.parent).summary
    return summary.exists() and summary.stat().st_mtime > info.get("started", 0)


def _age(pid: int) -> float:
    import psutil

    try:
        return time.time() - psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0.0


def sweep() -> list[int]:
    """Kill the embedded-cluster daemons (with their executors) whose owner is dead: a tied
    cluster's process, or a DAG-started cluster's run (see the module docstring); remove their
    scratch folders. -> their pids."""
    dead = [(mark, env.get("TMPDIR")) for mark, _, env in _daemons()
            if (_owner_dead(env[ENV_OWNER]) if env.get(ENV_OWNER) else
                _age(mark["pid"]) > SWEEP_MIN_AGE_S and _orphaned(mark["pid"], Path(env[ENV_STATE])))]
    stopped = owned.stop_groups([mark for mark, _ in dead], STOP_S) if dead else []
    for _, scratch in dead:  # the folder make_scratch made for it (remove_scratch: only a checked one)
        if scratch and Path(scratch).name.startswith("bm-spark-"):
            remove_scratch(scratch)
    return stopped
