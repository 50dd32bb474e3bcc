"""Process handling every launcher shares: start, stop, tee, free ports.

- ``start_session(argv, die_with_parent=...)``: a command in its own session, so its own process
  group (group id = its pid), optionally tied to the starting thread (``PR_SET_PDEATHSIG``: the
  kernel SIGTERMs it when that thread ends, a SIGKILLed caller included);
- ``stop_tree(targets, grace_s)``: SIGTERM each target (a launcher such as torchrun or a
  cluster daemon started with ``--block`` takes its own processes down), wait up to ``grace_s`` for the whole trees
  (recorded before the signal), SIGKILL what is left of them; ``tree=False``: the targets only.
  ``kill_after`` is the second half alone (processes already told to stop), ``stop_groups`` the
  same by process group (``killpg``: daemons started with ``start_session``), ``sigkill`` at once;
- ``Tee``: a process's output to a log file and to this process's stdout (``[prefix]`` before
  each line), its last lines kept for the error message. Where the log cannot be written (a full
  disk) or the output read, it stops the process (its cell fails) and drains its pipe, so nothing
  blocks on a full pipe; ``error`` says why ("no space left on device writing <log>");
- ``free_port(host)``: a TCP port free here; ``free_ports_on(host, n)`` / ``free_port_on(host)``:
  free on a launch host (``Host.run``: its own kernel picks them, inside its namespace).

Targets are ``subprocess.Popen`` objects (waited for through ``poll``, so their exit code stays
right), pids or ``psutil.Process`` objects (psutil reaps those that are this process's children).
Stdlib only at import; psutil is imported where needed.
"""

from __future__ import annotations

import collections
import contextlib
import os
import functools
import select
import signal
import socket
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

TAIL_LINES = 40  # of a process's output, in the error when it fails
POLL_S = 0.05
TEE_STOP_GRACE_S = 10.0  # a process whose output cannot be kept: SIGTERM, then SIGKILL after this
KILL_WAIT_S = 5.0  # stop_tree's wait after its SIGKILL
DRAIN_AFTER_S = 10.0  # its pipe is drained this long after that at most (a process outside its tree)
log = logging.getLogger(__name__)
_ECHO = threading.Lock()  # one whole line at a time on this process's stdout


@functools.lru_cache(maxsize=1)
def _prctl():
    """libc's prctl, resolved in the parent: a preexec_fn must not import or dlopen in the child
    (another thread of the parent may have held those locks at the fork)."""
    import ctypes

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl


