"""Losing a host in the middle of training (``matrix.fault = "host_loss"``), getting it back
(``"host_return"``), and what it cost.

On a cell across two or more hosts, the first attempt loses one host in the middle of epoch
``matrix.fault_epoch`` (``matrix.fault_victim``: ``worker`` = the LAST host, ``coordinator`` = the
first, which holds the platform's coordinator: its ``Platform.coordinator_note``): once rank 0's
heartbeat (``attempts.progress``) reaches half of that epoch's steps, every process of the host
is killed with SIGKILL at once (its cgroups' and namespace's members, repeated until none is left:
a forking daemon cannot outrun it). The host itself stays (a machine that rebooted).

``host_return``: ``matrix.return_after_s`` after the loss, the host's platform agent is started
again as an operator's supervisor would: the command the platform offered for that host
(``offer_restart``; elastic torchrun: the same torchrun line, which joins the c10d rendezvous, and
the survivors grow back to the full world size). A platform that offered none gets nothing
restarted, and the record says so.

Then the platform has ``matrix.recovery_deadline_s`` to train again by its own means (its retry
setting, ``Platform.retries_note``, e.g. torchrun's ``--max-restarts``, elastic or not: all from
``matrix.platform_retries``): training again = a new start of the workers noted in
``<cell>/world_sizes.json`` (``pipelines.training.checkpoint``), or the launch finishing. If the launch fails first, or nothing trains at the deadline (then every
process of the cell's hosts is stopped, so nothing hangs), the attempt fails with the reason, and
the project's retry (``matrix.cell_retries``: a new attempt on every host, resuming from the last
checkpoint) may recover it. ``<cell>/fault.json`` records the loss (and the return);
``record`` completes it with the attempts and the world sizes (time lost, epochs redone, who
recovered, world size before / after the loss / after the return) into ``CellResult.fault``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import threading
import time
from collections.abc import Iterator

from pipelines import platforms
from pipelines.cluster.processes import Tee, sigkill, stop_tree
from pipelines.measure import attempts
from pipelines.runfolder.fileio import atomic_write_json, read_json_list
from pipelines.runfolder.paths import CellPaths

log = logging.getLogger(__name__)
POLL_S = 0.1
LOSSES = ("host_loss", "host_return")
RETURNED_GRACE_S = 30.0  # after the launch: the returned agent's own exit barrier (torchrun's)
# (cell folder, host name) -> (command, environment, log, grace s): what a returning host runs again
_RESTARTS: dict[tuple[str, str], tuple[list[str], dict, object, float]] = {}


def offer_restart(cell: CellPaths, host, cmd: list[str], env, log_path, grace_s: float = RETURNED_GRACE_S) -> None:
    """A platform's launch: ``cmd`` is what ``host`` runs again when it comes back (host_return);
    ``grace_s``: how long it may take to leave by itself once the launch ended (0: an agent that
    never does, e.g. a cluster node started with ``--block``, stopped at once)."""
    _RESTARTS[(str(cell.root), host.name)] = (list(cmd), dict(env), log_path, grace_s)


def withdraw_restarts(cell: CellPaths) -> None:
    """The launch ended: nothing of this cell is to be started again."""
    for key in [k for k in _RESTARTS if k[0] == str(cell.root)]:
        _RESTARTS.pop(key, None)


class RecoveryTimeout(RuntimeError):
    """The platform did not recover a lost host within the recovery deadline."""


def _who_restarts() -> str:
    """`` (<agents> do here)``: what the platforms that offer one start again (``Platform.return_agent``)."""
    agents = list(dict.fromkeys(p.return_agent for p in platforms.all_platforms() if p.return_agent))
    return f" ({' and '.join(agents)} do here)" if agents else ""


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


# what the training loop writes (pipelines.training.checkpoint: PATTERN, WORLD_SIZES), read here
# without importing torch (the adapters import this module; tests/platforms/test_launch.py)
CHECKPOINTS = "epoch-*.pt"
WORLD_SIZES = "world_sizes.json"


def _starts(cell: CellPaths) -> list[dict]:
    """Each start of the cell's workers, noted by rank 0 (``checkpoint.note_world_size``)."""
    return read_json_list(cell.root / WORLD_SIZES)


