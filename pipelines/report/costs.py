"""The report's "What each platform costs" section and one resource timeline per cell.

What each cell's processes used (``CellResult.resources``, measured by ``pipelines.measure.resources``): CPU
seconds and utilisation, peak memory, the platform's footprint beside the ranks' (what runs that is
not a rank, by kind: JVMs, raylet and GCS, torchrun, the driver), bytes, GPU, and the cost priced
from the price sheet (``config.tracking``, ``pipelines.evaluation.resource_cost``). Wiring:

    by_cell = cell_results(config, paths)
    timeline_plots(by_cell, paths.cells, paths.report)      # report/timeline-<cell>.png
    costs_markdown(summary, by_cell, paths.report)          # the section; embeds those plots
"""

from __future__ import annotations

import re
from pathlib import Path

from pipelines.runfolder.paths import cell_name
from pipelines.report.tables import _md_table, _text, split_table
from pipelines.measure.resources import read_timeline
from pipelines.measure.outside import OUTSIDE_SHARE_BOUND
from pipelines.report.lifetimes import standing_provision
from pipelines.runfolder.results import CellResult, ResourceUsage
from pipelines.runfolder.summary import RunSummary

# peak memory in one column per scope: the ranks, the platform (every other process of the cell),
# the whole cell (on a host: the host's cgroup, page cache included); by platform: the comparison's table
COST_COLUMNS = ["cell", "mode", "wall s", "CPUs", "CPU s (ranks / platform)", "CPU utilisation",
                "peak MB: ranks", "peak MB: platform", "peak MB: whole cell",
                "platform processes (peak RSS MB)", "sent / received", "GPU util / peak MB", "cost USD"]
HOST_COLUMNS = ["cell", "host", "measured by", "CPUs", "CPU s (ranks / platform)", "CPU utilisation",
                "peak MB: ranks / platform", "peak MB: whole host", "platform processes (peak RSS MB)",
                "sent / received"]
# the columns of the second table of each split pair (what a cell's platform ran, moved and cost)
COST_SECOND = ("platform processes (peak RSS MB)", "sent / received", "GPU util / peak MB", "cost USD")
PLATFORM_COLUMNS = ["platform", "workers", "network", "repeats measured", "cost USD (median)",
                    "CPU s (median)"]


def cell_results(config, paths) -> dict[str, CellResult]:
    """Cell name -> its CellResult, for every configured cell that has one."""
    from pipelines.evaluation import read_cells

    return {cell_name(b, w, r, s, n): result for (b, s, n, w, r), result in read_cells(config, paths).items()
            if isinstance(result, CellResult)}


def timeline_file(report_dir: Path, cell: str) -> Path:
    return Path(report_dir) / f"timeline-{re.sub(r'[^A-Za-z0-9._-]+', '_', cell)}.png"


# --- formatting ------------------------------------------------------------------------------

def _num(value, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def _bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _moved(sent: int | None, received: int | None) -> str:
    return "n/a" if sent is None and received is None else f"{_bytes(sent)} / {_bytes(received)}"


def _kinds(kinds: dict[str, float]) -> str:
    return ", ".join(f"{kind} {mb:.0f}" for kind, mb in kinds.items() if mb >= 0.5) or "none"


def _gpu(usage: ResourceUsage) -> str:
    if usage.gpus is None:
        return "n/a"
    util, peak = _num(usage.gpu_utilisation_mean, ".0f"), _num(usage.gpu_peak_memory_mb, ".0f")
    return f"{util} % / {peak} ({usage.gpus} GPU)"


def _cpu(total: float | None, ranks: float | None, platform: float | None) -> str:
    return f"{_num(total)} ({_num(ranks)} / {_num(platform)})"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f} %"


# --- the section -------------------------------------------------------------------------------

def cost_rows(summary: RunSummary, results_by_cell: dict[str, CellResult]) -> list[list[str]]:
    """One row per cell of the summary, in its order: the figures of ``COST_COLUMNS``."""
    rows = []
    for row in summary.cells:
        result = results_by_cell.get(row.cell)
        usage = result.resources if result is not None else None
        if usage is None:
            why = "failed" if row.status != "ok" else "not measured"
            rows.append([row.cell, row.platform_mode or "n/a", *[why] * (len(COST_COLUMNS) - 3),
                         _num(row.cost, ".6f")])
            continue
        rows.append([
            row.cell, result.platform_mode or "n/a", _num(usage.wall_seconds), _num(usage.cpus, "d"),
            _cpu(usage.cpu_seconds, usage.ranks_cpu_seconds, usage.platform_cpu_seconds),
            _pct(usage.cpu_utilisation), _num(usage.ranks_peak_rss_mb, ".0f"),
            _num(usage.platform_peak_rss_mb, ".0f"), _num(usage.peak_rss_mb, ".0f"), _kinds(usage.platform_processes),
            _moved(usage.bytes_sent, usage.bytes_received), _gpu(usage), _num(row.cost, ".6f")])
    return rows


