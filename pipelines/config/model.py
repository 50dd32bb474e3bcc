"""``BenchmarkConfig``: the one typed configuration of a benchmark run, in sections.

Fields are addressed by dotted path (``training.epochs``, ``engines.<name>.<field>``) or by the
flat name they had before sections existed (``epochs``, ``<name>_<field>``: ``field_paths()``
lists them): both work as input (``--set``, DAG params, ``model_copy(update=...)``, old
``config.json`` files); code reads the sections (``config.training.epochs``,
``config.engine(name).<field>``). Unknown keys and wrong types are refused with a message naming
the field and what is allowed.

    >>> cfg = load_config("smoke", {"training.epochs": 3})
    >>> cfg.training.epochs, cfg.epochs
    (3, 3)
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.config.profiles import PROFILES
from pipelines.config.sections import (
    DEFAULT_NETWORK, IDENTITY_SECTIONS, NETWORK_LOCAL, NETWORK_SSH, SECTIONS, ClusterConfig, DataConfig,
    EnginesConfig, MatrixConfig, TrackingConfig, TrainingConfig, fault_problem,
)
from pipelines.config.fields import ConfigError, _merge, _section_fields, alias_of, nest, path_of
from pipelines.config.strategy import TrainingStrategy
from pipelines.config.work import work_identity


class BenchmarkConfig(BaseModel):
    """Everything that decides what a benchmark run does. Immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = "custom"  # built without a profile; else a name of PROFILES
    data: DataConfig = Field(default_factory=DataConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    matrix: MatrixConfig = Field(default_factory=MatrixConfig)
    engines: EnginesConfig = Field(default_factory=EnginesConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        """A profile name (pipelines.config.PROFILES), or "custom" (built without one): it reaches
        reports, mail subjects and page links, so nothing else is taken."""
        if value not in (*PROFILES, "custom"):
            raise ValueError(f"unknown profile (allowed: {', '.join([*PROFILES, 'custom'])})")
        return value

    @model_validator(mode="after")
    def _networks_fit_the_cluster(self) -> "BenchmarkConfig":
        kind, networks = self.cluster.kind, self.matrix.networks or []
        if kind == "local" and any(n != NETWORK_LOCAL for n in networks):
            raise ValueError(f"matrix.networks (flat name: networks): {networks} need an emulated cluster "
                             "(cluster.kind=emulated); a local run has the one network 'local'")
        if kind == "emulated" and any(n in (NETWORK_LOCAL, NETWORK_SSH) for n in networks):
            raise ValueError(f"matrix.networks (flat name: networks): {networks}: an emulated cluster's networks "
                             "are link rates (unshaped, 10gbit, 1gbit, 100mbit, <n>mbit)")
        if kind == "ssh" and any(n != NETWORK_SSH for n in networks):
            raise ValueError(f"matrix.networks (flat name: networks): {networks}: real machines over SSH have "
                             "their own network ('ssh'); it cannot be shaped")
        if kind == "ssh" and not self.cluster.ssh_hosts:
            raise ValueError("cluster.ssh_hosts: cluster.kind=ssh needs the machines (user@host[:port], node 0 first)")
        return self

    @model_validator(mode="after")
    def _fault_fits_the_run(self) -> "BenchmarkConfig":
        """A fault that would inject nothing is refused, not run as a fault-free run."""
        problem = fault_problem(self.matrix, self.training.epochs, self.cluster)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="before")
    @classmethod
    def _sections_from_flat_names(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        flat = {k: v for k, v in values.items() if k != "profile" and k not in SECTIONS}
        if not flat:
            return values
        try:
            nested = nest(flat)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        base = {k: (v.model_dump() if isinstance(v, BaseModel) else v) for k, v in values.items() if k not in flat}
        return _merge(base, nested)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "BenchmarkConfig":
        """A changed copy, validated again; ``update`` keys are dotted paths or flat names."""
        if not update:
            return super().model_copy(deep=deep)
        try:
            return type(self).model_validate(_merge(self.model_dump(), nest(update)))
        except ValidationError as err:
            raise ConfigError(format_error(err)) from None

    def engine(self, platform: str) -> Any:
        """The settings of ``platform`` (``engines.<platform>``)."""
        return self.engines.of(platform)

    def strategy(self, name: str | None = None) -> TrainingStrategy:
        """The run's strategy called ``name``; a cell's config (one strategy): its own."""
        strategies = self.matrix.strategies
        if name is None:
            if len(strategies) != 1:
                raise ConfigError(f"strategies: this config holds {len(strategies)}; name one")
            return strategies[0]
        for s in strategies:
            if s.name == name:
                return s
        raise ConfigError(f"strategy {name!r} is not one of this run's strategies "
                          f"({', '.join(s.name for s in strategies)})")

    def resolved_tracking_uri(self) -> str:
        """MLflow URI: the config's, else a SQLite store in the output root.

        Never MLflow's implicit default (a store in the current working directory). The
        environment's MLFLOW_TRACKING_URI is taken when the config is built (``load_config``),
        not here: MLflow itself sets that variable in-process, which must not re-route a run.
        """
        if self.tracking.mlflow_tracking_uri:
            return self.tracking.mlflow_tracking_uri
        return f"sqlite:///{Path(self.tracking.output_root).resolve() / 'mlflow.db'}"

    def networks(self) -> list[str]:
        """The networks the cells run on: ``matrix.networks``, else the cluster's own one."""
        return list(self.matrix.networks or [DEFAULT_NETWORK[self.cluster.kind]])

    def cells(self) -> list[tuple[str, str, str, int, int]]:
        """Every (backend, strategy name, network, workers, repeat) training cell of this run,
        in a stable order. Strategies about how ranks talk (comm hooks, local SGD, FSDP) have no
        1-worker cell: they do not apply there (``not_applicable_cells`` lists them). Repeat r starts
        with the r-th platform, so no platform always pays the run's first cell's cold caches."""
        m = self.matrix
        return [(b, s.name, net, n, r) for r in range(m.repeats)
                for b in m.backends[r % len(m.backends):] + m.backends[:r % len(m.backends)]
                for s in m.strategies for net in self.networks() for n in m.worker_counts
                if n > 1 or not s.needs_process_group]

    def not_applicable_cells(self) -> list[tuple[str, int]]:
        """(strategy name, workers) pairs left out of ``cells``: nothing to communicate."""
        return [(s.name, n) for s in self.matrix.strategies for n in self.matrix.worker_counts
                if n == 1 and s.needs_process_group]

    def for_cell(self, world_size: int, repeat: int, strategy: str | None = None) -> "BenchmarkConfig":
        """The config one cell trains with: seed + repeat, the per-worker batch of the batch
        policy, the learning rate scaled to the global batch and the cell's one strategy
        (``strategy``: a name of ``strategies``; None = the first). Stored in the cell's spec."""
        t = self.training
        if t.batch_policy == "global":
            if t.batch_size % world_size:
                raise ConfigError(f"batch_size: the global batch {t.batch_size} cannot be split evenly "
                                  f"over {world_size} workers (batch_policy=global)")
            per_worker = t.batch_size // world_size
        else:
            per_worker = t.batch_size
        factor = per_worker * world_size / t.batch_size  # global batch vs the 1-worker batch
        scale = {"none": 1.0, "linear": factor, "sqrt": math.sqrt(factor)}[t.lr_scaling]
        chosen = self.strategy(strategy) if strategy is not None else self.matrix.strategies[0]
        training = t.model_copy(update={"seed": t.seed + repeat, "batch_size": per_worker,
                                        "learning_rate": t.learning_rate * scale})
        matrix = self.matrix.model_copy(update={"strategies": [chosen]})
        return BaseModel.model_copy(self, update={"training": training, "matrix": matrix})

    def training_identity(self) -> dict[str, Any]:
        """What decides what a cell trains (the data and training sections, one flat dict as
        before sections existed); a checkpoint resumes, and runs compare, only if it matches.
        Where and how the run is launched, tracked or judged may change between attempts."""
        identity: dict[str, Any] = {}
        for section in IDENTITY_SECTIONS:
            identity.update(getattr(self, section).model_dump(mode="json"))
        # new fields enter the identity only when used, so earlier runs keep their fingerprint
        for name, unused in (("class_ratio", None), ("near_duplicate_threshold", 0.9),
                             ("max_near_duplicate_fraction", None), ("max_near_overlap_fraction", None)):
            if identity.get(name, unused) == unused:
                identity.pop(name, None)
        strategies = self.matrix.strategies
        if len(strategies) == 1 and not strategies[0].is_default:  # a cell's config
            identity["strategy"] = strategies[0].model_dump(mode="json")
        return identity

    def fingerprint(self) -> str:
        """sha256 over ``pipelines.config.work.work_identity``: runs compare only within one fingerprint."""
        return hashlib.sha256(json.dumps(work_identity(self), sort_keys=True).encode()).hexdigest()[:16]

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name, as JSON values (MLflow params keep the names they had)."""
        dumped = json.loads(self.model_dump_json())
        out: dict[str, Any] = {"profile": dumped["profile"]}
        missing = object()
        for name, path in _section_fields().items():
            node: Any = dumped
            for part in path:
                node = node.get(part, missing) if isinstance(node, dict) else missing
            if node is not missing:
                out[name] = node
        return out

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def flat_view(raw: dict[str, Any]) -> dict[str, Any]:
    """A run folder's config.json as plain JSON with flat names, sectioned or written before
    sections existed (the page and the trends read it so); an unreadable one is returned as is."""
    try:
        return BenchmarkConfig.model_validate(raw).flat()
    except (ValidationError, ConfigError, ValueError):
        return raw


def format_error(err: ValidationError) -> str:
    from pipelines import platforms

    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "config"
        field += alias_of(tuple(e["loc"])) if len(e["loc"]) > 1 else ""
        allowed = ""
        if "backends" in field.split(".") and "registered" not in e["msg"]:
            allowed = f" (allowed: {', '.join(platforms.names())})"
        elif e["type"] == "extra_forbidden":
            section = SECTIONS.get(str(e["loc"][0])) if len(e["loc"]) > 1 else BenchmarkConfig
            known = ", ".join(section.model_fields) if section else ""
            allowed = f" (known fields{' of ' + str(e['loc'][0]) if len(e['loc']) > 1 else ''}: {known})"
        got = f"; got {e.get('input')!r}" if e["loc"] else ""  # a whole-config rule: its message says it
        lines.append(f"{field}: {e['msg']}{allowed}{got}")
    return "invalid benchmark config:\n  " + "\n  ".join(lines)


def json_schema() -> dict:
    """The config's JSON schema (the DAG's trigger form is built from it)."""
    from pipelines import platforms

    return _schema_of_generation(platforms.generation())


@functools.lru_cache(maxsize=4)
def _schema_of_generation(generation: int) -> dict:
    return BenchmarkConfig.model_json_schema()


FORM_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "items", "minItems",
             "uniqueItems", "pattern", "examples")


def form_schema(key: str) -> dict:
    """One field's JSON schema as a trigger form takes it (``key``: flat name or dotted path):
    its type plus null (empty = keep the profile's value), its bounds, choices and item schema."""
    schema = json_schema()

    def resolve(node: dict) -> dict:
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        return node

    node = schema
    for part in path_of(key):
        node = resolve(resolve(node)["properties"][part])
    out: dict[str, Any] = {}
    types: list[str] = []
    for variant in map(resolve, node.get("anyOf", [node])):
        if "type" in variant:
            types.append(variant["type"])
        out.update({k: variant[k] for k in FORM_KEYS if k in variant})
    if isinstance(out.get("items"), dict):
        out["items"] = resolve(out["items"])
    out["type"] = [*dict.fromkeys(t for t in types if t != "null"), "null"]
    if "enum" in out:
        out["enum"] = [None, *(v for v in out["enum"] if v is not None)]
    return out
