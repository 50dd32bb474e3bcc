"""The platform registry: which training platforms exist, and what each one brings.

A platform is one package: ``pipelines/platforms/<name>/`` for the project's own (``BUILTIN``:
found in this folder, so the project names them nowhere), or any importable package for a plug-in or a
test (listed in ``BENCHMARK_PLATFORMS``, or imported by the caller). Its ``__init__`` declares it with ``register(Platform(...))``: a frozen record of plain
data that imports nothing heavy (the DAG file reads it at parse time). The record says
everything the rest of the project needs to know about the platform, so no other module names
it: its label and colour, its settings (``engines.<name>``), its modes' caveats, whether it is
the reference the others are compared with, whether the smoke profile trains it, the process
kinds it starts (resources), the processes it uses but a cell does not start (``daemons``),
and the run-level services it needs (``services``: started before the first cell, stopped
after the last). Its adapter (``pipelines.platforms.contract.TrainingBackend``) is named as
``"module:Class"`` and imported only when a cell runs (``pipelines.run.cells.get_backend``).

    from pipelines import platforms
    platforms.names()              # ['ddp', 'spark', 'determined', 'ray', 'spark_dataframe']
    platforms.get("ray").label     # 'Ray Train'
    platforms.reference()          # 'ddp'

This module imports nothing of the project: the config validates platform names and settings
through it, and the platform packages it loads import only their settings' leaf helpers.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any

# the project's platform packages: every sub-package of this folder (a new platform adds its folder
# and touches nothing here); their order in reports is each Platform's ``order``
BUILTIN = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg))
PLUGINS_ENV = "BENCHMARK_PLATFORMS"
# the orchestration features the report's "What it takes" asks of every platform (the study's
# criteria beside speed): each platform names those it brings, with the test that shows it
FEATURES = ("scheduler", "web UI", "experiment tracking", "fault tolerance", "elastic training",
            "data integration")
_REGISTRY: dict[str, "Platform"] = {}
_builtins_loaded = False
_generation = 0  # bumped by every (un)registration: caches of what the registry implies follow it


class UnknownPlatform(ValueError):
    """A backend name no registered platform has."""


@dataclass(frozen=True)
class Platform:
    """What the project knows about one training platform (see the module docstring)."""

    name: str
    adapter: str  # "module:Class" of its TrainingBackend subclass
    label: str = ""  # human name, e.g. "PyTorch DDP (torchrun)"
    colour: str = "#64748b"  # plots and the Benchmarks page
    order: int = 100  # position in reports and the default matrix
    # engines.<name> in the config: a pydantic model of the platform's own settings; fields made
    # with pipelines.platforms.fields.deployment(...) are set by the deployment, never by a trigger
    settings: type | None = None
    # platform_mode -> what that mode leaves out of a deployed platform (the report's caveats)
    mode_caveats: Mapping[str, str] = field(default_factory=dict)
    study_overhead: float | None = None  # the published study's overhead over DDP (fraction)
    reference: bool = False  # the platform every other is compared with (overheads, the study)
    smoke: bool = True  # trained by the smoke profile
    default: bool = True  # in the matrix of a run that names no backends
    # how the platform's own cluster lives: "standing" (up before the cell, kept for the next: as
    # teams keep a Spark or Ray cluster), "per_job" (brought up inside the cell, its ``provision``
    # phase, and taken down after it), None (no cluster of its own: torchrun, the local Trainer)
    lifetime: str | None = None
    variant_of: str | None = None  # the standing platform a per-job variant is compared with
    # (marker found in a process's name or command line, kind): the resource split's names for
    # the processes this platform starts, checked in order
    process_kinds: tuple[tuple[str, str], ...] = ()
    # run folder -> pids of processes a cell of this platform uses but does not start (a cluster
    # the run keeps standing); never raises
    daemons: Callable[[Any], list[int]] | None = None
    # "module:object"s with start(config, paths) / stop(config, paths) / wanted(config): services
    # the run starts before its first cell of this platform and stops after the last
    services: tuple[str, ...] = ()
    study_note: str = ""  # what the report's study section says of it where it finished
    # the setting that holds this machine's node rank, for a platform whose cell is started on
    # every node (``train --node-rank``): node 0 tracks the cell, the others only lend processes
    node_rank_setting: str | None = None
    # what it takes to run it (the report's "What it takes"; pipelines.measure.footprint measures
    # the rest): the Python distributions it adds beyond torch and transformers (their dependency
    # closure is sized in the run's environment), the programs it needs beside Python (their
    # installation is sized), the files a user writes to run it across machines (the deployment
    # fields of ``settings`` are read from the model), and the orchestration features it brings:
    # feature (``FEATURES``) -> (what it is here, the test that shows it: "tests/<file>.py::<test>")
    distributions: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    cluster_files: tuple[str, ...] = ()
    features: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # why it cannot run across real machines over SSH yet ("" : it can); preflight refuses such a run
    ssh_refusal: str = ""
    # config -> "field=value" of the setting that sends a one-host run's ranks of this platform to
    # other machines (a cluster URL, a rendezvous endpoint), or None: preflight refuses such a run
    # over an untrusted network (cluster.trusted_network); loopback addresses are this machine's
    remote_ranks: Callable[[Any], str | None] | None = None
    # what a run that loses its first host (fault_victim=coordinator) takes from it, e.g. "Ray's head",
    # and the platform's own retry setting (platform_retries), e.g. "Ray `FailureConfig(max_failures)`":
    # the report's "Losing a host" section names them ("": nothing to say)
    coordinator_note: str = ""
    retries_note: str = ""
    # (regex, format): where the platform's launcher put a rank, read from the rank's working
    # directory; the regex's groups fill the format, appended to the rank's placement in the result
    # (pipelines.training.distributed.placement). (): nothing to add
    workdir_placement: tuple[str, str] = ()
    # fault=host_return: what the platform starts again on a host that comes back (the command its
    # launch offers pipelines.measure.faults), in words, e.g. "elastic torchrun" ("": nothing)
    return_agent: str = ""
    # profile -> {field: value} of its engines.<name> entry that the profile sets (pipelines.config.profiles):
    # e.g. the nightly's cluster master; the registry's platforms give theirs, a profile names none
    profile_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # what strategies it cannot run, in words, for the trigger form's help (e.g. "comm hooks, local SGD,
    # FSDP"; "": it runs every one); its adapter's strategy_refusal is what refuses them
    strategy_note: str = ""
    # what the report's prediction on the study's cluster (pipelines.report.whatif) leaves out of this
    # platform beyond the shared training loop, in words ("": nothing to say)
    prediction_note: str = ""
    # a result field it stored under an older name -> the field now ({}: none); result.json files of
    # old run folders still read (pipelines.runfolder.results), e.g. a session field once its own
    result_renames: Mapping[str, str] = field(default_factory=dict)
    package: str = ""  # the module that declared it (set by register): workers import it by name

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode_caveats", MappingProxyType(dict(self.mode_caveats)))
        object.__setattr__(self, "features", MappingProxyType(dict(self.features)))
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"platform {self.name!r}: unknown feature(s) {sorted(unknown)}; known: {FEATURES}")


def register(platform: Platform, package: str | None = None) -> Platform:
    """Make ``platform`` known under its name; ``package``: the module declaring it (a worker
    process imports it to know the platform), by default the adapter's package."""
    package = package or platform.adapter.partition(":")[0].rpartition(".")[0]
    platform = Platform(**{**platform.__dict__, "package": package})
    known = _REGISTRY.get(platform.name)
    if known is not None and known.adapter != platform.adapter:
        raise ValueError(f"platform {platform.name!r} is registered already by {known.package}")
    _REGISTRY[platform.name] = platform
    _changed()
    return platform


