"""The platform registry: which training platforms exist, and what each one brings.

A platform is one module under ``pipelines/backends/`` defining one ``TrainingBackend``
subclass with a ``name``: defining the class registers it (``TrainingBackend.__init_subclass__``
calls ``register``). The class declares everything about the
platform: how it launches ranks (one host, and ``launch_on_hosts`` for several), its settings
(a pydantic model, ``engines.<name>`` in the config, deployment fields marked there), its
preflight checks, its platform modes and their report caveats, its label and colour for plots
and the Benchmarks page, and its process cleanup. The config, preflight, the DAG's form, the
report, the page and the trends read this registry; no other file lists the platforms.

    from pipelines import platforms
    platforms.names()              # ['ddp', 'spark', 'determined', 'ray', 'spark_dataframe']
    platforms.get("ray").label     # 'Ray Train'
    platforms.adapter("ddp")       # a DDPBackend, ready to run a cell

Every module in ``pipelines/backends/`` (but ``base``) is imported on first use; a platform
defined elsewhere (a plug-in, a test) registers itself when its module is imported. This
module imports nothing heavy: the DAG file reads it at parse time.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

# Platforms are pipelines.platforms.contract.TrainingBackend subclasses; named "Platform" here so this
# module imports nothing of the package (the config imports it)
Platform = type
_REGISTRY: dict[str, Platform] = {}
_builtins_loaded = False
_generation = 0  # bumped by every (un)registration: caches of what the registry implies follow it


class UnknownPlatform(ValueError):
    """A backend name no registered platform has."""


def register(cls: Platform) -> Platform:
    """Make ``cls`` (a TrainingBackend subclass) the platform ``cls.name``."""
    name = str(cls.name)
    known = _REGISTRY.get(name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise ValueError(f"platform {name!r} is registered already by {known.__module__}.{known.__qualname__}")
    _REGISTRY[name] = cls
    _changed()
    return cls


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
    _builtins_loaded = True  # first: the modules imported below import this one
    # found by name at run time, as plug-ins are: the platform modules import the config, which
    # reads this registry, so this module imports none of them statically
    for module in ("ddp.adapter", "spark.adapter", "spark.dataframe", "determined.adapter", "ray.adapter"):
        importlib.import_module(f"pipelines.platforms.{module}")


def classes() -> list[Platform]:
    """Every registered platform, in report order (``order``, then name)."""
    _load_builtins()
    return sorted(_REGISTRY.values(), key=lambda c: (c.order, str(c.name)))


def names() -> list[str]:
    return [str(c.name) for c in classes()]


def default_names() -> list[str]:
    """The platforms of a run that names none: those in ``pipelines/backends/``. One registered
    from elsewhere (a plug-in, a test) trains only where a run names it in ``matrix.backends``."""
    return [str(c.name) for c in classes() if c.__module__.startswith("pipelines.platforms.")]


def get(name: str) -> Platform:
    """The platform class called ``name``; UnknownPlatform names the registered ones."""
    _load_builtins()
    try:
        return _REGISTRY[str(name)]
    except KeyError:
        raise UnknownPlatform(f"unknown backend {str(name)!r} (registered: {', '.join(names())})") from None


def adapter(name: str) -> Any:
    return get(name)()


def styles() -> dict[str, dict[str, str]]:
    """Label and colour of every platform: plots, the report and the Benchmarks page use these."""
    return {str(c.name): {"label": c.label, "colour": c.colour} for c in classes()}


class _BackendType(type):
    def __iter__(cls):
        return iter([Backend(n) for n in names()])


class Backend(str, metaclass=_BackendType):
    """A registered platform's name: a ``str`` (JSON-friendly) that only a registered name becomes.

    ``Backend("ddp")``; ``Backend("nope")`` raises ValueError naming the registered ones;
    ``list(Backend)`` lists them. The constants name the platforms this project ships."""

    DDP: ClassVar["Backend"]
    SPARK: ClassVar["Backend"]
    DETERMINED: ClassVar["Backend"]
    RAY: ClassVar["Backend"]
    SPARK_DATAFRAME: ClassVar["Backend"]

    def __new__(cls, value: Any) -> "Backend":
        value = str(value)
        get(value)
        return super().__new__(cls, value)

    def __reduce__(self):  # pickles as a plain str: a worker need not know the registry
        return (str, (str(self),))

    @property
    def value(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"Backend({str(self)!r})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.plain_serializer_function_ser_schema(str))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict:
        return {"type": "string", "enum": names()}


for _name in ("ddp", "spark", "determined", "ray", "spark_dataframe"):  # names, not registrations
    setattr(Backend, _name.upper(), str.__new__(Backend, _name))
