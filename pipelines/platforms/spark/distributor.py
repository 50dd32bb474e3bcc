"""What both Spark TorchDistributor platforms share (``spark``: the files feed, ``spark_dataframe``:
the rows through Spark): the cell's own SparkSession inside the timed window, TorchDistributor's
settings, Spark's GPU resources and the task-slot check. The backends pass their own training
step to ``run_distributor``.

The driver (the cell's session and TorchDistributor's call) runs in a process of its own
(``pipelines.platforms.driver``: ``launch_on_this_host`` is what it runs) in the network namespace
of its cluster (``driver_namespace``).

In barrier mode TorchDistributor streams the ranks' output to a server on the driver, which pyspark
binds to every interface: ``bind_log_server_to_driver`` makes it listen on the driver's address only.

``local_mode`` follows the master: ``local[...]`` -> local mode (torchrun on the driver, in the
driver's network namespace of its own);
any other master (``spark://host:7077``) -> barrier mode, one torchrun per Spark task, which
needs the project importable and pandas/pyarrow on the executors (``spark_env`` handles a
single machine). Barrier mode with more processes than task slots hangs silently in Spark,
so the slots are checked first (after giving a just-started session's executors up to
``SLOT_WAIT_S`` to register) and a ``RuntimeError`` names both numbers.

On a GPU host the cell's session is given Spark's GPU resources (``gpu_conf``: the driver's
GPUs in local mode; one GPU per executor task on a cluster, whose workers must advertise
theirs with ``spark.worker.resource.gpu.amount`` + the same discovery script), found by
``backends/spark_gpu_discovery.sh`` (nvidia-smi; ``SPARK_GPU_DISCOVERY_SCRIPT`` names another),
so TorchDistributor(use_gpu=True) accepts the task count and each rank gets its own GPU.

Across launch hosts (``run_cell(..., hosts=...)``) the driver runs on the first host
(``pipelines.platforms.spark.hosts``) and passes its cluster's master and the hosts' settings to
``run_distributor``; ``platform_fields`` then says ``cluster-<k>-hosts``.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pipelines.training.cell import CellSpec
from pipelines.config import BenchmarkConfig
from pipelines.cluster import netns
from pipelines.engines.spark import cluster as spark_cluster
from pipelines.engines.spark import EMBEDDED
from pipelines.engines.spark.cluster import master_url
from pipelines.engines.spark.session import get_spark, stop_spark
from pipelines.runfolder.scratch import make_scratch, remove_scratch

log = logging.getLogger(__name__)
# executors of a new session register within seconds on a healthy cluster; PIPELINES_SPARK_SLOT_WAIT_S
# sets it for the cell's driver process (a test that knows its cluster is short of slots waits less)
SLOT_WAIT_S = float(os.environ.get("PIPELINES_SPARK_SLOT_WAIT_S", "60"))
# shipped as package data under backends/ (pyproject.toml: "backends/*.sh")
DISCOVERY_SCRIPT = Path(__file__).parent / "gpu_discovery.sh"
# train(spark, distributor, spec, launch_time): runs the cell's ranks through the distributor
TrainStep = Callable[[object, object, CellSpec, float], None]


def is_local_master(master: str) -> bool:
    """``local`` / ``local[N]``: no executors, so no barrier tasks (TorchDistributor's local mode)."""
    return master == "local" or master.startswith("local[")


def distributor_settings(config: BenchmarkConfig, world_size: int, cuda: bool, master: str | None = None) -> dict:
    """Keyword arguments for ``TorchDistributor`` (pure: testable without Spark); ``master``: the
    URL the session uses when it is not the configured one (a cluster across hosts)."""
    master = master or config.engine("spark").master
    return {"num_processes": world_size, "local_mode": master.startswith("local"), "use_gpu": cuda}


def gpu_conf(local_mode: bool, gpus: int, discovery_script: str | None = None) -> dict[str, str]:
    """Spark resource settings for TorchDistributor(use_gpu=True) (pure: testable without GPUs).

    Local mode: the driver owns ``gpus`` GPUs (TorchDistributor gives one to each process).
    Cluster: each executor task takes one GPU (``spark.task.resource.gpu.amount=1``)."""
    script = discovery_script or os.environ.get("SPARK_GPU_DISCOVERY_SCRIPT") or str(DISCOVERY_SCRIPT)
    if local_mode:
        return {"spark.driver.resource.gpu.amount": str(gpus),
                "spark.driver.resource.gpu.discoveryScript": script}
    return {"spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1",
            "spark.executor.resource.gpu.discoveryScript": script}


def check_task_slots(num_processes: int, slots: int, master: str) -> None:
    if num_processes > slots:
        raise RuntimeError(
            f"TorchDistributor barrier mode needs {num_processes} concurrent Spark tasks but "
            f"{master} offers {slots} task slot(s); Spark would wait forever. Use fewer workers "
            "or a cluster with more executor cores.")


def task_slots(spark, needed: int = 1, wait_s: float | None = None) -> int:
    """Concurrent tasks the cluster can run now (registered executor cores / task cpus).

    Executors register a few seconds after the session starts: wait up to ``wait_s`` for
    ``needed`` slots (default ``SLOT_WAIT_S``) before answering (defaultParallelism says 2
    even with no executor registered).
    """
    sc = spark.sparkContext
    if sc.master.startswith("local"):
        return sc.defaultParallelism // max(1, int(spark.conf.get("spark.task.cpus", "1")))
    jsc = sc._jsc.sc()  # the scheduler's own count, the one its barrier check uses
    deadline = time.monotonic() + (SLOT_WAIT_S if wait_s is None else wait_s)
    while True:
        slots = jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())
        if slots >= needed or time.monotonic() >= deadline:
            return slots
        time.sleep(0.5)


