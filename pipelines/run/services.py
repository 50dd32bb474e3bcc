"""The run's services: clusters the platforms keep standing (``Platform.services``), started and
stopped by the run, never inside a cell's timed window, and never alive beside another cell.

A service is an object named ``"module:attr"`` in an engine's declaration (``pipelines.engines``:
the data stage's, whatever platforms are installed) or a platform's, with ``name``,
``at_setup(config)`` (started by the DAG's ``start_services`` task and the CLI before the data
stage: e.g. an engine's embedded cluster, which the data stage uses too), ``wanted(config)`` (a
standing cell of its platform uses it in this run), ``running(paths)``,
``start(paths, config, tied_to_caller)`` and ``stop(paths)``. ``before_cell`` runs under the
host's timing lock right before each cell's window: it brings up what a standing cell uses (its
start is the run's ``provision``, recorded in ``<run>/services.json``) and stops every other
service, so nothing of the run runs beside the cell. ``stop`` at the end stops them all.

On this host the services run in the run's loopback-only network namespace
(``pipelines.cluster.netns.ensure_run``), with every driver that uses them; ``stop`` ends it too.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from pipelines import engines, platforms
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.summary import read_service_starts as read_record  # the record this module writes

log = logging.getLogger(__name__)


def declared() -> dict[str, Any]:
    """"module:attr" -> service, of every engine, then every registered platform (registry order),
    once each."""
    out: dict[str, Any] = {}
    for target in (*engines.services(), *(t for platform in platforms.all_platforms() for t in platform.services)):
        if target not in out:
            module, _, attr = target.partition(":")
            out[target] = getattr(importlib.import_module(module), attr)
    return out


def _start(service: Any, paths: RunPaths, config: BenchmarkConfig, tied_to_caller: bool) -> str | None:
    """Start ``service`` and record how long its provision took (``<run>/services.json``)."""
    began = time.time()
    address = service.start(paths, config, tied_to_caller=tied_to_caller)
    seconds = round(time.time() - began, 3)
    record = read_record(paths)
    record.setdefault(service.name, []).append({"started": began, "provision_seconds": seconds})
    atomic_write_json(paths.root / "services.json", record)
    log.info("%s: up in %.1f s (%s)", service.name, seconds, address)
    return address


def start(config: BenchmarkConfig, paths: RunPaths, tied_to_caller: bool = False) -> dict[str, str | None]:
    """Start the services the run needs before its data stage (idempotent); name -> address.
    ``tied_to_caller``: they end with this process (the CLI); else they outlive it until stopped."""
    out = {}
    for service in declared().values():
        if service.at_setup(config) and not service.running(paths):
            out[service.name] = _start(service, paths, config, tied_to_caller)
    if not out:
        log.info("no service to start for this run")
    return out


def before_cell(config: BenchmarkConfig, paths: RunPaths, backend: str, tied_to_caller: bool = False) -> None:
    """Under the host lock, before the cell's window: the standing services its platform uses are
    up, every other service is down (nothing of the run beside the cell). ``tied_to_caller``: what
    it starts ends with this process (the CLI); else it outlives it until ``stop`` (a DAG task)."""
    platform = platforms.get(backend)
    mine = set(platform.services) if platform.lifetime == "standing" else set()
    for target, service in declared().items():
        used = target in mine and service.wanted(config)
        if used and not service.running(paths):
            _start(service, paths, config, tied_to_caller=tied_to_caller)
        elif not used and service.running(paths):
            log.info("%s: stopped before %s's cell (nothing of the run beside a timed cell)", service.name, backend)
            service.stop(paths)


def stop(paths: RunPaths) -> list[int]:
    """Stop every declared service this run folder has running, then the run's network namespace
    they ran in (with anything still in it: ``pipelines.cluster.netns``); the pids stopped."""
    from pipelines.cluster import netns

    stopped: list[int] = []
    for service in declared().values():
        stopped += service.stop(paths)
    return stopped + netns.stop_run(paths)
