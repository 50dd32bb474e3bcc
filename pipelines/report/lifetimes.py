"""Standing versus per-job clusters in the report: which lifetime each platform's figures are,
what a per-job cluster adds to a cell (its ``provision`` phase), and what the run's standing
clusters took to start, once, outside every cell (``RunSummary.standing_clusters``)."""

from __future__ import annotations

import statistics

from pipelines import platforms
from pipelines.runfolder.summary import Aggregate, RunSummary


def lifetime_of(backend: str) -> str | None:
    found = platforms.find(str(backend))
    return found.lifetime if found else None


def pairs(summary: RunSummary) -> list[tuple[Aggregate, Aggregate]]:
    """(standing, per-job) aggregates of the same platform, strategy, network and workers."""
    by_key = {(str(a.backend), a.strategy, a.network, a.workers): a for a in summary.aggregates if a.repeats_ok}
    out = []
    for (backend, strategy, network, workers), per_job in by_key.items():
        found = platforms.find(backend)
        standing = by_key.get((found.variant_of, strategy, network, workers)) if found and found.variant_of else None
        if standing is not None:
            out.append((standing, per_job))
    return out


def standing_provision(summary: RunSummary) -> str:
    """One phrase per standing cluster: how long it took to start, how many times (outside the cells)."""
    parts = []
    for name, seconds in summary.standing_clusters.items():
        if seconds:
            parts.append(f"{name}: {statistics.median(seconds):.1f} s to start"
                         f"{'' if len(seconds) == 1 else f' (median of {len(seconds)} starts)'}")
    return "; ".join(parts)


def lifetime_sentences(summary: RunSummary) -> list[str]:
    """What the verdict says of cluster lifetimes: the figures' lifetimes and each pair's gap."""
    standing = sorted({str(a.backend) for a in summary.aggregates if lifetime_of(a.backend) == "standing"})
    per_job = sorted({str(a.backend) for a in summary.aggregates if lifetime_of(a.backend) == "per_job"})
    if not per_job:  # nothing to compare: the platform's figures are its standing cluster's, as ever
        return []
    out = []
    if standing:
        started = standing_provision(summary)
        out.append(f"{', '.join(standing)}: standing clusters (up before each cell, kept for the next; "
                   f"their start is not in any cell" + (f": {started}" if started else "") + ").")
    if per_job:
        out.append(f"{', '.join(per_job)}: per-job clusters (brought up inside each cell: its provision phase).")
    for keep, own in pairs(summary):
        if keep.total_seconds.median is None or own.total_seconds.median is None:
            continue
        gap = own.total_seconds.median - keep.total_seconds.median
        provision = own.phases.get("provision", 0.0)
        launch = own.phases.get("launch", 0.0) - keep.phases.get("launch", 0.0)
        where = f" over {own.network}" if own.network not in ("local", None) else ""
        out.append(f"At {own.workers} worker(s){where}, {own.backend} takes {gap:+.1f} s against {keep.backend}: "
                   f"provision {provision:.1f} s, launch {launch:+.1f} s.")
    return out
