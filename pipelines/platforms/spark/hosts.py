"""Spark across several hosts by Spark's own multi-node path: a standalone cluster built on them.

``run_cell(config, paths, "spark" | "spark_dataframe", N, hosts=cluster.hosts)`` (e.g. the hosts of
``pipelines.cluster.EmulatedCluster``) calls the backend's ``launch_on_hosts`` -> ``launch`` here:

1. a standalone **Master on hosts[0]** (bound to its address, a port free there) and **one Worker
   per host** (bound to that host's address, ``N / len(hosts)`` cores, ``WORKER_MEMORY``), each
   started with ``host.run`` so it lives in that host (its namespace and cgroups); the launch
   waits until every worker says it registered. Logs and work dirs go to ``<cell>/spark-hosts/``
   (an executor runs in ``work/<host>/<app>/<id>``: the ranks' placement names it);
2. the **driver on hosts[0]** too (the launching process may not reach the hosts):
   ``python -m pipelines.platforms.spark.hosts --cell-dir ... --launch-time ... --master spark://h0:port
   --feed files|dataframe``, its output teed to the cell's ``train.log``. It builds the cell's
   session against that master (``spark.driver.host`` = h0's address; gloo and TensorPipe on the
   hosts' ``eth0`` through ``spark.executorEnv``) and runs the backend's own training step
   (``SparkBackend.train`` / ``SparkDataFrameBackend.train``) through
   ``spark_torch.run_distributor``: TorchDistributor in barrier mode, one task per worker core,
   after the task-slot check;
3. afterwards (success, failure, exception, KeyboardInterrupt) every process on every host is
   stopped (``host.stop_processes``): driver, master, workers, executors. That happens after rank
   0 wrote its result, so it is the cell's teardown phase.

Each rank reports its own host (``pipelines.training.distributed.placement``): the Workers get
``BENCHMARK_HOST`` from ``host.run`` and their executors (and the ranks they start) inherit it.
``SparkOnHosts`` is the part both Spark platforms share (``platform_mode`` "cluster-<k>-hosts").
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.training.cell import CellSpec
from pipelines.cluster.processes import free_port_on
from pipelines.platforms.torchrun import HOST_IFNAME, execute_on_hosts, host_nproc
from pipelines.runfolder.paths import PROJECT_ROOT

log = logging.getLogger(__name__)
DAEMON_DIR = "spark-hosts"  # under the cell folder: master/worker logs, the workers' work dirs
WORKER_MEMORY = "1g"  # per worker: one executor of Spark's default 1 GiB heap
STARTUP_S = 120.0  # a JVM on one loaded core
STOP_GRACE_S = 5.0  # SIGTERM -> SIGKILL for what the driver's exit left on a host
FEEDS = ("files", "dataframe")  # TrainingBackend.data_feed of the two Spark platforms
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# what an embedded cluster's daemon carries (pipelines.engines.spark.cluster): never inherited by ours
EMBEDDED_MARKS = ("PIPELINES_SPARK_STATE", "PIPELINES_SPARK_OWNER", "_SPARK_AUTH_SECRET")


def daemon_env(base: Mapping[str, str], host: Any, folder: Path, python: str = sys.executable) -> dict[str, str]:
    """Environment of a Master/Worker JVM on ``host``: bound to its address, in the foreground."""
    env = {k: v for k, v in base.items() if k not in EMBEDDED_MARKS}
    return {**env, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host.address, "SPARK_LOG_DIR": str(folder),
            "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": python}


def master_argv(home: Path, host: Any, port: int) -> list[str]:
    """The Master on ``host`` (web UI on a port its kernel picks)."""
    return [str(home / "bin" / "spark-class"), MASTER_CLASS, "--host", host.address, "--port", str(port),
            "--webui-port", "0"]


def worker_argv(home: Path, master: str, host: Any, cores: int, work_dir: Path,
                memory: str = WORKER_MEMORY) -> list[str]:
    """A Worker on ``host`` offering ``cores`` task slots to ``master``."""
    return [str(home / "bin" / "spark-class"), WORKER_CLASS, master, "--host", host.address,
            "--cores", str(cores), "--memory", memory, "--webui-port", "0", "--work-dir", str(work_dir)]


def session_conf(driver_address: str, ifname: str = HOST_IFNAME) -> dict[str, str]:
    """The cell session's settings across hosts: the driver on ``driver_address``, the ranks'
    gloo / TensorPipe / NCCL bootstrap on the hosts' cluster interface."""
    conf = {"spark.driver.host": driver_address, "spark.driver.bindAddress": driver_address}
    for var in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        conf[f"spark.executorEnv.{var}"] = ifname
    return conf


