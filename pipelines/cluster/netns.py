"""Loopback-only network namespaces for what a run starts on this host: a cell's own, and the run's.

A one-host cell's processes listen on every interface (torch's rendezvous store, a platform's
coordinator, node daemons and workers, a trial's chief sockets); in a network namespace whose only
interface is loopback, nothing outside it reaches them.

- **A cell's own** (``own()``): ``unshare --net`` (root) or ``unshare --user --map-root-user --net``
  (any other user: its own user namespace, as ``unshare -rn``) before the command, loopback brought
  up; everything the command starts lives in it, and it ends with its last process. Used for a
  torchrun (or a platform's own launcher) on one host and for a driver whose cluster is the cell's
  own (a per-job cluster, a local mode without one: ``pipelines.platforms.driver``).
- **The run's** (``ensure_run(paths)``): one that outlives any process, for what the run keeps
  standing on this host (the data stage's embedded cluster, a platform's standing cluster) and
  every driver that uses it (the data stage's tokenization, a standing cell's driver): a cluster and
  its drivers must share one loopback. A holder process keeps it (``<run>/netns/state.json``: its
  pid, start time and namespace; started under ``<run>/netns/lock``, so two callers never start two); ``Namespace.prefix``
  enters it with ``nsenter`` through a descriptor of the namespace opened while the holder is proved
  alive and whose inode is checked, as each command starts (never by pid: a reused pid is not joined);
  ``stop_run`` stops every process in it, then the holder. Ownership is proved before any signal:
  the holder by pid + start time, the processes stopped by being in its namespace.

Where neither works (a container whose seccomp profile refuses unshare or setns, user namespaces
turned off), ``own_problem`` / ``run_problem`` say why; preflight then refuses one-host cells unless
``cluster.allow_unisolated_cells`` (they would listen on every interface of this host), and at launch
``own()`` / ``ensure_run()`` fail closed (``pipelines.cluster.isolation``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.cluster import netns_entry
from pipelines.cluster.leftovers import process_start
from pipelines.cluster.isolation import HOST, NONE, OWN, RUN, place, unless_allowed
from pipelines.cluster.processes import identity, start_session, still, stop_tree
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.locks import locked
from pipelines.runfolder.paths import RunPaths

log = logging.getLogger(__name__)
# unshare(1) makes the namespace, sh brings lo up, then execs the command (same pid), so everything
# it starts lives in it. Not root: inside a user namespace of its own (this user mapped to root there).
_LOOPBACK_UP = ("/bin/sh", "-c", 'ip link set lo up && exec "$@"', "sh")
_UNSHARE_ROOT = ("unshare", "--net", "--", *_LOOPBACK_UP)
_UNSHARE_USER = ("unshare", "--user", "--map-root-user", "--net", "--", *_LOOPBACK_UP)
# the holder: a shell that says it is in, then sleeps for good (no Python: a user namespace's root may
# not reach this user's interpreter); HOLDER_ENV in its environment names the run's netns folder
HOLDER_ENV = "PIPELINES_RUN_NETNS"
_HOLD = ("/bin/sh", "-c", "echo ready && exec sleep infinity")
HOLDER_START_S = 30.0
STOP_GRACE_S = 10.0
SWEEP_MIN_AGE_S = 60.0  # a holder younger than this may still be being recorded by ensure_run
LOCK_WAIT_S = 120.0  # another caller holds the run's lock at most a holder's start and a sweep


class NamespaceGone(RuntimeError):
    """The run's namespace is recorded but its holder is not running any more."""


