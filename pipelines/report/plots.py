"""The report's PNG plots (matplotlib's Agg backend: files only, no display): the verdict's chart
(each platform's total time by phase, per worker count), time and scaling efficiency vs workers, accuracy per epoch,
overhead vs the reference platform, where each cell's time goes, and
(runs across hosts) communication and epoch time vs the links' bandwidth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines import platforms
from pipelines.runfolder.paths import DEFAULT_NETWORK, DEFAULT_STRATEGY
from pipelines.report.network import bandwidth, format_bandwidth
from pipelines.report.tables import PHASE_ORDER, backend_colour, reference_label
from pipelines.runfolder.results import CellResult
from pipelines.runfolder.summary import Aggregate, RunSummary


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


def _plain(value: Any) -> str:
    """A value from results or config as plot text: shown as is, never parsed as mathtext (``$..$``:
    a malformed expression fails the whole report) and on one line."""
    return " ".join(str(value).replace("$", r"\$").split())


def _by_backend(summary: RunSummary) -> dict[str, list[Aggregate]]:
    """Label -> aggregates of one platform: its name, or "<name> 100mbit" when the run has networks."""
    several = len({a.network for a in summary.aggregates}) > 1
    out: dict[str, list[Aggregate]] = {}
    for a in summary.aggregates:
        label = f"{a.backend} {a.network}" if several or a.network != DEFAULT_NETWORK else str(a.backend)
        out.setdefault(_plain(label), []).append(a)
    return out


def _label_backend(label: str) -> str:
    return label.split(" ", 1)[0]


def _colour(backend: Any) -> dict[str, str]:
    """``color=`` for the platform's fixed colour, if it has one; else nothing (the colour cycle)."""
    colour = backend_colour(backend)
    return {} if colour is None else {"color": colour}


def _legend_or_note(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    if not ax.has_data():
        ax.text(0.5, 0.5, "no finished cells", ha="center", va="center", transform=ax.transAxes)


def plot_verdict(summary: RunSummary, path: Path) -> Path:
    """The verdict's chart: per worker count (and network), each finished platform's median total
    time as a horizontal bar split by phase (colours as in ``plot_phases``), fastest on top, its
    time and overhead over the fastest at the bar's end."""
    from pipelines.report.verdict import groups

    bars = []  # (label, aggregate, fastest total)
    for group, aggs in groups(summary):
        done = [a for a in aggs if a.total_seconds.median is not None]
        bars += [(_plain(f"{group}: {a.backend}"), a, done[0].total_seconds.median) for a in done]
    plt, fig, ax = _figure()
    fig.set_size_inches(8, min(1.6 + 0.32 * len(bars), 9))
    names = [p for p in PHASE_ORDER if any(a.phases.get(p) for _, a, _ in bars)]
    labelled: set[str] = set()

    def label(name: str) -> str | None:
        return None if name in labelled or labelled.add(name) else name

    for y, (_, a, best) in enumerate(bars):
        left = 0.0
        for i, name in enumerate(names):
            width = a.phases.get(name, 0.0)
            if width:
                ax.barh(y, width, left=left, color=f"C{i}", label=label(name))
            left += width
        if not a.phases:
            left = a.total_seconds.median
            ax.barh(y, left, color="grey", label=label("total (no phases)"))
        total = a.total_seconds.median
        slower = f"  +{(total / best - 1) * 100:.0f} %" if best and total > best * 1.0005 else ""
        note = f"{total:.1f} s{slower}"
        ax.text(left, y, " " + note, va="center", fontsize="small")
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize="small")
    ax.invert_yaxis()
    ax.margins(x=0.2)
    ax.set(xlabel="seconds (median total per cell; bars: median per phase)",
           title="Total time per platform, fastest first, by phase")
    if ax.get_legend_handles_labels()[0]:  # beside the bars, not over their labels
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if not bars:
        _legend_or_note(ax)  # "no finished cells"
    return _save(plt, fig, path)


