"""The embedded Spark standalone cluster: ``spark_master="embedded"``.

Teams run Spark training on a cluster, not in TorchDistributor's local mode (torchrun on the
driver). With ``spark_master="embedded"`` the run starts a real standalone cluster from the
pyspark distribution (``$SPARK_HOME/bin/spark-class`` Master + Workers), bound to 127.0.0.1 and
sized to the host (one 1-core worker per CPU core), uses it for preprocessing and for every
spark cell (barrier tasks on its executors), and stops it at the end, also when a step failed.

The cluster outlives the process that started it (the DAG starts it in one task and stops it in
a teardown task), so what is needed to stop it lives in the run folder:
``<run>/spark-cluster/cluster.json`` (master URL, the process ids) beside the master/worker logs.

    with embedded_cluster(paths):           # the CLI's `run`
        ...
    start(paths); ...; stop(paths)          # the DAG's setup / teardown tasks
    master_url(config, paths)               # what Spark connects to ("local[*]", spark://..., or
                                            # the embedded cluster's URL)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.config import BenchmarkConfig
from pipelines.fileio import atomic_write_json
from pipelines.paths import RunPaths
from pipelines.signals import raise_on_sigterm

log = logging.getLogger(__name__)
EMBEDDED = "embedded"
STARTUP_S = 120.0  # JVM start on a loaded 2-core box
STOP_S = 20.0


class ClusterNotRunning(RuntimeError):
    """spark_master="embedded" but the run's cluster was not started (or is gone)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _spark_class(home: Path, args: list[str], env: dict, log_file: Path) -> subprocess.Popen:
    with open(log_file, "w") as out:
        return subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # own group: outlives a task, killed as one


def _wait_for_line(log_file: Path, needle: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if needle in log_file.read_text(errors="replace"):
            return
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a Spark process of the embedded cluster exited; {log_file}:\n"
                               f"{log_file.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"no {needle!r} in {log_file} after {STARTUP_S:.0f}s")


def host_workers() -> int:
    """Workers for this host: one 1-core worker per CPU core."""
    return max(1, os.cpu_count() or 1)


def start(paths: RunPaths, workers: int | None = None) -> str:
    """Start master + workers for the run (idempotent: a live cluster is kept); returns its URL."""
    if is_running(paths):
        return _read(paths)["url"]
    workers = workers or host_workers()
    home, folder = _spark_home(), paths.spark_cluster
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(folder),
           "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable}
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = [_spark_class(home, ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", str(port), "--webui-port", str(_free_port())],
                          env, folder / "master.log")]
    _record(paths, url, procs)  # written at once: a failed start is still stopped by stop()
    try:
        _wait_for_line(folder / "master.log", "I have been elected leader", procs)
        for i in range(1, workers + 1):
            procs.append(_spark_class(home, [
                "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(folder / f"worker{i}"),
            ], env, folder / f"worker{i}.log"))
            _record(paths, url, procs)
        for i in range(1, workers + 1):
            _wait_for_line(folder / f"worker{i}.log", "Successfully registered with master", procs)
    except BaseException:
        stop(paths)
        raise
    log.info("embedded Spark cluster up: %s, %d worker(s) x 1 core (logs: %s)", url, workers, folder)
    return url


def _record(paths: RunPaths, url: str, procs: list[subprocess.Popen]) -> None:
    atomic_write_json(paths.spark_cluster_info, {"url": url, "pids": [p.pid for p in procs],
                                                 "started": time.time()})


def _read(paths: RunPaths) -> dict:
    try:
        return json.loads(paths.spark_cluster_info.read_text())
    except FileNotFoundError:
        raise ClusterNotRunning(
            f"spark_master=embedded, but {paths.spark_cluster_info} is missing: the run's Spark cluster "
            "was not started (the CLI's `run` and the DAG's start_spark_cluster task start it)") from None


def _alive(pid: int) -> bool:
    """The process is running and is one of Spark's (a recycled pid is not ours)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"org.apache.spark.deploy" in cmdline


def is_running(paths: RunPaths) -> bool:
    if not paths.spark_cluster_info.exists():
        return False
    return all(_alive(pid) for pid in _read(paths)["pids"])


def stop(paths: RunPaths) -> list[int]:
    """Stop every process of the run's cluster (SIGTERM, then SIGKILL); returns the pids stopped."""
    if not paths.spark_cluster_info.exists():
        return []
    pids = [pid for pid in _read(paths)["pids"] if _alive(pid)]
    for sig, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        if not any(_alive(p) for p in pids):
            break
    for pid in pids:  # reap our own children (the CLI's case); others are reaped by init
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    paths.spark_cluster_info.unlink(missing_ok=True)
    log.info("embedded Spark cluster stopped (%d process(es))", len(pids))
    return pids


@contextlib.contextmanager
def embedded_cluster(paths: RunPaths, config: BenchmarkConfig) -> Iterator[str | None]:
    """Start the run's cluster when the config asks for it and none runs; stop the one it
    started afterwards, whatever happened (a cluster started by someone else is left alone)."""
    if config.engine("spark").master != EMBEDDED or is_running(paths):
        yield None
        return
    with raise_on_sigterm():  # a SIGTERM'd run still stops its cluster
        try:
            yield start(paths)
        finally:
            stop(paths)


def master_url(config: BenchmarkConfig, paths: RunPaths) -> str:
    """The master Spark connects to: the embedded cluster's URL, or the configured master."""
    if config.engine("spark").master != EMBEDDED:
        return config.engine("spark").master
    url = _read(paths)["url"]
    if not is_running(paths):
        raise ClusterNotRunning(f"the run's embedded Spark cluster ({url}) is not running; see "
                                f"{paths.spark_cluster}/*.log")
    return url
