"""Ray Train across the hosts of an emulated cluster, by Ray's own multi-node path.

``run_cell(..., "ray", 2, hosts=cluster.hosts)`` on a 2-host, 100 Mbit/s cluster: a Ray head on
h0, a node on h1 joining it, the driver on h0; the two workers land one per host
(STRICT_SPREAD), gloo's all-reduce crosses the shaped link, the phases add up, and afterwards no
process of the cell is left on any host and no raylet / GCS of it anywhere. The argv builders
are tested without root. Run alone:
    .venv/bin/python -m pytest tests/platforms/ray/test_ray_across_hosts.py -q -x -s
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from pipelines.platforms.ray import hosts as ray_hosts
from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

MB = 10**6
HOSTS = [SimpleNamespace(name=f"h{k}", address=f"10.213.0.{k + 1}") for k in range(3)]


def _config(tmp_path: Path, imdb_dir: Path, bert_tiny_dir: Path, **overrides):
    from pipelines.config import load_config

    return load_config("smoke", {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(tmp_path / "runs"),
        "epochs": 1, "max_seq_len": 32, "batch_policy": "per_worker", "batch_size": 16,
        "backends": ["ray", "ray_per_job"], "worker_counts": [2], **overrides})


def _options(argv: list[str]) -> dict[str, str | bool]:
    pairs = (a.split("=", 1) for a in argv if a.startswith("--"))
    return {p[0]: (p[1] if len(p) == 2 else True) for p in pairs}


def test_node_and_driver_commands_build_one_cluster_with_the_head_on_host0():
    scratch = "/tmp/bm-rh-x1y2z3w4"  # the launch's private folder (make_scratch)
    head = ray_hosts.node_argv(HOSTS, 0, 6390, 2, ray_hosts.node_temp_dir(scratch, HOSTS[0]), python="py")
    assert head[:4] == ["py", "-m", "ray.scripts.scripts", "start"]
    assert _options(head) == {
        "--head": True, "--port": "6390", "--include-dashboard": "false", "--node-ip-address": "10.213.0.1",
        "--num-cpus": "2", "--temp-dir": f"{scratch}/h0", "--disable-usage-stats": True, "--block": True,
        "--object-store-memory": str(ray_hosts.OBJECT_STORE_BYTES)}
    temp_dirs = {f"{scratch}/h0"}
    for k in (1, 2):
        node = _options(ray_hosts.node_argv(HOSTS, k, 6390, 2, ray_hosts.node_temp_dir(scratch, HOSTS[k]), python="py"))
        assert "--head" not in node and "--port" not in node and "--include-dashboard" not in node
        assert node["--address"] == "10.213.0.1:6390" and node["--node-ip-address"] == f"10.213.0.{k + 1}"
        assert node["--block"] is True
        temp_dirs.add(node["--temp-dir"])
    assert len(temp_dirs) == 3 and all(len(d) < 30 for d in temp_dirs)  # own folder per node, short
    assert ray_hosts.driver_argv(Path("/r/cells/ray-w2-r0"), 12.5, "10.213.0.1:6390", 2, python="py") == [
        "py", "-m", "pipelines.platforms.ray.hosts", "--cell-dir", "/r/cells/ray-w2-r0", "--launch-time", "12.5",
        "--address", "10.213.0.1:6390", "--nodes", "2"]
    assert ray_hosts.placement_strategy(2, 2) == "STRICT_SPREAD"
    assert ray_hosts.placement_strategy(4, 2) == "SPREAD"


def test_workers_and_nodes_environment():
    base = {"PIPELINES_X": "1", "SECRET": "x", "PYTHONPATH": "/elsewhere"}
    env = ray_hosts.workers_runtime_env(base)["env_vars"]
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "eth0"
    assert env["PIPELINES_X"] == "1" and "SECRET" not in env and env[ray_hosts.DRIVER_LOG_ENV] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/elsewhere"]
    nodes = ray_hosts.process_env({"RAY_ADDRESS": "auto", "RAY_AUTH_MODE": "disabled", "PATH": "/bin"})
    assert "RAY_ADDRESS" not in nodes and "RAY_AUTH_MODE" not in nodes  # the launch sets its own
    assert nodes["PATH"] == "/bin" and nodes["PYTHONUNBUFFERED"] == "1"


def test_a_bad_split_or_a_cluster_address_is_refused_before_anything_is_written(tmp_path, imdb_dir,
                                                                                bert_tiny_dir):
    from pipelines.run.cells import run_cell

    paths = RunPaths(tmp_path / "run")
    with pytest.raises(ValueError, match="cannot be split evenly over 2 host"):
        run_cell(_config(tmp_path, imdb_dir, bert_tiny_dir), paths, "ray", 3, hosts=HOSTS[:2])
    with pytest.raises(ValueError, match="leave engines.ray.address empty"):
        joining = _config(tmp_path, imdb_dir, bert_tiny_dir, ray_address="h0:6379")
        run_cell(joining, paths, "ray", 2, hosts=HOSTS[:2])
    assert not paths.cell("ray", 3, 0).spec.exists() and not paths.cell("ray", 2, 0).spec.exists()


def ray_daemons() -> set[tuple[int, str]]:
    """Live (not zombie) raylet / gcs_server processes on this machine."""
    found = set()
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            text = " ".join([proc.info["name"] or "", *(proc.info["cmdline"] or [])])
            if proc.info["status"] != psutil.STATUS_ZOMBIE and ("raylet" in text or "gcs_server" in text):
                found.add((proc.info["pid"], text[:160]))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


_NO_NETNS = why_unavailable()


@pytest.mark.slow  # 45-50 s alone
# heavy: at a landing ray_per_job's cross-host cell is its host-loss case's retry (tests/platforms/test_host_loss.py),
# which checks that nothing of it is left on the hosts; this one adds its phases and its scratch folders
@pytest.mark.heavy
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
@pytest.mark.parametrize("backend", ["ray_per_job"])  # the cell's own cluster on the hosts (named: its id says so)
def test_a_ray_cell_across_two_emulated_hosts(backend, tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell
    from pipelines.cluster import EmulatedCluster
    from pipelines.training import phases

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "rayx-run"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    before, scratches = ray_daemons(), set(Path("/tmp").glob("bm-rh-*"))
    with EmulatedCluster("rayx", hosts=2, network="100mbit") as cluster:
        result = run_cell(config, paths, backend, 2, hosts=cluster.hosts)  # the cell's own cluster
        left = {h.name: h.pids() for h in cluster.hosts}  # the launch stopped every node
        addresses = [h.address for h in cluster.hosts]
    assert left == {"h0": [], "h1": []}, left
    ours = {(pid, text) for pid, text in ray_daemons() - before if "/bm-rh-" in text}
    assert not ours, f"raylet / gcs_server of the cell survived it: {sorted(ours)}"
    assert set(Path("/tmp").glob("bm-rh-*")) <= scratches  # the launch's scratch (temp folders, token) removed

    assert result.status == "ok" and result.world_size == 2, result.error
    assert result.platform_mode == "cluster-2-hosts" and result.versions["launcher"] == "TorchTrainer"
    assert result.test is not None and result.phases["compute"] > 0
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds
    assert sorted(result.placements) == [f"h{k} {addresses[k]}" for k in (0, 1)]  # measured by each rank

    cell = paths.cell(backend, 2, 0)
    log_text = cell.log.read_text()
    assert "2 node(s) alive" in log_text and addresses[1] in log_text  # the driver's output, teed
    moved = json.loads(cell.link_bytes.read_text())
    assert result.link_bytes == moved and set(moved) == {"h0", "h1"}
    for host, counts in moved.items():  # the gradients crossed the link, both ways
        assert counts["tx"] > MB and counts["rx"] > MB, (host, counts)
    sys.stdout.write(f"\nray across 2 hosts @100mbit: total {result.total_seconds:.2f}s, start-up "
                     f"{result.startup_seconds:.2f}s, phases {json.dumps(result.phases)}, "
                     f"bytes {json.dumps(moved)}, placements {result.placements}\n")