def unregister(name: str) -> None:
    """Forget a platform (tests that declare one of their own)."""
    if _REGISTRY.pop(str(name), None) is not None:
        _changed()


def _changed() -> None:
    global _generation
    _generation += 1


def generation() -> int:
    """Changes whenever a platform is registered or removed."""
    _load_builtins()
    return _generation


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True  # first: the packages imported below import this module
    for package in BUILTIN:  # each package's __init__ declares its platforms (data, no adapter)
        importlib.import_module(f"{__name__}.{package}")
    for module in plugin_modules():
        importlib.import_module(module)


def plugin_modules() -> list[str]:
    """Modules declaring platforms from outside the project (``BENCHMARK_PLATFORMS``, comma-separated:
    every process of a run, the DAG's parse and the ranks alike, imports them)."""
    return [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]


def all_platforms() -> list[Platform]:
    """Every registered platform, in report order (``order``, then name)."""
    _load_builtins()
    return sorted(_REGISTRY.values(), key=lambda p: (p.order, p.name))


def names() -> list[str]:
    return [p.name for p in all_platforms()]


def is_builtin(platform: Platform) -> bool:
    return platform.package.startswith(f"{__name__}.")


def default_names() -> list[str]:
    """The platforms of a run that names none: the project's own that are ``default`` (a per-job
    cluster variant trains where a run names it). One registered from elsewhere (a plug-in, a
    test) trains only where a run names it in ``matrix.backends``."""
    return [p.name for p in all_platforms() if is_builtin(p) and p.default]


def smoke_names() -> list[str]:
    """The platforms the smoke profile trains."""
    return [p.name for p in all_platforms() if is_builtin(p) and p.smoke]


def get(name: str) -> Platform:
    """The platform called ``name``; UnknownPlatform names the registered ones."""
    _load_builtins()
    try:
        return _REGISTRY[str(name)]
    except KeyError:
        raise UnknownPlatform(f"unknown backend {str(name)!r} (registered: {', '.join(names())})") from None


def find(name: str) -> Platform | None:
    """The platform called ``name``, or None (a run folder from a platform no longer registered)."""
    try:
        return get(name)
    except UnknownPlatform:
        return None


def reference() -> str:
    """The name of the platform every other is compared with."""
    return next(p.name for p in all_platforms() if p.reference)


def check_name(value: Any) -> str:
    """``value`` as a registered platform's name (a plain ``str``); ValueError names the registered."""
    return get(str(value)).name


def styles() -> dict[str, dict[str, str]]:
    """Label and colour of every platform: plots, the report and the Benchmarks page use these."""
    return {p.name: {"label": p.label, "colour": p.colour} for p in all_platforms()}


def result_renames() -> dict[str, str]:
    """Old result field -> the field now, of every platform (``Platform.result_renames``)."""
    return {old: new for p in all_platforms() for old, new in p.result_renames.items()}


def process_kind_rules() -> list[tuple[str, str]]:
    """Every platform's (marker, kind) pairs, in report order (``pipelines.measure.resources``)."""
    return [rule for p in all_platforms() for rule in p.process_kinds]


class _RegisteredName:
    """Pydantic schema of a registered platform's name: a ``str`` checked by the registry, with
    the registered names as the JSON schema's enum (read when the schema is built)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(check_name, core_schema.str_schema())

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        return {"type": "string", "enum": names()}


PlatformName = Annotated[str, _RegisteredName()]  # a config field holding a platform's name
