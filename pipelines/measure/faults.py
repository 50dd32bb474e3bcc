"""Losing a host in the middle of training (``matrix.fault = "host_loss"``), and what it cost.

On a cell across two or more hosts, the first attempt loses its LAST host in the middle of epoch
``matrix.fault_epoch``: once rank 0's heartbeat (``attempts.progress``) reaches half of that
epoch's steps, every process of the host is killed with SIGKILL at once (its cgroups' and
namespace's members, repeated until none is left: a forking daemon cannot outrun it). The host
itself stays (a machine that rebooted): what comes back on it is up to whoever recovers.

Then the platform has ``matrix.recovery_deadline_s`` to recover by its own means (torchrun's
``--max-restarts``, Ray Train's ``FailureConfig(max_failures)``, Spark's ``spark.task.maxFailures``:
all set from ``matrix.platform_retries``). If the launch finishes, the platform recovered it. If it
fails first, or is still running at the deadline (then every process of the cell's hosts is
stopped, so nothing hangs), the attempt fails with the reason, and the project's retry
(``matrix.cell_retries``: a new attempt on every host, resuming from the last checkpoint) may
recover it. ``<cell>/fault.json`` records the loss; ``record`` completes it with the attempts
(time lost, epochs redone, checkpoint resumed from, who recovered) into ``CellResult.fault``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator

from pipelines.cluster.processes import sigkill
from pipelines.measure import attempts
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths

log = logging.getLogger(__name__)
POLL_S = 0.1


class RecoveryTimeout(RuntimeError):
    """The platform did not recover a lost host within the recovery deadline."""


def fault_file(cell: CellPaths):
    return cell.root / "fault.json"


def _kill_host(host, rounds: int = 20) -> list[int]:
    """SIGKILL everything on ``host`` at once, again until it stays empty."""
    killed: list[int] = []
    for _ in range(rounds):
        pids = host.pids()
        if not pids:
            break
        killed += pids
        sigkill(pids)
        time.sleep(0.05)
    return sorted(set(killed))


class HostLoss:
    """The injector of one attempt: a thread that waits for the epoch, kills the host, then
    enforces the recovery deadline."""

    def __init__(self, cell: CellPaths, hosts: list, epoch: int, deadline_s: float, platform: str):
        self.cell, self.hosts, self.epoch, self.deadline_s, self.platform = cell, hosts, epoch, deadline_s, platform
        self.victim = hosts[-1]
        self.done = threading.Event()
        self.lost_at: float | None = None
        self.timed_out = False
        self.thread = threading.Thread(target=self._watch, name="host-loss", daemon=True)

    def _watch(self) -> None:
        while not self.done.wait(POLL_S):
            where = attempts.progress(self.cell)
            if where and (where[0] > self.epoch or (where[0] == self.epoch and where[1] * 2 >= where[2])):
                self._lose(where)
                break
        if self.lost_at is None or self.done.wait(self.deadline_s):
            return
        self.timed_out = True  # no recovery in time: stop the cell everywhere, so the launch returns
        log.error("%s: no recovery %.0fs after losing %s: stopping the cell", self.platform, self.deadline_s,
                  self.victim.name)
        for host in self.hosts:
            host.stop_processes(grace_s=2.0)

    def _lose(self, where: tuple[int, int, int]) -> None:
        self.lost_at = time.time()
        killed = _kill_host(self.victim)
        log.warning("fault host_loss: killed %d process(es) of %s at epoch %d step %d/%d", len(killed),
                    self.victim.name, *where)
        atomic_write_json(fault_file(self.cell), {
            "kind": "host_loss", "host": self.victim.name, "epoch": where[0], "step": where[1],
            "steps": where[2], "at": self.lost_at, "killed_pids": killed, "deadline_s": self.deadline_s})


@contextlib.contextmanager
def inject(config, cell: CellPaths, hosts: list | None, attempt: int, platform: str) -> Iterator[HostLoss | None]:
    """Around a launch across ``hosts``: lose a host in the first attempt when the config asks."""
    if config.matrix.fault != "host_loss" or attempt != 1 or not hosts or len(hosts) < 2:
        if config.matrix.fault == "host_loss" and attempt == 1:  # said, not silently fault-free
            log.warning("fault=host_loss: %s runs on %s: no second host to lose, nothing injected",
                        cell.name, f"one host ({hosts[0].name})" if hosts else "this machine")
        yield None
        return
    loss = HostLoss(cell, list(hosts), config.matrix.fault_epoch, config.matrix.recovery_deadline_s, platform)
    loss.thread.start()
    try:
        yield loss
    except Exception as err:
        if loss.lost_at is None:
            raise
        waited = time.time() - loss.lost_at
        why = (f"no recovery within {loss.deadline_s:.0f}s" if loss.timed_out else
               f"it failed {waited:.1f}s later")
        _update(cell, {"platform_outcome": "timed_out" if loss.timed_out else "failed",
                       "platform_error": _clip(f"{type(err).__name__}: {err}")})
        cls = RecoveryTimeout if loss.timed_out else RuntimeError
        raise cls(f"{platform} lost host {loss.victim.name} in epoch {config.matrix.fault_epoch} and did not "
                  f"recover by its own means ({why}): {type(err).__name__}: {str(err)[-600:]}") from err
    else:
        if loss.lost_at is not None:
            _update(cell, {"platform_outcome": "recovered", "recovery_seconds": time.time() - loss.lost_at})
    finally:
        loss.done.set()
        loss.thread.join(10)


def _clip(text: str, head: int = 600, tail: int = 900) -> str:
    """The error's start (what failed) and end (the launcher's last lines)."""
    return text if len(text) <= head + tail else f"{text[:head]} [...] {text[-tail:]}"


def _update(cell: CellPaths, fields: dict) -> None:
    try:
        record = json.loads(fault_file(cell).read_text())
    except (FileNotFoundError, ValueError):
        return
    atomic_write_json(fault_file(cell), {**record, **fields})


def record(cell: CellPaths, history: list, resumed_from_epoch: int) -> dict | None:
    """``CellResult.fault`` from ``fault.json``, the attempts and the epoch the final attempt's
    training resumed from: who recovered, and at what cost."""
    try:
        loss = json.loads(fault_file(cell).read_text())
    except (FileNotFoundError, ValueError):
        return None
    ok = bool(history) and history[-1].outcome == "ok"
    by_platform = loss.get("platform_outcome") == "recovered"
    recovered_by = "platform" if by_platform else ("project" if ok and len(history) > 1 else "none")
    retry = history[1] if len(history) > 1 else None
    recovery = loss.get("recovery_seconds") if by_platform else (
        (retry.start - loss["at"]) + (retry.recovery_seconds or 0.0) - (retry.start - history[0].end)
        if retry and retry.recovery_seconds is not None and history[0].end else None)
    return {
        "kind": loss["kind"], "host": loss["host"], "epoch": loss["epoch"], "step": loss["step"],
        "steps": loss["steps"], "recovered_by": recovered_by, "platform_outcome": loss.get("platform_outcome"),
        "platform_error": loss.get("platform_error"), "deadline_s": loss["deadline_s"],
        "recovery_seconds": recovery,  # the loss -> training again (platform: -> the attempt's end)
        "lost_seconds": sum(a.lost_seconds for a in history),  # work after the last checkpoint, thrown away
        "resumed_from_epoch": resumed_from_epoch if recovered_by != "none" else None,
        # the lost epoch counts whole: its steps before the loss were trained again
        "epochs_redone": loss["epoch"] - resumed_from_epoch if recovered_by != "none" else None,
    }
