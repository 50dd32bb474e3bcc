"""What every rank of a cell owes its adapter, whoever runs the training loop (the shared loop
under torchrun and the platforms that run it; a platform's own Trainer for its trial):

- its pid file ``<cell>/ranks/rank-<k>.pid`` once it knows its rank
  (``pipelines.measure.process_kinds.write_rank_pid``: the resource split by process);
- rank 0's heartbeat ``<cell>/heartbeat`` while it trains, at most 4 times a second
  (``pipelines.measure.attempts.beat``: a killed attempt's end, and where training is, which
  ``pipelines.measure.faults`` waits for);
- the training record (``pipelines.training.record``: phases and per-epoch metrics), continued
  from a checkpoint's on resume;
- the epoch-end hook after each epoch's checkpoint (``PIPELINES_EPOCH_END_HOOK``, resolved by
  ``pipelines.training.cell.epoch_end_hook``: tests inject faults through it);
- at the end, every rank's device and placement, and rank 0's final test, exported model and
  ``<cell>/worker_result.json`` (``pipelines.training.outcome``).

    process = RankProcess(spec, env, launch_time, epoch_end=epoch_end_hook())  # writes the pid file
    record = process.start_record(state and state["record"], samples_per_epoch)
    process.beat(epoch, step, steps)       # after each training step (1-based)
    process.epoch_ended(epoch)             # after each epoch's checkpoint
    process.finish(model, ...)             # every rank; rank 0 tests, exports, writes the result

``setup_logging`` is the workers' logging, the same under every launcher.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

import torch
from torch.utils.data import TensorDataset

from pipelines.measure import attempts
from pipelines.measure.process_kinds import write_rank_pid
from pipelines.runfolder.results import CellResult, RankSteps
from pipelines.training.cell import CellSpec
from pipelines.training.distributed import DistEnv
from pipelines.training.host import HOST_ENV
from pipelines.training.outcome import (all_gather_json, timed_export, worker_devices, worker_result,
                                        write_worker_result)
from pipelines.training.record import TrainingRecord
from pipelines.training.steps import final_test

log = logging.getLogger("pipelines.training")
BEAT_INTERVAL_S = 0.25


def setup_logging() -> None:
    """Rank 0 logs at INFO, the others only warnings (one readable log per cell)."""
    level = logging.INFO if int(os.environ.get("RANK", "0")) == 0 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s rank%(process)d: %(message)s")


class RankProcess:
    """One rank of one cell: pid file, heartbeat, record, epoch-end hook and result."""

    def __init__(self, spec: CellSpec, env: DistEnv, launch_time: float,
                 epoch_end: Callable[..., None] | None = None) -> None:
        self.spec, self.env, self.launch_time = spec, env, float(launch_time)
        self.epoch_end = epoch_end  # called as epoch_end(epoch=, rank=, cell_dir=)
        self.record: TrainingRecord | None = None
        self._last_beat = 0.0
        write_rank_pid(spec.cell_dir, env.rank)  # this process is a rank of the cell

    def start_record(self, state: dict | None, samples_per_epoch: int) -> TrainingRecord:
        """This rank's training record, continued from a checkpoint's ``state`` (None: a new one)."""
        self.record = TrainingRecord.from_state(state, samples_per_epoch)
        return self.record

    def beat(self, epoch: int, step: int, steps: int) -> None:
        """After training step ``step`` of ``steps`` in ``epoch`` (1-based): rank 0's heartbeat."""
        if self.env.is_main and time.time() - self._last_beat > BEAT_INTERVAL_S:
            attempts.beat(self.spec.cell, epoch, step, steps)
            self._last_beat = time.time()

    def epoch_ended(self, epoch: int) -> None:
        """After the checkpoint of ``epoch`` (1-based), on every rank."""
        if self.epoch_end is not None:
            self.epoch_end(epoch=epoch, rank=self.env.rank, cell_dir=self.spec.cell_dir)

    def finish(self, model: torch.nn.Module, *, model_source: str, test_set: TensorDataset,
               train_samples: int, checkpoint_path: str | None, steps_per_epoch: int,
               comm_bytes_per_step: float | None = None,
               link_bytes_per_train_step: float | None = None,
               strategy_fields: dict | None = None) -> CellResult | None:
        """Every rank (the devices are gathered); rank 0: the final test of ``model``, its export
        and ``worker_result.json``, which it returns."""
        devices, placements = worker_devices(self.env, self.spec.backend)
        rank_steps = gather_rank_steps(self.env, self.record)  # a collective: every rank
        if not self.env.is_main:
            return None
        spec, env = self.spec, self.env
        test, test_seconds = final_test(model, test_set, spec, env.device)
        log.info("test: accuracy %.3f macro-F1 %.3f loss %.4f", test.accuracy, test.f1, test.loss)
        model_path, export_seconds = timed_export(model, spec.cell)
        result = worker_result(
            spec, env, self.record, launch_time=self.launch_time, model_source=model_source, test=test,
            test_seconds=test_seconds, train_samples=train_samples, test_samples=len(test_set),
            checkpoint_path=checkpoint_path, model_path=model_path, devices=devices, placements=placements,
            export_seconds=export_seconds, comm_bytes_per_step=comm_bytes_per_step,
            steps_per_epoch=steps_per_epoch, link_bytes_per_train_step=link_bytes_per_train_step)
        result = result.model_copy(update={"rank_steps": rank_steps, **(strategy_fields or {})})
        write_worker_result(result, spec)
        return result


def gather_rank_steps(env: DistEnv, record: TrainingRecord | None) -> list[RankSteps]:
    """Every rank's step times and train-phase split (``TrainingRecord.rank_steps``), gathered to
    every rank (one small JSON message per rank, like the devices): rank 0's result carries them all."""
    host = os.environ.get(HOST_ENV) or socket.gethostname()
    mine = record.rank_steps(env.rank, host).model_dump() if record is not None else None
    every = all_gather_json(mine, env)
    return [RankSteps.model_validate(r) for r in every if r is not None]
