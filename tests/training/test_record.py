"""One definition of every timed phase: the torch loop and the Determined trial fill the same
TrainingRecord, so their results carry the same fields with the same meanings."""

from __future__ import annotations

import pytest

from pipelines.runfolder.results import EpochMetrics
from pipelines.training.record import TrainingRecord


class FakeClock:
    """Both clocks of the record (perf counter and wall time), advanced by hand."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


EPOCHS = [  # (data+compute s, eval s, checkpoint s) per epoch
    (10.0, 2.0, 0.5),
    (12.0, 3.0, 0.25),
]
METRICS = dict(train_loss=0.6, train_accuracy=0.7, eval_loss=0.65, eval_accuracy=0.66)


def drive_like_the_loop(clock: FakeClock, record: TrainingRecord) -> TrainingRecord:
    """The call sequence of pipelines.training.loop._train."""
    for train_s, eval_s, ckpt_s in EPOCHS:
        record.training_started()
        with record.phase("train"):
            clock.tick(train_s)
        with record.phase("eval"):
            clock.tick(eval_s)
        record.end_epoch(**METRICS)
        with record.phase("checkpoint"):
            clock.tick(ckpt_s)
    return record


def drive_like_determined(clock: FakeClock, record: TrainingRecord, tmp_path) -> TrainingRecord:
    """The callback sequence det.pytorch.Trainer makes, through the real EpochRecorder."""
    from pipelines.runfolder.paths import CellPaths
    from pipelines.platforms.determined.trial import EpochRecorder

    recorder = EpochRecorder(record, CellPaths(tmp_path), is_main=True)
    for epoch_idx, (train_s, eval_s, ckpt_s) in enumerate(EPOCHS):
        recorder.on_training_epoch_start(epoch_idx)
        clock.tick(train_s)
        recorder.on_training_workload_end({"loss": METRICS["train_loss"],
                                           "accuracy": METRICS["train_accuracy"]}, [])
        recorder.on_validation_start()
        clock.tick(eval_s)
        recorder.on_validation_end({"loss_sum": METRICS["eval_loss"] * 100,
                                    "correct": METRICS["eval_accuracy"] * 100, "count": 100})
        clock.tick(ckpt_s)
        recorder.on_checkpoint_upload_end(f"uuid-{epoch_idx}")
    return record


def _record(clock: FakeClock) -> TrainingRecord:
    return TrainingRecord(samples_per_epoch=400, clock=clock, wall=clock)


def test_loop_and_determined_record_the_same_phases(tmp_path):
    loop_clock, det_clock = FakeClock(), FakeClock()
    by_loop = drive_like_the_loop(loop_clock, _record(loop_clock))
    by_det = drive_like_determined(det_clock, _record(det_clock), tmp_path)

    assert by_loop.history == by_det.history  # same fields, same values
    assert by_loop.timings(launch_time=990.0, final_test_seconds=1.0) == \
        by_det.timings(launch_time=990.0, final_test_seconds=1.0)
    first, second = by_loop.history
    assert (first.train_seconds, first.eval_seconds, first.checkpoint_seconds) == (10.0, 2.0, 0.5)
    assert first.epoch_seconds == 12.5 and second.epoch_seconds == 15.25
    assert second.elapsed_seconds == pytest.approx(10 + 2 + 0.5 + 12 + 3)  # checkpoint 2 after it
    assert second.samples_per_second == pytest.approx(800 / 22.0)  # training phase only
    timings = by_loop.timings(launch_time=990.0, final_test_seconds=1.0)
    assert timings == {"startup_seconds": 10.0, "training_seconds": 22.0, "evaluation_seconds": 6.0,
                       "checkpoint_seconds": 0.75, "samples_per_second": pytest.approx(800 / 22.0)}
    assert (tmp_path / "determined" / "latest.json").exists()  # the resume marker


def test_resumed_record_continues_phases_and_elapsed_time():
    clock = FakeClock()
    first = _record(clock)
    first.training_started()
    with first.phase("train"):
        clock.tick(10.0)
    with first.phase("eval"):
        clock.tick(2.0)
    first.end_epoch(**METRICS)
    state = first.state()  # what the checkpoint holds

    clock.tick(100.0)  # the kill, the retry's start-up
    resumed = TrainingRecord.from_state(state, 400, clock=clock, wall=clock)
    assert resumed.resumed_from_epoch == 1 and resumed.epochs_done == 1
    resumed.training_started()
    with resumed.phase("train"):
        clock.tick(11.0)
    with resumed.phase("eval"):
        clock.tick(2.0)
    m = resumed.end_epoch(**METRICS)
    assert m.epoch == 2 and resumed.totals["train"] == 21.0
    assert m.elapsed_seconds == pytest.approx(12.0 + 13.0)  # time between attempts is not training
    assert all(isinstance(h, EpochMetrics) for h in resumed.history)


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase 'io'"):
        _record(FakeClock()).begin("io")
