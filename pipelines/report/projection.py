"""The report's view of fixed versus per-epoch (``pipelines.evaluation.projection``): each platform's
total projected to the summary's job, the table under "Beside the published study", and the
figures the verdict's projection sentence is made of.

A cell here lasts seconds to minutes, so its total is mostly what it pays once (launch and
teardown); the job a team runs lasts many epochs. The table says what each platform costs once
and per epoch, what that makes for the stated job (the study's 25,000 reviews x 20 epochs unless
``tracking.projected_job`` says otherwise), and from which job length the fixed cost stays under
5 % of the total.
"""

from __future__ import annotations

from pipelines import platforms
from pipelines.report.tables import _fmt, _md_table, networked
from pipelines.runfolder.summary import Aggregate, Job, Projection, RunSummary

FIXED_PERCENT = 5  # pipelines.evaluation.projection.FIXED_SHARE, as the report says it

PROJECTION_COLUMNS = ["platform", "workers", "fixed s", "epoch s: first / steady", "ms per review-epoch",
                      "projected total s (95 %)", "vs reference (projected)", "fixed share", "fixed under 5 % from"]


def job_text(job: Job) -> str:
    """"the study's job (25,000 reviews x 20 epochs, tested on 25,000)" or "the configured job (...)"."""
    whose = "the study's job" if job == Job() else "the configured job"
    return (f"{whose} ({job.train_samples:,} reviews x {job.epochs} epoch{'s' if job.epochs != 1 else ''}, "
            f"tested on {job.test_samples:,})")


def projected(aggs: list[Aggregate]) -> list[tuple[Aggregate, Projection]]:
    """The aggregates that have a projection, fastest projected total first."""
    found = [(a, a.projection) for a in aggs if a.projection is not None]
    return sorted(found, key=lambda pair: pair[1].total_seconds)


def fixed_under_text(a: Aggregate) -> str:
    """"12,300 reviews x epochs (31 epochs here)": from which job length the fixed cost stays
    under 5 % of the total; "n/a" without a projection."""
    p = a.projection
    if p is None or p.fixed_under_5pct_sample_epochs is None:
        return "n/a"
    here = p.fixed_under_5pct_epochs
    return f"{p.fixed_under_5pct_sample_epochs:,.0f} reviews x epochs ({here} epoch{'s' if here != 1 else ''} here)"


def fixed_range(aggs: list[Aggregate]) -> tuple[Aggregate, Aggregate] | None:
    """The aggregates whose fixed cost stops mattering first and last (by reviews x epochs)."""
    known = [a for a in aggs if a.projection and a.projection.fixed_under_5pct_sample_epochs is not None]
    if not known:
        return None
    key = lambda a: a.projection.fixed_under_5pct_sample_epochs  # noqa: E731
    return min(known, key=key), max(known, key=key)


def projection_rows(summary: RunSummary) -> list[list[str]]:
    """Per aggregate: fixed, first / steady-state epoch, per review-epoch, the projected total,
    its overhead over the reference platform's projected total, the fixed share and where it falls under 5 %."""
    reference = platforms.reference()
    bases = {(a.network, a.workers): a.projection for a in summary.aggregates
             if a.backend == reference and a.projection is not None}
    rows = []
    for a in summary.aggregates:
        p = a.projection
        if p is None:
            continue
        base = bases.get((a.network, a.workers))
        versus = None if base is None or not base.total_seconds else p.total_seconds / base.total_seconds - 1
        workers = str(a.workers) if not networked(summary) else f"{a.workers} ({a.network})"
        rows.append([
            str(a.backend), workers, _fmt(a.fixed_seconds),
            f"{_fmt(a.first_epoch_seconds)} / {_fmt(a.steady_epoch_seconds)}",
            "n/a" if a.per_sample_seconds is None else f"{a.per_sample_seconds * 1000:.3f}",
            f"{p.total_seconds:,.0f}" + (f" ({p.low_seconds:,.0f}-{p.high_seconds:,.0f})"
                                         if p.low_seconds is not None and p.high_seconds is not None else ""),
            _fmt(versus, "pct"), f"{p.fixed_share * 100:.1f} %", fixed_under_text(a),
        ])
    return rows


def projection_lines(summary: RunSummary) -> list[str]:
    """The "Projected to the job" part of "Beside the published study"."""
    rows = projection_rows(summary)
    title = f"Projected to {job_text(summary.job)}, at this run's measured per-review speed:"
    if not rows:
        return [title, "", "No platform has a projection (no finished cell with epochs, or a summary written "
                "before projections existed: evaluate the run again): nothing to project."]
    return [title, "", _md_table(PROJECTION_COLUMNS, rows), "",
            "Each cell's wall time splits into what a job pays once and what it pays per epoch "
            "(`pipelines/evaluation/projection.py`), medians over repeats: fixed = provision + launch + teardown "
            "(+ retries); the steady-state epoch = training + held-out evaluation + checkpoint, the median of "
            "the epochs after the first (a 1-epoch cell has only its first epoch, which then stands for every "
            "epoch); the first epoch's extra over it is paid once. Projected total = fixed + that warm-up + "
            "the job's epochs x its reviews x the seconds per review-epoch + the final test scaled to the job's "
            "test reviews; in brackets its 95 % interval, from the what-if model's fit of the run's cells and "
            "repeats (`pipelines/whatif`). 'Fixed under 5 % from': the job length (reviews x epochs; in brackets, epochs of "
            f"this run's training set) from which the fixed cost stays under {FIXED_PERCENT} % of the total "
            "(the final test left out: it only lowers the share). Set your own job with "
            "`tracking.projected_job` (train_samples, epochs, test_samples)."]