def plot_time_vs_workers(summary: RunSummary, path: Path) -> Path:
    plt, fig, ax = _figure()
    for label, aggs in _by_backend(summary).items():
        backend = _label_backend(label)
        for what, style in (("total_seconds", "-o"), ("training_seconds", "--s")):
            pts = [a for a in aggs if getattr(a, what).median is not None]
            if not pts:
                continue
            med = [getattr(a, what).median for a in pts]
            err = [[m - getattr(a, what).min for m, a in zip(med, pts)],
                   [getattr(a, what).max - m for m, a in zip(med, pts)]]
            ax.errorbar([a.workers for a in pts], med, yerr=err, fmt=style, capsize=3,
                        label=f"{label} ({what.split('_')[0]})", **_colour(backend))
    ax.set(xlabel="workers", ylabel="seconds (median, min-max)", title="Wall time vs workers")
    ax.set_xticks(sorted({a.workers for a in summary.aggregates}))
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_scaling_efficiency(summary: RunSummary, path: Path) -> Path:
    plt, fig, ax = _figure()
    for label, aggs in _by_backend(summary).items():
        pts = [a for a in aggs if a.scaling_efficiency is not None]
        if pts:
            ax.plot([a.workers for a in pts], [a.scaling_efficiency for a in pts], "-o", label=label,
                    **_colour(_label_backend(label)))
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
        net = "" if r.network == DEFAULT_NETWORK else f" {r.network}"
        label = _plain(f"{r.backend!s} w{r.world_size}{net}")
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
    groups = _by_backend(summary)
    others = [label for label in groups if _label_backend(label) != platforms.reference()]
    workers = sorted({a.workers for a in summary.aggregates})
    width = 0.8 / max(len(others), 1)
    for i, label in enumerate(others):
        vals = {a.workers: a.overhead_vs_reference_total for a in groups[label]}
        xs = [w for w in workers if vals.get(w) is not None]
        ax.bar([w + (i - (len(others) - 1) / 2) * width for w in xs], [vals[w] * 100 for w in xs],
               width=width, label=label, **_colour(_label_backend(label)))
    ax.axhline(0, color="black", linewidth=0.8)
    reference = _plain(reference_label())
    ax.set(xlabel="workers", ylabel=f"% slower than {reference} (median total time)", title=f"Overhead vs {reference}")
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
    ax.set_xticks(range(len(aggs)), [_plain(a.key) for a in aggs], rotation=30, ha="right")
    ax.set(xlabel="backend-workers", ylabel="seconds (median per phase over repeats)",
           title="Where the time goes (phases of each cell's wall time)")
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_network(summary: RunSummary, path: Path) -> Path:
    """Communication phase (left) and epoch time (right) against the links' bandwidth (log x):
    one line per platform (its colour) at its largest worker count; other strategies dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    aggs = [a for a in summary.aggregates if a.workers > 1 and bandwidth(a.network) is not None]
    top = {}
    for a in aggs:
        top[(a.backend, a.strategy)] = max(top.get((a.backend, a.strategy), 0), a.workers)
    styles = ["-o", "--s", ":^", "-.v", "--D", ":x"]
    strategies = list(dict.fromkeys([DEFAULT_STRATEGY, *(a.strategy for a in aggs)]))  # default: solid
    for ax, what, title in ((axes[0], "communication_seconds", "Communication phase"),
                            (axes[1], "epoch_seconds", "Epoch time")):
        for (backend, strategy), workers in top.items():
            pts = sorted((bandwidth(a.network), getattr(a, what)) for a in aggs
                         if (a.backend, a.strategy, a.workers) == (backend, strategy, workers)
                         and getattr(a, what) is not None)
            if not pts:
                continue
            label = _plain(str(backend) + ("" if strategy == DEFAULT_STRATEGY else f" {strategy}") + f" w{workers}")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[strategies.index(strategy) % len(styles)],
                    label=label, **_colour(backend))
        ax.set_xscale("log")
        ticks = {bandwidth(a.network): a.network for a in aggs}
        ax.set_xticks(sorted(ticks), [format_bandwidth(t, ticks[t]).replace(" (", "\n(") for t in sorted(ticks)])
        ax.minorticks_off()
        ax.set(xlabel="link bandwidth (log)", ylabel="seconds (median over repeats)",
               title=f"{title} vs bandwidth")
        _legend_or_note(ax)
    return _save(plt, fig, path)
