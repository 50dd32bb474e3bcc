"""The comparison report: ``report/report.md``, ``report/report.html`` and PNG plots.

Reads ``report/summary.json`` (``evaluate`` writes it; missing -> ``SummaryMissing``) and the
cells' result.json files (for the per-epoch curves). Writes, all under ``report/``:

    report.md            comparison table, dataset, model source, hardware, failed cells
    report.html          the same on one self-contained page (plots embedded as data URIs)
    time_vs_workers.png  median total and training time per backend vs workers (min-max bars)
    scaling_efficiency.png, accuracy_curves.png, overhead_vs_ddp.png

Plots use matplotlib's Agg backend (no display needed). Failed cells never stop the report:
they are listed with their reason. Run it on a finished run folder with
    python -c "from pipelines.stages import report; print(report('runs/<run>'))"
"""

from __future__ import annotations

import base64
import html
import json
import logging
from pathlib import Path
from typing import Any

from pipelines.config import Backend, BenchmarkConfig
from pipelines.evaluation import read_cells
from pipelines.fileio import atomic_write_text
from pipelines.paths import DEFAULT_STRATEGY, RunPaths
from pipelines.results import CellResult
from pipelines.summary import Aggregate, RunSummary, read_summary
from pipelines.training import phases

log = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "backend", "mode", "workers", "repeats ok", "total s (median)", "training s (median)",
    "total s 95 % CI (n)", "samples/s (median)", "test accuracy (median)", "test accuracy 95 % CI",
    "test F1 (median)", "time to target s", "scaling efficiency", "overhead vs ddp (total)",
    "overhead vs ddp (training)", "resumed", "est. cost",
]


# The published study this benchmark reproduces (README): BERT-tiny on IMDB, 3 GPU nodes.
STUDY_SETTING = "3 GPU nodes; DDP: 20 epochs in 499 s on 2 GPUs"
# over DDP: Determined 1.21x, Spark 2.87x (the study's one Spark figure, beside both Spark data feeds)
STUDY_OVERHEAD = {"determined": 0.21, "spark": 1.87, "spark_dataframe": 1.87}
MODE_CAVEATS = {
    ("spark", "local"): "TorchDistributor in local mode starts torchrun on the driver: no executor, no "
                        "barrier stage, each rank reads the token files itself. It measures a SparkSession "
                        "plus TorchDistributor's launch, not a Spark cluster's scheduling or data feed.",
    ("determined", "local"): "Determined's Trainer runs in-process under torchrun: no master, no scheduling, "
                             "no checkpoint upload. It measures the Trainer's own bookkeeping, not a "
                             "Determined cluster's overhead.",
    ("ray", "local-cluster"): "Ray Train on a one-node Ray cluster started for the cell on this host: its "
                              "start-up includes the cluster's, and there is no network between workers. "
                              "It measures Ray's own launch and bookkeeping, not a multi-node cluster's.",
}


def _interval(ci, kind: str = "num", with_n: bool = False) -> str:
    if ci.low is None:
        return "n/a"
    text = f"{_fmt(ci.low, kind)} - {_fmt(ci.high, kind)}"
    return f"{text} ({ci.n})" if with_n else text


def _fmt(value: Any, kind: str = "num") -> str:
    if value is None:
        return "n/a"
    if kind == "pct":
        return f"{value * 100:+.1f} %"
    if kind == "ratio":
        return f"{value:.2f}"
    if kind in ("acc", "cost"):
        return f"{value:.4f}"
    return f"{value:.2f}"


def _mode(a: Aggregate, missing: str) -> str:
    """How the platform ran, and how the training rows reached its ranks: "cluster, dataframe feed"."""
    mode = a.platform_mode or missing
    return f"{mode}, {a.data_feed} feed" if a.data_feed else mode


