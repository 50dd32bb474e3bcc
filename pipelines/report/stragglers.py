"""The report's "Stragglers: a slow host, a slow link" section (``matrix.fault`` = ``slow_host`` /
``slow_link``, injected by ``pipelines.measure.stragglers``; the cells' ``straggler`` record and
every rank's step times, ``CellResult.rank_steps``).

The healthy figure a slow cell is compared with comes from another run: a run has one ``fault``
for all its cells, so the reference is the same cell (platform, strategy, network, workers,
repeat: the cell's name) of a run beside it (the same output folder) with ``fault=none`` and the
same config fingerprint (it trained the same data and model), its newest finished result. Run
the healthy run and the straggler runs side by side (``bench/RESULTS.md`` shows the commands);
without one the slowdown is "n/a" and the per-rank table still shows who waited for whom.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipelines.report.tables import _md_table, _text
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.runfolder.results import CellResult

log = logging.getLogger(__name__)
CELL_HEADER = ["cell", "platform", "strategy", "network", "slowed", "training s (healthy)", "training s (slow)",
               "slowdown", "total s (healthy)", "total s (slow)", "status"]
RANK_HEADER = ["cell", "rank", "host", "steps", "step p50 ms", "step p95 ms", "compute ms/step",
               "communication ms/step", "healthy compute / communication ms/step"]


def _slowed(result: CellResult) -> str:
    s = result.straggler or {}
    if s.get("kind") == "slow_host":
        throttled = s.get("throttled_seconds")
        return (f"{s.get('host')} CPU at {s.get('fraction', 0) * 100:g} %"
                + (f" (throttled {throttled:.0f} s)" if throttled is not None else ""))
    base = f" of {s.get('base')}" + (" (unshaped: assumed)" if s.get("base_assumed") else "")
    return f"{s.get('host')} link at {s.get('fraction', 0) * 100:g} %{base}"


def _ratio(slow: float, healthy: float | None) -> str:
    return f"x{slow / healthy:.2f}" if healthy else "n/a"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cell_row(name: str, result: CellResult, healthy: CellResult | None) -> list[str]:
    return [_text(name), _text(result.backend), _text(result.strategy), _text(result.network), _text(_slowed(result)),
            _seconds(healthy.training_seconds if healthy else None), _seconds(result.training_seconds),
            _ratio(result.training_seconds, healthy.training_seconds if healthy else None),
            _seconds(healthy.total_seconds if healthy else None), _seconds(result.total_seconds),
            _text(result.status)]


def _rank_rows(name: str, result: CellResult, healthy: CellResult | None) -> list[list[str]]:
    victim = (result.straggler or {}).get("host")
    before = {r.rank: r for r in (healthy.rank_steps if healthy else [])}
    rows = []
    for r in sorted(result.rank_steps, key=lambda r: r.rank):
        ref = before.get(r.rank)
        rows.append([_text(name), str(r.rank), _text(f"{r.host} (slow)" if r.host == victim else r.host), str(r.steps),
                     f"{r.step_p50_s * 1000:.0f}", f"{r.step_p95_s * 1000:.0f}", f"{r.compute_per_step_s * 1000:.0f}",
                     f"{r.communication_per_step_s * 1000:.0f}",
                     f"{ref.compute_per_step_s * 1000:.0f} / {ref.communication_per_step_s * 1000:.0f}" if ref else "-"])
    return rows


def _who_waited(result: CellResult) -> str:
    """Which rank waited for which: the slowest computer and the longest waiter, from the step times."""
    ranks = result.rank_steps
    if len(ranks) < 2:
        return ""
    computer = max(ranks, key=lambda r: r.compute_per_step_s)
    waiter = max(ranks, key=lambda r: r.communication_per_step_s)
    if (result.straggler or {}).get("kind") == "slow_link":  # one wire: every rank waits on it alike
        return (f"every rank waited on {(result.straggler or {}).get('host')}'s link: communication "
                + " / ".join(f"{r.communication_per_step_s * 1000:.0f}" for r in ranks) + " ms/step, compute "
                + " / ".join(f"{r.compute_per_step_s * 1000:.0f}" for r in ranks) + " ms/step (ranks "
                + " / ".join(str(r.rank) for r in ranks) + ")")
    if computer.rank == waiter.rank:
        return (f"rank {computer.rank} ({computer.host}) both computed and communicated longest "
                f"({computer.compute_per_step_s * 1000:.0f} + {computer.communication_per_step_s * 1000:.0f} ms/step)")
    return (f"rank {waiter.rank} ({waiter.host}) waited {waiter.communication_per_step_s * 1000:.0f} ms/step in "
            f"communication for rank {computer.rank} ({computer.host}), which computed "
            f"{computer.compute_per_step_s * 1000:.0f} ms/step")


def _fault_line(kind: str, cells: dict[str, CellResult], healthy: dict[str, CellResult]) -> str:
    """Who keeps training under this fault, and at what cost."""
    kept = [n for n, r in cells.items() if r.status == "ok"]
    failed = [n for n, r in cells.items() if r.status != "ok"]
    costs = [f"{_text(cells[n].backend)} {_text(cells[n].strategy)} "
             f"{_ratio(cells[n].training_seconds, healthy[n].training_seconds if n in healthy else None)}"
             for n in kept]
    what = "a slow host (its CPU cut)" if kind == "slow_host" else "a slow link (one host's link cut)"
    return (f"- `{kind}`, {what}: {len(kept)} of {len(cells)} cell(s) kept training to the end"
            + (f" ({', '.join(_text(n) for n in failed)} failed)" if failed else "")
            + (f"; training time against the healthy cell: {', '.join(costs)}" if costs else "")
            + ". A synchronous platform does not route around a straggler: every step runs at the slow "
              "rank's pace, and the healthy ranks' time goes into waiting (communication).")


def stragglers_markdown(results: dict[str, CellResult], healthy: dict[str, CellResult] | None = None) -> str | None:
    """The section (with its own ``## `` title), or None when no cell had a straggler. ``healthy``:
    the reference cells by name (``healthy_references``)."""
    slow = {name: r for name, r in sorted(results.items()) if r.straggler}
    if not slow:
        return None
    healthy = {n: r for n, r in (healthy or {}).items() if n in slow and r.status == "ok"}
    lines = ["## Stragglers: a slow host, a slow link", "",
             "Each cell below ran with one host slow for the whole cell (`fault=slow_host`: its CPU cut to "
             "`slow_fraction` of its cores with the CFS quota; `fault=slow_link`: its link shaped to `slow_fraction` "
             "of the cell's network), against the same cell of a healthy run beside this one (same output folder, "
             "same config fingerprint, `fault=none`; n/a when there is none). Training s: the training phase, summed "
             "over epochs; total s: the whole cell.", "",
             _md_table(CELL_HEADER, [_cell_row(n, r, healthy.get(n)) for n, r in slow.items()]), "",
             "Per rank (this cell's last attempt): a step is the rank's wall time from having its batch to asking for "
             "the next; compute is the train phase less data waits and communication; communication is the gradient "
             "(or local SGD's parameter) collectives in flight, so a rank waiting for a slower one waits there.", "",
             _md_table(RANK_HEADER, [row for n, r in slow.items() for row in _rank_rows(n, r, healthy.get(n))]), ""]
    waits = [(n, w) for n, r in slow.items() if (w := _who_waited(r))]
    lines += [f"- {_text(n)}: {_text(w)}" for n, w in waits] + [""]
    for kind in ("slow_host", "slow_link"):
        cells = {n: r for n, r in slow.items() if r.straggler.get("kind") == kind}
        if cells:
            lines.append(_fault_line(kind, cells, healthy))
    return "\n".join(lines).rstrip() + "\n"


def healthy_references(run_root: Path, fingerprint: str, names: list[str]) -> dict[str, CellResult]:
    """The healthy cells of ``names`` from the runs beside ``run_root`` (same parent folder) whose
    config has ``fingerprint`` and ``fault=none``: per name, the newest finished ok result."""
    from pipelines.config.loading import read_config

    found: dict[str, tuple[float, CellResult]] = {}
    for config_file in sorted(Path(run_root).parent.glob("*/config.json")):
        if config_file.parent.resolve() == Path(run_root).resolve():
            continue
        try:
            config = read_config(config_file)
        except Exception as err:  # another tool's folder, or an older config: not a reference
            log.debug("not a reference run: %s (%s)", config_file.parent, err)
            continue
        if config.matrix.fault != "none" or config.fingerprint() != fingerprint:
            continue
        for name in names:
            path = CellPaths(RunPaths(config_file.parent).cells / name).result
            try:
                result = CellResult.read(path)
            except (OSError, ValueError):
                continue
            if result.status == "ok" and (name not in found or path.stat().st_mtime > found[name][0]):
                found[name] = (path.stat().st_mtime, result)
    return {name: result for name, (_, result) in found.items()}
