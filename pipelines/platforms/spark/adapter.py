"""Spark TorchDistributor, the files feed: ``TorchDistributor(...).run(train_worker, ...)``.

Every rank reads the token shards itself (the shared loop's loader). What both Spark platforms
share (the cell's own session, local vs barrier mode, GPU resources, the task-slot check) is
``pipelines.platforms.spark.distributor``. Only paths (strings) are passed to the function; rank 0 writes the
result file.

Cluster run (tests/scaleout/test_spark_cluster.py starts a standalone master + 2 workers):
    python -m pipelines train --backend spark --workers 2 --set spark_master=spark://host:7077

Across launch hosts (``run_cell(..., hosts=cluster.hosts)``): a standalone cluster built on the
hosts, the driver on the first (``pipelines.platforms.spark.hosts``); ``platform_mode`` cluster-<k>-hosts.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, field_validator

from pipelines.platforms.spark import distributor as spark_torch
from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import Backend, deployment
from pipelines.platforms.spark.hosts import SparkOnHosts
from pipelines.training.worker import train_worker

log = logging.getLogger(__name__)


class SparkSettings(BaseModel):
    """``engines.spark`` (both Spark data feeds): where TorchDistributor's tasks run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "local[*]" (TorchDistributor local mode: torchrun on the driver), "embedded" (a standalone
    # cluster the run starts and stops: pipelines.engines.spark_cluster) or a cluster URL spark://host:7077
    master: str = deployment("local[*]", env="BENCHMARK_SPARK_MASTER", flat="spark_master")

    @field_validator("master")
    @classmethod
    def _known_master(cls, v: str) -> str:
        if v == "embedded" or v == "local" or v.startswith(("local[", "spark://", "k8s://", "yarn")):
            return v
        raise ValueError("must be local[N|*], embedded (the run's own standalone cluster) or a cluster "
                         "master URL (spark://host:7077, k8s://..., yarn)")


class SparkBackend(SparkOnHosts, TrainingBackend):
    name = Backend.SPARK
    order = 10
    label = "Spark TorchDistributor"
    colour = "#c2410c"
    settings = SparkSettings
    study_overhead = 1.87  # the study: Spark 2.87x DDP's time
    mode_caveats = {"local": "TorchDistributor in local mode starts torchrun on the driver: no executor, no "
                             "barrier stage, each rank reads the token files itself. It measures a SparkSession "
                             "plus TorchDistributor's launch, not a Spark cluster's scheduling or data feed."}

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        self.hosts_used(spec, forget=True)  # this machine (a previous attempt may have used hosts)
        spark_torch.run_distributor(spec, launch_time, self.train)

    def train(self, spark, distributor, spec: CellSpec, launch_time: float) -> None:
        """The files feed: every rank reads the token shards itself (the shared loop's loader)."""
        distributor.run(train_worker, str(spec.cell_dir), launch_time)

    def platform_fields(self, spec: CellSpec) -> dict:
        return spark_torch.platform_fields(spec, hosts=self.hosts_used(spec))

    def versions(self) -> dict[str, str]:
        return spark_torch.versions()
