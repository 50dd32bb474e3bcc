"""The training record: per-epoch metrics, phase timings and the resume marker of one cell.

One definition of every timed phase, used by the shared torch loop and by a platform's own trial
(driven from its Trainer's callbacks) alike, so no platform is timed differently:

- ``train``: the epoch's training steps: waiting for batches, forward, backward, gradient
  all-reduce, optimizer and scheduler step, and the all-reduce of the epoch's train metrics;
- ``eval``: the held-out evaluation after each epoch (sharded over the ranks, all-reduced);
- ``checkpoint``: gathering the RNG states and writing the checkpoint (rank 0 writes);
- ``startup``: the adapter's launch time -> the first training step of this attempt;
- inside ``train``, two parts measured as they happen (``add`` / ``timed_batches``): ``data``
  (waiting for the next batch) and ``communication`` (gradient all-reduce in flight, from a
  DistributedDataParallel comm-hook timer, plus the epoch metrics' all-reduce); ``compute`` is
  the rest;
- ``elapsed``: wall time from the first training step to the end of the newest epoch,
  summed over attempts (a resumed cell continues from the elapsed time of its checkpoint).

    record = TrainingRecord(samples_per_epoch=len(sampler) * world_size)
    record.training_started()
    with record.phase("train"):
        ...
    with record.phase("eval"):
        ...
    epoch = record.end_epoch(train_loss=..., train_accuracy=..., eval_loss=..., eval_accuracy=...)
    with record.phase("checkpoint"):
        save({..., "record": record.state()})

``state()`` / ``TrainingRecord.from_state`` carry everything across a restart, so a resumed cell
reports the phases of all its attempts (``totals``); ``cell_phases`` gives this attempt's own,
named as in ``pipelines.training.phases``. The clocks are injectable for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from pipelines.runfolder.results import EpochMetrics, RankSteps

PHASES = ("train", "eval", "checkpoint")
TRAIN_PARTS = ("data", "communication")  # measured inside the train phase; compute = the rest


class TrainingRecord:
    def __init__(self, samples_per_epoch: int, *, clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time, state: dict[str, Any] | None = None):
        state = state or {}
        self.samples_per_epoch = samples_per_epoch
        self._clock, self._wall = clock, wall
        self.history = [EpochMetrics.model_validate(h) for h in state.get("history", [])]
        self.totals = {p: float(state.get("totals", {}).get(p, 0.0)) for p in PHASES + TRAIN_PARTS}
        self._attempt_base = dict(self.totals)  # totals when this attempt began (resume)
        self.resumed_from_epoch = len(self.history)
        self._elapsed_before = float(state.get("elapsed", 0.0))
        self._epoch = dict.fromkeys(PHASES, 0.0)  # phases of the epoch in progress
        self._open: dict[str, float] = {}
        self.first_step: float | None = None  # wall clock of this attempt's first step
        self.step_seconds: list[float] = []  # this attempt's steps: batch in hand -> next batch asked for

    # --- phases -----------------------------------------------------------------------------
    def training_started(self) -> None:
        """Mark this attempt's first training step (start-up ends here); idempotent."""
        if self.first_step is None:
            self.first_step = self._wall()

    def begin(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r} (phases: {', '.join(PHASES)})")
        self._open[phase] = self._clock()

    def is_open(self, phase: str) -> bool:
        return phase in self._open

    def end(self, phase: str) -> float:
        seconds = self._clock() - self._open.pop(phase)
        self._epoch[phase] += seconds
        self.totals[phase] += seconds
        if phase == "checkpoint" and self.history:  # the checkpoint follows its epoch's record
            last = self.history[-1]
            self.history[-1] = last.model_copy(update={
                "checkpoint_seconds": last.checkpoint_seconds + seconds,
                "epoch_seconds": last.epoch_seconds + seconds})
            self._epoch["checkpoint"] = 0.0
        return seconds

    def add(self, part: str, seconds: float) -> None:
        """Add measured seconds to a part of the train phase (``data``, ``communication``)."""
        if part not in TRAIN_PARTS:
            raise ValueError(f"unknown train-phase part {part!r} (parts: {', '.join(TRAIN_PARTS)})")
        self.totals[part] += seconds

    def timed_batches(self, batches: Iterable) -> Iterator:
        """Yield from ``batches``, adding the time spent waiting for each to ``data``."""
        iterator = iter(batches)
        while True:
            start = self._clock()
            try:
                batch = next(iterator)
            except StopIteration:
                self.totals["data"] += self._clock() - start
                return
            got = self._clock()
            self.totals["data"] += got - start
            yield batch
            self.step_seconds.append(self._clock() - got)  # the consumer's step on this batch

    @contextmanager
    def communicating(self) -> Iterator[None]:
        """Time a blocking collective of the train phase (e.g. the epoch metrics' all-reduce)."""
        start = self._clock()
        try:
            yield
        finally:
            self.totals["communication"] += self._clock() - start

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        self.begin(phase)
        try:
            yield
        finally:
            self.end(phase)

    # --- epochs -----------------------------------------------------------------------------
    @property
    def epochs_done(self) -> int:
        return len(self.history)

    def elapsed(self) -> float:
        started = self.first_step if self.first_step is not None else self._wall()
        return self._elapsed_before + self._wall() - started

    def end_epoch(self, *, train_loss: float, train_accuracy: float, eval_loss: float,
                  eval_accuracy: float, learning_rate: float | None = None) -> EpochMetrics:
        """Close the epoch whose train and eval phases just ended; returns its record."""
        epoch = self._epoch
        metrics = EpochMetrics(
            epoch=self.epochs_done + 1, train_loss=train_loss, train_accuracy=train_accuracy,
            eval_loss=eval_loss, eval_accuracy=eval_accuracy, learning_rate=learning_rate,
            train_seconds=epoch["train"], eval_seconds=epoch["eval"], checkpoint_seconds=0.0,
            epoch_seconds=epoch["train"] + epoch["eval"],
            elapsed_seconds=self.elapsed(),
            samples_per_second=(self.samples_per_epoch * (self.epochs_done + 1) / self.totals["train"]
                                if self.totals["train"] > 0 else 0.0),
        )
        self.history.append(metrics)
        self._epoch = dict.fromkeys(PHASES, 0.0)
        return metrics

    # --- resume and result ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint or marker file (weights_only-loadable, JSON-able)."""
        return {"history": [h.model_dump() for h in self.history], "totals": dict(self.totals),
                "elapsed": self.history[-1].elapsed_seconds if self.history else 0.0}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, samples_per_epoch: int, **clocks) -> "TrainingRecord":
        return cls(samples_per_epoch, state=state, **clocks)

    def timings(self, launch_time: float, final_test_seconds: float) -> dict[str, float]:
        """The CellResult timing fields (evaluation includes the final test evaluation)."""
        first = self.first_step if self.first_step is not None else self._wall()
        return {
            "startup_seconds": first - launch_time,
            "training_seconds": self.totals["train"],
            "evaluation_seconds": self.totals["eval"] + final_test_seconds,
            "checkpoint_seconds": self.totals["checkpoint"],
            "samples_per_second": self.history[-1].samples_per_second if self.history else 0.0,
        }

    def rank_steps(self, rank: int, host: str | None) -> RankSteps:
        """This rank's step times and train-phase split over this attempt (``CellResult.rank_steps``)."""
        own = {p: self.totals[p] - self._attempt_base[p] for p in self.totals}
        steps = sorted(self.step_seconds)

        def quantile(q: float) -> float:  # nearest rank
            return steps[min(len(steps) - 1, max(0, round(q * len(steps)) - 1))] if steps else 0.0

        return RankSteps(rank=rank, host=host, steps=len(steps), step_mean_s=sum(steps) / len(steps) if steps else 0.0,
                         step_p50_s=quantile(0.5), step_p95_s=quantile(0.95), step_max_s=steps[-1] if steps else 0.0,
                         compute_s=max(0.0, own["train"] - own["data"] - own["communication"]),
                         communication_s=own["communication"], data_s=own["data"])

    def cell_phases(self, launch_time: float, *, final_test_seconds: float = 0.0,
                    export_seconds: float = 0.0) -> dict[str, float]:
        """This attempt's phases up to its result (``pipelines.training.phases``; the adapter
        adds ``teardown`` and earlier attempts): launch, data, compute, communication,
        checkpoint (+ the model export) and evaluation (+ the final test)."""
        own = {p: self.totals[p] - self._attempt_base[p] for p in self.totals}
        first = self.first_step if self.first_step is not None else self._wall()
        return {
            "launch": first - launch_time,
            "data": own["data"],
            "compute": max(0.0, own["train"] - own["data"] - own["communication"]),
            "communication": own["communication"],
            "checkpoint": own["checkpoint"] + export_seconds,
            "evaluation": own["eval"] + final_test_seconds,
        }
