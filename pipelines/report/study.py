"""The "Beside the published study" section: each platform's overhead over the reference platform
(``platforms.reference()``, the study's reference too) here, where the extra time goes, its
overhead projected to the study's job (or the configured one), beside the study's figure, with the
caveats of the modes this run used; then each platform's projected total (``pipelines.report.projection``)."""

from __future__ import annotations

from pipelines import platforms
from pipelines.runfolder.paths import DEFAULT_NETWORK
from pipelines.report.projection import projection_lines
from pipelines.report.tables import (PHASE_ORDER, _fmt, _md_table, _mode, _text, mode_caveat, reference_label,
                                     study_overhead)
from pipelines.runfolder.summary import Aggregate, RunSummary

# The published study this benchmark reproduces (README): BERT-tiny on IMDB, 3 GPU nodes; {reference}:
# the reference platform's label (the study's figure is the reference's time)
STUDY_SETTING = "3 GPU nodes; {reference}: 20 epochs in 499 s on 2 GPUs"
STUDY_COLUMNS = ["platform", "mode here", "workers", "overhead here (total)", "overhead here (training)",
                 "where the extra time goes (vs reference, medians)", "overhead projected to the job", "study's overhead"]


def _where_the_time_goes(a: Aggregate, ref: Aggregate) -> str:
    """The phase that carries most of a platform's extra time over the reference's (``phases``;
    start-up / training for summaries written before phases were recorded)."""
    total = (a.total_seconds.median or 0.0) - (ref.total_seconds.median or 0.0)
    if a.phases and ref.phases:
        extra = {p: a.phases.get(p, 0.0) - ref.phases.get(p, 0.0) for p in PHASE_ORDER
                 if p in a.phases or p in ref.phases}
    else:
        extra = {"start-up": (a.startup_seconds.median or 0.0) - (ref.startup_seconds.median or 0.0),
                 "training": (a.training_seconds.median or 0.0) - (ref.training_seconds.median or 0.0)}
    ranked = sorted(extra, key=lambda k: -abs(extra[k]))
    parts = ", ".join(f"{k} {extra[k]:+.2f} s" for k in ranked[:3])
    return f"{total:+.2f} s total, mostly {ranked[0]}: {parts}"


def _projected_overhead(a: Aggregate, ref: Aggregate) -> str:
    """The platform's projected total for the summary's job over the reference's
    (``pipelines.evaluation.projection``)."""
    if a.projection is None or ref.projection is None or not ref.projection.total_seconds:
        return "n/a"
    return _fmt(a.projection.total_seconds / ref.projection.total_seconds - 1, "pct")


def study_rows(summary: RunSummary) -> list[list[str]]:
    """Each platform's overhead over the reference platform here beside the study's, with this run's
    mode (the hardware and the study's setting are the section's first sentence: the same for every row)."""
    reference = platforms.reference()
    refs = {(a.network, a.workers): a for a in summary.aggregates if a.backend == reference and a.repeats_ok}
    rows = []
    for a in summary.aggregates:
        if a.backend == reference or not a.repeats_ok or (a.network, a.workers) not in refs:
            continue
        ref = refs[(a.network, a.workers)]
        study = study_overhead(str(a.backend))
        workers = str(a.workers) if a.network == DEFAULT_NETWORK else f"{a.workers} ({a.network})"
        rows.append([
            str(a.backend), _mode(a, "unknown"), workers,
            _fmt(a.overhead_vs_reference_total, "pct"), _fmt(a.overhead_vs_reference_training, "pct"),
            _where_the_time_goes(a, ref), _projected_overhead(a, ref),
            "n/a" if study is None else f"{study * 100:+.0f} % ({1 + study:.2f}x)",
        ])
    return rows


def _study_lines(summary: RunSummary) -> list[str]:
    return [*_overhead_lines(summary), "", *projection_lines(summary)]


def _overhead_lines(summary: RunSummary) -> list[str]:
    rows = study_rows(summary)
    if not rows:
        reference = _text(reference_label())
        return [f"No platform besides {reference} finished at a worker count {reference} also ran: nothing to set "
                "beside the study."]
    setting = STUDY_SETTING.format(reference=reference_label())
    lines = [f"Hardware here: {_text(summary.hardware.hardware_class)}. The study: {_text(setting)}.", "",
             _md_table(STUDY_COLUMNS, rows), ""]  # _md_table escapes every cell
    modes = sorted({(str(a.backend), a.platform_mode) for a in summary.aggregates if a.platform_mode})
    caveats = [f"- {_text(backend)} ({_text(mode)}): {_text(caveat)}" for backend, mode in modes
               if (caveat := mode_caveat(backend, mode))]
    if caveats:  # a Markdown list needs a blank line before it, or it runs on as one paragraph
        lines += ["Local modes are not the platform's cluster overhead:", "", *caveats, ""]
    finished = dict.fromkeys(str(a.backend) for a in summary.aggregates if a.repeats_ok)
    notes = [f"- {note}" for name in finished if (p := platforms.find(name)) and (note := p.study_note)]
    notes.append("- The study's percentages are its whole-run overheads on GPUs; this run's are per cell "
                 "(total = adapter entry to result, training = the training phase alone) and, projected to the "
                 "job, what the same fixed and per-epoch costs make for a job of that length (below).")
    return lines + ["Notes:", "", *notes]
