"""Determined AI: the benchmark trial under ``det.pytorch.Trainer`` (local, under torchrun), or
an experiment on a Determined master (``engines.determined.master``).

``adapter.py`` launches; ``trial.py`` is the training process (a ``PyTorchTrial``). The local
mode listens on ``tcp://*:12360`` / ``12365``: its torchrun runs in a loopback-only namespace of
the cell's own (``pipelines.platforms.torchrun.isolated``).
"""

from pydantic import BaseModel, ConfigDict

from pipelines.platforms.fields import deployment
from pipelines.platforms import Platform, register

LOCAL_CAVEAT = ("Determined's Trainer runs in-process under torchrun: no master, no scheduling, "
                "no checkpoint upload. It measures the Trainer's own bookkeeping, not a "
                "Determined cluster's overhead.")


class DeterminedSettings(BaseModel):
    """``engines.determined``: None = the local Trainer; else the master experiments go to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str | None = deployment(None, env="BENCHMARK_DETERMINED_MASTER", flat="determined_master")


def _remote_ranks(config) -> str | None:  # a Determined master: the trials on its agents
    master = config.engine("determined").master
    return f"engines.determined.master={master}" if master else None


PLATFORM = register(Platform(
    name="determined", remote_ranks=_remote_ranks, adapter=f"{__name__}.adapter:DeterminedBackend", order=20, label="Determined AI",
    colour="#047857", settings=DeterminedSettings,
    strategy_note="comm hooks, local SGD, FSDP, pipeline, async",  # its Trainer wraps the model and steps the optimizer itself
    study_overhead=0.21,  # the study: Determined 1.21x DDP's time
    # the report looks modes up exactly: one caveat for one host and for local-<k>-nodes
    mode_caveats={"local": LOCAL_CAVEAT, **{f"local-{k}-nodes": LOCAL_CAVEAT for k in range(2, 65)}},
    process_kinds=(("determined", "determined"),),
    # its scheduler, web UI and experiment tracking are the master's: with the local Trainer
    # measured here, none of them runs (engines.determined.master: not deployed by the project)
    distributions=("determined",),
))
