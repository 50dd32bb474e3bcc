"""Ray Train: ``TorchTrainer`` runs the shared loop in Ray worker actors.

``adapter.py`` runs a cell on a local Ray cluster, on an existing one (``engines.ray.address``),
or on a cluster built on the run's hosts (``hosts.py``); ``worker.py`` is the training process.
A one-host cell's driver (``ray.init`` and ``TorchTrainer``) runs in a process of its own
(``pipelines.platforms.driver``) in its cluster's network namespace: the run's for the standing
head, the cell's own for a per-job cluster, this host's for ``engines.ray.address`` (outside one, the
head's GCS, raylet and workers would listen on every interface).

Signals (``pipelines.measure.signals``): ``ray.init`` replaces SIGTERM's handler with one that exits
at once, so the driver holds ``RaiseOnceHandlers`` around it; Ray's C++ core wraps an exception a
handler raised in a ``SystemError`` (``cause_of`` finds it) and ``ray.get`` swallows one, so the
driver process ends its tree without raising (``end_tree_on_signal``); after ``ray.shutdown()``
the workers notice their raylet is gone only by polling (``stop_leftovers``).
"""

import json
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipelines.platforms.fields import deployment
from pipelines.platforms import Platform, register


class RaySettings(BaseModel):
    """``engines.ray``: None = the run's own Ray cluster (``ray``: standing, kept for the run;
    ``ray_per_job``: one per cell); else a cluster someone keeps standing, to join."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "auto" (the cluster this host belongs to), "ray://host:10001" (Ray Client) or "host:6379"
    # (the head's GCS address): join that cluster, which is left running
    address: str | None = deployment(None, env="BENCHMARK_RAY_ADDRESS", flat="ray_address")
    # Ray Train V2's elastic worker group: a cell of N workers runs ScalingConfig(num_workers=(this, N)),
    # so after losing a node Ray restarts the group with the workers that still fit (at least this
    # many) from the last reported checkpoint, and grows it back when the node returns. None: a
    # fixed size (num_workers=N), a lost node fails the attempt. Needs matrix.platform_retries >= 1
    # (FailureConfig(max_failures): each shrink is a failure Ray recovers from)
    elastic_min_workers: int | None = Field(None, ge=1)
    # how often a healthy elastic group checks the cluster for room to grow (Ray's default: 60 s)
    elastic_resize_interval_s: float = Field(5.0, ge=0.5, le=3600)

    @field_validator("address")
    @classmethod
    def _known_address(cls, v: str | None) -> str | None:
        if v is None or v == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-]+:\d{1,5}", v):
            return v
        raise ValueError("must be empty (the run's own Ray cluster), 'auto' (the cluster "
                         "this host belongs to), ray://host:port (Ray Client) or host:port (the head's GCS)")


_LOCAL = ("there is no network between workers: it measures Ray's own launch and bookkeeping, not a "
          "multi-node cluster's.")
_FEATURES = {
    "scheduler": ("Ray places the worker actors on the cluster's nodes (a placement group over both hosts)",
                  "tests/platforms/ray/test_ray_across_hosts.py::test_a_ray_cell_across_two_emulated_hosts"),
    "fault tolerance": ("a new run restores the latest checkpoint reported to Ray Train (its run snapshot)",
                        "tests/platforms/ray/test_ray.py::test_ray_cell_killed_after_epoch_1_resumes_from_rays_checkpoint"),
    "elastic training": ("engines.ray.elastic_min_workers: a lost worker node, the group restarts smaller from "
                         "the last checkpoint in the same attempt",
                         "tests/platforms/ray/test_ray_elastic.py::"
                         "test_ray_loses_a_worker_node_and_goes_on_with_one_worker_by_itself"),
}
_SSH_REFUSAL = ("across SSH machines its head and nodes would need the cluster's token on every machine (it is "
                "written to this machine's /tmp only) and a tracked stop; until then run it on emulated hosts or "
                "join a Ray cluster of your own (engines.ray.address)")
_COMMON = dict(settings=None, colour="#7c3aed", distributions=("ray",), features=_FEATURES, ssh_refusal=_SSH_REFUSAL,
               coordinator_note="Ray's head", retries_note="Ray `FailureConfig(max_failures)`",
               return_agent="Ray's nodes",  # a returning host's `ray start --address=<head>` (hosts.offer_return)
               # "=" : the process's own name; else a part of its command line (a worker's names its raylet)
               process_kinds=(("=raylet", "raylet"), ("=gcs_server", "gcs_server"), ("ray::", "ray_worker"),
                              ("default_worker.py", "ray_worker"), ("/ray/", "ray_other")))


def standing_pids(paths) -> list[int]:
    """The run's standing Ray cluster's node processes (``standing.py`` writes its state): a
    standing cell's platform, not the run's."""
    try:
        return list(json.loads((paths.root / "ray-standing" / "state.json").read_text())["pids"])
    except (OSError, ValueError, KeyError):
        return []


def _remote_ranks(config) -> str | None:  # a Ray cluster someone keeps: the workers on its nodes
    address = config.engine("ray").address
    return f"engines.ray.address={address}" if address else None


PLATFORM = register(Platform(
    name="ray", adapter=f"{__name__}.adapter:RayBackend", order=30, label="Ray Train", remote_ranks=_remote_ranks,
    **{**_COMMON, "settings": RaySettings}, lifetime="standing",
    services=(f"{__name__}.standing:STANDING_SERVICE",), daemons=standing_pids,
    mode_caveats={"local-standing": "Ray Train on a one-node Ray cluster kept for the run on this host: " + _LOCAL},
))
PER_JOB = register(Platform(
    name="ray_per_job", adapter=f"{__name__}.adapter:RayPerJobBackend", order=31,
    label="Ray Train, per-job cluster", **{**_COMMON, "colour": "#a78bfa"}, lifetime="per_job", variant_of="ray",
    default=False, smoke=False,  # named where a run compares lifetimes (engines.ray: the same Ray)
    mode_caveats={"local-cluster": "Ray Train on a one-node Ray cluster started for the cell on this host: its "
                                   "provision is the cluster's start; " + _LOCAL},
))