def _last_checkpoint_at(cell: CellPaths) -> float | None:
    """When the newest checkpoint was written (its file's time): the work after it is lost."""
    found = sorted(cell.checkpoints.glob(CHECKPOINTS))
    try:
        return found[-1].stat().st_mtime if found else None
    except OSError:
        return None


class HostLoss:
    """The injector of one attempt: a thread that waits for the epoch, kills the host, enforces the
    recovery deadline and, for host_return, starts the host's agent again."""

    def __init__(self, cell: CellPaths, hosts: list, epoch: int, deadline_s: float, platform: str, *,
                 kind: str = "host_loss", victim: str = "worker", return_after_s: float = 0.0):
        self.cell, self.hosts, self.epoch, self.deadline_s, self.platform = cell, hosts, epoch, deadline_s, platform
        self.kind, self.victim_role, self.return_after_s = kind, victim, return_after_s
        self.victim = hosts[0] if victim == "coordinator" else hosts[-1]
        self.done = threading.Event()
        self.lost_at: float | None = None
        self.timed_out = False
        self.returned: subprocess.Popen | None = None
        self.returned_grace_s = RETURNED_GRACE_S
        self.returned_tee: Tee | None = None
        self.thread = threading.Thread(target=self._watch, name="host-loss", daemon=True)

    def _watch(self) -> None:
        while not self.done.wait(POLL_S):
            where = attempts.progress(self.cell)
            if where and (where[0] > self.epoch or (where[0] == self.epoch and where[1] * 2 >= where[2])):
                self._lose(where)
                break
        if self.lost_at is None:
            return
        if self.kind == "host_return" and not self.done.wait(self.return_after_s):
            self._return()
        while not self.done.wait(POLL_S):  # the deadline: training again (a new start) or the launch ended
            if any(e["first_step_at"] > self.lost_at for e in _starts(self.cell)):
                break
            if time.time() - self.lost_at > self.deadline_s:
                self._stop_at_deadline()
                return
        if self.returned is not None:
            self._watch_regrowth()

    def _watch_regrowth(self) -> None:
        """After a return: the survivors' workers are stopped to let the host in, losing their epoch in
        progress since its checkpoint; rank 0's heartbeat says how far it was (the last beat seen
        before the next start, timed from the epoch's first beat seen)."""
        starts = len(_starts(self.cell))
        seen, epoch_seen, last_beat = None, None, None
        while not self.done.wait(POLL_S):
            where = attempts.progress(self.cell)
            if len(_starts(self.cell)) > starts:
                if epoch_seen is not None:
                    _update(self.cell, {"regrowth_lost_epoch": seen[0], "regrowth_lost_steps": seen[1],
                                        "regrowth_lost_seconds": last_beat - epoch_seen})
                return
            if where and where != seen:
                if seen is None or where[0] != seen[0]:
                    epoch_seen = time.time()
                seen, last_beat = where, time.time()

    def _stop_at_deadline(self) -> None:
        self.timed_out = True  # no recovery in time: stop the cell everywhere, so the launch returns
        log.error("%s: no recovery %.0fs after losing %s: stopping the cell", self.platform, self.deadline_s,
                  self.victim.name)
        for host in self.hosts:
            host.stop_processes(grace_s=2.0)

    def _lose(self, where: tuple[int, int, int]) -> None:
        self.lost_at = time.time()
        # the record first: a launch that fails within the kill still finds it to note its outcome in
        atomic_write_json(fault_file(self.cell), {
            "kind": self.kind, "host": self.victim.name, "victim": self.victim_role, "epoch": where[0],
            "step": where[1], "steps": where[2], "at": self.lost_at, "killed_pids": [],
            "deadline_s": self.deadline_s, "last_checkpoint_at": _last_checkpoint_at(self.cell)})
        killed = _kill_host(self.victim)
        _update(self.cell, {"killed_pids": killed})
        log.warning("fault %s: killed %d process(es) of %s (%s) at epoch %d step %d/%d", self.kind, len(killed),
                    self.victim.name, self.victim_role, *where)

    def _return(self) -> None:
        """The host is back: start its agent again if the platform offered one, else say so."""
        offered = _RESTARTS.get((str(self.cell.root), self.victim.name))
        now = time.time()
        fields = {"returned_at": now, "return_after_s": self.return_after_s}
        if offered is None:
            why = (f"{self.platform} offered no agent to start again on {self.victim.name}{_who_restarts()}: "
                   "nothing was restarted")
            log.warning("fault host_return: %s", why)
            _update(self.cell, {**fields, "restarted": None, "not_restarted": why})
            return
        cmd, env, log_path, self.returned_grace_s = offered
        log.warning("fault host_return: %s is back after %.0fs: starting its agent again", self.victim.name,
                    self.return_after_s)
        self.returned = self.victim.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True)
        self.returned_tee = Tee(self.returned, log_path, prefix=f"{self.victim.name}-returned").start()
        _update(self.cell, {**fields, "restarted": " ".join(cmd[:3] + ["..."])})

    def end_returned(self) -> None:
        """After the launch: the returned agent leaves with the others (its exit barrier); stop it
        if it does not within ``RETURNED_GRACE_S``, and note how it ended."""
        if self.returned is None:
            return
        try:
            code = self.returned.wait(self.returned_grace_s)
        except subprocess.TimeoutExpired:
            stop_tree([self.returned], 5.0)
            code = self.returned.returncode
            log.warning("fault host_return: the returned agent on %s was still running: stopped", self.victim.name)
        if self.returned_tee is not None:
            self.returned_tee.join(5)
        _update(self.cell, {"returned_exit_code": code})


