"""The report's PNG plots (matplotlib's Agg backend: files only, no display): time and scaling
efficiency vs workers, accuracy per epoch, overhead vs DDP, and where each cell's time goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config import Backend
from pipelines.report.tables import PHASE_ORDER, backend_colour
from pipelines.results import CellResult
from pipelines.summary import Aggregate, RunSummary


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers and in Airflow workers
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(7, 4.2), dpi=100)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def _by_backend(summary: RunSummary) -> dict[str, list[Aggregate]]:
    out: dict[str, list[Aggregate]] = {}
    for a in summary.aggregates:
        out.setdefault(a.backend, []).append(a)
    return out


def _colour(backend: Any) -> dict[str, str]:
    """``color=`` for the platform's fixed colour, if it has one; else nothing (the colour cycle)."""
    colour = backend_colour(backend)
    return {} if colour is None else {"color": colour}


def _legend_or_note(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    if not ax.has_data():
        ax.text(0.5, 0.5, "no finished cells", ha="center", va="center", transform=ax.transAxes)


def plot_time_vs_workers(summary: RunSummary, path: Path) -> Path:
    plt, fig, ax = _figure()
    for backend, aggs in _by_backend(summary).items():
        for what, style in (("total_seconds", "-o"), ("training_seconds", "--s")):
            pts = [a for a in aggs if getattr(a, what).median is not None]
            if not pts:
                continue
            med = [getattr(a, what).median for a in pts]
            err = [[m - getattr(a, what).min for m, a in zip(med, pts)],
                   [getattr(a, what).max - m for m, a in zip(med, pts)]]
            ax.errorbar([a.workers for a in pts], med, yerr=err, fmt=style, capsize=3,
                        label=f"{backend} ({what.split('_')[0]})", **_colour(backend))
    ax.set(xlabel="workers", ylabel="seconds (median, min-max)", title="Wall time vs workers")
    ax.set_xticks(sorted({a.workers for a in summary.aggregates}))
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_scaling_efficiency(summary: RunSummary, path: Path) -> Path:
    plt, fig, ax = _figure()
    for backend, aggs in _by_backend(summary).items():
        pts = [a for a in aggs if a.scaling_efficiency is not None]
        if pts:
            ax.plot([a.workers for a in pts], [a.scaling_efficiency for a in pts], "-o", label=backend,
                    **_colour(backend))
    ax.axhline(1.0, color="grey", linestyle=":", label="ideal")
    ax.set(xlabel="workers", ylabel="t(1) / (N * t(N)), training time", title="Scaling efficiency")
    ax.set_xticks(sorted({a.workers for a in summary.aggregates}))
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_accuracy_curves(results: list[CellResult], target: float, path: Path) -> Path:
    """Colour = backend, line style = worker count; repeats share a label."""
    plt, fig, ax = _figure()
    colours = {b: backend_colour(b) or f"C{i}"
               for i, b in enumerate(dict.fromkeys(str(r.backend) for r in results))}
    styles = {w: s for w, s in zip(sorted({r.world_size for r in results}), ["-", "--", ":", "-."] * 4)}
    labelled = set()
    for r in results:
        if not r.epochs:
            continue
        label = f"{str(r.backend)} w{r.world_size}"
        ax.plot([e.epoch for e in r.epochs], [e.eval_accuracy for e in r.epochs], marker="o",
                color=colours[str(r.backend)], linestyle=styles[r.world_size], alpha=0.8,
                label=None if label in labelled else label)
        labelled.add(label)
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target}")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="epoch", ylabel="held-out accuracy", title="Accuracy per epoch (all repeats)")
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_overhead(summary: RunSummary, path: Path) -> Path:
    plt, fig, ax = _figure()
    others = [b for b in _by_backend(summary) if b != Backend.DDP]
    workers = sorted({a.workers for a in summary.aggregates})
    width = 0.8 / max(len(others), 1)
    for i, backend in enumerate(others):
        vals = {a.workers: a.overhead_vs_ddp_total
                for a in summary.aggregates if a.backend == backend}
        xs = [w for w in workers if vals.get(w) is not None]
        ax.bar([w + (i - (len(others) - 1) / 2) * width for w in xs], [vals[w] * 100 for w in xs],
               width=width, label=backend, **_colour(backend))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(xlabel="workers", ylabel="% slower than DDP (median total time)", title="Overhead vs plain DDP")
    ax.set_xticks(workers)
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_phases(summary: RunSummary, path: Path) -> Path:
    """Where the time goes: one stacked bar per (backend, workers), a segment per phase."""
    plt, fig, ax = _figure()
    aggs = [a for a in summary.aggregates if a.phases]
    names = [p for p in PHASE_ORDER if any(a.phases.get(p) for a in aggs)]
    bottoms = [0.0] * len(aggs)
    for i, name in enumerate(names):
        heights = [a.phases.get(name, 0.0) for a in aggs]
        ax.bar(range(len(aggs)), heights, bottom=bottoms, label=name, color=f"C{i}")
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(aggs)), [a.key for a in aggs], rotation=30, ha="right")
    ax.set(xlabel="backend-workers", ylabel="seconds (median per phase over repeats)",
           title="Where the time goes (phases of each cell's wall time)")
    _legend_or_note(ax)
    return _save(plt, fig, path)
