"""The comparison report (report.md, report.html, PNG plots under the run's ``report/``); re-run it on a
finished run folder: python -c "from pipelines.stages import report; print(report('runs/<run>'))"
tables: rows and platform texts; plots: the PNGs; study: beside the published study; render: the pages."""

from pipelines.report.plots import (plot_accuracy_curves, plot_overhead, plot_phases, plot_scaling_efficiency,
                                    plot_time_vs_workers)
from pipelines.report.render import build_report, render_html, render_markdown
from pipelines.report.study import STUDY_SETTING, study_rows
from pipelines.report.tables import (PHASE_ORDER, STRATEGY_COLUMNS, TABLE_COLUMNS,
                                     backend_colour, mode_caveat, phase_rows, platform_view, strategy_rows,
                                     study_overhead, table_rows)

__all__ = [
    "PHASE_ORDER", "STRATEGY_COLUMNS", "STUDY_SETTING", "TABLE_COLUMNS",
    "backend_colour", "build_report", "mode_caveat", "phase_rows", "platform_view", "plot_accuracy_curves",
    "plot_overhead", "plot_phases", "plot_scaling_efficiency", "plot_time_vs_workers", "render_html",
    "render_markdown", "strategy_rows", "study_overhead", "study_rows", "table_rows",
]
