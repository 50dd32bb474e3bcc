"""What it takes to run each platform, measured (the report's "What it takes"; summary.json's
``what_it_takes``): per platform of a run,

- install: the MB its Python distributions add to this environment beyond torch and transformers
  (the training stack every platform needs): the dependency closure of ``Platform.distributions`` (their
  ``Requires-Dist`` without extras, read with ``importlib.metadata``), less theirs,
  each distribution sized by the files its RECORD lists; and the programs it needs beside
  Python (``Platform.programs``: the installation folder of the one on PATH);
- processes and listening TCP ports: what its cells' resource sampler saw
  (``ResourceUsage.processes_started`` / ``processes_standing``, ``listening``), from its cell with
  the most workers: started per cell, or standing for the run (a cluster kept for the run);
- configuration to run it across machines: its settings' deployment fields (``engines.<name>``,
  ``pipelines.platforms.fields.deployment``) and ``Platform.cluster_files``;
- the lines of its package here (code lines: neither blank nor comment-only);
- the orchestration features it brings, each with the test that shows it (``Platform.features``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from pipelines import platforms
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.runfolder.results import CellResult
from pipelines.runfolder.summary import PlatformNeeds

# every platform trains the same Hugging Face BERT with torch: what a platform adds is beyond them
BASE_DISTRIBUTIONS = ("torch", "transformers")
MB = 1024 * 1024


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(name: str) -> list[str]:
    """The distributions ``name`` needs (its Requires-Dist that apply without an extra)."""
    out = []
    for text in metadata.requires(name) or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


@functools.lru_cache(maxsize=None)
def closure(names: tuple[str, ...]) -> frozenset[str]:
    """The installed distributions ``names`` need, themselves included (canonical names)."""
    seen, stack = set(), list(names)
    while stack:
        name = _canonical(stack.pop())
        if name in seen:
            continue
        try:
            stack.extend(_requires(name))
        except metadata.PackageNotFoundError:
            continue  # not installed (an optional dependency): not part of this environment
        seen.add(name)
    return frozenset(seen)


@functools.lru_cache(maxsize=None)
def distribution_mb(name: str) -> float:
    """MB of the files a distribution installed (its RECORD)."""
    total = 0
    for file in metadata.distribution(name).files or ():
        try:
            total += Path(file.locate()).stat().st_size
        except OSError:
            continue
    return total / MB


def folder_mb(folder: Path) -> float:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total / MB


@functools.lru_cache(maxsize=None)
def program_install(program: str) -> tuple[str, float] | None:
    """(folder, MB) of the installation of ``program`` found on PATH (a JDK: the folder holding
    its ``bin/``); None if it is not installed."""
    found = shutil.which(program)
    if not found:
        return None
    home = Path(os.path.realpath(found)).parent.parent  # <home>/bin/<program>
    return str(home), round(folder_mb(home), 1)


def install_added(platform: platforms.Platform) -> tuple[float, list[tuple[str, float]]]:
    """(MB, [(distribution, MB), largest first]) the platform's distributions add beyond the base."""
    added = closure(tuple(platform.distributions)) - closure(BASE_DISTRIBUTIONS)
    sizes = sorted(((name, distribution_mb(name)) for name in added), key=lambda kv: -kv[1])
    return round(sum(mb for _, mb in sizes), 1), sizes


def code_lines(folder: Path) -> int:
    """Lines of Python under ``folder`` that are neither blank nor only a comment."""
    count = 0
    for path in sorted(folder.rglob("*.py")):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            count += bool(stripped) and not stripped.startswith("#")
    return count


def package_folder(platform: platforms.Platform) -> Path:
    return PROJECT_ROOT / Path(*platform.package.split("."))


def cluster_settings(platform: platforms.Platform) -> list[str]:
    """The settings a user sets to run the platform across machines: its deployment fields (a
    variant or a second data feed reads those of the platform of its package that has settings)."""
    owner = platform if platform.settings else next(
        (p for p in platforms.all_platforms() if p.package == platform.package and p.settings), None)
    fields = getattr(owner.settings, "model_fields", {}) if owner else {}
    return [f"engines.{owner.name}.{name}" for name, info in fields.items()
            if (info.json_schema_extra or {}).get("deployment")]


def _counts(kinds: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def _ports(listening: dict[str, list[str]]) -> tuple[int, int]:
    from pipelines.measure.listeners import is_loopback

    every = [a for addresses in listening.values() for a in addresses]
    return len(every), sum(not is_loopback(a) for a in every)


def platform_needs(name: str, cells: dict[str, CellResult]) -> PlatformNeeds:
    """The row of one platform: measured here and now, and from its cells' results (cell -> result)."""
    platform = platforms.get(name)
    mb, sizes = install_added(platform)
    programs = {p: program_install(p) for p in platform.programs}
    measured = [(n, r) for n, r in cells.items() if r.resources is not None]
    cell, result = max(measured, key=lambda nr: (nr[1].world_size, nr[1].status == "ok"), default=(None, None))
    usage = result.resources if result else None
    ports, beyond = _ports(usage.listening) if usage else (None, None)
    standing_ports, standing_beyond = _ports(usage.standing_listening) if usage else (None, None)
    return PlatformNeeds(
        platform=name, label=platform.label or name, lifetime=platform.lifetime,
        install_mb=mb, install_distributions=len(sizes),
        install_largest=", ".join(f"{n} {m:.0f} MB" for n, m in sizes[:3]),
        programs="; ".join(f"{p} {v[1]:.0f} MB ({v[0]})" if v else f"{p} (not installed)"
                           for p, v in programs.items()),
        measured_cell=cell,
        processes_per_cell=_counts(usage.processes_started) if usage else None,
        processes_per_run=_counts(usage.processes_standing) if usage else None,
        ports_per_cell=ports, ports_per_cell_beyond_loopback=beyond,
        ports_per_run=standing_ports, ports_per_run_beyond_loopback=standing_beyond,
        cluster_config=", ".join(cluster_settings(platform) + [f.split(":")[0] for f in platform.cluster_files]),
        package_lines=code_lines(package_folder(platform)),
        features=", ".join(platform.features),
    )


def what_it_takes(results_by_cell: dict[str, CellResult]) -> list[PlatformNeeds]:
    """One row per registered platform among the run's cells (cell name -> result), in report order."""
    by_platform: dict[str, dict[str, CellResult]] = {}
    for cell, result in results_by_cell.items():
        if platforms.find(result.backend) is not None:
            by_platform.setdefault(result.backend, {})[cell] = result
    order = {p.name: i for i, p in enumerate(platforms.all_platforms())}
    return [platform_needs(name, cells) for name, cells in sorted(by_platform.items(), key=lambda kv: order[kv[0]])]
