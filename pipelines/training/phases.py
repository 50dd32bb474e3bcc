"""Where a cell's wall time goes: one definition of every phase, the same for every backend.

A cell's phases (``CellResult.phases``, seconds) split its timed window (adapter entry, after
the host lock, -> the attempt's end) into:

- ``provision``: bringing up the platform's own cluster inside the cell (a per-job cluster's
  head or master and its workers or nodes: ``Platform.lifetime``), where the cell does; a standing
  cluster's provision is the run's, outside every cell (``pipelines.run.services``);
- ``launch``: adapter entry -> the first training step, less ``provision``: process start, the
  platform's own start-up (a JVM and its session, executors, agents, a client's connection),
  process group, loading the token shards, model build;
- ``data``: the training thread waiting for the next batch (``TrainingRecord.timed_batches``);
- ``communication``: wall time during which a gradient all-reduce is in flight (a DDP
  communication-hook timer, ``CommTimer``: the union of the buckets' intervals, so the part
  that overlaps the backward pass counts here), plus the all-reduce of each epoch's metrics;
- ``compute``: the rest of the training phase: forward, backward, optimizer and scheduler
  steps, and whatever per-step work the platform adds around them;
- ``checkpoint``: the per-epoch checkpoints and the export of the trained model;
- ``evaluation``: the per-epoch held-out evaluation and the final test;
- ``teardown``: rank 0 has its result -> the attempt ends: process group teardown, process
  exit, launcher / platform session / per-job cluster stop;
- ``retries``: the wall time of earlier, failed attempts (only when a cell was retried).

They add up to the cell's ``total_seconds`` up to small gaps nobody owns (logging, the
per-epoch hook, gathering device labels): ``unattributed`` says how much, and the tests hold it
under 2 %. The training phase itself is ``data + compute + communication``.

    timer = CommTimer()
    ddp_model.register_comm_hook(None, timer.wrap(allreduce_hook))
    ...
    record.add("communication", timer.take())

Importing this module is cheap (no torch at import time: the adapters and reports use it).
On a GPU the hook timer sees when NCCL's work completes from the host's side (its futures'
callbacks), an approximation; on CPU (gloo) it is the all-reduce itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


PHASES = ("launch", "data", "compute", "communication", "checkpoint", "evaluation", "teardown")
PROVISION = "provision"  # first, where the cell brought up its platform's cluster
RETRIES = "retries"


class CommTimer:
    """Times a DDP communication hook: each bucket from the hook's call to its future's result.

    ``take()`` returns the union of the intervals since the last call (in-flight buckets
    overlap each other; counted once) and starts over.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []

    def wrap(self, hook: Callable) -> Callable:
        def timed_hook(state, bucket):
            start = self._clock()
            future = hook(state, bucket)

            def done(fut):
                with self._lock:
                    self._intervals.append((start, self._clock()))
                return fut.value()

            return future.then(done)

        timed_hook.__name__ = f"timed_{getattr(hook, '__name__', 'hook')}"
        return timed_hook

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._intervals.append((start, end))

    def take(self) -> float:
        with self._lock:
            intervals, self._intervals = sorted(self._intervals), []
        total, cur_start, cur_end = 0.0, None, None
        for start, end in intervals:
            if cur_end is None or start > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        if cur_end is not None:
            total += cur_end - cur_start
        return total


def time_ddp_communication(model, timer: CommTimer, hook: Callable | None = None, state=None):
    """Register ``hook`` (default: DDP's own all-reduce, as a hook) on a DDP model, timed by ``timer``.

    Anything that is not a DistributedDataParallel module (one process, FSDP) has no buckets to
    time and is returned unchanged.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(state, timer.wrap(hook or allreduce_hook))
    return model


def complete(worker_phases: dict[str, float], *, work_end: float, attempt_end: float,
             earlier_attempts_seconds: float, provision_seconds: float = 0.0) -> dict[str, float]:
    """The cell's phases: the worker's (launch .. evaluation), ``provision`` split out of launch
    where the cell brought up its platform's cluster, teardown (result -> attempt end) and
    retries (earlier attempts), in the order of ``PHASES`` (``provision`` first where there is one)."""
    phases = {p: float(worker_phases.get(p, 0.0)) for p in PHASES if p != "teardown"}
    if provision_seconds > 0:
        provision = min(provision_seconds, phases["launch"])  # inside the launch, never more than it
        phases = {PROVISION: provision, **phases, "launch": phases["launch"] - provision}
    phases["teardown"] = max(0.0, attempt_end - work_end)
    if earlier_attempts_seconds > 0:
        phases[RETRIES] = earlier_attempts_seconds
    return phases


def unattributed(phases: dict[str, float], total_seconds: float) -> float:
    """Seconds of the cell's wall time no phase owns (positive) or counted twice (negative)."""
    return total_seconds - sum(phases.values())