def _die_with_parent() -> None:  # preexec_fn: the kernel sends SIGTERM when the starting thread ends
    _PRCTL_IN_CHILD(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_PRCTL_IN_CHILD = _prctl()


def start_session(argv: Sequence[str], *, die_with_parent: bool = False, **popen_kwargs) -> subprocess.Popen:
    """Start ``argv`` in a session (and process group) of its own: it outlives a task's process
    group and is stopped as one (``stop_groups``); ``die_with_parent``: SIGTERM when the starting
    thread ends."""
    return subprocess.Popen(list(argv), start_new_session=True,  # noqa: PLW1509 - prctl only
                            preexec_fn=_die_with_parent if die_with_parent else None, **popen_kwargs)


def _process(target: Any):
    """The ``psutil.Process`` of a live target (Popen, pid or psutil.Process); None once gone."""
    import psutil

    if isinstance(target, subprocess.Popen) and target.poll() is not None:
        return None
    if isinstance(target, psutil.Process):
        return target
    try:
        return psutil.Process(getattr(target, "pid", target))
    except psutil.NoSuchProcess:
        return None


def _exited(item: Any) -> bool:
    """Has ``item`` (Popen or psutil.Process) exited? Reaps it when it is our child."""
    import psutil

    if isinstance(item, subprocess.Popen):
        return item.poll() is not None
    try:
        item.wait(0)
    except psutil.TimeoutExpired:
        return False
    return True


def wait_gone(items: Iterable[Any], timeout_s: float) -> list:
    """Wait up to ``timeout_s`` until every item (Popen or psutil.Process) has exited; returns
    those still running."""
    alive, deadline = list(items), time.monotonic() + timeout_s
    while True:
        alive = [item for item in alive if not _exited(item)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def kill_after(items: Iterable[Any], grace_s: float, kill_wait_s: float = 5.0) -> list:
    """Give ``items`` (Popen or psutil.Process, already told to stop) ``grace_s`` to exit, SIGKILL
    the rest and wait up to ``kill_wait_s`` for them; returns those that had to be killed."""
    import psutil

    alive = wait_gone(items, grace_s)
    for item in alive:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            item.kill()  # psutil: not a pid that was reused meanwhile; Popen: not once reaped
    wait_gone(alive, kill_wait_s)
    return alive


def stop_tree(targets: Iterable[Any], grace_s: float, *, kill_wait_s: float = KILL_WAIT_S,
              tree: bool = True) -> list[int]:
    """SIGTERM each live target (Popen, pid or psutil.Process), wait up to ``grace_s`` for the
    targets and (``tree``) every descendant each had when signalled, SIGKILL what is left, wait
    up to ``kill_wait_s`` for that. Popen targets are reaped. Returns the pids that were killed."""
    import psutil

    watched: list = []
    for target in targets:
        proc = _process(target)
        if proc is None:
            continue
        family = []
        if tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                family = proc.children(recursive=True)
        watched += [target if isinstance(target, subprocess.Popen) else proc, *family]
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    return [item.pid for item in kill_after(watched, grace_s, kill_wait_s)]


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def identity(pid: int) -> list:
    """[pid, start time]: what names one process for good (a pid alone may be reused later)."""
    import psutil

    try:
        return [pid, psutil.Process(pid).create_time()]
    except psutil.NoSuchProcess:
        return [pid, None]


def still(identity_: Sequence) -> bool:
    """The process ``identity`` names still runs (the same pid and start time, not a zombie)."""
    import psutil

    pid, started = identity_
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_groups(leaders: Sequence[int], grace_s: float, *, kill_wait_s: float = 5.0,
                alive: Callable[[int], bool] = running) -> None:
    """SIGTERM the process group of each leader (``start_session``), wait up to ``grace_s`` until
    no leader is ``alive``, else SIGKILL the groups and wait up to ``kill_wait_s``; then reap the
    leaders that are our own children (others are reaped by init)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        for pid in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(alive(p) for p in leaders):
            time.sleep(0.2)
        if not any(alive(p) for p in leaders):
            break
    for pid in leaders:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def sigkill(pids: Iterable[int]) -> None:
    """SIGKILL each pid at once (no grace); those already gone are skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Tee:
    """A process's text output, line by line: appended to ``log_path`` (flushed), echoed to this
    process's stdout (``[prefix] `` before each line when given), its last ``tail_lines`` kept
    (``text``); ``ready`` is set once a line contains ``marker``. ``run`` streams in the calling
    thread until the output ends, ``start`` in a daemon thread (``thread``).

    When the log cannot be written (ENOSPC, EIO) or the output not read (bytes that are not
    UTF-8), ``error`` says why, the process tree is stopped (SIGTERM, SIGKILL after
    ``stop_grace_s``: its cell fails rather than going on unlogged) and the pipe drained meanwhile,
    so the process never blocks on a full pipe and ``run`` ends within ``stop_grace_s`` + a few
    seconds. ``text`` ends with the error. A stdout that cannot be written only stops the echo."""

    def __init__(self, proc: subprocess.Popen, log_path: Path, prefix: str | None = None,
                 marker: str | None = None, tail_lines: int = TAIL_LINES,
                 stop_grace_s: float = TEE_STOP_GRACE_S):
        self.proc, self.log_path, self.prefix, self.marker = proc, Path(log_path), prefix, marker
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.ready = threading.Event()
        self.thread: threading.Thread | None = None
        self.stop_grace_s = stop_grace_s
        self.error: str | None = None
        self._echo = True

    def start(self) -> Tee:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        try:
            log_file = open(self.log_path, "a")
        except OSError as err:
            self._fail(_cannot_write(err, self.log_path))
            return
        try:
            reason = self._stream(log_file)
        finally:
            with contextlib.suppress(OSError):
                log_file.close()  # after ENOSPC its buffer cannot be flushed either
        if reason:
            self._fail(reason)

    def _stream(self, log_file) -> str | None:
        """Copy the output until it ends; why it could not, if so."""
        lines = iter(self.proc.stdout)  # type: ignore[arg-type]
        while True:
            try:
                line = next(lines)
            except StopIteration:
                return None
            except (OSError, ValueError) as err:  # bytes that are not UTF-8, a pipe closed under us
                return f"{type(err).__name__} reading the output logged to {self.log_path}: {err}"
            try:
                log_file.write(line)
                log_file.flush()
            except OSError as err:  # a full disk, an I/O error
                return _cannot_write(err, self.log_path)
            self.tail.append(line)
            self._show(line)
            if self.marker and self.marker in line:
                self.ready.set()

    def _show(self, line: str) -> None:
        if not self._echo:
            return
        try:
            with _ECHO:
                sys.stdout.write(f"[{self.prefix}] {line}" if self.prefix else line)
        except (OSError, ValueError):  # our own stdout (a closed pipe, a full disk): the log keeps it all
            self._echo = False

    def _fail(self, reason: str) -> None:
        """The output cannot be kept: say why, stop the process tree, drain its pipe until it ends."""
        self.error = reason
        log.error("%s; stopping the process (pid %s)", reason, self.proc.pid)
        stop_s = self.stop_grace_s + KILL_WAIT_S  # stop_tree's SIGTERM grace, then its SIGKILL wait
        stopper = threading.Thread(target=stop_tree, args=([self.proc], self.stop_grace_s), daemon=True)
        stopper.start()
        self._drain(time.monotonic() + stop_s + DRAIN_AFTER_S)
        stopper.join(stop_s)

    def _drain(self, deadline: float) -> None:
        """Read and drop the pipe's bytes until its end (every writer gone) or ``deadline``."""
        try:
            fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
            pipe = select.poll()  # not select(): a busy driver's fds may be above 1024
            pipe.register(fd, select.POLLIN)
            while time.monotonic() < deadline:
                if pipe.poll(200) and not os.read(fd, 1 << 16):
                    return
        except (OSError, ValueError):  # the pipe is closed already
            return
        log.warning("the output pipe of pid %s (log %s) is still open after its stop; left undrained",
                    self.proc.pid, self.log_path)

    def join(self, timeout_s: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout_s)

    def text(self) -> str:
        return "".join(self.tail) + (f"[tee] {self.error}\n" if self.error else "")


def _cannot_write(err: OSError, path: Path) -> str:
    """``no space left on device writing <path>``: what the error was, and where."""
    return f"{os.strerror(err.errno).lower() if err.errno else err} writing {path}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` (an address of this machine) right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


_FREE_PORTS = ("import socket, sys; socks = [socket.socket() for _ in range(int(sys.argv[2]))]; "
               "[s.bind((sys.argv[1], 0)) for s in socks]; print(*(s.getsockname()[1] for s in socks))")


def free_ports_on(host: Any, count: int = 1, python: str = sys.executable, timeout_s: float = 30.0) -> list[int]:
    """``count`` different TCP ports free on a launch host now (``host.run``: a tiny Python there
    binds them at once, its own kernel picking them inside its namespace, then releases them)."""
    proc = host.run([python, "-c", _FREE_PORTS, host.address, str(count)], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"could not find {count} free port(s) on {host.name}: {err.strip()}")
    return [int(port) for port in out.split()]


def free_port_on(host: Any, python: str = sys.executable, timeout_s: float = 30.0) -> int:
    """A TCP port free on a launch host right now (``free_ports_on``)."""
    return free_ports_on(host, 1, python, timeout_s)[0]


def run_to_end(cmd: list[str], env, log_path: Path, *, what: str, grace_s: float,
               cwd: Path | None = None, started: Callable[[subprocess.Popen], None] | None = None) -> None:
    """Run a launcher to completion, teeing its output to ``log_path`` (and stdout); raise with its
    tail when it exits non-zero, or with the reason when its log cannot be written (``Tee``: the
    launcher is stopped within ``grace_s``). Interrupted (a signal's exception), it stops the launcher's tree
    within ``grace_s``; killed outright, the launcher gets SIGTERM from the kernel (its stop of its
    ranks). ``what`` names it in the error; ``started(proc)`` is called once it runs."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("launching: %s", " ".join(cmd))
    # PR_SET_PDEATHSIG: a SIGKILLed driver takes its launcher (and the launcher its ranks) down
    # errors="replace": a stray byte that is not UTF-8 is shown as such, not a reason to stop the launcher
    with subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # noqa: PLW1509
                          stdin=subprocess.DEVNULL, text=True, errors="replace",
                          preexec_fn=_die_with_parent) as proc:
        tee = Tee(proc, log_path, stop_grace_s=grace_s)
        try:
            if started is not None:
                started(proc)
            tee.run()  # ends when the output does, or (its log unwritable) with the launcher stopped
            proc.wait()
        finally:
            if proc.poll() is None:  # we are being interrupted: take the launcher (and ranks) down
                stop_tree([proc], grace_s)
    if tee.error:  # even an exit 0: what it did is not in its log
        raise RuntimeError(f"{what} was stopped: {tee.error} (exit code {proc.returncode}); "
                           f"last lines:\n{tee.text()}")
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited with {proc.returncode} (full log: {log_path}); "
                           f"last lines:\n{tee.text()}")
