"""Spark TorchDistributor: the shared worker run by ``TorchDistributor(...).run(train_worker, ...)``.

``local_mode`` follows the master: ``local[...]`` -> local mode (torchrun on the driver);
any other master (``spark://host:7077``) -> barrier mode, one torchrun per Spark task, which
needs the project importable and pandas/pyarrow on the executors (``spark_env`` handles a
single machine). Barrier mode with more processes than task slots hangs silently in Spark,
so the slots are checked first (after giving a just-started session's executors up to
``SLOT_WAIT_S`` to register) and a ``RuntimeError`` names both numbers. Only paths (strings)
are passed to the function; rank 0 writes the result file.

Cluster run (tests/scaleout/test_spark_cluster.py starts a standalone master + 2 workers):
    python -m pipelines train --backend spark --workers 2 --set spark_master=spark://host:7077
"""

from __future__ import annotations

import logging
import time

from pipelines.backends.base import TrainingBackend
from pipelines.cell import CellSpec
from pipelines.config import Backend, BenchmarkConfig
from pipelines.spark_session import get_spark, stop_spark
from pipelines.training.worker import train_worker

log = logging.getLogger(__name__)
SLOT_WAIT_S = 60.0  # executors of a new session register within seconds on a healthy cluster


def distributor_settings(config: BenchmarkConfig, world_size: int, cuda: bool) -> dict:
    """Keyword arguments for ``TorchDistributor`` (pure: testable without Spark)."""
    return {"num_processes": world_size, "local_mode": config.spark_master.startswith("local"),
            "use_gpu": cuda}


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
        spark = get_spark(spec.config.spark_master, app_name=f"train-{spec.cell_dir.name}", fresh=True)
        try:
            settings = distributor_settings(spec.config, spec.world_size, torch.cuda.is_available())
            if not settings["local_mode"]:
                check_task_slots(spec.world_size, task_slots(spark, spec.world_size), spec.config.spark_master)
            log.info("TorchDistributor(%s) on %s", settings, spec.config.spark_master)
            TorchDistributor(**settings).run(train_worker, str(spec.cell_dir), launch_time)
        finally:
            stop_spark()

    def platform_fields(self) -> dict:
        return {"spark_session": "fresh"}

    def versions(self) -> dict[str, str]:
        import pyspark

        return {"pyspark": pyspark.__version__, "launcher": "TorchDistributor"}
