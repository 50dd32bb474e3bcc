"""report.md and report.html from the run's summary.json and cells (``build_report``): sections
on setup, fault tolerance, dataset, model and hardware, and the page put together."""

from __future__ import annotations

import base64
import html
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pipelines.config import BenchmarkConfig
from pipelines.evaluation import read_cells
from pipelines.runfolder.fileio import atomic_write_text
from pipelines.runfolder.paths import RunPaths, cell_name
from pipelines.report.network import has_networks, network_lines
from pipelines.report.plots import (plot_accuracy_curves, plot_network, plot_overhead, plot_phases,
                                    plot_scaling_efficiency, plot_time_vs_workers, plot_verdict)
from pipelines.report.costs import costs_markdown, timeline_plots
from pipelines.report.faults import faults_markdown
from pipelines.report.stragglers import healthy_references, stragglers_markdown
from pipelines.report.what_it_takes import what_it_takes_markdown
from pipelines.report.study import _study_lines
from pipelines.report.whatif import WhatIfSections, whatif_sections
from pipelines.report.tables import (_code, _md_table, _phase_lines, _strategy_lines, _text,
                                     comparison_tables, platform_view, reference_label)
from pipelines.report.verdict import CHART as VERDICT_CHART
from pipelines.report.verdict import VERDICT_FILE, Verdict, build_verdict, read_regression, write_verdict
from pipelines.runfolder.results import CellResult
from pipelines.runfolder.summary import RunSummary, read_summary

log = logging.getLogger(__package__)  # "pipelines.report", as before the split

COMPARISON_NOTE = (  # {reference}: the reference platform's label
    "Times are medians over repeats; each cell's times are summed over its attempts, and its timed "
    "window never overlapped another timed cell on the host. Scaling efficiency is t(1)/(N*t(N)) on "
    "training time. Overhead is relative to the reference platform, {reference}, at the same worker count. "
    "Time to target: training-phase time (no evaluation, no checkpoints) until the first epoch at or above the target "
    "accuracy on the validation split (repeats that reached it in brackets); test accuracy is "
    "measured once, after training. 'resumed': repeats that needed more than one attempt. Cost: priced "
    "from the price sheet (see 'What each platform costs'; n/a where the cell's use was not measured). Peak "
    "memory, in three scopes (largest over the repeats): the ranks (the training processes' RSS summed at "
    "their peak), the platform (every other process of the cell: launcher, the platform's daemons and JVMs, the driver) "
    "and the whole cell (all of them at once; on emulated hosts the hosts' cgroups, page cache included).")


def _dataset_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    manifest = summary.dataset
    if not manifest:
        return [f"- Source: {_text(config.data.dataset_source)} (no snapshot manifest found)"]
    lines = [f"- Source: {_text(manifest.get('source', config.data.dataset_source))}"
             + (f" ({_text(manifest['source_kind'])})" if manifest.get("source_kind") else "")
             + f", sampling seed {_text(manifest.get('seed', config.training.seed))}"]
    for split, info in (manifest.get("splits") or {}).items():
        sha = str(info.get("sha256", ""))[:12]
        lines.append(f"- {_text(split)}: {_text(info.get('rows'))} rows (of {_text(info.get('source_rows'))} in "
                     f"the source), per label {_text(json.dumps(info.get('rows_per_label')))}"
                     + (f", content sha256 {_code(sha + '...')}" if sha else ""))
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
    machines = (f"- Cluster: {len(hw.cluster_hosts)} {_text(summary.cluster)} host(s), "
                f"{_text(', '.join(hw.cluster_hosts))}; the driver ran on {_text(', '.join(hw.hosts) or 'unknown')}"
                if hw.cluster_hosts else f"- Host(s): {_text(', '.join(hw.hosts) or 'unknown')}")
    return [f"- Device(s): {_text(', '.join(hw.devices) or 'unknown')}",
            f"{machines}; CPU count (evaluating host): {_text(hw.cpu_count)}",
            f"- Versions: {_text(versions)}"]


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
            + ("intervals are 95 % bootstrap intervals of the median over the repeats (n = repeats)."
               if config.matrix.repeats > 1 else "one repeat per cell, so no intervals.")]


