"""Field helpers for config models, the project's and each platform's (``engines.<name>``).

A leaf beside the registry: it imports nothing of the project, so a platform package can declare
its settings without importing the config (which reads the registry: that would be a cycle).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field


def deployment(default: Any, *, env: str | None = None, flat: str | None = None, **kwargs: Any) -> Any:
    """A field the deployment sets (``env``: the variable a host's default comes from; ``flat``:
    the field's name in the flat configs written before sections existed, when it differs)."""
    extra = {"deployment": True, **({"env": env} if env else {}), **({"flat": flat} if flat else {})}
    return Field(default, json_schema_extra=extra, **kwargs)
