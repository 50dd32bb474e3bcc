"""How the ranks of a cell cooperate: ``TrainingStrategy`` and its short names ("fp16", "localsgd-4",
"pipeline-4", "async").

A strategy is part of the config (``matrix.strategies``); ``pipelines.training.strategies`` runs it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from pipelines.runfolder.paths import DEFAULT_STRATEGY

# A strategy name as a trigger form accepts it (the JSON schema of ``matrix.strategies`` items).
_PART = (r"(default|fp16|bf16|powersgd(-r[0-9]+)?|localsgd-[0-9]+|fsdp|ddp|pipeline-[0-9]+|async(-[0-9]+)?|"
         r"weighted_sampler|weighted_loss)")
STRATEGY_PATTERN = rf"^{_PART}(\+{_PART})*$"
STRATEGY_EXAMPLES = ["default", "fp16", "bf16", "powersgd-r1", "powersgd-r4", "localsgd-4", "localsgd-16", "fsdp",
                     "pipeline-4", "async", "async-1", "weighted_sampler", "weighted_loss"]
ASYNC_STALENESS_BOUND = 4  # "async": a gradient staler than this many server updates is dropped


class TrainingStrategy(BaseModel):
    """How the ranks of a cell cooperate, orthogonal to the backend that launches them.

    ``comm_hook``: DDP gradient communication (``none`` = fp32 all-reduce; ``fp16`` / ``bf16``
    compression; ``powersgd`` low-rank compression of rank ``powersgd_rank``); ``sync_every``:
    local SGD, parameters averaged every N steps (1 = plain synchronous DDP); ``sharding``:
    ``ddp`` (replicated) or ``fsdp`` (FSDP2 ``fully_shard``); ``imbalance``: how training
    counters an imbalanced train split (``weighted_sampler`` draws rows with probability
    1 / class count, ``weighted_loss`` weights the loss by N / (K * class count));
    ``pipeline_microbatches``: pipeline parallelism when > 0, the model's layers split over the
    ranks (one stage each, GPipe over that many microbatches a batch: ``pipelines.training.pipeline``);
    ``asynchronous``: workers push gradients to a parameter server and pull its weights, no barrier
    between their steps (``pipelines.training.parameter_server``); a gradient computed on weights more
    than ``staleness_bound`` server updates old is dropped ("async" = bound 4, "async-<k>" = bound k).
    ``name`` is the short label of cells and reports ("default" when nothing is changed).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    powersgd_rank: int = Field(1, ge=1, le=64)  # matrix_approximation_rank of PowerSGD
    sync_every: int = Field(1, ge=1, le=10_000)  # local SGD period in optimizer steps
    sharding: Literal["ddp", "fsdp"] = "ddp"
    imbalance: Literal["none", "weighted_sampler", "weighted_loss"] = "none"
    pipeline_microbatches: int = Field(0, ge=0, le=1024)  # 0: no pipeline; else microbatches a batch
    asynchronous: bool = False  # a parameter server, no barrier (async)
    staleness_bound: int = Field(ASYNC_STALENESS_BOUND, ge=0, le=10_000)  # with asynchronous only

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        """Without ``pipeline_microbatches`` when 0 and the asynchronous fields when synchronous: a config,
        checkpoint or cell written before the fields existed dumps (and fingerprints, and resumes) as it did."""
        data = handler(self)
        if not self.pipeline_microbatches:
            data.pop("pipeline_microbatches", None)
        if not self.asynchronous:
            data.pop("asynchronous", None)
            data.pop("staleness_bound", None)
        return data

    @property
    def name(self) -> str:
        parts = []
        if self.comm_hook == "powersgd":
            parts.append(f"powersgd-r{self.powersgd_rank}")
        elif self.comm_hook != "none":
            parts.append(self.comm_hook)
        if self.sync_every > 1:
            parts.append(f"localsgd-{self.sync_every}")
        if self.sharding != "ddp":
            parts.append(self.sharding)
        if self.pipeline_microbatches:
            parts.append(f"pipeline-{self.pipeline_microbatches}")
        if self.asynchronous:
            parts.append("async" if self.staleness_bound == ASYNC_STALENESS_BOUND else f"async-{self.staleness_bound}")
        if self.imbalance != "none":
            parts.append(self.imbalance)
        return "+".join(parts) or DEFAULT_STRATEGY

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_STRATEGY

    def result_fields(self) -> dict[str, Any]:
        """The CellResult fields that record this strategy."""
        return {"strategy": self.name, "comm_hook": self.comm_hook,
                "powersgd_rank": self.powersgd_rank if self.comm_hook == "powersgd" else None,
                "sync_every": self.sync_every, "sharding": self.sharding, "imbalance": self.imbalance,
                "pipeline_microbatches": self.pipeline_microbatches, "asynchronous": self.asynchronous,
                "staleness_bound": self.staleness_bound if self.asynchronous else None}

    @property
    def needs_process_group(self) -> bool:
        """Strategies about how ranks talk: meaningless on one worker."""
        return self.comm_hook != "none" or self.sync_every > 1 or self.sharding != "ddp" or \
            self.pipeline_microbatches > 0 or self.asynchronous

    def pipeline_refusal(self, world_size: int, global_batch: int | None = None,
                         layers: int | None = None) -> str | None:
        """Why this pipeline strategy cannot split the model over ``world_size`` workers (None: it
        can, or it is no pipeline). A pipeline has one stage per worker, each with at least one of
        the model's ``layers`` encoder layers; ``global_batch`` rows (per-worker batch x workers)
        are split into ``pipeline_microbatches`` equal microbatches. Unknown values are not checked."""
        m = self.pipeline_microbatches
        if not m:
            return None
        if world_size < 2:
            return (f"strategy {self.name!r} with {world_size} worker: pipeline_microbatches splits the model "
                    "into one stage per worker, and one worker has nothing to split")
        if layers is not None and world_size > layers:
            return (f"strategy {self.name!r} at {world_size} workers: pipeline_microbatches makes one stage per "
                    f"worker, {world_size} stages, and the model has {layers} encoder layers (at least one a "
                    f"stage): run it at 2 to {layers} workers")
        if global_batch is not None and global_batch % m:
            return (f"strategy {self.name!r} at {world_size} workers: pipeline_microbatches={m} does not split "
                    f"the global batch of {global_batch} rows (batch_size per worker x workers) into equal "
                    "microbatches; choose a count that divides it")
        return None

    @model_validator(mode="after")
    def _compatible(self) -> "TrainingStrategy":
        if self.sharding == "fsdp" and (self.comm_hook != "none" or self.sync_every > 1):
            raise ValueError("sharding=fsdp takes no DDP comm_hook and no sync_every > 1 "
                             "(FSDP reduce-scatters gradients itself; hooks and local SGD are DDP's)")
        if self.comm_hook != "none" and self.sync_every > 1:
            raise ValueError("comm_hook and sync_every > 1 exclude each other: local SGD registers "
                             "its own DDP hook (post-local-SGD)")
        if self.pipeline_microbatches and (self.sharding != "ddp" or self.comm_hook != "none" or self.sync_every > 1):
            raise ValueError("pipeline_microbatches > 0 takes no sharding=fsdp, no comm_hook and no sync_every > 1: "
                             "a pipeline gives each rank its own layers, so no gradient is all-reduced, hooked, "
                             "averaged or sharded")
        if self.asynchronous and (self.sharding != "ddp" or self.comm_hook != "none" or self.sync_every > 1
                                  or self.pipeline_microbatches):
            raise ValueError("asynchronous takes no sharding=fsdp, no comm_hook, no sync_every > 1 and no "
                             "pipeline_microbatches: each worker pushes its whole gradient to the parameter server and "
                             "pulls its whole model, so nothing is all-reduced, hooked, averaged, sharded or split")
        return self


