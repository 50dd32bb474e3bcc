"""Ray Train: ``TorchTrainer`` runs the shared loop in Ray worker actors.

``adapter.py`` runs a cell on a local Ray cluster, on an existing one (``engines.ray.address``),
or on a cluster built on the run's hosts (``hosts.py``); ``worker.py`` is the training process.
"""

import re

from pydantic import BaseModel, ConfigDict, field_validator

from pipelines.platforms.fields import deployment
from pipelines.platforms import Platform, register


class RaySettings(BaseModel):
    """``engines.ray``: None = a local Ray cluster per cell; else the cluster to join."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "auto" (the cluster this host belongs to), "ray://host:10001" (Ray Client) or "host:6379"
    # (the head's GCS address): join that cluster, which is left running
    address: str | None = deployment(None, env="BENCHMARK_RAY_ADDRESS", flat="ray_address")

    @field_validator("address")
    @classmethod
    def _known_address(cls, v: str | None) -> str | None:
        if v is None or v == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-]+:\d{1,5}", v):
            return v
        raise ValueError("must be empty (a local Ray cluster started for each cell), 'auto' (the cluster "
                         "this host belongs to), ray://host:port (Ray Client) or host:port (the head's GCS)")


PLATFORM = register(Platform(
    name="ray", adapter=f"{__name__}.adapter:RayBackend", order=30, label="Ray Train", colour="#7c3aed",
    settings=RaySettings,
    mode_caveats={"local-cluster": "Ray Train on a one-node Ray cluster started for the cell on this host: its "
                                   "start-up includes the cluster's, and there is no network between workers. "
                                   "It measures Ray's own launch and bookkeeping, not a multi-node cluster's."},
    # "=" : the process's own name; else a part of its command line (a worker's names its raylet)
    process_kinds=(("=raylet", "raylet"), ("=gcs_server", "gcs_server"), ("ray::", "ray_worker"),
                   ("default_worker.py", "ray_worker"), ("/ray/", "ray_other")),
))
