"""Spark TorchDistributor, the files feed: ``TorchDistributor(...).run(train_worker, ...)``.

Every rank reads the token shards itself (the shared loop's loader). What both Spark platforms
share (the cell's own session, local vs barrier mode, GPU resources, the task-slot check) is
``pipelines.platforms.spark.distributor``. Only paths (strings) are passed to the function; rank 0 writes the
result file.

Cluster run (tests/platforms/spark/test_spark_cluster.py starts a standalone master + 2 workers):
    python -m pipelines train --backend spark --workers 2 --set spark_master=spark://host:7077

Across launch hosts (``run_cell(..., hosts=cluster.hosts)``): a standalone cluster built on the
hosts, the driver on the first (``pipelines.platforms.spark.hosts``); ``platform_mode`` cluster-<k>-hosts.
"""

from __future__ import annotations

import logging

from pipelines.platforms.spark import distributor as spark_torch
from pipelines.platforms.contract import TrainingBackend
from pipelines.config import BenchmarkConfig, ConfigError
from pipelines.training.cell import CellSpec
from pipelines.platforms.spark.hosts import SparkOnHosts
from pipelines.training.worker import train_worker

log = logging.getLogger(__name__)


class SparkBackend(SparkOnHosts, TrainingBackend):
    name = "spark"

    def train(self, spark, distributor, spec: CellSpec, launch_time: float) -> None:
        """The files feed: every rank reads the token shards itself (the shared loop's loader)."""
        distributor.run(train_worker, str(spec.cell_dir), launch_time)

    def platform_fields(self, spec: CellSpec) -> dict:
        return spark_torch.platform_fields(spec, hosts=self.hosts_used(spec))

    def versions(self) -> dict[str, str]:
        return spark_torch.versions()


class SparkPerJobBackend(SparkBackend):
    """The files feed on a Spark cluster of the cell's own, brought up inside its window."""

    name = "spark_per_job"

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        refusal = spark_torch.per_job_refusal(config, self.name)
        return [*([refusal] if refusal else []), *super().preflight(config, cells)]

    def spec(self, config: BenchmarkConfig, world_size: int, *args, **kwargs) -> CellSpec:
        refusal = None if getattr(self, "_on_hosts", False) else spark_torch.per_job_refusal(config, self.name)
        if refusal:
            raise ConfigError(refusal)
        return super().spec(config, world_size, *args, **kwargs)
