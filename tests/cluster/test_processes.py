"""pipelines.cluster.processes: start, stop-then-kill, tee and free ports, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from pipelines.cluster import processes

# a parent that forwards nothing and a child that ignores SIGTERM: only SIGKILL ends the child
STUBBORN_TREE = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
                 "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
                 "time.sleep(60)'], stdout=subprocess.PIPE, text=True); c.stdout.readline(); "
                 "print(c.pid, flush=True); time.sleep(60)")


def _stubborn_tree() -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", STUBBORN_TREE], stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())


def test_stop_tree_kills_what_is_left_of_the_tree_after_the_grace():
    parent, child = _stubborn_tree()
    try:
        start = time.monotonic()
        killed = processes.stop_tree([parent], grace_s=0.5)
        assert 0.5 <= time.monotonic() - start < 10
        assert parent.returncode == -signal.SIGTERM  # the Popen is reaped with its real exit code
        assert killed == [child] and not processes.running(child)
    finally:
        for pid in (parent.pid, child):
            processes.sigkill([pid])
        parent.wait(5)


def test_stop_tree_without_tree_signals_only_the_targets():
    parent, child = _stubborn_tree()
    try:
        assert processes.stop_tree([parent.pid], grace_s=5.0, tree=False) == []  # SIGTERM was enough
        assert processes.running(child)  # not a target: left alone
        assert processes.stop_tree([child], grace_s=0.3, tree=False) == [child]  # ignores SIGTERM
        assert not processes.running(child)
    finally:
        processes.sigkill([parent.pid, child])
        parent.wait(5)


def test_kill_after_and_gone_targets():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(10)
    assert processes.stop_tree([done, 2**22 + 12345], grace_s=0.1) == []  # exited / no such pid: nothing
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert processes.kill_after([sleeper], grace_s=0.2) == [sleeper]  # no SIGTERM first: killed
    assert sleeper.returncode == -signal.SIGKILL


def test_stop_groups_sigkills_the_group_when_its_leader_outlives_the_grace():
    # leader and child both ignore SIGTERM (the shell's ignored disposition is inherited)
    leader = processes.start_session(["/bin/sh", "-c", 'trap "" TERM; sleep 60 & echo $!; wait'],
                                     stdout=subprocess.PIPE, text=True)
    try:
        child = int(leader.stdout.readline())
        assert os.getpgid(child) == os.getpgid(leader.pid) == leader.pid != os.getpgrp()
        start = time.monotonic()
        processes.stop_groups([leader.pid], grace_s=0.5, kill_wait_s=5.0)
        assert time.monotonic() - start >= 0.5
        assert leader.poll() is not None  # reaped by stop_groups (so Popen sees no exit code)
        deadline = time.monotonic() + 5
        while processes.running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes.running(child)  # the group's SIGKILL reached it too
    finally:
        processes.sigkill([leader.pid])
        leader.wait(5)


def test_tee_writes_the_log_echoes_with_a_prefix_and_keeps_the_tail(tmp_path, capsys):
    proc = subprocess.Popen([sys.executable, "-c", "for i in range(50): print('line', i)\nprint('READY')"],
                            stdout=subprocess.PIPE, text=True)
    tee = processes.Tee(proc, tmp_path / "out.log", prefix="h0", marker="READY", tail_lines=3).start()
    assert tee.ready.wait(10)
    tee.join(10)
    proc.wait(10)
    assert (tmp_path / "out.log").read_text().splitlines()[:2] == ["line 0", "line 1"]
    assert tee.text() == "line 48\nline 49\nREADY\n"
    assert "[h0] line 7\n" in capsys.readouterr().out


def test_free_ports_here_and_on_a_host():
    assert 0 < processes.free_port() < 65536
    host = SimpleNamespace(name="here", address="127.0.0.1", run=lambda argv, **kw: subprocess.Popen(argv, **kw))
    ports = processes.free_ports_on(host, 3)
    assert len(set(ports)) == 3 and 0 < processes.free_port_on(host) < 65536
    broken = SimpleNamespace(name="nowhere", address="203.0.113.1", run=host.run)  # not an address of ours
    with pytest.raises(RuntimeError, match="could not find 1 free port"):
        processes.free_port_on(broken)


def test_an_identity_names_one_process_for_good():
    """pid + start time: a process that ended, or another one under the same pid, is not it."""
    import subprocess
    import sys

    from pipelines.cluster.processes import identity, still

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    mark = identity(proc.pid)
    assert still(mark) and not still([proc.pid, mark[1] - 1.0])  # the same pid, started at another time
    proc.kill()
    proc.wait()
    assert not still(mark)
