"""Fixed versus per-epoch: what a cell pays once and what it pays per epoch, and the total that
makes for a stated job (``config.tracking.projected_job``: the study's 25,000 reviews x 20 epochs
unless a team states its own).

``split(result)`` cuts a finished cell's wall time (``CellResult.total_seconds``) into

- fixed: the phases a job pays once whatever its length (``FIXED_PHASES``, definitions in
  ``pipelines.training.phases``): provision (a cluster started inside the cell), launch (to the
  first training step), teardown (result to the attempt's end) and retries (earlier attempts);
- the epochs: each one's training + held-out evaluation + checkpoint (``EpochMetrics.epoch_seconds``).
  The steady-state epoch is the median of the epochs after the first; a 1-epoch cell has only its
  first, which then stands for every epoch. The first epoch's extra over the steady state (warm-up:
  allocator, caches, lazy initialisation) is paid once;
- final: the rest (the final test, the model export, gaps no phase owns), which grows with the test set.

``project(split, job)`` = fixed + warm-up + job.epochs x job.train_samples x per-sample seconds
+ final x job.test_samples / the cell's test reviews, where per-sample seconds = the steady-state
epoch / the cell's training reviews (the run's measured per-sample speed; the held-out evaluation
grows with the training set, as a validation split of it does). ``fixed_under(split)`` is the job
length, in reviews x epochs, from which the fixed cost stays under ``FIXED_SHARE`` of the total,
the final test left out (it only lowers the share). Pure functions: evaluation (``aggregate_fields``)
and the report use them; they read no file.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from pipelines.runfolder.results import CellResult
from pipelines.runfolder.summary import CellRow, Job, Projection
from pipelines.training import phases

FIXED_PHASES = ("provision", "launch", "teardown", phases.RETRIES)
FIXED_SHARE = 0.05


@dataclass(frozen=True)
class Split:
    """A cell (or the medians over repeats) cut into what it pays once and per epoch."""

    fixed_seconds: float
    first_epoch_seconds: float
    steady_epoch_seconds: float
    final_seconds: float
    train_samples: int  # training reviews per epoch
    test_samples: int  # reviews of the final test

    @property
    def warmup_seconds(self) -> float:
        """The first epoch's extra over the steady state (0 for a 1-epoch cell)."""
        return self.first_epoch_seconds - self.steady_epoch_seconds

    @property
    def per_sample_seconds(self) -> float:
        """Seconds per training review and epoch (its share of training, evaluation, checkpoint)."""
        return self.steady_epoch_seconds / self.train_samples


def fixed_seconds(result: CellResult) -> float:
    """What the cell paid once: its fixed phases; a result written before phases: its start-up."""
    if result.phases:
        return sum(result.phases.get(p, 0.0) for p in FIXED_PHASES)
    return result.startup_seconds


def steady_epoch(epoch_seconds: list[float]) -> float:
    """The median of the epochs after the first; the one epoch when there is only one."""
    return float(statistics.median(epoch_seconds[1:])) if len(epoch_seconds) > 1 else float(epoch_seconds[0])


def split(result: CellResult) -> Split | None:
    """``result`` cut into fixed, first, steady-state epoch and final; None for a failed cell, one
    without epochs or without training reviews. A resumed cell's earlier attempts are in its
    retries (fixed): its final is what remains after the epochs of its last attempt."""
    if result.status != "ok" or not result.epochs or result.train_samples <= 0:
        return None
    epochs = sorted(result.epochs, key=lambda e: e.epoch)
    seconds = [e.epoch_seconds for e in epochs]
    last_attempt = [e.epoch_seconds for e in epochs if e.epoch > result.resumed_from_epoch] or seconds
    fixed = fixed_seconds(result)
    return Split(fixed_seconds=fixed, first_epoch_seconds=seconds[0], steady_epoch_seconds=steady_epoch(seconds),
                 final_seconds=max(0.0, result.total_seconds - fixed - sum(last_attempt)),
                 train_samples=result.train_samples, test_samples=result.test_samples)


def project(s: Split, job: Any) -> float:
    """The total seconds of ``job`` (train_samples, epochs, test_samples) at this split's speed."""
    final = s.final_seconds * job.test_samples / s.test_samples if s.test_samples else s.final_seconds
    return s.fixed_seconds + s.warmup_seconds + job.epochs * job.train_samples * s.per_sample_seconds + final


def fixed_under(s: Split, share: float = FIXED_SHARE) -> float | None:
    """Reviews x epochs from which the fixed cost is under ``share`` of fixed + warm-up + epochs
    (0: from the first review); None when nothing grows with the job (no per-sample time)."""
    if s.per_sample_seconds <= 0:
        return None
    need = s.fixed_seconds * (1 - share) / share - s.warmup_seconds
    return max(0.0, need / s.per_sample_seconds)


def projection(s: Split, job: Any) -> Projection:
    """The summary's projection of one split onto ``job``."""
    total = project(s, job)
    under = fixed_under(s)
    return Projection(total_seconds=total, fixed_seconds=s.fixed_seconds,
                      fixed_share=s.fixed_seconds / total if total > 0 else 1.0,
                      fixed_under_5pct_sample_epochs=under,
                      fixed_under_5pct_epochs=None if under is None else max(1, math.ceil(under / s.train_samples)))


# --- evaluation: per cell, and the medians over repeats ----------------------------------------------

SPLIT_FIELDS = ("fixed_seconds", "first_epoch_seconds", "steady_epoch_seconds", "per_sample_seconds",
                "final_seconds", "train_samples", "test_samples")


def row_fields(result: CellResult) -> dict[str, Any]:
    """A cell's CellRow fields of its split (none for a failed cell or one without epochs)."""
    s = split(result)
    if s is None:
        return {}
    return {"fixed_seconds": s.fixed_seconds, "first_epoch_seconds": s.first_epoch_seconds,
            "steady_epoch_seconds": s.steady_epoch_seconds, "per_sample_seconds": s.per_sample_seconds,
            "final_seconds": s.final_seconds, "train_samples": s.train_samples, "test_samples": s.test_samples}


def aggregate_fields(rows: list[CellRow], job: Any) -> dict[str, Any]:
    """The Aggregate fields over finished repeats: the median of each split field and the
    projection of those medians onto ``job``; {} when no repeat has a split."""
    rows = [r for r in rows if r.fixed_seconds is not None and r.train_samples]
    if not rows:
        return {}
    out: dict[str, Any] = {f: statistics.median(getattr(r, f) for r in rows) for f in SPLIT_FIELDS}
    out["train_samples"], out["test_samples"] = int(out["train_samples"]), int(out["test_samples"])
    s = Split(**{f: out[f] for f in SPLIT_FIELDS if f != "per_sample_seconds"})
    return {**out, "projection": projection(s, job)}


def job_of(config_job: Any) -> Job:
    """The summary's record of the configured job."""
    return Job(train_samples=config_job.train_samples, epochs=config_job.epochs,
               test_samples=config_job.test_samples)
