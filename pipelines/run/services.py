"""The run's services: what platforms need running before their first cell and stopped after the
last (``Platform.services``), started and stopped by the DAG's setup / teardown tasks and the CLI.

A service is an object named ``"module:attr"`` in a platform's declaration, with ``name``,
``wanted(config) -> bool`` (e.g. the embedded Spark cluster: ``engines.spark.master ==
"embedded"``), ``running(paths) -> bool``, ``start(paths, tied_to_caller) -> str | None`` and
``stop(paths) -> list[int]``. Each is imported here, by name, when a run starts or stops
services: the registry itself imports nothing.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from pipelines import platforms
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import RunPaths

log = logging.getLogger(__name__)


def declared() -> list[Any]:
    """Every service some registered platform declares, once each, in registry order."""
    out: dict[str, Any] = {}
    for platform in platforms.all_platforms():
        for target in platform.services:
            if target not in out:
                module, _, attr = target.partition(":")
                out[target] = getattr(importlib.import_module(module), attr)
    return list(out.values())


def wanted(config: BenchmarkConfig) -> list[Any]:
    """The services this run's config asks for."""
    return [service for service in declared() if service.wanted(config)]


def start(config: BenchmarkConfig, paths: RunPaths, tied_to_caller: bool = False) -> dict[str, str | None]:
    """Start every wanted service that is not running yet (idempotent); name -> its address.
    ``tied_to_caller``: they end with this process (the CLI); else they outlive it until stopped."""
    out = {}
    for service in wanted(config):
        if service.running(paths):
            log.info("%s: already running for this run", service.name)
            continue
        out[service.name] = service.start(paths, tied_to_caller=tied_to_caller)
    if not out:
        log.info("no service to start for this run")
    return out


def stop(paths: RunPaths) -> list[int]:
    """Stop every declared service this run folder has running; the pids stopped."""
    stopped: list[int] = []
    for service in declared():
        stopped += service.stop(paths)
    return stopped
