"""pipelines.cluster.tree_guard with real processes: a launcher that dies of SIGTERM without passing it on
(as DeepSpeed's runner does) takes its children down through the guard; what a launcher leaves running
when it exits is stopped; the guard exits with the command's status."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

GUARD = [sys.executable, "-m", "pipelines.cluster.tree_guard", "--grace-s", "5", "--"]
# a launcher that starts a child and dies of SIGTERM (Python's default) without stopping it
LAUNCHER = ("import subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '300'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(300)\n")


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.time() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.1)


def test_sigterm_to_the_guard_stops_the_children_the_launcher_would_leave():
    with subprocess.Popen([*GUARD, sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True) as guard:
        child = int(guard.stdout.readline())
        try:
            guard.terminate()  # what the kernel sends when the driver dies (PR_SET_PDEATHSIG)
            assert guard.wait(30) == 128 + 15
            assert _gone(child, 10), "the launcher's child outlived the guard's stop"
        finally:
            if not _gone(child, 0):
                psutil.Process(child).kill()


def test_what_the_launcher_leaves_running_when_it_exits_is_stopped_and_its_status_kept():
    out = subprocess.run([*GUARD, "sh", "-c", "sleep 300 & echo $!; exit 3"], capture_output=True, text=True,
                         timeout=60)
    orphan = int(out.stdout.split()[0])
    assert out.returncode == 3
    assert "leaving 1 process(es) running" in out.stderr
    assert _gone(orphan, 10), "the launcher's orphan (re-parented to the guard) was not stopped"


@pytest.mark.parametrize("argv", [[], ["--"]])
def test_no_command_is_refused_by_name(argv):
    out = subprocess.run([*GUARD[:-1], *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no command to guard" in out.stderr
