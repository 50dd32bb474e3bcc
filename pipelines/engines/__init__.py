"""The data stage's engines, one package each (``pipelines/engines/<name>/``), and their settings
(``engines.<name>`` in the config).

An engine is what the data stage runs on; its package's ``__init__`` declares, in plain pydantic,
``Settings`` (the model of ``engines.<name>``) and, where the engine runs a cluster of its own for
the run, ``SERVICE`` (``"module:attr"`` of it: ``pipelines.run.services`` starts it at set-up and
stops it before a cell that does not use it). A platform that trains on the same engine declares
the engine's model as its own settings (``Platform.settings``) and lists the engine's service
among its own, so the engine, not the platform, owns them: the data stage keeps working whatever
platforms are installed.

This module only finds the packages (as the registry finds the platforms'): it names no engine,
and loading the declarations imports no engine, so the config (which validates ``engines.<name>``)
and the platform declarations (which name the models) both read them without a cycle.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from pydantic import BaseModel

# engine name -> its declaration (the package's __init__: settings and service only)
ENGINES: dict[str, ModuleType] = {
    found.name: importlib.import_module(f"{__name__}.{found.name}")
    for found in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name) if found.ispkg}
# engine name -> its settings model: the config's ``engines.<name>`` entries besides the platforms' own
ENGINE_SETTINGS: dict[str, type[BaseModel]] = {name: module.Settings for name, module in ENGINES.items()}


def services() -> tuple[str, ...]:
    """``"module:attr"`` of every engine's run service (the data stage uses it: started at set-up)."""
    return tuple(module.SERVICE for module in ENGINES.values() if getattr(module, "SERVICE", None))
