"""Starting and entering the run's network namespace (``pipelines.cluster.netns``): two callers at
once start one holder (the run's lock), and a command enters the namespace through a descriptor this
process holds, never by the holder's pid, so a pid that names another process later is not joined.
Real holders, real namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.cluster import netns
from pipelines.cluster.processes import identity, stop_tree
from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths

pytestmark = pytest.mark.skipif(netns.run_problem() is not None, reason="no run network namespace here")
# a caller in a process of its own: waits for the agreed instant, then ensure_run; says what it entered
CALLER = """
import subprocess, sys, time
from pathlib import Path
from pipelines.cluster import netns
from pipelines.runfolder.paths import RunPaths
netns.run_problem()  # its probe first, so both callers reach ensure_run at the same instant
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
where = netns.ensure_run(RunPaths(Path(sys.argv[1])))
print(subprocess.run([*where.prefix, "readlink", "/proc/self/ns/net"], capture_output=True, text=True).stdout.strip())
"""


def _holders_of(paths: RunPaths) -> list[int]:
    return [pid for pid, folder in netns.holders() if folder == netns.run_folder(paths).resolve()]


def test_two_callers_at_once_start_one_holder(tmp_path):
    paths = RunPaths(tmp_path / "run")
    at = time.time() + 6.0  # both are up and probed by then, on a loaded 2-core machine
    callers = [subprocess.Popen([sys.executable, "-c", CALLER, str(paths.root), repr(at)], cwd=PROJECT_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        said = [caller.communicate(timeout=120) for caller in callers]
        assert all(caller.returncode == 0 for caller in callers), said
        assert time.time() > at, "the callers did not meet at the agreed instant"
        holders = _holders_of(paths)
        assert len(holders) == 1, f"two holders started: {holders}"
        assert said[0][0].strip() == said[1][0].strip() == netns.run_state(paths)["netns"] == netns.of_process(holders[0])
        lock = netns.run_folder(paths) / "lock"
        assert lock.stat().st_mode & 0o777 == 0o600 and netns.run_folder(paths).stat().st_mode & 0o777 == 0o700
    finally:
        for caller in callers:
            caller.kill()
        netns.stop_run(paths)
        stop_tree(_holders_of(paths), 1.0, tree=False)


def test_a_link_planted_as_the_lock_is_refused(tmp_path):
    paths = RunPaths(tmp_path / "run")
    netns.run_folder(paths).mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (netns.run_folder(paths) / "lock").symlink_to(victim)
    with pytest.raises(OSError):  # O_NOFOLLOW: ELOOP, no holder started
        netns.ensure_run(paths)
    assert victim.read_text() == "kept" and netns.run_state(paths) is None and not _holders_of(paths)


def _start_with_pid(pid: int, argv: list[str], tries: int = 50) -> subprocess.Popen | None:
    """``argv`` started as process ``pid`` (a pid reused for real: the kernel's next pid set to it,
    as root), or None when other processes kept taking it first."""
    for _ in range(tries):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(argv)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="root: sets the kernel's next pid to reuse the holder's")
def test_a_holders_pid_reused_by_another_process_is_never_joined(tmp_path):
    paths = RunPaths(tmp_path / "run")
    where = netns.ensure_run(paths)
    found = netns.run_state(paths)
    holder = found["identity"][0]
    try:
        # a pid is reused after the kernel wrapped its pid counter, never within the clock tick
        # (10 ms) its first process started in; here it is reused at once, so let a few ticks pass
        # first, or the decoy could carry the holder's very start time (flaky on an idle machine)
        time.sleep(0.05)
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)  # our child: reaped, its pid free
        # its pid now names a process of another network namespace (what a reused pid is, as root)
        decoy = _start_with_pid(holder, [*netns.own("a decoy", allow_unisolated=False).prefix, "sleep", "60"])
        assert decoy is not None, "could not reuse the holder's pid"
        try:
            deadline = time.monotonic() + 10
            while netns.of_process(decoy.pid) in (None, netns.of_process(os.getpid())) and time.monotonic() < deadline:
                time.sleep(0.02)  # until unshare made its namespace
            assert netns.of_process(decoy.pid) not in (found["netns"], netns.of_process(os.getpid()))
            # the prefix made while the holder ran: refused as it starts, not run in the decoy's namespace
            late = subprocess.run([*where.prefix, "readlink", "/proc/self/ns/net"], check=False, capture_output=True,
                                  text=True, timeout=30)
            assert late.returncode != 0 and "is gone" in late.stderr and not late.stdout, late
            with pytest.raises(netns.NamespaceGone):  # a new lookup: its pid, another start
                netns.enter(found)
            # a record naming the decoy as it is now (pid and start): not the recorded namespace, refused
            named = netns.enter({**found, "identity": identity(decoy.pid)})
            wrong = subprocess.run([*named.prefix, "true"], check=False, capture_output=True, text=True, timeout=30)
            assert wrong.returncode != 0 and "is gone" in wrong.stderr, wrong
        finally:
            decoy.kill()
            decoy.wait()
    finally:
        netns.stop_run(paths)
