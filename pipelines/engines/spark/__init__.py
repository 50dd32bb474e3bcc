"""The Spark engine: the data stage tokenizes on it (``pipelines.data.preprocess``), and the
Spark platforms' TorchDistributor cells run on it. ``engines.spark`` (``Settings``) is its own;
the platforms declare that model as theirs.

``session.py``: a driver's SparkSession (and its authenticated way onto the embedded cluster);
``cluster.py``: the run's embedded standalone cluster (``master="embedded"``), started and stopped
as the run's service (``SERVICE``); ``daemons.py``: this host's embedded-cluster daemons found
from ``/proc`` (a cluster's secret by its URL, the sweep of dead owners' daemons).

This module declares the settings only, in plain pydantic: it imports nothing of the project
(``pipelines.engines`` loads it with every engine's declaration).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

EMBEDDED = "embedded"  # the master value that asks for the run's own cluster (cluster.py)
SERVICE = f"{__name__}.cluster:EMBEDDED_SERVICE"  # the embedded cluster, when master is EMBEDDED


class SparkSettings(BaseModel):
    """``engines.spark``: where the Spark engine runs, for the data stage and for the platforms
    that train on it (their TorchDistributor tasks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "local[*]" (one JVM on this machine: TorchDistributor's local mode runs torchrun on the driver),
    # "embedded" (a standalone cluster the run starts and stops: pipelines.engines.spark.cluster) or a
    # cluster URL spark://host:7077
    # a deployment field, marked as pipelines.platforms.fields.deployment marks one (set by the host's
    # BENCHMARK_SPARK_MASTER, never by a trigger; flat name spark_master)
    master: str = Field("local[*]", json_schema_extra={"deployment": True, "env": "BENCHMARK_SPARK_MASTER",
                                                        "flat": "spark_master"})

    @field_validator("master")
    @classmethod
    def _known_master(cls, v: str) -> str:
        if v == EMBEDDED or v == "local" or v.startswith(("local[", "spark://", "k8s://", "yarn")):
            return v
        raise ValueError("must be local[N|*], embedded (the run's own standalone cluster) or a cluster "
                         "master URL (spark://host:7077, k8s://..., yarn)")


Settings = SparkSettings  # what pipelines.engines reads of every engine
