"""report.md and report.html from the run's summary.json and cells (``build_report``): sections
on setup, fault tolerance, dataset, model and hardware, and the page put together."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

from pipelines.config import BenchmarkConfig
from pipelines.evaluation import read_cells
from pipelines.fileio import atomic_write_text
from pipelines.paths import RunPaths
from pipelines.report.plots import (plot_accuracy_curves, plot_overhead, plot_phases, plot_scaling_efficiency,
                                    plot_time_vs_workers)
from pipelines.report.study import _study_lines
from pipelines.report.tables import (TABLE_COLUMNS, _md_table, _phase_lines, _strategy_lines, _text,
                                     platform_view, table_rows)
from pipelines.results import CellResult
from pipelines.summary import RunSummary, read_summary

log = logging.getLogger(__package__)  # "pipelines.report", as before the split

COMPARISON_NOTE = (
    "Times are medians over repeats; each cell's times are summed over its attempts, and its timed "
    "window never overlapped another timed cell on the host. Scaling efficiency is t(1)/(N*t(N)) on "
    "training time. Overhead is relative to plain DDP at the same worker count. Time to target: "
    "training-phase time (no evaluation, no checkpoints) until the first epoch at or above the target "
    "accuracy on the validation split (repeats that reached it in brackets); test accuracy is "
    "measured once, after training. 'resumed': repeats that needed more than one attempt.")


def _dataset_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    manifest = summary.dataset
    if not manifest:
        return [f"- Source: {_text(config.data.dataset_source)} (no snapshot manifest found)"]
    lines = [f"- Source: {_text(manifest.get('source', config.data.dataset_source))}"
             + (f" ({_text(manifest['source_kind'])})" if manifest.get("source_kind") else "")
             + f", sampling seed {manifest.get('seed', config.training.seed)}"]
    for split, info in (manifest.get("splits") or {}).items():
        sha = str(info.get("sha256", ""))[:12]
        lines.append(f"- {split}: {info.get('rows')} rows (of {info.get('source_rows')} in the source), "
                     f"per label {json.dumps(info.get('rows_per_label'))}"
                     + (f", content sha256 `{sha}...`" if sha else ""))
    return lines


def _model_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    sources = summary.model_sources
    weights = ", ".join(sources) or "unknown (no finished cell)"
    lines = [f"- Model: {_text(config.training.model_source)}; weights: {_text(weights)}"]
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
    if config.training.batch_policy == "global":
        batch = (f"- Batch: a fixed global batch of {config.training.batch_size}, split over the workers: every worker "
                 "count runs the same optimisation, so accuracies are like for like.")
    else:
        batch = (f"- Batch: {config.training.batch_size} per worker, so the global batch grows with the workers "
                 f"({config.training.batch_size} x N): accuracy across worker counts is NOT like for like.")
    scaling = {"none": "the same learning rate at every worker count",
               "linear": "the learning rate scaled linearly with the global batch",
               "sqrt": "the learning rate scaled with the square root of the global batch"}[config.training.lr_scaling]
    return [batch, f"- Learning rate: {config.training.learning_rate} at 1 worker, {scaling} (lr_scaling={config.training.lr_scaling}).",
            f"- Repeats: repeat r trains with seed {config.training.seed} + r (initialisation and data order); "
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


def render_markdown(config: BenchmarkConfig, summary: RunSummary, plots: list[Path]) -> str:
    failed = summary.failed
    full, summary = summary, platform_view(summary, config)  # platforms compare on one strategy
    parts = [
        f"# Distributed training benchmark: {summary.run}",
        f"Profile `{config.profile}`, {config.training.epochs} epochs, batch {config.training.batch_size} "
        f"({config.training.batch_policy.replace('_', ' ')}), sequence length {config.data.max_seq_len}, "
        f"{config.matrix.repeats} repeat(s), target accuracy {config.tracking.target_accuracy} (validation split), "
        f"price {config.tracking.price_per_worker_hour} per worker-hour. Config fingerprint `{summary.fingerprint}`. "
        f"Status: **{summary.status}**.",
        "## Comparison", _md_table(TABLE_COLUMNS, table_rows(summary)), COMPARISON_NOTE,
        *(["## Training strategies", "\n".join(_strategy_lines(full, config))]
          if len(config.matrix.strategies) > 1 or not config.matrix.strategies[0].is_default else []),
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
    """Write report.md, report.html and the plots under ``report/``; returns the written paths.
    Reads summary.json (missing -> ``SummaryMissing``) and the cells' result.json (epoch curves)."""
    full = read_summary(paths)
    summary = platform_view(full, config)  # the plots compare platforms on the run's first strategy
    first = config.matrix.strategies[0].name
    results = [r for r in read_cells(config, paths).values() if isinstance(r, CellResult) and r.strategy == first]
    paths.report.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_time_vs_workers(summary, paths.plot("time_vs_workers")),
        plot_scaling_efficiency(summary, paths.plot("scaling_efficiency")),
        plot_accuracy_curves(results, config.tracking.target_accuracy, paths.plot("accuracy_curves")),
        plot_overhead(summary, paths.plot("overhead_vs_ddp")),
        plot_phases(summary, paths.plot("phases")),
    ]
    md = render_markdown(config, full, plots)
    atomic_write_text(paths.report_markdown, md)
    atomic_write_text(paths.report_html, render_html(md, paths.report))
    log.info("report written to %s", paths.report)
    return {"markdown": str(paths.report_markdown), "html": str(paths.report_html),
            "plots": [str(p) for p in plots], "summary": str(paths.summary)}
