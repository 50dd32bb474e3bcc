"""Every one-host cell in a private network namespace: its rendezvous port is unreachable.

torchrun's rendezvous store (a one-node ``--standalone`` run) listens on every interface, and
Determined's local mode on ``tcp://*:12360`` / ``12365``; ``pipelines.platforms.torchrun.execute`` starts such
a launcher under ``unshare --net`` with only loopback up. The test holds a ddp cell after its
first epoch, finds the ranks' MASTER_PORT, shows the port answers inside the cell's namespace
and refuses from this host's own namespace, then lets the cell finish.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from pipelines.cluster import netns
from pipelines.platforms import torchrun as launch
from pipelines.runfolder.paths import RunPaths
from tests import fault_injection
from tests.token_shards import write_token_shards

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_CONNECT = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()"


def test_a_standalone_torchrun_is_isolated_and_others_are_not():
    cmd = ["py", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "-m", "w"]
    if netns.own_problem() is None:
        assert launch.isolated(cmd)[:3] == ["unshare", "--net", "--"] and launch.isolated(cmd)[-len(cmd):] == cmd
    else:
        assert launch.isolated(cmd) == cmd


# as another user: isolated() picks the user-namespace prefix; the command listens on every interface
_AS_USER = """
import socket, subprocess, sys
from pipelines.platforms import torchrun
# stdlib only: the system's Python (this machine's venv Python lives under /root, which a user
# namespace's root cannot search)
listener = ["/usr/bin/python3", "-c", "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(60)"]
cmd = torchrun.isolated(listener)
print(" ".join(cmd[:5]), flush=True)
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
print(proc.stdout.readline().strip(), proc.pid, flush=True)
proc.wait()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists() or not Path("/usr/bin/python3").exists(),
                    reason="setpriv as root: runs as nobody; /usr/bin/python3 for the listener")
def test_a_cell_started_by_a_user_who_is_not_root_is_isolated_too(tmp_path):
    """Not root (the compose stack's Celery workers): a user namespace with its own network, as
    ``unshare -rn`` does; a listener on every interface inside it is unreachable from the host."""
    from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE, listening

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOME", "XDG"))}
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                             _AS_USER], stdout=subprocess.PIPE, text=True, env={**env, "HOME": str(tmp_path)},
                            cwd=PROJECT_ROOT)
    try:
        prefix = proc.stdout.readline().split()
        assert prefix == ["unshare", "--user", "--map-root-user", "--net", "--"], prefix
        port, pid = (int(x) for x in proc.stdout.readline().split())
        listener = next(p for p in psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
                        if listening([p.pid]))
        # every interface... of its own namespace, where there is only loopback (and the sampler says so)
        assert listening([listener.pid]) == {listener.pid: {f"0.0.0.0:{port}{LOOPBACK_ONLY_NAMESPACE}"}}
        assert os.readlink(f"/proc/{listener.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        for addr in {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}:
            with pytest.raises(OSError):
                socket.create_connection((addr, port), timeout=5).close()
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()


def _rank_with_port(cell_dir: Path, deadline_s: float = 240.0) -> tuple[psutil.Process, int]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
                if "pipelines.training.worker" in cmdline and str(cell_dir) in cmdline and "torch.distributed.run" not in cmdline:
                    port = proc.environ().get("MASTER_PORT")
                    if port:
                        return proc, int(port)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.5)
    raise AssertionError(f"no rank of {cell_dir} with a MASTER_PORT appeared")


@pytest.mark.slow
@pytest.mark.skipif(netns.own_problem() is not None, reason="needs root and unshare --net")
def test_a_ddp_cells_rendezvous_port_is_unreachable_from_the_host(tmp_path, make_config, imdb_dir, bert_tiny_dir,
                                                                   monkeypatch):
    from pipelines.run.cells import run_cell

    release = tmp_path / "release"  # rank 0 holds after epoch 1 until the probes below are done (at most 60 s)
    for key, value in {**fault_injection.env(1, PROJECT_ROOT), fault_injection.HOLD_SECONDS_ENV: "60",
                       fault_injection.HOLD_RELEASE_ENV: str(release)}.items():
        monkeypatch.setenv(key, value)
    paths = write_token_shards(RunPaths(tmp_path / "runs" / "iso"), imdb_dir, bert_tiny_dir, train_per_class=32,
                               test_per_class=16, seq_len=32, seed=5)
    config = make_config(epochs=2, max_seq_len=32, batch_size=16, backends=["ddp"], worker_counts=[2])
    results: dict = {}
    thread = threading.Thread(target=lambda: results.update(r=run_cell(config, paths, "ddp", 2)), daemon=True)
    thread.start()
    rank, port = _rank_with_port(paths.cell("ddp", 2, 0).root)
    assert os.readlink(f"/proc/{rank.pid}/ns/net") != os.readlink("/proc/self/ns/net")  # its own namespace
    inside = subprocess.run(["nsenter", f"--net=/proc/{rank.pid}/ns/net", sys.executable, "-c", _CONNECT, str(port)],
                            capture_output=True, text=True, timeout=30)
    assert inside.returncode == 0, f"the store should answer inside the cell: {inside.stderr}"
    with pytest.raises(OSError):  # refused: nothing listens on that port in the host's namespace
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    for addr in {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}:
        with pytest.raises(OSError):
            socket.create_connection((addr, port), timeout=5).close()
    release.touch()
    thread.join(300)
    assert results["r"].status == "ok" and len(results["r"].epochs) == 2