@dataclass(frozen=True)
class Namespace:
    """Where a process runs: ``kind`` "own" (a namespace of its own), "run" (the run's) or "host"
    (this host's: nothing isolated); ``prefix``: the command prefix that puts it there;
    ``not_isolated``: why this host's, where a namespace was wanted but could not be made."""

    kind: str
    prefix: tuple[str, ...] = ()
    address: str = "127.0.0.1"  # what its processes bind to (a launch host's interface, for free_ports_on)
    not_isolated: str | None = None

    @property
    def name(self) -> str:
        return {"own": "a network namespace of its own", "run": "the run's network namespace"}.get(
            self.kind, "this host's network namespace")

    @property
    def isolation(self) -> str:  # the result's (pipelines.cluster.isolation)
        return NONE if self.not_isolated else {"own": OWN, "run": RUN}.get(self.kind, HOST)

    def run(self, argv: list[str], env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` there (``pipelines.cluster.processes.free_ports_on`` asks it for ports)."""
        return subprocess.Popen([*self.prefix, *argv], env=env, **popen_kwargs)


def _probe(cmd: tuple[str, ...]) -> str | None:
    """None when ``cmd true`` runs, else what it said."""
    try:
        out = subprocess.run([*cmd, "true"], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    return None if out.returncode == 0 else (out.stderr.strip() or f"exit code {out.returncode}")


_WORKED: set[tuple] = set()  # the setups (tools found, user) whose probe passed; a refusal is tried again


def _setup(*tools: str) -> tuple:
    return (*(shutil.which(tool) for tool in tools), os.geteuid())


def own_problem() -> str | None:
    """Why no command can get a namespace of its own here, or None. A pass is kept (for the tools
    on PATH then); a refusal or a time-out is tried again next time (it may have been the load)."""
    setup = _setup("unshare", "ip")
    if setup in _WORKED:
        return None
    missing = [tool for tool, found in zip(("unshare", "ip"), setup) if found is None]
    if missing:
        return f"{' and '.join(missing)} not installed (util-linux, iproute2)"
    root = os.geteuid() == 0
    said = _probe(_UNSHARE_ROOT if root else _UNSHARE_USER)
    if said is None:
        _WORKED.add(setup)
        return None
    how = "unshare --net as root" if root else "unshare --user --net (a user namespace: not root)"
    return f"{how} was refused: {said}"


def own_prefix() -> tuple[str, ...]:
    """The prefix that gives a command a loopback-only namespace of its own; () where impossible."""
    if own_problem():
        return ()
    return _UNSHARE_ROOT if os.geteuid() == 0 else _UNSHARE_USER


def _placed(where: Namespace) -> Namespace:
    place(where.isolation)
    return where


def _exposed(what: str, problem: str, allow_unisolated: bool | None) -> Namespace:
    """This host's namespace for ``what``, which could get none of its own: ``NotIsolated`` unless allowed."""
    unless_allowed(what, problem, allow_unisolated)
    return _placed(Namespace("host", not_isolated=problem))


def own(what: str = "the cell", allow_unisolated: bool | None = None) -> Namespace:
    """A namespace of its own for a command. Where none can be made: ``NotIsolated`` with the
    reason, or this host's (warned, ``NONE``) when ``allow_unisolated`` (None: as the cell being run
    says, ``isolation.isolating``; no cell: refused)."""
    problem = own_problem()
    if problem:
        return _exposed(what, problem, allow_unisolated)
    return _placed(Namespace("own", own_prefix()))


def host(not_isolated: str | None = None) -> Namespace:
    """This host's namespace: for a driver that reaches a cluster over the network; ``not_isolated``:
    why, where a namespace was wanted (a cluster started exposed: ``NONE``)."""
    return _placed(Namespace("host", not_isolated=not_isolated))


def of_process(pid: int) -> str | None:
    """The network namespace ``pid`` is in ("net:[inode]"), or None once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def members(netns: str, exclude: set[int] = frozenset()) -> list[int]:
    """This user's processes in the network namespace ``netns`` (``of_process``), but ``exclude``."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            if entry.stat().st_uid == os.getuid() and os.readlink(f"{entry.path}/ns/net") == netns:
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def stop_members(netns: str | None, grace_s: float = STOP_GRACE_S, exclude: set[int] = frozenset()) -> list[int]:
    """Stop every process left in ``netns``, a namespace only this project's processes entered and
    that something keeps alive meanwhile (its holder, or a ``pin``), so that its inode names it
    alone: SIGTERM, SIGKILL after ``grace_s``; the pids. Never this process's own namespace."""
    if not netns or netns == of_process(os.getpid()):
        return []
    left = members(netns, exclude)
    stop_tree(left, grace_s, tree=False)
    return left


def pin(pid: int, timeout_s: float = 5.0) -> int | None:
    """An open descriptor of the network namespace that ``pid``, just started under ``own()``'s
    prefix, enters (waited for until it is not this process's), or None when ``pid`` exits first.
    While it is open the namespace lives on, even empty, so no other namespace can take its inode:
    ``stop_pinned`` stops only what is proved to be in it."""
    mine = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        if os.fstat(fd).st_ino != mine:
            return fd
        os.close(fd)
        time.sleep(0.005)
    return None


def stop_pinned(fd: int, grace_s: float = STOP_GRACE_S) -> list[int]:
    """Stop every process left in the namespace ``fd`` holds (``pin``), then let the namespace go."""
    try:
        return stop_members(f"net:[{os.fstat(fd).st_ino}]", grace_s)
    finally:
        os.close(fd)


# --- the run's namespace ------------------------------------------------------------------------

def run_folder(paths) -> Path:
    return Path(paths.root) / "netns"


def run_state(paths) -> dict | None:
    try:
        return json.loads((run_folder(paths) / "state.json").read_text())
    except (OSError, ValueError):
        return None


def running(paths) -> bool:
    found = run_state(paths)
    return bool(found) and still(found["identity"])


def _enter(found: dict) -> Namespace:
    pid = found["identity"][0]
    start = process_start(pid)  # read while the holder is proved to run (before and after)
    if start is None or not still(found["identity"]):
        raise NamespaceGone(f"the run's network namespace is gone: its holder (pid {pid}) is not running")
    if of_process(os.getpid()) == found["netns"]:
        return Namespace("run")
    return Namespace("run", netns_entry.prefix(pid, start, found["netns"], found["user"]))


def enter(found: dict) -> Namespace:
    """The run's namespace ``found`` (``run_state``) as a place to run a command: ``nsenter`` into
    its holder's namespace (with its user namespace when not root), proved as each command starts
    (``pipelines.cluster.netns_entry``); no prefix from inside it. ``NamespaceGone`` once its holder is not running."""
    return _placed(_enter(found))


def _start_holder(folder: Path, tied: bool) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), HOLDER_ENV: str(folder)}
    proc = start_session([*own_prefix(), *_HOLD], die_with_parent=tied, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], HOLDER_START_S)
    line = proc.stdout.readline() if ready else ""
    proc.stdout.close()  # it says nothing more
    if line.strip() != "ready":
        stop_tree([proc], 1.0)
        raise RuntimeError(f"the run's network namespace did not start: {line.strip() or 'no answer'}")
    return proc


def run_problem() -> str | None:
    """Why the run's namespace cannot be made and entered here, or None (a holder is started,
    entered with ``true``, and stopped). A pass is kept, a refusal tried again (``own_problem``)."""
    problem = own_problem()
    if problem:
        return problem
    setup = _setup("unshare", "ip", "nsenter")
    if setup in _WORKED:
        return None
    if setup[2] is None:
        return "nsenter not installed (util-linux)"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="netns-probe-") as folder:
        holder = _start_holder(Path(folder), tied=True)
        found = {"identity": identity(holder.pid), "netns": of_process(holder.pid), "user": os.geteuid() != 0}
        try:
            said = _probe(_enter(found).prefix)
        except NamespaceGone as err:
            said = str(err)
        finally:
            stop_tree([holder], 1.0)
    if said is None:
        _WORKED.add(setup)
        return None
    return f"nsenter into a namespace of this user's was refused: {said}"


def ensure_run(paths, tied_to_caller: bool = False, allow_unisolated: bool | None = None) -> Namespace:
    """The run's namespace, started if none runs (idempotent; under the run's lock, so concurrent
    callers share one holder). Where it cannot be made or entered here: ``NotIsolated`` with the
    reason, or this host's (warned, ``NONE``) when ``allow_unisolated`` (None: as the cell being run
    says, ``isolating``). ``tied_to_caller``: it ends with this process (the CLI); else it outlives it
    until ``stop_run`` (the DAG's teardown)."""
    found = run_state(paths)
    if found and still(found["identity"]):
        return enter(found)
    problem = run_problem()
    if problem:
        return _exposed("the run's standing clusters", problem, allow_unisolated)
    folder = run_folder(paths)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with locked(folder / "lock", LOCK_WAIT_S):
        found = run_state(paths)
        if found and still(found["identity"]):  # another caller started it while we waited
            return enter(found)
        _stop_run(paths)  # what a dead holder left
        swept = sweep()
        if swept:
            log.warning("stopped %d process(es) left in the namespaces of finished runs: %s", len(swept), swept)
        holder = _start_holder(folder.resolve(), tied_to_caller)
        found = {"identity": identity(holder.pid), "netns": of_process(holder.pid), "user": os.geteuid() != 0,
                 "started": time.time()}
        atomic_write_json(folder / "state.json", found)
    log.info("the run's network namespace is up (%s, holder pid %d)", found["netns"], holder.pid)
    return enter(found)


def stop_run(paths) -> list[int]:
    """Stop every process in the run's namespace, then its holder; the pids stopped."""
    if run_state(paths) is None:
        return []
    with locked(run_folder(paths) / "lock", LOCK_WAIT_S):
        return _stop_run(paths)


def _stop_run(paths) -> list[int]:
    found = run_state(paths)
    if found is None:
        return []
    (run_folder(paths) / "state.json").unlink(missing_ok=True)
    if not still(found["identity"]):  # never signal a pid that is no longer the holder
        return []
    holder = found["identity"][0]
    stopped = stop_members(found["netns"], exclude={holder})
    stop_tree([holder], STOP_GRACE_S, tree=False)
    if stopped:
        log.info("the run's network namespace: stopped %d process(es) left in it", len(stopped))
    return [*stopped, holder]


def holder_folder(pid: int) -> Path | None:
    """The run's netns folder a namespace holder names (``HOLDER_ENV``), or None: not a holder of
    this user's (or gone)."""
    try:
        if Path(f"/proc/{pid}").stat().st_uid != os.getuid():
            return None
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    mark = f"{HOLDER_ENV}=".encode()
    found = next((item[len(mark):] for item in environ if item.startswith(mark)), None)
    return Path(found.decode(errors="replace")) if found else None


def holders() -> list[tuple[int, Path]]:
    """(pid, run's netns folder) of this user's namespace holders on this host."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (folder := holder_folder(int(entry.name))) is not None:
            out.append((int(entry.name), folder))
    return out


def sweep() -> list[int]:
    """Stop the namespaces (every process in them, and the holder) that no run records any more, or
    whose run has finished (its report/summary.json is newer than the namespace); the pids."""
    stopped = []
    for pid, folder in holders():
        mark = identity(pid)
        if mark[1] is None or time.time() - mark[1] < SWEEP_MIN_AGE_S:
            continue
        try:
            found = json.loads((folder / "state.json").read_text())
        except (OSError, ValueError):
            found = None
        summary = RunPaths(folder.parent).summary
        recorded = found is not None and found["identity"] == mark
        finished = recorded and summary.exists() and summary.stat().st_mtime > found.get("started", 0)
        if recorded and not finished:
            continue
        netns = of_process(pid)
        if still(mark):  # the same process, checked again right before any signal
            stopped += stop_members(netns, exclude={pid})
            stop_tree([pid], STOP_GRACE_S, tree=False)
            stopped.append(pid)
    return stopped
