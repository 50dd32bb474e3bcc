"""The phase definitions (pipelines.training.phases): the hook timer, the data wait, and how a
cell's phases are put together; the backends' real cells are checked in tests/platforms."""

from __future__ import annotations

import pytest

from pipelines.training import phases
from pipelines.training.phases import CommTimer
from pipelines.training.record import TrainingRecord
from tests.training.test_record import FakeClock


def test_comm_timer_counts_overlapping_buckets_once():
    timer = CommTimer()
    for start, end in [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.75)]:  # buckets in flight
        timer.add(start, end)
    assert timer.take() == pytest.approx(4.0)  # [0, 3] + [5, 6]
    assert timer.take() == 0.0  # taken: starts over


def test_comm_timer_times_a_hook_until_its_future_completes():
    import torch

    clock = FakeClock(0.0)
    timer = CommTimer(clock=clock)

    def slow_hook(state, bucket):
        clock.tick(0.25)  # the collective runs
        future = torch.futures.Future()
        future.set_result(bucket)
        return future

    timed = timer.wrap(slow_hook)
    assert timed(None, torch.ones(3)).wait().tolist() == [1.0, 1.0, 1.0]  # the hook's value passes through
    assert timer.take() == pytest.approx(0.25)


def test_data_wait_and_communication_split_the_train_phase():
    clock = FakeClock()
    record = TrainingRecord(samples_per_epoch=4, clock=clock, wall=clock)
    launch = clock.now
    clock.tick(3.0)  # processes, data, model: launch

    def batches():
        for _ in range(4):
            clock.tick(0.5)  # waiting for a batch
            yield object()

    record.training_started()
    with record.phase("train"):
        for _ in record.timed_batches(batches()):
            clock.tick(1.0)  # forward, backward, step
        with record.communicating():
            clock.tick(0.25)  # the epoch metrics' all-reduce
        record.add("communication", 0.75)  # the gradient buckets (hook timer), inside the steps
    with record.phase("eval"):
        clock.tick(2.0)
    record.end_epoch(train_loss=0.5, train_accuracy=0.5, eval_loss=0.5, eval_accuracy=0.5)
    with record.phase("checkpoint"):
        clock.tick(0.5)

    got = record.cell_phases(launch, final_test_seconds=1.0, export_seconds=0.25)
    assert got == pytest.approx({"launch": 3.0, "data": 2.0, "compute": 3.25, "communication": 1.0,
                                 "checkpoint": 0.75, "evaluation": 3.0})
    assert got["data"] + got["compute"] + got["communication"] == pytest.approx(record.totals["train"])


def test_a_resumed_attempt_reports_only_its_own_phases():
    clock = FakeClock()
    first = TrainingRecord(samples_per_epoch=4, clock=clock, wall=clock)
    first.training_started()
    with first.phase("train"):
        clock.tick(5.0)
    first.end_epoch(train_loss=0.5, train_accuracy=0.5, eval_loss=0.5, eval_accuracy=0.5)

    resumed = TrainingRecord.from_state(first.state(), 4, clock=clock, wall=clock)
    launch = clock.now
    clock.tick(1.0)
    resumed.training_started()
    with resumed.phase("train"):
        clock.tick(2.0)
    assert resumed.totals["train"] == pytest.approx(7.0)  # the record spans attempts
    assert resumed.cell_phases(launch)["compute"] == pytest.approx(2.0)  # this attempt: its own


def test_complete_adds_teardown_and_retries_in_order():
    worker = {"launch": 1.0, "data": 0.5, "compute": 6.0, "communication": 1.5, "checkpoint": 0.5,
              "evaluation": 1.0}
    done = phases.complete(worker, work_end=100.0, attempt_end=101.5, earlier_attempts_seconds=4.0)
    assert tuple(done) == phases.PHASES + (phases.RETRIES,)
    assert done["teardown"] == 1.5 and done["retries"] == 4.0
    assert phases.unattributed(done, 16.0) == pytest.approx(0.0)
    assert phases.RETRIES not in phases.complete(worker, work_end=1, attempt_end=2, earlier_attempts_seconds=0)
