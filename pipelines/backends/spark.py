"""Spark TorchDistributor: the shared worker run by ``TorchDistributor(...).run(train_worker, ...)``.

``local_mode`` follows the master: ``local[...]`` -> local mode (torchrun on the driver);
any other master (``spark://host:7077``) -> barrier mode, one torchrun per Spark task, which
needs the project importable and pandas/pyarrow on the executors (``spark_env`` handles a
single machine). Barrier mode with more processes than task slots hangs silently in Spark,
so the slots are checked first (after giving a just-started session's executors up to
``SLOT_WAIT_S`` to register) and a ``RuntimeError`` names both numbers. Only paths (strings)
are passed to the function; rank 0 writes the result file.

On a GPU host the cell's session is given Spark's GPU resources (``gpu_conf``: the driver's
GPUs in local mode; one GPU per executor task on a cluster, whose workers must advertise
theirs with ``spark.worker.resource.gpu.amount`` + the same discovery script), found by
``spark_gpu_discovery.sh`` (nvidia-smi; ``SPARK_GPU_DISCOVERY_SCRIPT`` names another), so
TorchDistributor(use_gpu=True) accepts the task count and each rank gets its own GPU.

Cluster run (tests/scaleout/test_spark_cluster.py starts a standalone master + 2 workers):
    python -m pipelines train --backend spark --workers 2 --set spark_master=spark://host:7077
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pipelines.backends.base import TrainingBackend
from pipelines.cell import CellSpec
from pipelines.config import Backend, BenchmarkConfig
from pipelines.spark_cluster import master_url
from pipelines.spark_session import get_spark, stop_spark
from pipelines.training.worker import train_worker

log = logging.getLogger(__name__)
SLOT_WAIT_S = 60.0  # executors of a new session register within seconds on a healthy cluster
DISCOVERY_SCRIPT = Path(__file__).with_name("spark_gpu_discovery.sh")


def distributor_settings(config: BenchmarkConfig, world_size: int, cuda: bool) -> dict:
    """Keyword arguments for ``TorchDistributor`` (pure: testable without Spark)."""
    return {"num_processes": world_size, "local_mode": config.spark_master.startswith("local"),
            "use_gpu": cuda}


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


class SparkBackend(TrainingBackend):
    name = Backend.SPARK

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        import torch
        from pyspark.ml.torch.distributor import TorchDistributor

        # A session of its own, started inside the timed window and stopped after it: the same
        # start-up cost whoever runs the cell (no reuse of the data stage's or a previous cell's).
        settings = distributor_settings(spec.config, spec.world_size, torch.cuda.is_available())
        conf = gpu_conf(settings["local_mode"], torch.cuda.device_count()) if settings["use_gpu"] else {}
        master = master_url(spec.config, spec.paths)  # "embedded": the run's own standalone cluster
        spark = get_spark(master, app_name=f"train-{spec.cell_dir.name}", conf=conf, fresh=True)
        try:
            if not settings["local_mode"]:
                check_task_slots(spec.world_size, task_slots(spark, spec.world_size), master)
            log.info("TorchDistributor(%s) on %s", settings, master)
            self.train(spark, TorchDistributor(**settings), spec, launch_time)
        finally:
            stop_spark()

    def train(self, spark, distributor, spec: CellSpec, launch_time: float) -> None:
        """The files feed: every rank reads the token shards itself (the shared loop's loader)."""
        distributor.run(train_worker, str(spec.cell_dir), launch_time)

    def platform_fields(self, spec: CellSpec) -> dict:
        local = distributor_settings(spec.config, spec.world_size, cuda=False)["local_mode"]
        return {"spark_session": "fresh", "platform_mode": "local" if local else "cluster"}

    def versions(self) -> dict[str, str]:
        import pyspark

        return {"pyspark": pyspark.__version__, "launcher": "TorchDistributor"}