def parse_strategy(value: Any) -> Any:
    """A strategy as the CLI / trigger form gives it: a dict of fields, or a canonical name
    (``"default"``, ``"fp16"``, ``"powersgd-r2"``, ``"localsgd-4"``, ``"fsdp"``, ``"pipeline-4"``,
    ``"async"``, ``"async-2"``, ``"weighted_loss"``, joined with ``+``)."""
    if not isinstance(value, str):
        return value
    fields: dict[str, Any] = {}
    for part in filter(None, value.strip().split("+")):
        if part == DEFAULT_STRATEGY:
            continue
        if part in ("fp16", "bf16", "powersgd"):
            fields["comm_hook"] = part
        elif part.startswith("powersgd-r") and part[10:].isdigit():
            fields.update(comm_hook="powersgd", powersgd_rank=int(part[10:]))
        elif part.startswith("localsgd-") and part[9:].isdigit():
            fields["sync_every"] = int(part[9:])
        elif part in ("fsdp", "ddp"):
            fields["sharding"] = part
        elif part.startswith("pipeline-") and part[9:].isdigit() and int(part[9:]) > 0:
            fields["pipeline_microbatches"] = int(part[9:])
        elif part == "async":
            fields["asynchronous"] = True
        elif part.startswith("async-") and part[6:].isdigit():
            fields.update(asynchronous=True, staleness_bound=int(part[6:]))
        elif part in ("weighted_sampler", "weighted_loss"):
            fields["imbalance"] = part
        else:
            raise ValueError(f"unknown strategy part {part!r} in {value!r} (known: default, fp16, bf16, "
                             "powersgd, powersgd-r<rank>, localsgd-<steps>, fsdp, pipeline-<microbatches> "
                             "(at least 1), async, async-<staleness bound>, weighted_sampler, weighted_loss; "
                             "joined with '+')")
    return fields