def host_rows(results_by_cell: dict[str, CellResult]) -> list[list[str]]:
    """One row per (cell, host) of the cells that ran across hosts (and their driver)."""
    rows = []
    for name, result in results_by_cell.items():
        for host, part in (result.resources.per_host if result.resources else {}).items():
            rss = f"{_num(part.ranks_peak_rss_mb, '.0f')} / {_num(part.platform_peak_rss_mb, '.0f')}"
            rows.append([name, host, part.note or part.source, _num(part.cpus, "d"),
                         _cpu(part.cpu_seconds, part.ranks_cpu_seconds, part.platform_cpu_seconds),
                         _pct(part.cpu_utilisation), rss, _num(part.peak_memory_mb, ".0f"),
                         _kinds(part.platform_processes), _moved(part.bytes_sent, part.bytes_received)])
    return rows


def platform_rows(summary: RunSummary) -> list[list[str]]:
    """Per (platform, workers, network): the median cost and CPU over the repeats (peak memory by
    scope: the comparison's "Throughput, cost and resources" table)."""
    def measured(a) -> int:
        key = (a.backend, a.strategy, a.network, a.workers)
        return sum(1 for c in summary.cells
                   if c.cost is not None and (c.backend, c.strategy, c.network, c.workers) == key)

    return [[str(a.backend), str(a.workers), a.network, str(measured(a)), _num(a.cost, ".6f"),
             _num(a.cpu_seconds)] for a in summary.aggregates]


def _price_lines(summary: RunSummary) -> list[str]:
    sheet = summary.price_sheet
    return [
        f"Prices (USD, the config's `tracking` section): {sheet.per_cpu_hour} per vCPU-hour, "
        f"{sheet.per_gb_hour} per GB-hour of memory, {sheet.per_gpu_hour} per GPU-hour. "
        f"Source: {_text(sheet.source or 'not stated')}.",
        "A cell's cost = provisioned CPUs x wall hours x the CPU price + peak memory GB x wall hours x the "
        "GB price + GPUs x wall hours x the GPU price; wall hours = the cell's total seconds (all its "
        "attempts) / 3600; provisioned CPUs = the cores the cell could use (on this host: the driver's CPU "
        "affinity; on emulated hosts: the sum of the hosts' cpusets); peak memory = the whole cell's peak "
        "(GB = 1024 MB, as cloud price lists count it); GPUs = the ranks on a CUDA device.",
    ]


def _method_lines(summary: RunSummary, results_by_cell: dict[str, CellResult]) -> list[str]:
    intervals = sorted({r.resources.interval_s for r in results_by_cell.values() if r.resources})
    every = "/".join(f"{i:g}" for i in intervals) or "0.5"
    notes = sorted({n for r in results_by_cell.values() if r.resources for n in r.resources.notes})
    return [
        f"Measured while each cell launched and trained (its last attempt), every {every} s. On this host: "
        "the driver (the process that ran the cell) and every process started under it, plus the "
        "daemons of a cluster the run keeps standing for the cell's platform, from /proc: CPU = user + system; peak memory = the "
        "largest sum of RSS over one sample (pages shared between processes count in each). On emulated "
        "hosts: each host's cgroups (cpuacct; memory.max_usage_in_bytes, page cache included) plus the "
        "driver's processes; bytes = the hosts' link counters (on this host: the cell's private network "
        "namespace where it has one, else n/a). Ranks = the processes that wrote their pid "
        "(`<cell>/ranks/`); the platform = everything else (launcher, the platform's daemons and JVMs, the driver). Peak "
        "memory per scope: the ranks' RSS summed at their peak sample, the platform's likewise, and the whole "
        "cell's (all of them at once; per host: the host's cgroup); the peaks need not fall on one sample, so "
        "ranks + platform may exceed the whole cell.",
        *[f"- {_text(n)}" for n in notes],
        *[f"- {_text(name)}: no rank wrote its pid (e.g. a trial outside the shared loop): all its "
          "processes count as the platform's"
          for name, r in results_by_cell.items() if r.resources and not r.resources.ranks],
    ]


def beside_lines(results_by_cell: dict[str, CellResult]) -> list[str]:
    """What ran beside each timed cell: the run's own processes left alive through it (nothing
    should be) and the host's CPU used outside it; a cell over the bound is flagged."""
    bound = OUTSIDE_SHARE_BOUND
    lines = [f"A cell is timed alone: no process of the run outside it should be alive during its window, and "
             f"processes outside it (anything on the host) should use under {bound:.0%} of the host's cores."]
    flagged = []
    for name, r in results_by_cell.items():
        usage = r.resources
        if usage is None:
            continue
        left = ", ".join(f"{k} x{n}" for k, n in sorted(usage.run_processes_outside.items()))
        share = usage.outside_cpu_share
        if left or (share is not None and share > bound):
            flagged.append(f"- **{_text(name)}**: " + "; ".join(filter(None, [
                f"the run's processes beside it: {_text(left)}" if left else "",
                f"outside CPU {share:.1%} of the host's cores (over {bound:.0%})" if share and share > bound else ""])))
    shares = [r.resources.outside_cpu_share for r in results_by_cell.values()
              if r.resources and r.resources.outside_cpu_share is not None]
    if shares:
        lines.append(f"Outside CPU during the cells: {min(shares):.1%} to {max(shares):.1%} of the host's cores.")
    return lines + (["Flagged:", "", *flagged] if flagged else ["No cell flagged."])


