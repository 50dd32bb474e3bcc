"""The comparison report (report.md, report.html, PNG plots and verdict.json under the run's ``report/``);
re-run it on a finished run folder: python -c "from pipelines.run.stages import report; print(report('runs/<run>'))"
verdict: the opening sentences (what the run found); tables: rows and platform texts; plots: the PNGs;
study: beside the published study; projection: each platform's total projected to the study's job (or
``tracking.projected_job``), fixed versus per-epoch; network: the Network section (runs across hosts);
render: the pages.
Section order (render.render_markdown): Verdict, Comparison (time, quality, throughput/cost tables),
then "What each platform costs" (costs.py: render_markdown's ``costs``), strategies, network, study,
phases, setup, ..."""

from pipelines.report.network import (BREAK_EVEN_COLUMNS, NETWORK_COLUMNS, BreakEven, break_even,
                                      break_even_rows, has_networks, network_rows)
from pipelines.report.plots import (plot_accuracy_curves, plot_network, plot_overhead, plot_phases,
                                    plot_scaling_efficiency, plot_time_vs_workers, plot_verdict)
from pipelines.report.render import build_report, render_html, render_markdown
from pipelines.report.study import STUDY_SETTING, study_rows
from pipelines.report.tables import (COMPARISON_TABLES, PHASE_ORDER, QUALITY_COLUMNS, RESOURCE_COLUMNS,
                                     STRATEGY_COLUMNS, TIME_COLUMNS, backend_colour, comparison_tables,
                                     has_intervals, mode_caveat, phase_rows, platform_view, strategy_rows,
                                     study_overhead)
from pipelines.report.verdict import PARITY_POINTS, Verdict, build_verdict

__all__ = [
    "BREAK_EVEN_COLUMNS", "COMPARISON_TABLES", "NETWORK_COLUMNS", "PARITY_POINTS", "PHASE_ORDER", "QUALITY_COLUMNS",
    "RESOURCE_COLUMNS", "STRATEGY_COLUMNS", "STUDY_SETTING", "TIME_COLUMNS", "BreakEven", "Verdict",
    "backend_colour", "break_even", "break_even_rows", "build_report", "build_verdict", "comparison_tables",
    "has_intervals", "has_networks", "mode_caveat", "network_rows", "phase_rows", "platform_view",
    "plot_accuracy_curves", "plot_network", "plot_overhead", "plot_phases", "plot_scaling_efficiency",
    "plot_time_vs_workers", "plot_verdict", "render_html", "render_markdown", "strategy_rows", "study_overhead",
    "study_rows",
]
