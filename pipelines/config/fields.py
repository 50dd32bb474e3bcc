"""Config fields by flat name and by dotted path: which is which, which are deployment settings, nesting."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

from pipelines.config.sections import SECTIONS, settings_models


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field and what is allowed."""


def _marked(field: Any, key: str) -> Any:
    extra = field.json_schema_extra
    return extra.get(key) if isinstance(extra, dict) else None


def _section_fields() -> dict[str, tuple[str, ...]]:
    """Flat name -> path of every field of the fixed sections and of every ``engines`` entry."""
    from pipelines import platforms

    return _fields_of_generation(platforms.generation())


@functools.lru_cache(maxsize=4)
def _fields_of_generation(generation: int) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for section, model in SECTIONS.items():
        for name, field in model.model_fields.items():
            out[_marked(field, "flat") or name] = (section, name)
    for entry, settings in settings_models().items():  # engines.<entry>: its flat name, else <entry>_<field>
        for name, field in settings.model_fields.items():
            out[_marked(field, "flat") or f"{entry}_{name}"] = ("engines", str(entry), name)
    return out


def field_paths() -> dict[str, tuple[str, ...]]:
    """Flat alias -> path (``"epochs"`` -> ``("training", "epochs")``; an ``engines`` field
    ``<entry>_<field>`` -> ``("engines", <entry>, <field>)`` unless its ``deployment(flat=...)`` says)."""
    return _section_fields()


def alias_of(path: tuple) -> str:
    """`` (flat name: X)`` for a field path that has a flat alias, else ""."""
    path = tuple(str(p) for p in path)
    names = [name for name, p in _section_fields().items() if p == path and name != path[-1]]
    return f" (flat name: {names[0]})" if names else ""


def deployment_fields() -> dict[str, str | None]:
    """Dotted path of every deployment field -> the BENCHMARK_* variable of its host default."""
    out: dict[str, str | None] = {}
    for section, model in SECTIONS.items():
        for name, field in model.model_fields.items():
            if _marked(field, "deployment"):
                out[f"{section}.{name}"] = _marked(field, "env")
    for entry, settings in settings_models().items():
        for name, field in settings.model_fields.items():
            if _marked(field, "deployment"):
                out[f"engines.{entry}.{name}"] = _marked(field, "env")
    return out


def deployment_keys(overrides: dict[str, Any]) -> list[str]:
    """The keys of ``overrides`` (flat, dotted or whole sections) that would set a deployment field."""
    deployment = deployment_fields()
    refused = []
    for key, value in overrides.items():
        try:
            nested = nest({key: value})
        except ConfigError:
            continue  # an unknown key: load_config names it

        def leaves(node: Any, prefix: str) -> list[str]:
            if not isinstance(node, dict) or prefix in deployment:
                return [prefix]
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}.{k}" if prefix else k)]

        if any(leaf in deployment for leaf in leaves(nested, "")):
            refused.append(key)
    return sorted(refused)


def path_of(key: str) -> tuple[str, ...]:
    """A dotted path or a flat alias -> path; ConfigError for a key no field has."""
    if key in ("profile", *SECTIONS):
        return (key,)
    if "." in key:
        return tuple(key.split("."))
    found = _section_fields().get(key)
    if found is None:
        raise ConfigError(f"{key}: unknown config field (known fields: {', '.join(sorted(_section_fields()))}; "
                          f"or a dotted path section.field, sections: {', '.join(SECTIONS)})")
    return found


def nest(values: dict[str, Any]) -> dict[str, Any]:
    """Flat and dotted keys -> one nested dict (sections given whole are merged too)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, BaseModel) and key in SECTIONS:
            value = value.model_dump()
        path = path_of(key)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {part} is not a section")
        if isinstance(value, dict) and isinstance(node.get(path[-1]), dict):
            node[path[-1]] = _merge(node[path[-1]], value)
        else:
            node[path[-1]] = value
    return out


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("strategies",):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
