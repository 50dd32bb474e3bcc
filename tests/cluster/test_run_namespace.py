"""The run's network namespace (``pipelines.cluster.netns``): what the run keeps standing on this host
and the drivers that use it share one loopback, which nothing outside reaches; stopping it stops
everything in it, and a signal only ever goes to a process proven to be the holder or in its namespace.
Real namespaces, real processes (the standing clusters in it: tests/platforms/test_lifetimes.py,
spark/test_spark_dataframe.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from pipelines.cluster import netns
from pipelines.cluster.processes import identity
from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE, listening
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths

pytestmark = pytest.mark.skipif(netns.run_problem() is not None, reason="no run network namespace here")
LISTEN = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); "
          "print(s.getsockname()[1], flush=True); time.sleep(120)")
CONNECT = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()"


def _host_addresses() -> set[str]:
    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited, its parent not yet told
    except psutil.NoSuchProcess:
        return True


def test_a_listener_in_the_runs_namespace_answers_there_only_and_stops_with_it(tmp_path):
    paths = RunPaths(tmp_path / "run")
    where = netns.ensure_run(paths)
    # entered through a descriptor proved to be the holder's namespace (tests/cluster/test_run_namespace_entry.py)
    assert where.kind == "run" and where.prefix[:2] == ("/bin/sh", "-c") and "nsenter" in where.prefix[2]
    assert netns.ensure_run(paths) == where  # idempotent: the same namespace for every later driver
    listener = where.run([sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)
    try:
        port = int(listener.stdout.readline())
        assert netns.of_process(listener.pid) == netns.run_state(paths)["netns"] != netns.of_process(os.getpid())
        assert listening([listener.pid]) == {listener.pid: {f"0.0.0.0:{port}{LOOPBACK_ONLY_NAMESPACE}"}}
        inside = subprocess.run([*where.prefix, sys.executable, "-c", CONNECT, str(port)], capture_output=True,
                                text=True, timeout=30)
        assert inside.returncode == 0, inside.stderr  # a driver entering the namespace reaches it
        for address in _host_addresses():  # every interface of this host: refused
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=5).close()
        holder = netns.run_state(paths)["identity"][0]
        stopped = netns.stop_run(paths)
        assert listener.pid in stopped and holder in stopped and listener.wait(15) is not None
        assert netns.run_state(paths) is None and _gone(holder)
        assert netns.stop_run(paths) == []  # nothing recorded any more: nothing to stop
    finally:
        listener.kill()
        netns.stop_run(paths)


def test_the_holder_is_never_signalled_once_its_pid_names_another_process(tmp_path):
    """Ownership by pid and start time: a recorded holder whose pid now belongs to another process
    (PID reuse, here a process with the same pid and another start) is not stopped, nor is anything
    in that process's namespace."""
    paths = RunPaths(tmp_path / "run")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid, started = identity(bystander.pid)
        netns.run_folder(paths).mkdir(parents=True)
        atomic_write_json(netns.run_folder(paths) / "state.json", {
            "identity": [pid, started - 5.0], "netns": netns.of_process(pid), "user": False, "started": started})
        assert not netns.running(paths)
        assert netns.stop_run(paths) == [] and bystander.poll() is None
        with pytest.raises(netns.NamespaceGone, match="is not running"):
            netns.enter({"identity": [pid, started - 5.0], "netns": "net:[1]", "user": False})
    finally:
        bystander.kill()
        bystander.wait()


def test_the_sweep_stops_a_finished_runs_namespace_and_keeps_a_running_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(netns, "SWEEP_MIN_AGE_S", 0.0)
    done, live = RunPaths(tmp_path / "done"), RunPaths(tmp_path / "live")
    try:
        left = netns.ensure_run(done).run([sys.executable, "-c", "import time; time.sleep(120)"])
        netns.ensure_run(live)
        holder = netns.run_state(done)["identity"][0]
        time.sleep(0.05)
        done.summary.parent.mkdir(parents=True)
        done.summary.write_text("{}")  # the run finished: its report is newer than its namespace
        swept = netns.sweep()
        assert {left.pid, holder} <= set(swept) and left.wait(15) is not None
        assert netns.running(live) and netns.run_state(live)["identity"][0] not in swept
    finally:
        netns.stop_run(done)
        netns.stop_run(live)


def test_a_user_who_is_not_root_gets_the_runs_namespace_too():
    """Not root (the compose stack's Celery workers, a user's own machine): the holder gets a user
    namespace with its own network (``unshare -rn``) and drivers enter both (``nsenter -U -n``)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("setpriv as root: runs as nobody; /usr/bin/python3 for the listener")
    folder = Path(tempfile.mkdtemp(prefix="netns-nobody-"))
    os.chown(folder, 65534, 65534)
    # the listener is the system's Python: this machine's venv Python lives under /root, which a user
    # namespace's root cannot search
    script = f"""
import subprocess, sys
from pipelines.cluster import netns
from pipelines.runfolder.paths import RunPaths
paths = RunPaths({str(folder / 'run')!r})
where = netns.ensure_run(paths)
print(where.prefix[-2], flush=True)  # the namespaces it enters
proc = where.run(["/usr/bin/python3", "-c", {LISTEN!r}], stdout=subprocess.PIPE, text=True)
print(proc.stdout.readline().strip(), proc.pid, flush=True)
sys.stdin.readline()
print(len(netns.stop_run(paths)), flush=True)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOME", "XDG"))}
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                             script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**env, "HOME": str(folder)}, cwd=PROJECT_ROOT)
    try:
        prefix = proc.stdout.readline().split()
        assert prefix == ["net+user"], prefix  # its user namespace too, entered by nsenter with its network
        port, pid = (int(x) for x in proc.stdout.readline().split())
        assert psutil.Process(pid).uids().real == 65534
        assert listening([pid]) == {pid: {f"0.0.0.0:{port}{LOOPBACK_ONLY_NAMESPACE}"}}
        for address in _host_addresses():
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=5).close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 2  # the listener and the holder
        assert proc.wait(30) == 0
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            p.kill()
        proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(netns.own_problem() is not None, reason="no namespace of its own here")
def test_what_a_driver_leaves_in_its_own_namespace_is_stopped_once_it_exits():
    """A per-job cluster's driver runs in a namespace of its own (pipelines/platforms/driver.py): held open
    (``pin``) from its start, so after it exits its inode still names it alone, and what it left there (an
    orphan in a session of its own, as a Ray agent) is stopped; nothing outside it is touched."""
    where = netns.own()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "start_new_session=True); print(p.pid, flush=True)")
    driver = where.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    fd = netns.pin(driver.pid)
    try:
        assert fd is not None
        orphan = int(driver.stdout.readline())
        assert driver.wait(30) == 0 and not _gone(orphan)  # the driver is gone, what it started is not
        assert netns.members(f"net:[{os.fstat(fd).st_ino}]") == [orphan]
        assert netns.stop_pinned(fd) == [orphan] and _gone(orphan)
        fd = None
        assert bystander.poll() is None  # in this host's namespace: never a member
    finally:
        if fd is not None:
            os.close(fd)
        bystander.kill()
        bystander.wait()