def _recovery_lines(summary: RunSummary) -> list[str]:
    """Fault tolerance measured: cells that needed more than one attempt, and what it cost."""
    resumed = [c for c in summary.cells if c.resumed]
    if not resumed:
        return ["No cell needed a second attempt."]
    lines = [f"- {_code(c.cell)}: {c.attempts} attempts, {c.lost_seconds:.1f} s of training lost, "
             f"{c.recovery_seconds:.1f} s from the failure to training again" for c in resumed]
    by_backend: dict[str, list[float]] = {}
    for c in resumed:
        by_backend.setdefault(c.backend, []).append(c.recovery_seconds + c.lost_seconds)
    lines += [f"- {_text(backend)}: recovery cost (lost + recovery) median {sorted(v)[len(v) // 2]:.1f} s over "
              f"{len(v)} resumed cell(s)" for backend, v in by_backend.items()]
    return lines


def _comparison_lines(summary: RunSummary) -> list[str]:
    """The platform comparison as three narrow tables (time, quality, cost) and the note."""
    lines: list[str] = []
    for title, header, rows in comparison_tables(summary):
        lines += [f"### {title}", "", _md_table(header, rows), ""]
    return lines + [COMPARISON_NOTE.format(reference=_text(reference_label()))]


def _lists_apart(markdown_text: str) -> str:
    """A blank line before every Markdown list that follows a paragraph line: without it the
    items run on as one paragraph in the HTML."""
    out: list[str] = []
    for line in markdown_text.split("\n"):
        if line.startswith("- ") and out and out[-1].strip() and not out[-1].startswith(("- ", "  ")):
            out.append("")
        out.append(line)
    return "\n".join(out)


def render_markdown(config: BenchmarkConfig, summary: RunSummary, plots: list[Path],
                    verdict: Verdict | None = None, costs: str | None = None, faults: str | None = None,
                    whatif: WhatIfSections | None = None) -> str:
    """The report's Markdown: the verdict first, then the comparison, the other sections and the plots
    (``plots``: the PNGs, the verdict's chart among them or not: it is shown under the verdict).
    ``costs``: the "What each platform costs" section as Markdown with its own "## " title
    (pipelines.report.costs.costs_markdown), placed right after the comparison tables."""
    failed = summary.failed
    full, summary = summary, platform_view(summary, config)  # platforms compare on one strategy
    if verdict is None:
        verdict = build_verdict(summary, chart=VERDICT_CHART if VERDICT_CHART in {p.name for p in plots} else None)
    sections: list[tuple[str, list[str]]] = [
        ("Verdict", verdict.markdown_lines()),
        ("Comparison", _comparison_lines(summary)),
        *([("", [costs.strip()])] if costs else []),  # "What each platform costs": its own title
        *([("", [takes.strip()])] if (takes := what_it_takes_markdown(full)) else []),
        *([("Training strategies", _strategy_lines(full, config))]
          if len(config.matrix.strategies) > 1 or not config.matrix.strategies[0].is_default else []),
        *([("Network", network_lines(full, config))] if has_networks(full) else []),
        ("Beside the published study", _study_lines(summary) + (whatif.study if whatif else [])),
        *([("Your cluster (predicted)", whatif.your_cluster)] if whatif else []),
        ("Where the time goes", _phase_lines(summary)),
        ("Training setup", _batch_policy_lines(config)),
        ("Fault tolerance (resumed cells)", _recovery_lines(summary)),
        *([("", [faults.strip()])] if faults else []),  # "Losing a host", "Stragglers" (report.faults, .stragglers)
        ("Dataset", _dataset_lines(summary, config)),
        ("Model", _model_lines(summary, config)),
        ("Hardware", _hardware_lines(summary)),
        ("Failed cells", [f"- {_text(f.cell)}: {_text(f.error)}" for f in failed] or ["None."]),
        ("Plots", ["\n\n".join(f"![{p.stem}]({p.name})" for p in plots if p.name != verdict.chart)]),
    ]
    parts = [
        f"# Distributed training benchmark: {_text(summary.run)}",
        f"Profile {_code(config.profile)}, {config.training.epochs} epochs, batch {config.training.batch_size} "
        f"({_text(config.training.batch_policy.replace('_', ' '))}), sequence length {config.data.max_seq_len}, "
        f"{config.matrix.repeats} repeat(s), target accuracy {config.tracking.target_accuracy} (validation split). "
        f"Config fingerprint {_code(summary.fingerprint)}. "
        f"Status: **{_text(summary.status)}**.",
        *((f"## {title}\n\n" if title else "") + "\n".join(lines) for title, lines in sections),
    ]
    return _lists_apart("\n\n".join(parts) + "\n")