@functools.cache
def _log_server_on_driver_address() -> type:
    """pyspark's ``LogStreamingServer`` (the ranks' output, streamed to the driver in barrier mode)
    on the driver's address instead of 0.0.0.0: pyspark gives it ``spark.driver.host``, the address
    the tasks' clients connect to, but binds every interface, and whoever reaches this host could
    write into the cell's log. Its port is the kernel's pick at bind time (no free-port race)."""
    import socketserver
    import threading

    from pyspark.ml.torch import log_communication as logs

    class DriverAddressLogServer(logs.LogStreamingServer):
        def start(self, spark_host_address: str = "") -> None:
            if self.server:
                raise RuntimeError("Cannot start the server twice.")
            server = socketserver.ThreadingTCPServer((spark_host_address or "127.0.0.1", 0), logs.WriteLogToStdout)
            server.is_active = True  # its handlers read it
            self.server, self.port = server, server.server_address[1]
            self.serve_thread = threading.Thread(target=server.serve_forever, daemon=True,
                                                 kwargs={"poll_interval": logs._SERVER_POLL_INTERVAL})
            self.serve_thread.start()

        def shutdown(self) -> None:
            server = self.server
            super().shutdown()
            if server is not None:
                server.server_close()

    return DriverAddressLogServer


def bind_log_server_to_driver() -> None:
    """Make TorchDistributor start its log server on the driver's address (``_log_server_on_driver_address``)."""
    from pyspark.ml.torch import distributor as torch_distributor

    torch_distributor.LogStreamingServer = _log_server_on_driver_address()