def standing_lines(summary: RunSummary) -> list[str]:
    """The run's standing clusters: started outside every cell, so no cell's phases hold their start."""
    text = standing_provision(summary)
    return [f"Standing clusters, started outside the cells (each start, not in any cell's figures): {_text(text)}."
            ] if text else []


def costs_markdown(summary: RunSummary, results_by_cell: dict[str, CellResult], report_dir: Path) -> str:
    """The report's "What each platform costs" section (Markdown, every value escaped), with the
    timelines ``timeline_plots`` wrote into ``report_dir``."""
    parts = ["## What each platform costs", *_price_lines(summary)]
    if summary.aggregates:
        parts += ["### By platform", _md_table(PLATFORM_COLUMNS, platform_rows(summary))]
    # two narrow tables (a 1280-pixel window): what the cell used; what it moved and cost
    parts += ["### Per cell", *split_table(COST_COLUMNS, cost_rows(summary, results_by_cell), COST_SECOND,
                                           keys=("cell",))]
    hosts = host_rows(results_by_cell)
    if hosts:
        parts += ["### Per host", *split_table(HOST_COLUMNS, hosts, COST_SECOND, keys=("cell", "host"))]
    parts += ["### Beside each cell", "\n".join(beside_lines(results_by_cell) + standing_lines(summary))]
    parts += ["### How it was measured", "\n".join(_method_lines(summary, results_by_cell))]
    plots = [(name, timeline_file(report_dir, name)) for name in results_by_cell]
    plots = [(name, path) for name, path in plots if path.exists()]
    if plots:
        parts += ["### CPU and memory over time",
                  "Ranks and platform stacked; dashed lines: the first training step and the end of the work "
                  "(teardown starts). CPU: 100 % = one core.",
                  "\n\n".join(f"![timeline {_text(name)}]({path.name})" for name, path in plots)]
    return "\n\n".join(parts) + "\n"


# --- the timelines -----------------------------------------------------------------------------

def phase_marks(result: CellResult) -> list[tuple[float, str]]:
    """(seconds on the timeline, label) of the first training step and of the work's end."""
    usage = result.resources
    if usage is None:
        return []
    last = result.attempts[-1] if result.attempts else None
    start = last.start if last else (result.timed_window.start if result.timed_window else usage.started)
    startup = last.startup_seconds if last and last.startup_seconds is not None else result.startup_seconds
    marks = [(start + startup - usage.started, "first step")] if startup else []
    if result.work_end is not None:
        marks.append((result.work_end - usage.started, "teardown"))
    return [(t, label) for t, label in marks if 0.0 <= t <= usage.wall_seconds + usage.interval_s]


def _plain(value) -> str:
    """Plot text shown as is: never parsed as mathtext (``$..$``), on one line."""
    return " ".join(str(value).replace("$", r"\$").split())


def timeline_plot(name: str, result: CellResult, timeline: list[dict], path: Path) -> Path:
    """CPU (100 % = one core) and RSS of ranks and platform over the cell, phases marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [row["t"] for row in timeline]
    fig, (cpu, mem) = plt.subplots(2, 1, sharex=True, figsize=(7, 5), dpi=100)
    for ax, key, unit in ((cpu, "cpu_percent", "CPU %"), (mem, "rss_mb", "RSS MB")):
        ranks = [row.get(f"ranks_{key}", 0.0) for row in timeline]
        platform = [row.get(f"platform_{key}", 0.0) for row in timeline]
        ax.stackplot(t, ranks, platform, labels=["ranks", "platform"], colors=["#2563eb", "#f59e0b"],
                     alpha=0.8)
        ax.set_ylabel(unit)
        for i, (x, label) in enumerate(phase_marks(result)):
            ax.axvline(x, color="#111827", linestyle="--", linewidth=1)
            if ax is cpu:  # staggered: the marks of a short cell lie close together
                ax.annotate(label, (x, 1.01 + 0.07 * i), xycoords=("data", "axes fraction"),
                            fontsize="x-small", va="bottom", ha="right" if i == 0 else "left")
    mem.legend(loc="upper left", fontsize="small")
    usage = result.resources
    cpu.set_title(_plain(f"{name}: CPU and memory ({usage.source if usage else 'not measured'})"), pad=22)
    mem.set_xlabel("seconds since the attempt started")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def timeline_plots(results_by_cell: dict[str, CellResult], cells_dir: Path, report_dir: Path) -> list[Path]:
    """One PNG per measured cell (``timeline-<cell>.png`` in ``report_dir``), from its
    ``<cell>/resources.json``; cells without a timeline get none."""
    Path(report_dir).mkdir(parents=True, exist_ok=True)
    out = []
    for name, result in results_by_cell.items():
        timeline = read_timeline(Path(cells_dir) / name)
        if result.resources is not None and timeline:
            out.append(timeline_plot(name, result, timeline, timeline_file(report_dir, name)))
    return out
