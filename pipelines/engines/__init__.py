"""The data stage's engines and their settings (``engines.<name>`` in the config).

An engine is what the data stage runs on (``spark_session.py``: the session, ``spark_cluster.py``:
the run's embedded standalone cluster); a platform that trains on the same engine declares the
engine's settings model as its own (``Platform.settings``), so the engine, not the platform, owns
them: the data stage keeps working whatever platforms are installed.

This module declares the settings only, in plain pydantic: it imports nothing of the project, so
the config (which validates ``engines.<name>``) and the platform declarations (which name the
model) both read it without importing an engine, and the registry's loading of those declarations
makes no cycle through it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

EMBEDDED = "embedded"  # the master value that asks for the run's own cluster (spark_cluster)


class SparkSettings(BaseModel):
    """``engines.spark``: where the Spark engine runs, for the data stage and for the platforms
    that train on it (their TorchDistributor tasks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "local[*]" (one JVM on this machine: TorchDistributor's local mode runs torchrun on the driver),
    # "embedded" (a standalone cluster the run starts and stops: pipelines.engines.spark_cluster) or a
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


# engine name -> its settings model: the config's ``engines.<name>`` entries besides the platforms' own
ENGINE_SETTINGS: dict[str, type[BaseModel]] = {"spark": SparkSettings}