@contextlib.contextmanager
def inject(config, cell: CellPaths, hosts: list | None, attempt: int, platform: str) -> Iterator[HostLoss | None]:
    """Around a launch across ``hosts``: lose a host in the first attempt when the config asks
    (host_loss, host_return; the other faults are not this module's)."""
    matrix = config.matrix
    if matrix.fault not in LOSSES or attempt != 1 or not hosts or len(hosts) < 2:
        if matrix.fault in LOSSES and attempt == 1:  # said, not silently fault-free
            log.warning("fault=%s: %s runs on %s: no second host to lose, nothing injected", matrix.fault,
                        cell.name, f"one host ({hosts[0].name})" if hosts else "this machine")
        yield None
        return
    loss = HostLoss(cell, list(hosts), matrix.fault_epoch, matrix.recovery_deadline_s, platform, kind=matrix.fault,
                    victim=getattr(matrix, "fault_victim", "worker"),
                    return_after_s=getattr(matrix, "return_after_s", 0.0))
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
        raise cls(f"{platform} lost host {loss.victim.name} in epoch {matrix.fault_epoch} and did not "
                  f"recover by its own means ({why}): {type(err).__name__}: {str(err)[-600:]}") from err
    else:
        if loss.timed_out:  # the launch returned because the deadline stopped it (a Ray driver exits 0 then)
            _update(cell, {"platform_outcome": "timed_out", "platform_error": "stopped at the recovery deadline"})
            raise RecoveryTimeout(f"{platform} lost host {loss.victim.name} in epoch {matrix.fault_epoch} and did "
                                  f"not recover by its own means (no recovery within {loss.deadline_s:.0f}s)")
        if loss.lost_at is not None:
            _update(cell, {"platform_outcome": "recovered", "recovery_seconds": time.time() - loss.lost_at})
    finally:
        loss.done.set()
        loss.thread.join(10)
        loss.end_returned()


def _clip(text: str, head: int = 600, tail: int = 900) -> str:
    """The error's start (what failed) and end (the launcher's last lines)."""
    return text if len(text) <= head + tail else f"{text[:head]} [...] {text[-tail:]}"


def _update(cell: CellPaths, fields: dict) -> None:
    try:
        record = json.loads(fault_file(cell).read_text())
    except (FileNotFoundError, ValueError):
        return
    atomic_write_json(fault_file(cell), {**record, **fields})