def table_rows(summary: RunSummary) -> list[list[str]]:
    rows = []
    for a in summary.aggregates:
        tta = a.time_to_target_seconds
        tta_text = "not reached" if tta is None else f"{tta:.2f} ({a.reached_target}/{a.repeats_ok})"
        rows.append([
            a.backend, _mode(a, "n/a"), str(a.workers), f"{a.repeats_ok}/{a.repeats}",
            _fmt(a.total_seconds.median), _fmt(a.training_seconds.median),
            _interval(a.total_seconds_ci, with_n=True), _fmt(a.samples_per_second.median),
            _fmt(a.test_accuracy.median, "acc"), _interval(a.test_accuracy_ci, "acc"),
            _fmt(a.test_f1.median, "acc"), tta_text, _fmt(a.scaling_efficiency, "ratio"),
            _fmt(a.overhead_vs_ddp_total, "pct"), _fmt(a.overhead_vs_ddp_training, "pct"),
            f"{a.resumed_cells}/{a.repeats_ok}", _fmt(a.estimated_cost, "cost"),
        ])
    return rows


# --- training strategies (issue 13) -------------------------------------------------------------
STRATEGY_COLUMNS = [
    "backend", "strategy", "workers", "repeats ok", "total s (median)", "training s (median)",
    "training vs default", "samples/s (median)", "test accuracy (median)", "test macro-F1 (median)",
    "test recall per class", "comm MB/step", "phases: data / compute / communication s",
]


def platform_view(summary: RunSummary, config: BenchmarkConfig) -> RunSummary:
    """The summary restricted to the run's first strategy ("default" unless changed): what the
    platform comparison, the study section and the plots compare; strategies get their own table."""
    first = config.strategies[0].name
    return summary.model_copy(update={"aggregates": [a for a in summary.aggregates if a.strategy == first]})


def strategy_rows(summary: RunSummary) -> list[list[str]]:
    """One row per (backend, strategy, workers): time, accuracy, macro-F1, per-class recall (the
    imbalance strategies' effect), payload per step handed to collectives (comm hooks, local SGD)."""
    default = {(a.backend, a.workers): a for a in summary.aggregates if a.strategy == DEFAULT_STRATEGY}
    rows = []
    # grouped by backend and workers; strategies in the run's order (stable sort)
    for a in sorted(summary.aggregates, key=lambda a: (a.backend.value, a.workers)):
        base = default.get((a.backend, a.workers))
        vs_default = None
        if base is not None and a is not base and base.training_seconds.median and a.training_seconds.median:
            vs_default = a.training_seconds.median / base.training_seconds.median - 1
        rows.append([
            a.backend.value, a.strategy, str(a.workers), f"{a.repeats_ok}/{a.repeats}",
            _fmt(a.total_seconds.median), _fmt(a.training_seconds.median),
            "-" if a is base else _fmt(vs_default, "pct"), _fmt(a.samples_per_second.median),
            _fmt(a.test_accuracy.median, "acc"), _fmt(a.test_f1.median, "acc"),
            " / ".join(f"{r:.3f}" for r in a.recall_per_class) or "n/a",
            "n/a" if a.comm_bytes_per_step is None else f"{a.comm_bytes_per_step / 2**20:.3f}",
            " / ".join(f"{a.phases.get(p, 0.0):.2f}" for p in ("data", "compute", "communication"))
            if a.phases else "n/a",
        ])
    return rows