def driver_argv(cell_dir: Path, launch_time: float, master: str, feed: str,
                python: str = sys.executable) -> list[str]:
    if feed not in FEEDS:
        raise ValueError(f"feed must be one of {FEEDS}; got {feed!r}")
    return [python, "-m", "pipelines.platforms.spark.driver", "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time),
            "--master", master, "--feed", feed]


def driver_env(base: Mapping[str, str], host: Any, python: str = sys.executable) -> dict[str, str]:
    """The driver's environment on ``host``: its address for Spark, the project importable."""
    pythonpath = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PROJECT_ROOT) not in pythonpath:
        pythonpath.insert(0, str(PROJECT_ROOT))
    return {**base, "SPARK_LOCAL_IP": host.address, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
            "PYTHONPATH": os.pathsep.join(pythonpath), "TOKENIZERS_PARALLELISM": "false"}


def _start(host: Any, argv: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen:
    with open(log_file, "w") as out:
        return host.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for_line(log_file: Path, needle: str, procs: Sequence[subprocess.Popen],
                  timeout_s: float = STARTUP_S) -> None:
    """Until ``needle`` is in ``log_file``; raise with the log's tail when a daemon exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        if needle in text:
            return
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a Spark daemon on the hosts exited before {needle!r}; {log_file}:\n{text[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {needle!r} in {log_file} after {timeout_s:.0f}s:\n{text[-2000:]}")
        time.sleep(0.25)


def start_daemons(hosts: Sequence[Any], folder: Path, cores: int, with_procs: bool = False):
    """Master on hosts[0], one Worker per host; returns the master URL once every worker registered
    (``with_procs``: and the daemons' processes)."""
    home = spark_home()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port_on(hosts[0])
    url = f"spark://{hosts[0].address}:{port}"
    master_log = folder / "master.log"
    procs = [_start(hosts[0], master_argv(home, hosts[0], port), daemon_env(os.environ, hosts[0], folder),
                    master_log)]
    wait_for_line(master_log, "I have been elected leader", procs)
    logs = []
    for host in hosts:
        logs.append(folder / f"worker-{host.name}.log")
        procs.append(_start(host, worker_argv(home, url, host, cores, folder / "work" / host.name),
                            daemon_env(os.environ, host, folder), logs[-1]))
    for log_file in logs:
        wait_for_line(log_file, "Successfully registered with master", procs)
    log.info("spark across %d host(s): master %s, one worker of %d core(s) per host (logs: %s)",
             len(hosts), url, cores, folder)
    return (url, procs) if with_procs else url


def stop_hosts(hosts: Sequence[Any], grace_s: float = STOP_GRACE_S) -> list[int]:
    """Stop every process on every host (driver, daemons, executors, ranks); returns the pids."""
    stopped = []
    for host in hosts:
        try:
            stopped += host.stop_processes(grace_s)
        except Exception as err:  # noqa: BLE001 - keep the cell's own error; say what was not stopped
            log.warning("could not stop the processes on %s: %s", host.name, err)
    return stopped


def launch(spec: CellSpec, launch_time: float, hosts: Sequence[Any], feed: str, master: str | None = None) -> None:
    """The cell across ``hosts``: the driver on hosts[0] (teed to train.log) submitting to
    ``master`` (the run's standing cluster: its workers end the application's executors), else to
    daemons of its own (per job: its ``provision`` phase), stopped after it with every other
    process the cell left on the hosts."""
    from pipelines.platforms.contract import provisioning

    cores = host_nproc(spec.world_size, len(hosts))  # one barrier task per worker core
    if feed not in FEEDS:  # before anything starts
        raise ValueError(f"feed must be one of {FEEDS}; got {feed!r}")
    own = master is None
    try:
        if own:
            with provisioning(spec.cell):
                master = start_daemons(hosts, spec.cell_dir / DAEMON_DIR, cores)
        cmd = driver_argv(spec.cell_dir, launch_time, master, feed)
        try:
            execute_on_hosts([cmd], driver_env(os.environ, hosts[0]), hosts[:1], [spec.cell.log],
                             what="the Spark driver")
        except RuntimeError as err:
            raise RuntimeError(f"spark driver on {hosts[0].name}: {err}") from None
    finally:
        if own:
            stopped = stop_hosts(hosts)
            log.info("spark across hosts: stopped %d process(es) on %d host(s)", len(stopped), len(hosts))


def standing_folder(paths) -> Path:  # the run's standing cluster on the hosts (standing.py)
    return paths.root / "spark-standing"


def standing_state(paths) -> dict | None:
    try:
        return json.loads((standing_folder(paths) / "state.json").read_text())
    except (OSError, ValueError):
        return None


def standing_master(paths) -> str:
    """The run's standing cluster's master URL (a standing cell's driver submits to it)."""
    found = standing_state(paths)
    if found is None:
        raise RuntimeError(f"no standing Spark cluster for this run ({standing_folder(paths)}): the runner "
                           "starts it before a standing Spark cell (pipelines.run.services.before_cell)")
    return found["url"]


class SparkOnHosts:
    """What both Spark platforms share, mixed into their backends: the launch on this host (the
    driver process) and across hosts. Each feed brings its ``train`` step."""

    data_feed: str

    def _hosts_by_cell(self) -> dict[Path, int]:
        """Cell folder -> hosts its latest launch used (``platform_fields`` reads it)."""
        if not hasattr(self, "_spark_hosts_used"):
            self._spark_hosts_used: dict[Path, int] = {}
        return self._spark_hosts_used

    def run(self, config, world_size: int, *, hosts: list | None = None, **kwargs):
        """As every backend's, knowing meanwhile whether the cell runs across ``hosts``
        (``_on_hosts``: then no refusal about the configured local master applies)."""
        self._on_hosts = bool(hosts)
        try:
            return super().run(config, world_size, hosts=hosts, **kwargs)  # type: ignore[misc]
        finally:
            self._on_hosts = False

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """A standing platform submits to the run's standing cluster on the hosts; a per-job one
        starts its own (``launch``)."""
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        master = None
        if getattr(self, "lifetime", None) == "standing":
            master = standing_master(spec.paths)
        launch(spec, launch_time, hosts, self.data_feed, master)

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        """On this host: the driver in a process of its own, in its cluster's network namespace
        (``pipelines.platforms.driver``, ``distributor.driver_namespace``); it runs ``drive``."""
        from pipelines.platforms import driver
        from pipelines.platforms.spark import distributor

        self.hosts_used(spec, forget=True)  # this machine (a previous attempt may have used hosts)
        driver.launch(self, spec, launch_time, distributor.driver_namespace(spec, getattr(self, "lifetime", None)))

    def drive(self, spec: CellSpec, launch_time: float) -> None:
        """In the driver process: the cell's session and TorchDistributor's call on this host."""
        from pipelines.platforms.spark import distributor

        distributor.launch_on_this_host(spec, launch_time, self.train, getattr(self, "lifetime", None))

    def hosts_used(self, spec: CellSpec, forget: bool = False) -> int | None:
        """Hosts the cell's latest launch ran on (None: this machine); ``forget``: a local launch."""
        if forget:
            return self._hosts_by_cell().pop(spec.cell_dir, None)
        return self._hosts_by_cell().get(spec.cell_dir)
