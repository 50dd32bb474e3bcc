"""What a run's fingerprint covers beyond what a cell trains: the settings that change the work.

``work_identity(config)`` is ``config.training_identity()`` (data and training: also a checkpoint's
identity) plus, as ``engines.<entry>.<field>``, every setting of the ``engines`` entries the matrix's
platforms read (ZeRO stage and offload, elastic groups) and, as ``cluster.<field>``, the emulated
hosts' share of a core and memory limit. ZeRO-3 is then never compared with ZeRO-2 as if it were
the same job. Each enters only where it differs from its default, so runs that never set one keep
their fingerprint; deployment fields (where a run connects: masters, addresses, node ranks) stay
out, as the hardware class says where it ran. Whether a cluster is standing or per job is the
backend's name (``<platform>`` / ``<platform>_per_job``), part of every metric's key, so those
never compare either.
"""

from __future__ import annotations

from typing import Any

from pipelines.config.sections import settings_models

CLUSTER_FIELDS = ("cpu_per_host", "memory_mb_per_host")  # None: the whole core, no limit


def _is_deployment(field: Any) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("deployment"))


def settings_owner(backend: str) -> str | None:
    """The ``engines`` entry a backend reads: its own, else that of the standing platform it is a
    variant of (``Platform.variant_of``: a per-job cluster reads its standing one's), else its
    family's (the name before its first ``_``: a second data feed of one platform reads the first's)."""
    from pipelines import platforms

    known = settings_models()
    for name in (backend, platforms.get(backend).variant_of, backend.split("_")[0]):
        if name in known:
            return name
    return None


def work_identity(config: Any) -> dict[str, Any]:
    """``config.training_identity()`` plus the non-default settings that change the work (module doc)."""
    identity = config.training_identity()
    for owner in sorted({o for b in config.matrix.backends if (o := settings_owner(str(b)))}):
        settings = config.engine(owner)
        values, defaults = settings.model_dump(mode="json"), type(settings)().model_dump(mode="json")
        for name, field in type(settings).model_fields.items():
            if not _is_deployment(field) and values[name] != defaults[name]:
                identity[f"engines.{owner}.{name}"] = values[name]
    for name in CLUSTER_FIELDS:
        if (value := getattr(config.cluster, name)) is not None:
            identity[f"cluster.{name}"] = value
    return identity