def _strategy_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    lines = [_md_table(STRATEGY_COLUMNS, strategy_rows(summary)), ""]
    lines.append("Each strategy is a cell of its own (pipelines.config.TrainingStrategy): `fp16`/`bf16`/"
                 "`powersgd-r<k>` are DDP gradient-compression hooks, `localsgd-<n>` averages the parameters "
                 "every n steps instead of all-reducing gradients, `fsdp` shards parameters, gradients and "
                 "optimizer state (FSDP2), `weighted_sampler`/`weighted_loss` counter class imbalance. Test "
                 "recall per class is label 0 / 1 / ...; the imbalance strategies should raise the minority "
                 "class's. comm MB/step: payload each rank hands to gradient/parameter collectives per "
                 "optimizer step (compressed sizes for the hooks; n/a for one worker and FSDP). Phases: the "
                 "training phase split as in 'Where the time goes' (FSDP's collectives are not hooks: its "
                 "communication counts as compute).")
    skipped = config.not_applicable_cells()
    if skipped:
        lines.append("Not applicable (no cell): " + ", ".join(f"{s} at {n} worker" for s, n in skipped)
                     + ": one worker has no one to communicate with.")
    if config.class_ratio is not None:
        lines.append(f"Train sample imbalanced on purpose: class_ratio={config.class_ratio} (every label other "
                     "than 0 has that fraction of label 0's rows); test stays stratified.")
    return lines


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# --- plots -------------------------------------------------------------------------------

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
                        label=f"{backend} ({what.split('_')[0]})")
    ax.set(xlabel="workers", ylabel="seconds (median, min-max)", title="Wall time vs workers")
    ax.set_xticks(sorted({a.workers for a in summary.aggregates}))
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_scaling_efficiency(summary: RunSummary, path: Path) -> Path:
    plt, fig, ax = _figure()
    for backend, aggs in _by_backend(summary).items():
        pts = [a for a in aggs if a.scaling_efficiency is not None]
        if pts:
            ax.plot([a.workers for a in pts], [a.scaling_efficiency for a in pts], "-o", label=backend)
    ax.axhline(1.0, color="grey", linestyle=":", label="ideal")
    ax.set(xlabel="workers", ylabel="t(1) / (N * t(N)), training time", title="Scaling efficiency")
    ax.set_xticks(sorted({a.workers for a in summary.aggregates}))
    _legend_or_note(ax)
    return _save(plt, fig, path)


def plot_accuracy_curves(results: list[CellResult], target: float, path: Path) -> Path:
    """Colour = backend, line style = worker count; repeats share a label."""
    plt, fig, ax = _figure()
    colours = {b: f"C{i}" for i, b in enumerate(dict.fromkeys(r.backend.value for r in results))}
    styles = {w: s for w, s in zip(sorted({r.world_size for r in results}), ["-", "--", ":", "-."] * 4)}
    labelled = set()
    for r in results:
        if not r.epochs:
            continue
        label = f"{r.backend.value} w{r.world_size}"
        ax.plot([e.epoch for e in r.epochs], [e.eval_accuracy for e in r.epochs], marker="o",
                color=colours[r.backend.value], linestyle=styles[r.world_size], alpha=0.8,
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
               width=width, label=backend)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(xlabel="workers", ylabel="% slower than DDP (median total time)", title="Overhead vs plain DDP")
    ax.set_xticks(workers)
    _legend_or_note(ax)
    return _save(plt, fig, path)


PHASE_ORDER = (*phases.PHASES, phases.RETRIES)


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


def phase_rows(summary: RunSummary) -> list[list[str]]:
    """Per (backend, workers): each phase's median seconds and its share of the total."""
    rows = []
    for a in summary.aggregates:
        if not a.phases:
            continue
        total = sum(a.phases.values())
        rows.append([a.key, _fmt(a.total_seconds.median, "s")] + [
            f"{a.phases[p]:.2f} ({a.phases[p] / total * 100:.0f} %)" if p in a.phases and total else "-"
            for p in PHASE_ORDER])
    return rows


def _phase_lines(summary: RunSummary) -> list[str]:
    rows = phase_rows(summary)
    if not rows:
        return ["No finished cell recorded phases."]
    return [_md_table(["cell", "total", *PHASE_ORDER], rows), "",
            "Phases (seconds, median over repeats; share of their sum): launch = adapter entry to the first "
            "training step (processes, JVM/executors, platform start-up, data and model loading); data = "
            "waiting for batches; communication = a gradient all-reduce in flight (DDP hook timer; overlap "
            "with the backward pass counts here) + epoch metrics' all-reduce; compute = the rest of the "
            "training steps; checkpoint = per-epoch checkpoints + model export; evaluation = per-epoch "
            "held-out + final test; teardown = result written to the attempt's end (process exit, session / "
            "cluster stop); retries = earlier failed attempts. Definitions: `pipelines/training/phases.py`."]


