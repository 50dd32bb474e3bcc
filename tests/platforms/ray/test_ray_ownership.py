"""Ray's processes and temp folders are the run's by proof (issue 43): a standing cluster's stop
signals only the processes it recorded (pid, start time, uid), their descendants and this user's
processes naming its private scratch folder as a whole path; Ray's temp folders live in 0700
scratch folders with unguessable names, never a planted ``/tmp/ray-<pid>`` or ``/tmp/rs<pid>``;
a driver on the hosts that hangs or whose output is no longer read fails its cell.

The fast tests use plain sleeping processes; one slow test starts two real standing Ray heads
whose folders share a prefix (about 30 s on two loaded cores)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.cluster import netns
from pipelines.platforms.ray import hosts as ray_hosts
from pipelines.platforms.ray import standing
from pipelines.platforms.ray.standing import STANDING_SERVICE, names_folder
from pipelines.platforms.ray.trainer import local_cluster_options
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.runfolder.scratch import check_scratch, make_scratch, remove_scratch

NOBODY = 65534


@contextlib.contextmanager
def sleepers():
    """``start(arg, user=None)``: a shell sleeping with ``arg`` on its command line, in a session
    of its own (all killed at the end)."""
    started: list[subprocess.Popen] = []

    def start(arg: str, user: int | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(["sh", "-c", "sleep 60; :", "sh", arg], start_new_session=True, user=user)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _mark(proc) -> dict:
    return standing._mark(proc.pid)


def test_a_folder_is_named_only_as_a_whole_path():
    assert names_folder("/tmp/bm-rs-ab", "/tmp/bm-rs-ab")
    assert names_folder("--temp-dir=/tmp/bm-rs-ab/ray", "/tmp/bm-rs-ab")
    assert not names_folder("--temp-dir=/tmp/bm-rs-abc/ray", "/tmp/bm-rs-ab")  # a longer name, the same start
    assert not names_folder("/tmp/bm-rs-ab0", "/tmp/bm-rs-ab") and not names_folder("x/tmp/bm-rs-ab", "/tmp/bm-rs-ab")


def test_stop_signals_only_what_it_proves_the_clusters(tmp_path):
    paths = RunPaths(tmp_path / "run")
    scratch = make_scratch("rs")
    longer = Path(f"{scratch}0")  # another run's folder: the same characters and one more
    longer.mkdir(mode=0o700)
    try:
        with sleepers() as start:
            node = start(f"--temp-dir={scratch}/ray")  # the recorded node
            orphan = start(f"--session-dir={scratch}/ray/session_1")  # outlived its node: names the folder
            neighbour = start(f"--temp-dir={longer}/ray")
            reused = start("--unrelated")  # its pid recorded, with another start time: pid reuse
            stranger = start(f"--temp-dir={scratch}/ray", user=NOBODY) if os.geteuid() == 0 else None
            time.sleep(0.2)  # the shells run
            standing.folder(paths).mkdir(parents=True)
            atomic_write_json(standing.folder(paths) / "state.json", {
                "kind": "local", "pids": [node.pid, reused.pid], "scratch": str(scratch), "token": "-",
                "owned": [_mark(node), {**_mark(reused), "start": _mark(reused)["start"] - 1}]})
            assert not STANDING_SERVICE.running(paths)  # the "reused" one is not the recorded process

            stopped = STANDING_SERVICE.stop(paths)

            assert {node.pid, orphan.pid} <= set(stopped)  # and the node's child `sleep`
            assert not {neighbour.pid, reused.pid, *([stranger.pid] if stranger else [])} & set(stopped)
            assert node.wait(5) is not None and orphan.wait(5) is not None
            for alive in (neighbour, reused, *([stranger] if stranger else [])):
                assert alive.poll() is None, alive.args
        assert not scratch.exists() and longer.exists() and standing.state(paths) is None
    finally:
        remove_scratch(scratch)
        remove_scratch(longer)


def test_check_scratch_refuses_a_link_and_an_open_folder(tmp_path):
    private = make_scratch("test")
    try:
        assert check_scratch(private) == private and private.stat().st_mode & 0o777 == 0o700
        link = tmp_path / "link"
        link.symlink_to(private)
        with pytest.raises(PermissionError, match="is a link"):
            check_scratch(link)
        open_folder = tmp_path / "open"
        open_folder.mkdir()
        open_folder.chmod(0o777)
        with pytest.raises(PermissionError, match="has mode drwxrwxrwx"):
            check_scratch(open_folder)
        remove_scratch(link)  # never followed
        assert private.exists()
    finally:
        remove_scratch(private)
    assert not private.exists()


def test_a_planted_ray_folder_is_not_a_cells_temp_folder(tmp_path):
    """The old name of a per-job cluster's temp folder, planted as a link: the options name a
    private folder instead, the same on every call of this process until it is removed."""
    planted = Path(f"/tmp/ray-{os.getpid()}")
    target = tmp_path / "attacker"
    target.mkdir()
    planted.symlink_to(target)
    try:
        temp_dir = Path(local_cluster_options(2, 1)["_temp_dir"])
        assert temp_dir.parent != planted and not temp_dir.is_relative_to(planted)
        assert check_scratch(temp_dir.parent) and len(str(temp_dir)) < 30  # Ray's socket paths
        assert local_cluster_options(1, 1)["_temp_dir"] == str(temp_dir)  # the shutdown removes this one
        remove_scratch(temp_dir.parent)
        assert local_cluster_options(1, 1)["_temp_dir"] != str(temp_dir)  # gone: a new one
        assert list(target.iterdir()) == []
    finally:
        planted.unlink()


def test_node_temp_folders_are_in_the_launchs_scratch():
    hosts = [SimpleNamespace(name=f"h{k}", address=f"10.213.0.{k + 1}") for k in range(2)]
    argv = ray_hosts.node_argv(hosts, 1, 6390, 2, ray_hosts.node_temp_dir("/tmp/bm-rh-x1y2z3", hosts[1]))
    assert "--temp-dir=/tmp/bm-rh-x1y2z3/h1" in argv


def _on_hosts(tmp_path, one_epoch_config, script: str) -> ray_hosts.RayOnHosts:
    """A RayOnHosts whose one host runs ``script`` (a Python one-liner) as its driver."""
    host = SimpleNamespace(name="h0", address="127.0.0.1",
                           run=lambda argv, env=None, **kw: subprocess.Popen([sys.executable, "-c", script], **kw))
    cell = CellPaths(tmp_path / "cell")
    spec = SimpleNamespace(world_size=1, config=one_epoch_config, cell_dir=cell.root, cell=cell)
    return ray_hosts.RayOnHosts(spec, [host])


@pytest.mark.parametrize("script, deadline_s, error", [
    ("import time; time.sleep(60)", 1.0, "still running after 1s"),
    ("import os, time; os.close(1); os.close(2); time.sleep(60)", 60.0, "no longer read"),  # its reader: EOF
])
def test_a_driver_on_the_hosts_that_hangs_fails_the_cell(tmp_path, one_epoch_config, script, deadline_s,
                                                          error):
    cluster = _on_hosts(tmp_path, one_epoch_config, script)
    begun = time.monotonic()
    try:
        with pytest.raises((TimeoutError, RuntimeError), match=error):
            cluster.drive(0.0, "127.0.0.1:1", poll_s=0.05, deadline_s=deadline_s)
        assert time.monotonic() - begun < 10
    finally:
        cluster.stop()
    assert cluster.driver.proc.poll() is not None


@pytest.mark.slow
@pytest.mark.skipif(netns.run_problem() is not None, reason="no run network namespace here (nsenter refused)")
def test_stopping_one_standing_cluster_leaves_another_whose_folder_starts_the_same(tmp_path, one_epoch_config,
                                                                                  monkeypatch):
    """Two standing Ray heads, the second's scratch folder = the first's + "0" (the old stop,
    a substring match on ``/tmp/rs<pid>``, killed both); the old predictable names are planted as
    links. Stopping the first leaves the second serving: a driver joins it and runs a task."""
    from pipelines.run import services

    made: list[Path] = []

    def prefix_sharing(purpose: str) -> Path:
        path = Path(f"{made[0]}0") if made else make_scratch(purpose)
        if made:
            path.mkdir(mode=0o700)
        made.append(path)
        return path

    monkeypatch.setattr(standing, "make_scratch", prefix_sharing)
    planted = [Path(f"/tmp/rs{os.getpid()}"), Path(f"/tmp/ray-{os.getpid()}")]
    (tmp_path / "attacker").mkdir()
    for link in planted:
        link.symlink_to(tmp_path / "attacker")
    first, second = RunPaths(tmp_path / "first"), RunPaths(tmp_path / "second")
    try:
        STANDING_SERVICE.start(first, one_epoch_config, tied_to_caller=True)
        STANDING_SERVICE.start(second, one_epoch_config, tied_to_caller=True)
        found = standing.state(second)
        assert [found["scratch"], standing.state(first)["scratch"]] == [f"{made[0]}0", str(made[0])]
        seconds = {p.pid for p in standing._naming(found["scratch"])}
        assert len(seconds) >= 3  # `ray start`, gcs_server, raylet, ...

        STANDING_SERVICE.stop(first)

        assert standing._naming(str(made[0])) == [] and not made[0].exists()
        assert STANDING_SERVICE.running(second) and seconds <= {p.pid for p in standing._naming(found["scratch"])}
        join = ("import sys, ray; ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2]); "
                "print('task', ray.get(ray.remote(lambda: 41 + 1).remote()))")
        out = subprocess.run([*standing.namespace(found).prefix, sys.executable, "-c", join, found["address"],
                              found["node_ip"]], env={**os.environ, **standing.token_env(found)},
                             capture_output=True, text=True, timeout=180)
        assert "task 42" in out.stdout, out.stderr[-3000:]
        assert list((tmp_path / "attacker").iterdir()) == []  # nothing went through the planted links
    finally:
        services.stop(first)
        services.stop(second)
        for link in planted:
            link.unlink(missing_ok=True)
    assert not any(p.exists() for p in made)
