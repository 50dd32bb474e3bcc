"""Hosts reached over SSH (``pipelines.cluster.ssh``), the way DeepSpeed / MPI start multi-node jobs.

A 3-host emulated cluster: sshd (fresh host key, root login with a fresh key pair, all in
tmp_path) runs inside h0 and h1; h2 plays the launching machine (the root namespace cannot
reach the hosts, so the ssh client runs in h2's namespace: ``ssh_prefix``). A DDP cell runs
with one rank on each host over ssh; terminating (or killing) the local ssh takes the remote
process tree down, SIGTERM-ignoring parent and new-session grandchild included. The argv and
entry parsing are checked without root. Run alone:
    .venv/bin/python -m pytest tests/cluster/test_ssh_hosts.py -q -s
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from pipelines.cluster import why_unavailable
from pipelines.cluster.ssh import SSHHost, parse_host_entry, ssh_hosts
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

MB = 10**6
SSH_PORT = 2222


def test_entries_argv_and_remote_command():
    assert parse_host_entry("node1") == (None, "node1", 22)
    assert parse_host_entry("bench@10.0.0.7:2200", user="root") == ("bench", "10.0.0.7", 2200)
    assert parse_host_entry("[fe80::1]:23", user="u", port=2) == ("u", "fe80::1", 23)
    with pytest.raises(ValueError):
        parse_host_entry("a@b@c")
    hosts = ssh_hosts(["n0", "bob@n1:2201"], user="root", port=2222, identity_file="/k/id",
                      ssh_prefix=["ip", "netns", "exec", "launcher"], names=["h0", "h1"], known_hosts_file="/k/kh")
    assert [(h.name, h.user, h.address, h.port) for h in hosts] == [("h0", "root", "n0", 2222),
                                                                      ("h1", "bob", "n1", 2201)]
    argv = hosts[1].ssh_command("true")
    assert argv[:5] == ["ip", "netns", "exec", "launcher", "ssh"] and argv[-3:] == ["--", "bob@n1", "true"]
    for opt in ("BatchMode=yes", "StrictHostKeyChecking=yes", "UserKnownHostsFile=/k/kh", "IdentitiesOnly=yes"):
        assert opt in argv
    assert argv[argv.index("-i") + 1] == "/k/id" and argv[argv.index("-p") + 1] == "2201" and "-T" in argv
    remote = hosts[0].remote_command(["python", "-m", "x", "it's"], "/work dir")
    words = shlex.split(remote)
    assert words[:4] == ["cd", "/work dir", "&&", "exec"] and words[-4:] == ["python", "-m", "x", "it's"]
    # the environment is never on the command line (ps shows it to every local user): an allow-list of
    # it goes first on the session's stdin; a secret stays here
    env = {"BENCHMARK_X": "b c", "OMP_NUM_THREADS": "1", "PATH": "/bin", "PWD": "/here", "X-Y": "1",
           "AWS_SECRET_ACCESS_KEY": "s3cr3t", "MLFLOW_TRACKING_PASSWORD": "pw", "GLOO_SOCKET_IFNAME": "eth0"}
    hosts[0].ifname = "ens5"  # what the machine answered (interface()), or set by hand
    assert hosts[0].forwarded_env(env) == {"BENCHMARK_X": "b c", "OMP_NUM_THREADS": "1", "PATH": "/bin",
                                           "GLOO_SOCKET_IFNAME": "ens5", "BENCHMARK_HOST": "h0"}
    assert "s3cr3t" not in remote and "BENCHMARK_X" not in remote
    with pytest.raises(ValueError, match="host names must differ"):
        ssh_hosts(["a:1", "a:2"])
    from pipelines.cluster import ssh
    from pipelines.training import host

    assert ssh.HOST_ENV == host.HOST_ENV  # what the ranks read back (placement)


_NO_NETNS = why_unavailable()
_NO_SSHD = None if Path("/usr/sbin/sshd").exists() else "no /usr/sbin/sshd: scripts/system_deps.sh"


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _sshd_config(tmp: Path, host) -> Path:
    config = tmp / f"sshd-{host.name}.conf"
    config.write_text("\n".join([
        f"ListenAddress {host.address}:{SSH_PORT}", f"HostKey {tmp / 'host_key'}",
        f"PidFile {tmp / f'sshd-{host.name}.pid'}", f"AuthorizedKeysFile {tmp / 'client_key.pub'}",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PrintMotd no",
        "ClientAliveInterval 10", "MaxStartups 100", "LogLevel VERBOSE", ""]))
    return config


def _wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def _reachable(host: SSHHost) -> bool:
    try:
        return host.check(["true"], timeout_s=10) == ""
    except (RuntimeError, subprocess.TimeoutExpired):
        return False


@contextmanager
def ssh_cluster(tmp: Path, network: str = "1gbit", **host_options):
    """(cluster, ssh hosts h0/h1, sshd pids): sshd in h0 and h1, the client in h2; everything stopped after."""
    from pipelines.cluster import EmulatedCluster

    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    host_key = _keygen(tmp / "host_key")
    _keygen(tmp / "client_key")
    with EmulatedCluster("sshx", hosts=3, network=network) as cluster:
        servers = cluster.hosts[:2]
        (tmp / "known_hosts").write_text("".join(f"[{h.address}]:{SSH_PORT} {host_key}\n" for h in servers))
        daemons = []
        try:
            for h in servers:
                with open(tmp / f"sshd-{h.name}.log", "w") as log:  # the child keeps its own copy
                    daemons.append(h.run(["/usr/sbin/sshd", "-D", "-e", "-f", str(_sshd_config(tmp, h))],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            hosts = ssh_hosts([h.address for h in servers], user="root", port=SSH_PORT,
                              identity_file=str(tmp / "client_key"), names=[h.name for h in servers],
                              ssh_prefix=["ip", "netns", "exec", cluster.hosts[2].netns],
                              known_hosts_file=str(tmp / "known_hosts"), **host_options)
            for host in hosts:
                _wait_until(lambda host=host: _reachable(host), 20, f"sshd on {host.name}")
            yield cluster, hosts, [d.pid for d in daemons]
        finally:
            for daemon in daemons:
                daemon.terminate()
                try:
                    daemon.wait(10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(5)
        # sshd included, nothing is left in any host
        _wait_until(lambda: all(not h.pids() for h in cluster.hosts), 10, "the hosts to be empty")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# on the remote host: ignores SIGTERM, starts a grandchild in its own session, reports pids and env
_STUBBORN = ("import json, os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
             "print(json.dumps({'pids': [os.getpid(), c.pid], 'host': os.environ['BENCHMARK_HOST'], "
             "'odd': os.environ['BENCHMARK_ODD'], 'secret': os.environ.get('AWS_SECRET_ACCESS_KEY'), "
             "'cwd': os.getcwd()}), flush=True); time.sleep(300)")


@pytest.mark.skipif(_NO_NETNS is not None or _NO_SSHD is not None, reason=str(_NO_NETNS or _NO_SSHD))
def test_terminating_or_killing_the_local_ssh_kills_the_remote_process_tree(tmp_path):
    odd = "a b 'c' \"d\" $HOME `x` ; \\"
    with ssh_cluster(tmp_path, network="unshaped", kill_grace_s=2.0) as (cluster, hosts, sshd_pids):
        for host, stop in zip(hosts, ("terminate", "kill")):
            proc = host.run([sys.executable, "-c", _STUBBORN], env={"BENCHMARK_ODD": odd, "PATH": "/usr/bin:/bin",
                                                                    "AWS_SECRET_ACCESS_KEY": "s3cr3t"},
                            cwd=str(tmp_path), stdout=subprocess.PIPE, text=True)
            report = json.loads(proc.stdout.readline())
            assert (report["host"], report["odd"], report["cwd"]) == (host.name, odd, str(tmp_path))
            # the environment went through stdin (not the ssh command line), without what is not allowed
            assert report["secret"] is None and odd not in " ".join(proc.args)
            emulated = next(h for h in cluster.hosts if h.name == host.name)
            assert set(report["pids"]) <= set(emulated.pids())  # they run inside that host
            start = time.monotonic()
            getattr(proc, stop)()
            proc.wait(10)
            pids = report["pids"]
            _wait_until(lambda pids=pids: not any(map(_alive, pids)), 15, f"the remote tree to die ({stop})")
            print(f"\n{stop}: the remote tree on {host.name} died {time.monotonic() - start:.2f}s later "
                  "(SIGTERM ignored: the reaper's SIGKILL after its 2 s grace)")
            _wait_until(lambda h=emulated: set(h.pids()) <= set(sshd_pids), 10, f"only sshd left on {host.name}")


def _config(tmp_path: Path, imdb_dir: Path, bert_tiny_dir: Path):
    from pipelines.config import load_config

    return load_config("smoke", {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(tmp_path / "runs"),
        "epochs": 1, "max_seq_len": 32, "batch_policy": "per_worker", "batch_size": 16,
        "backends": ["ddp"], "worker_counts": [2]})


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None or _NO_SSHD is not None, reason=str(_NO_NETNS or _NO_SSHD))
def test_a_ddp_cell_over_ssh_one_rank_on_each_host(tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell
    from pipelines.training import phases

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "sshx-run"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    (tmp_path / "ssh").mkdir()
    with ssh_cluster(tmp_path / "ssh") as (cluster, hosts, sshd):
        assert [h.interface() for h in hosts] == ["eth0", "eth0"]  # asked of each machine, not assumed
        result = run_cell(_config(tmp_path, imdb_dir, bert_tiny_dir), paths, "ddp", 2, hosts=hosts)
        for h in cluster.hosts[:2]:  # the launch waited for every torchrun: only sshd is left
            _wait_until(lambda h=h: set(h.pids()) <= set(sshd), 10, f"only sshd left on {h.name}")
        addresses = [h.address for h in cluster.hosts[:2]]

    assert result.status == "ok" and result.world_size == 2, result.error
    assert result.platform_mode == "torchrun-2-nodes"
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds
    cell = paths.cell("ddp", 2, 0)
    assert json.loads(cell.placements.read_text()) == [{"rank": k, "host": f"h{k}", "address": addresses[k]}
                                                       for k in (0, 1)]
    worker = json.loads(cell.worker_result.read_text())  # what the ranks reported from where they ran
    assert worker["placements"] == [f"h{k} {addresses[k]}" for k in (0, 1)], worker["placements"]
    moved = json.loads(cell.link_bytes.read_text())
    assert result.link_bytes == moved and set(moved) == {"h0", "h1"}
    for host, counts in moved.items():  # the gradients crossed the link, both ways
        assert counts["tx"] > MB and counts["rx"] > MB, (host, counts)
    print(f"\nddp over ssh, 2 hosts @1gbit: total {result.total_seconds:.2f}s, start-up "
          f"{result.startup_seconds:.2f}s, communication {result.phases['communication']:.2f}s, "
          f"phases {json.dumps(result.phases)}, bytes {json.dumps(moved)}")