def _legend_or_note(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    if not ax.has_data():
        ax.text(0.5, 0.5, "no finished cells", ha="center", va="center", transform=ax.transAxes)


# --- text --------------------------------------------------------------------------------

def _dataset_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    manifest = summary.dataset
    if not manifest:
        return [f"- Source: {_text(config.dataset_source)} (no snapshot manifest found)"]
    lines = [f"- Source: {_text(manifest.get('source', config.dataset_source))}"
             + (f" ({_text(manifest['source_kind'])})" if manifest.get("source_kind") else "")
             + f", sampling seed {manifest.get('seed', config.seed)}"]
    for split, info in (manifest.get("splits") or {}).items():
        sha = str(info.get("sha256", ""))[:12]
        lines.append(f"- {split}: {info.get('rows')} rows (of {info.get('source_rows')} in the source), "
                     f"per label {json.dumps(info.get('rows_per_label'))}"
                     + (f", content sha256 `{sha}...`" if sha else ""))
    return lines


def _model_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    sources = summary.model_sources
    weights = ", ".join(sources) or "unknown (no finished cell)"
    lines = [f"- Model: {_text(config.model_source)}; weights: {_text(weights)}"]
    if "random_init" in sources:
        lines.append("- **The model was randomly initialised (no pretrained weights were available): "
                     "its accuracy is NOT comparable with published BERT-tiny results on IMDB.** "
                     "Times and scaling are still meaningful.")
    return lines


def _hardware_lines(summary: RunSummary) -> list[str]:
    hw = summary.hardware
    versions = ", ".join(f"{k} {v}" for k, v in sorted(hw.versions.items())) or "unknown"
    return [f"- Device(s): {_text(', '.join(hw.devices) or 'unknown')}",
            f"- Host(s): {_text(', '.join(hw.hosts) or 'unknown')}; "
            f"CPU count (evaluating host): {hw.cpu_count}",
            f"- Versions: {versions}"]


def _batch_policy_lines(config: BenchmarkConfig) -> list[str]:
    if config.batch_policy == "global":
        batch = (f"- Batch: a fixed global batch of {config.batch_size}, split over the workers: every worker "
                 "count runs the same optimisation, so accuracies are like for like.")
    else:
        batch = (f"- Batch: {config.batch_size} per worker, so the global batch grows with the workers "
                 f"({config.batch_size} x N): accuracy across worker counts is NOT like for like.")
    scaling = {"none": "the same learning rate at every worker count",
               "linear": "the learning rate scaled linearly with the global batch",
               "sqrt": "the learning rate scaled with the square root of the global batch"}[config.lr_scaling]
    return [batch, f"- Learning rate: {config.learning_rate} at 1 worker, {scaling} (lr_scaling={config.lr_scaling}).",
            f"- Repeats: repeat r trains with seed {config.seed} + r (initialisation and data order); "
            "intervals are 95 % bootstrap intervals of the median over the repeats (n = repeats)."]


def _recovery_lines(summary: RunSummary) -> list[str]:
    """Fault tolerance measured: cells that needed more than one attempt, and what it cost."""
    resumed = [c for c in summary.cells if c.resumed]
    if not resumed:
        return ["No cell needed a second attempt."]
    lines = [f"- `{c.cell}`: {c.attempts} attempts, {c.lost_seconds:.1f} s of training lost, "
             f"{c.recovery_seconds:.1f} s from the failure to training again" for c in resumed]
    by_backend: dict[str, list[float]] = {}
    for c in resumed:
        by_backend.setdefault(c.backend, []).append(c.recovery_seconds + c.lost_seconds)
    lines += [f"- {backend}: recovery cost (lost + recovery) median {sorted(v)[len(v) // 2]:.1f} s over "
              f"{len(v)} resumed cell(s)" for backend, v in by_backend.items()]
    return lines


def _where_the_time_goes(a: Aggregate, ddp: Aggregate) -> str:
    """The phase that carries most of a platform's extra time over DDP (``phases``; start-up /
    training for summaries written before phases were recorded)."""
    total = (a.total_seconds.median or 0.0) - (ddp.total_seconds.median or 0.0)
    if a.phases and ddp.phases:
        extra = {p: a.phases.get(p, 0.0) - ddp.phases.get(p, 0.0) for p in PHASE_ORDER
                 if p in a.phases or p in ddp.phases}
    else:
        extra = {"start-up": (a.startup_seconds.median or 0.0) - (ddp.startup_seconds.median or 0.0),
                 "training": (a.training_seconds.median or 0.0) - (ddp.training_seconds.median or 0.0)}
    ranked = sorted(extra, key=lambda k: -abs(extra[k]))
    parts = ", ".join(f"{k} {extra[k]:+.2f} s" for k in ranked[:3])
    return f"{total:+.2f} s total, mostly {ranked[0]}: {parts}"


def study_rows(summary: RunSummary) -> list[list[str]]:
    """Each platform's overhead over DDP here beside the study's, with this run's mode and hardware."""
    ddp = {a.workers: a for a in summary.aggregates if a.backend == Backend.DDP and a.repeats_ok}
    hardware = summary.hardware.hardware_class
    rows = []
    for a in summary.aggregates:
        if a.backend == Backend.DDP or not a.repeats_ok or a.workers not in ddp:
            continue
        study = STUDY_OVERHEAD.get(a.backend.value)
        rows.append([
            a.backend.value, _mode(a, "unknown"), str(a.workers), hardware,
            _fmt(a.overhead_vs_ddp_total, "pct"), _fmt(a.overhead_vs_ddp_training, "pct"),
            _where_the_time_goes(a, ddp[a.workers]),
            "n/a" if study is None else f"{study * 100:+.0f} % ({1 + study:.2f}x)", STUDY_SETTING,
        ])
    return rows


def _study_lines(summary: RunSummary) -> list[str]:
    rows = study_rows(summary)
    if not rows:
        return ["No platform besides DDP finished at a worker count DDP also ran: nothing to set beside the study."]
    header = ["platform", "mode here", "workers", "hardware here", "overhead here (total)",
              "overhead here (training)", "where the extra time goes (vs ddp, medians)", "study's overhead",
              "study's setting"]
    lines = [_md_table(header, [[_text(c) for c in row] for row in rows]), ""]
    modes = sorted({(a.backend.value, a.platform_mode) for a in summary.aggregates if a.platform_mode})
    caveats = [f"- {backend} ({mode}): {MODE_CAVEATS[(backend, mode)]}" for backend, mode in modes
               if (backend, mode) in MODE_CAVEATS]
    if caveats:
        lines += ["Local modes are not the platform's cluster overhead:", *caveats]
    if {Backend.SPARK, Backend.SPARK_DATAFRAME} <= {a.backend for a in summary.aggregates if a.repeats_ok}:
        lines.append("- spark and spark_dataframe are the same TorchDistributor run with two data feeds: each "
                     "rank reads the token files (files feed), or the tokenized DataFrame's partitions reach "
                     "the ranks through a Spark barrier stage (dataframe feed); their difference is what "
                     "feeding the data through Spark costs.")
    lines.append("- The study's percentages are its whole-run overheads on GPUs; this run's are per cell "
                 "(total = adapter entry to result, training = the training phase alone).")
    return lines


def _text(value: Any) -> str:
    """A value from results or config, inert in Markdown and HTML (errors, sources, names)."""
    return html.escape(str(value), quote=True).replace("|", "&#124;").replace("`", "&#96;")


def render_markdown(config: BenchmarkConfig, summary: RunSummary, plots: list[Path]) -> str:
    failed = summary.failed
    full, summary = summary, platform_view(summary, config)  # platforms compare on one strategy
    parts = [
        f"# Distributed training benchmark: {summary.run}",
        f"Profile `{config.profile}`, {config.epochs} epochs, batch {config.batch_size} "
        f"({config.batch_policy.replace('_', ' ')}), sequence length {config.max_seq_len}, "
        f"{config.repeats} repeat(s), target accuracy {config.target_accuracy} (validation split), "
        f"price {config.price_per_worker_hour} per worker-hour. Config fingerprint `{summary.fingerprint}`. "
        f"Status: **{summary.status}**.",
        "## Comparison", _md_table(TABLE_COLUMNS, table_rows(summary)),
        "Times are medians over repeats; each cell's times are summed over its attempts, and its timed "
        "window never overlapped another timed cell on the host. Scaling efficiency is t(1)/(N*t(N)) on "
        "training time. Overhead is relative to plain DDP at the same worker count. Time to target: "
        "training-phase time (no evaluation, no checkpoints) until the first epoch at or above the target "
        "accuracy on the validation split (repeats that reached it in brackets); test accuracy is "
        "measured once, after training. 'resumed': repeats that needed more than one attempt.",
        *(["## Training strategies", "\n".join(_strategy_lines(full, config))]
          if len(config.strategies) > 1 or not config.strategies[0].is_default else []),
        "## Beside the published study", "\n".join(_study_lines(summary)),
        "## Where the time goes", "\n".join(_phase_lines(summary)),
        "## Training setup", "\n".join(_batch_policy_lines(config)),
        "## Fault tolerance (resumed cells)", "\n".join(_recovery_lines(summary)),
        "## Dataset", "\n".join(_dataset_lines(summary, config)),
        "## Model", "\n".join(_model_lines(summary, config)),
        "## Hardware", "\n".join(_hardware_lines(summary)),
        "## Failed cells",
        "\n".join(f"- {_text(f.cell)}: {_text(f.error)}" for f in failed) if failed else "None.",
        "## Plots", "\n\n".join(f"![{p.stem}]({p.name})" for p in plots),
    ]
    return "\n\n".join(parts) + "\n"


def render_html(markdown_text: str, report_dir: Path) -> str:
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables"])
    for png in sorted(report_dir.glob("*.png")):  # one self-contained page
        data = base64.b64encode(png.read_bytes()).decode()
        body = body.replace(f'src="{png.name}"', f'src="data:image/png;base64,{data}"')
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
             "img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Benchmark report</title>"
            f"<style>{style}</style></head><body>{body}</body></html>\n")


def build_report(config: BenchmarkConfig, paths: RunPaths) -> dict[str, Any]:
    """Write report.md, report.html and the plots; returns the written paths."""
    full = read_summary(paths)
    summary = platform_view(full, config)  # the plots compare platforms on the run's first strategy
    first = config.strategies[0].name
    results = [r for r in read_cells(config, paths).values() if isinstance(r, CellResult) and r.strategy == first]
    paths.report.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_time_vs_workers(summary, paths.plot("time_vs_workers")),
        plot_scaling_efficiency(summary, paths.plot("scaling_efficiency")),
        plot_accuracy_curves(results, config.target_accuracy, paths.plot("accuracy_curves")),
        plot_overhead(summary, paths.plot("overhead_vs_ddp")),
        plot_phases(summary, paths.plot("phases")),
    ]
    md = render_markdown(config, full, plots)
    atomic_write_text(paths.report_markdown, md)
    atomic_write_text(paths.report_html, render_html(md, paths.report))
    log.info("report written to %s", paths.report)
    return {"markdown": str(paths.report_markdown), "html": str(paths.report_html),
            "plots": [str(p) for p in plots], "summary": str(paths.summary)}
