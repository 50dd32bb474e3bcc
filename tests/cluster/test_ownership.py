"""Ownership proved before any signal or removal: a process is its PID *and* its start time, so a
PID reused by another process is never mistaken for the owner (the sweep, the keeper's stop), and
the host lock lives in a folder only its user can write."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipelines.cluster import leftovers, lifecycle
from pipelines.measure import attempts
from pipelines.runfolder.paths import RunPaths



def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.skipif(os.geteuid() != 0, reason="ip netns needs root")
def test_the_sweep_removes_what_an_owner_with_a_reused_pid_left_and_nothing_else():
    """Three namespaces: one of this live process (kept), one that names this PID with another start
    (the owner died and its PID was reused: removed), one not of ours (never touched)."""
    me, start = os.getpid(), leftovers.process_start(os.getpid())
    live, reused, foreign = f"{leftovers.owner_prefix()}-own-h0", f"bmc{me}s{start + 1}-own-h0", "bmctest-foreign"
    for ns in (live, reused, foreign):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        swept = leftovers.sweep()
        left = set(leftovers.list_netns())
        assert reused in swept and reused not in left
        assert live in left and live not in swept and foreign in left
    finally:
        for ns in (live, reused, foreign):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_the_owner_of_a_name_is_its_pid_and_start():
    prefix = leftovers.owner_prefix()
    assert prefix == f"bmc{os.getpid()}s{leftovers.process_start(os.getpid())}"
    assert leftovers.owner_pid(f"{prefix}-c-h1") == os.getpid()
    assert not leftovers._owner_is_dead(f"{prefix}-c-h1", leftovers.OWNER_PATTERN)
    assert leftovers._owner_is_dead(f"bmc{os.getpid()}s1-c-h1", leftovers.OWNER_PATTERN)  # reused pid
    assert not leftovers._owner_is_dead("bmc123-old-style", leftovers.OWNER_PATTERN)  # not our form: untouched


def test_stop_never_signals_a_process_that_only_has_the_keepers_pid(tmp_path):
    """The state names the keeper by pid and start; a live process with that pid but another start
    (the keeper died, its pid was reused) is left alone."""
    other = _sleeper()
    try:
        paths = RunPaths(tmp_path / "run")
        paths.cluster.mkdir(parents=True)
        start = leftovers.process_start(other.pid)
        from pipelines.cluster.processes import identity

        pid, created = identity(other.pid)
        lifecycle.state_file(paths).write_text(json.dumps(
            {"status": "ready", "keeper_pid": pid, "keeper": [pid, created + 1000.0], "prefix": f"bmc{pid}s{start}"}))
        assert not lifecycle.is_running(paths)
        lifecycle.stop(paths)
        assert other.poll() is None, "a process with the keeper's pid but another start was signalled"
    finally:
        other.kill()
        other.wait()


def test_the_host_lock_lives_in_a_folder_only_its_user_can_write(tmp_path, monkeypatch):
    folder = tmp_path / "lockdir"
    monkeypatch.setattr(attempts, "DEFAULT_LOCK", str(folder / "host.lock"))
    monkeypatch.delenv("BENCHMARK_HOST_LOCK", raising=False)
    with attempts.host_lock():
        pass
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    folder.chmod(0o777)  # someone made it writable by all: refused, with the fix
    with pytest.raises(PermissionError, match=r"no one else can write .*remove it"):
        with attempts.host_lock():
            pass
    folder.chmod(0o700)
    (folder / "host.lock").unlink()
    (folder / "host.lock").symlink_to(tmp_path / "elsewhere")  # a link planted in its place: never followed
    with pytest.raises(OSError):
        with attempts.host_lock():
            pass
    assert not (tmp_path / "elsewhere").exists()