def _world_sizes(cell: CellPaths, loss: dict) -> dict:
    """World size before the loss, at the first start after it and at the first after the return
    (``<cell>/world_sizes.json``: each start of the workers, noted by rank 0 at its first step)."""
    starts = _starts(cell)
    before = [e for e in starts if e["first_step_at"] <= loss["at"]]
    after = [e for e in starts if e["first_step_at"] > loss["at"]]
    returned_at = loss.get("returned_at")
    after_return = [e for e in after if returned_at is not None and e["first_step_at"] > returned_at]
    full = before[-1]["world_size"] if before else None
    grown = next((e for e in after_return if full is not None and e["world_size"] >= full), None)
    return {
        "world_sizes": [[e["epoch"], e["world_size"]] for e in starts],  # (epochs done, world size) per start
        "world_size_before": full,
        "world_size_after_loss": after[0]["world_size"] if after else None,
        "seconds_to_train_again": after[0]["first_step_at"] - loss["at"] if after else None,
        "resumed_after_loss_from_epoch": after[0]["epoch"] if after else None,
        # the group that trained after the return: the grown one, else the last (a group of the
        # survivors whose first step only came after the return is not "after the return")
        "world_size_after_return": (grown or after_return[-1])["world_size"] if after_return else None,
        "grew_back": grown is not None if returned_at is not None else None,
        "seconds_return_to_full_size": grown["first_step_at"] - returned_at if grown else None,
    }


def _how(by_platform: bool, sizes: dict) -> str | None:
    """What the platform did: went on with fewer ranks, or started the same number again."""
    if not by_platform or sizes["world_size_after_loss"] is None:
        return None
    return "shrank" if sizes["world_size_after_loss"] < (sizes["world_size_before"] or 0) else "restarted"


def record(cell: CellPaths, history: list, resumed_from_epoch: int) -> dict | None:
    """``CellResult.fault`` from ``fault.json``, the attempts, the world sizes and the epoch the
    final attempt's training resumed from: who recovered, and at what cost."""
    try:
        loss = json.loads(fault_file(cell).read_text())
    except (FileNotFoundError, ValueError):
        return None
    ok = bool(history) and history[-1].outcome == "ok"
    by_platform = loss.get("platform_outcome") == "recovered"
    recovered_by = "platform" if by_platform else ("project" if ok and len(history) > 1 else "none")
    sizes = _world_sizes(cell, loss)
    retry = history[1] if len(history) > 1 else None
    recovery = (sizes["seconds_to_train_again"] or loss.get("recovery_seconds")) if by_platform else (
        (retry.start - loss["at"]) + (retry.recovery_seconds or 0.0) - (retry.start - history[0].end)
        if retry and retry.recovery_seconds is not None and history[0].end else None)
    resumed = sizes["resumed_after_loss_from_epoch"] if by_platform else resumed_from_epoch
    if by_platform and resumed is None:
        resumed = resumed_from_epoch
    # work thrown away: the attempts' (project retry), or in the attempt the platform kept going:
    # the loss's epoch before the loss (and, when a returned host made the survivors start again, their
    # epoch in progress then)
    lost = sum(a.lost_seconds for a in history)
    if by_platform and loss.get("last_checkpoint_at"):
        lost += max(0.0, loss["at"] - loss["last_checkpoint_at"])
        lost += loss.get("regrowth_lost_seconds") or 0.0
    return {
        "kind": loss["kind"], "host": loss["host"], "victim": loss.get("victim", "worker"), "epoch": loss["epoch"],
        "step": loss["step"], "steps": loss["steps"], "recovered_by": recovered_by,
        "platform_action": _how(by_platform, sizes), "platform_outcome": loss.get("platform_outcome"),
        "platform_error": loss.get("platform_error"), "deadline_s": loss["deadline_s"],
        "recovery_seconds": recovery,  # the loss -> the first training step after it
        "lost_seconds": lost,  # work after the last checkpoint, thrown away
        "resumed_from_epoch": resumed if recovered_by != "none" else None,
        # the lost epoch counts whole: its steps before the loss were trained again
        "epochs_redone": loss["epoch"] - resumed if recovered_by != "none" and resumed is not None else None,
        "returned_at": loss.get("returned_at"), "return_after_s": loss.get("return_after_s"),
        "restarted": loss.get("restarted"), "not_restarted": loss.get("not_restarted"),
        "regrowth_lost_seconds": loss.get("regrowth_lost_seconds"),  # the survivors' epoch stopped to grow back
        **sizes,
    }