def run_distributor(spec: CellSpec, launch_time: float, train: TrainStep, master: str | None = None,
                    conf: dict[str, str] | None = None) -> None:
    """Start the cell's own SparkSession, check the slots, ``train(spark, TorchDistributor(...),
    spec, launch_time)``, stop the session.

    A session of its own, started inside the timed window and stopped after it: the same
    start-up cost whoever runs the cell (no reuse of the data stage's or a previous cell's).
    ``master`` / ``conf``: another master than the configured one and extra session settings
    (the driver of a cell across hosts, ``pipelines.platforms.spark.hosts``)."""
    import torch
    from pyspark.ml.torch.distributor import TorchDistributor

    settings = distributor_settings(spec.config, spec.world_size, torch.cuda.is_available(), master=master)
    gpus = gpu_conf(settings["local_mode"], torch.cuda.device_count()) if settings["use_gpu"] else {}
    # the platform's own recovery: a failed (barrier) task is tried again (matrix.platform_retries)
    retries = {"spark.task.maxFailures": str(spec.config.matrix.platform_retries + 1)}
    # the driver's temp files (Spark's local dirs, its JVM's, TorchDistributor's) in a 0700 folder of the cell's
    scratch, tempdir = make_scratch("spark-driver"), tempfile.tempdir
    private = {"spark.local.dir": str(scratch), "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}"}
    conf = {**gpus, **retries, **private, **(conf or {})}
    master = master or master_url(spec.config, spec.paths)  # "embedded": the run's own standalone cluster
    try:
        tempfile.tempdir = str(scratch)
        spark = get_spark(master, app_name=f"train-{spec.cell_dir.name}", conf=conf, fresh=True)
        if not settings["local_mode"]:
            check_task_slots(spec.world_size, task_slots(spark, spec.world_size), master)
        log.info("TorchDistributor(%s) on %s", settings, master)
        bind_log_server_to_driver()
        train(spark, TorchDistributor(**settings), spec, launch_time)
    finally:
        stop_spark(jvm=True)  # the driver's JVM ends with the cell: nothing of it beside the next one
        tempfile.tempdir = tempdir
        remove_scratch(scratch)


def driver_namespace(spec: CellSpec, lifetime: str | None) -> netns.Namespace:
    """Where the cell's driver runs (``pipelines.platforms.driver``): with a cluster of its own (per
    job) or none (local mode: torchrun on the driver) in a network namespace of the cell's own; on
    the run's embedded cluster in that cluster's (``spark_cluster.namespace``); with a cluster URL in
    this host's (it reaches that cluster over the network)."""
    master = spec.config.engine("spark").master
    if lifetime == "per_job" or master.startswith("local"):
        return netns.own("the cell's Spark driver")
    if master == EMBEDDED:
        return spark_cluster.namespace(spec.paths)
    return netns.host()


def per_job_refusal(config: BenchmarkConfig, backend: str) -> str | None:
    """Why a per-job Spark cell cannot run with this config, or None: on this host its cluster is
    an embedded standalone cluster of its own (a local master has none; a cluster URL is someone's
    standing cluster)."""
    if config.cluster.kind != "local" or config.engine("spark").master == "embedded":
        return None
    return (f"{backend}: a per-job Spark cluster on this host is an embedded standalone cluster the cell "
            f"starts and stops; engines.spark.master={config.engine('spark').master!r} has none to start. Set "
            f"engines.spark.master=embedded, run on a cluster's hosts (cluster.kind=emulated), or leave "
            f"{backend} out of backends.")


def launch_on_this_host(spec: CellSpec, launch_time: float, train: TrainStep, lifetime: str | None) -> None:
    """The cell on this host: standing (the configured master: local mode, the run's embedded
    cluster or a cluster URL), or per job (an embedded cluster of the cell's own, brought up inside
    its window as its ``provision`` phase and stopped after it)."""
    if lifetime != "per_job":
        run_distributor(spec, launch_time, train)
        return
    from pipelines.platforms.contract import provisioning
    from pipelines.runfolder.paths import RunPaths

    own = RunPaths(spec.cell_dir / "own-cluster")
    try:
        with provisioning(spec.cell):
            url = spark_cluster.start(own, workers=spec.world_size, tied_to_caller=True)
        run_distributor(spec, launch_time, train, master=url)
    finally:
        spark_cluster.stop(own)


def platform_fields(spec: CellSpec, hosts: int | None = None) -> dict:
    """A fresh session per cell; ``platform_mode`` local (torchrun on the driver), cluster, or
    cluster-<k>-hosts (a standalone cluster built on ``hosts`` launch hosts: pipelines.platforms.spark.hosts)."""
    if hosts:
        return {"platform_session": "fresh", "platform_mode": f"cluster-{hosts}-hosts"}
    local = distributor_settings(spec.config, spec.world_size, cuda=False)["local_mode"]
    return {"platform_session": "fresh", "platform_mode": "local" if local else "cluster"}


def versions(launcher: str = "TorchDistributor") -> dict[str, str]:
    import pyspark

    return {"pyspark": pyspark.__version__, "launcher": launcher}