SAFE_URL_SCHEMES = ("", "http", "https")  # links and images of the HTML report (relative: the plots)


def _safe_url(url: str) -> bool:
    """Whether a link or image URL may stay in the HTML report: http(s) or relative, no
    ``javascript:``/``data:``/``vbscript:``. Character references are decoded first and urlsplit
    drops tabs and newlines, as a browser reads ``java&#9;script:``."""
    try:
        return urlsplit(html.unescape(url).strip()).scheme.lower() in SAFE_URL_SCHEMES
    except ValueError:
        return False


def _markdown_to_html(markdown_text: str) -> str:
    """Markdown -> HTML with raw HTML off: tags in the text come out as text, never as markup
    (python-markdown's block and inline HTML passes are removed); unsafe link URLs are dropped."""
    import markdown
    from markdown.treeprocessors import Treeprocessor

    class SafeUrls(Treeprocessor):
        def run(self, root):
            for element in root.iter():
                for attr in ("href", "src"):
                    if element.get(attr) is not None and not _safe_url(element.get(attr)):
                        del element.attrib[attr]

    md = markdown.Markdown(extensions=["tables"])
    md.preprocessors.deregister("html_block")  # <div>...</div> blocks: passed through raw
    md.inlinePatterns.deregister("html")  # inline <tag>, </tag>, <!-- -->: passed through raw
    md.treeprocessors.register(SafeUrls(md), "safe_urls", 1)  # after "inline" (20) made the links
    return md.convert(markdown_text)


def render_html(markdown_text: str, report_dir: Path) -> str:
    body = _markdown_to_html(markdown_text)
    for png in sorted(report_dir.glob("*.png")):  # one self-contained page
        data = base64.b64encode(png.read_bytes()).decode()
        body = body.replace(f'src="{png.name}"', f'src="data:image/png;base64,{data}"')
    # 1180 px of text: with its margins the page fits a 1280-pixel window; the tables are split
    # narrow enough to fit it (report.tables.COMPARISON_TABLES, split_table)
    style = ("body{font-family:sans-serif;max-width:1180px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 6px}"
             "img{max-width:100%}li{margin:.2em 0}")
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
    verdict_chart = plot_verdict(summary, paths.plot(Path(VERDICT_CHART).stem))
    verdict = build_verdict(summary, read_regression(paths), chart=verdict_chart.name)
    write_verdict(verdict, paths)
    plots = [
        verdict_chart,
        plot_time_vs_workers(summary, paths.plot("time_vs_workers")),
        plot_scaling_efficiency(summary, paths.plot("scaling_efficiency")),
        plot_accuracy_curves(results, config.tracking.target_accuracy, paths.plot("accuracy_curves")),
        plot_overhead(summary, paths.plot("overhead_vs_reference")),
        plot_phases(summary, paths.plot("phases")),
        *([plot_network(full, paths.plot("network"))] if has_networks(full) else []),
    ]
    every = {key: r for key, r in read_cells(config, paths).items() if isinstance(r, CellResult)}
    by_cell = {cell_name(b, w, r, s, net): res for (b, s, net, w, r), res in every.items()}
    timeline_plots(by_cell, paths.cells, paths.report)  # report/timeline-<cell>.png, shown by the costs section
    md = render_markdown(config, full, plots, verdict, costs=costs_markdown(full, by_cell, paths.report),
                         faults="\n\n".join(filter(None, [faults_markdown(by_cell), stragglers_markdown(
                             by_cell, healthy_references(paths.root, config.fingerprint(), list(by_cell)))])) or None,
                         whatif=whatif_sections(config, paths))
    atomic_write_text(paths.report_markdown, md)
    atomic_write_text(paths.report_html, render_html(md, paths.report))
    log.info("report written to %s", paths.report)
    return {"markdown": str(paths.report_markdown), "html": str(paths.report_html),
            "plots": [str(p) for p in plots], "summary": str(paths.summary),
            "verdict": str(paths.report / VERDICT_FILE)}
