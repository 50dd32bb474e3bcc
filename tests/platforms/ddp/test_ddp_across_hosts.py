"""DDP across the hosts of an emulated cluster: one torchrun per host, gloo over the shaped link.

``run_cell(..., hosts=cluster.hosts)`` on a 2-host, 100 Mbit/s cluster: rank 0 on h0, rank 1 on
h1, the gradients cross the link (BERT-tiny: 4.4 M parameters, ~17 MB fp32 per all-reduce step),
the phases add up, and nothing of the cell is left running in the hosts. The argv builder is
tested without root. Run alone:
    .venv/bin/python -m pytest tests/platforms/ddp/test_ddp_across_hosts.py -q
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed.run as torchrun

from pipelines.platforms import torchrun as launch
from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.platforms.small_runs import left_in_hosts
from tests.token_shards import write_token_shards

MB = 10**6


def _config(tmp_path: Path, imdb_dir: Path, bert_tiny_dir: Path, **overrides):
    from pipelines.config import load_config

    return load_config("smoke", {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(tmp_path / "runs"),
        "epochs": 1, "max_seq_len": 32, "batch_policy": "per_worker", "batch_size": 16,
        "backends": ["ddp"], "worker_counts": [2], **overrides})


HOSTS = [SimpleNamespace(name=f"h{k}", address=f"10.213.0.{k + 1}") for k in range(3)]


def test_host_commands_are_static_nodes_with_the_rendezvous_on_host0(tmp_path, imdb_dir, bert_tiny_dir):
    cfg = _config(tmp_path, imdb_dir, bert_tiny_dir)
    cmds = launch.host_torchrun_commands(6, Path("/r/cells/ddp-w6-r0"), 12.5, HOSTS, 29411, python="py")
    assert len(cmds) == 3
    for node, cmd in enumerate(cmds):
        assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
        args = torchrun.get_args_parser().parse_args(cmd[3:])
        assert not args.standalone
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("3", node, "2")
        assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("static", "10.213.0.1:29411", "ddp-w6-r0")
        assert args.training_script == "pipelines.training.worker"
        assert args.training_script_args == ["--cell-dir", "/r/cells/ddp-w6-r0", "--launch-time", "12.5"]
    assert cfg.engine("ddp").nnodes == 1  # the caller's config is untouched
    assert launch.host_placements(6, HOSTS) == [
        {"rank": r, "host": f"h{r // 2}", "address": f"10.213.0.{r // 2 + 1}"} for r in range(6)]
    with pytest.raises(ValueError, match="workers=4 cannot be split evenly over 3 host"):
        launch.host_torchrun_commands(4, Path("/r/c"), 1.0, HOSTS, 29411)
    env = launch.host_env(cfg, {"PATH": "/bin"}, 2, gpus=0)
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "eth0"
    assert env["OMP_NUM_THREADS"] == str(cfg.training.threads_per_worker) and env["PATH"] == "/bin"


def test_hosts_with_a_multi_node_config_or_a_bad_split_are_refused(tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell
    from pipelines.runfolder.results import CellResult

    paths = RunPaths(tmp_path / "run")
    with pytest.raises(ValueError, match="cannot be split evenly over 2 host"):
        run_cell(_config(tmp_path, imdb_dir, bert_tiny_dir), paths, "ddp", 3, hosts=HOSTS[:2])
    assert not paths.cell("ddp", 3, 0).spec.exists()
    multi = _config(tmp_path, imdb_dir, bert_tiny_dir, ddp_nnodes=2, ddp_rdzv_endpoint="n0:1")
    with pytest.raises(ValueError, match="hosts= drives every node"):
        run_cell(multi, paths, "ddp", 2, hosts=HOSTS[:2])
    assert CellResult.read(paths.cell("ddp", 2, 0).result).status == "failed"


_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_cell_across_two_emulated_hosts(tmp_path, imdb_dir, bert_tiny_dir, monkeypatch):
    monkeypatch.setenv("LOGLEVEL", "INFO")  # torchrun logs each node's rendezvous (group_rank=...)
    from pipelines.run.cells import run_cell
    from pipelines.cluster import EmulatedCluster
    from pipelines.training import phases

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "ddpx-run"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    with EmulatedCluster("ddpx", hosts=2, network="100mbit") as cluster:
        result = run_cell(config, paths, "ddp", 2, hosts=cluster.hosts)
        # the launch waited for every torchrun: nothing of the cell is left in the hosts
        left = left_in_hosts(cluster.hosts)
        addresses = [h.address for h in cluster.hosts]
    assert left == {"h0": [], "h1": []}, left

    assert result.status == "ok" and result.world_size == 2, result.error
    assert result.platform_mode == "torchrun-2-nodes"
    assert result.test is not None and result.phases["compute"] > 0 and result.phases["communication"] > 0
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds

    cell = paths.cell("ddp", 2, 0)
    placements = json.loads(cell.placements.read_text())
    assert result.placements == [f"h{k} {addresses[k]}" for k in (0, 1)]  # each rank's host, in the result
    assert placements == [{"rank": 0, "host": "h0", "address": addresses[0]},
                          {"rank": 1, "host": "h1", "address": addresses[1]}]
    for node, text in enumerate((cell.log.read_text(), cell.node_log(1).read_text())):
        for line in (f"group_rank={node}", f"global_ranks=[{node}]", "group_world_size=2"):
            assert line in text, f"node {node} log lacks {line!r}:\n{text[-2000:]}"
    moved = json.loads(cell.link_bytes.read_text())
    assert result.link_bytes == moved and set(moved) == {"h0", "h1"}  # in the cell's result too
    for host, counts in moved.items():  # the gradients crossed the link, both ways
        assert counts["tx"] > MB and counts["rx"] > MB, (host, counts)
    print(f"\nddp across 2 hosts @100mbit: total {result.total_seconds:.2f}s, start-up "
          f"{result.startup_seconds:.2f}s, communication {result.phases['communication']:.2f}s, "
          f"compute {result.phases['compute']:.2f}s, phases {json.dumps(result.phases)}, bytes {json.dumps(moved)}")


@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_one_host_failing_stops_the_others_and_raises_with_its_tail(tmp_path):
    import sys
    import time

    from pipelines.cluster import EmulatedCluster
    from pipelines.cluster.leftovers import _netns_pids

    wait = [sys.executable, "-c", "import time; print('waiting', flush=True); time.sleep(120)"]
    fail = [sys.executable, "-c", "import sys, time; time.sleep(0.5); print('boom on h1'); sys.exit(3)"]
    logs = [tmp_path / "train.log", tmp_path / "train-node1.log"]
    with EmulatedCluster("ddpf", hosts=2, network="unshaped") as cluster:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"(?s)h1 \(node 1\) exited with 3.*boom on h1"):
            launch.execute_on_hosts([wait, fail], dict(os.environ), cluster.hosts, logs)
        assert time.monotonic() - start < 15  # h0 was stopped, not waited for
        assert _netns_pids(cluster.hosts[0].netns) == []
    assert "waiting" in logs[0].read_text() and "boom on h1" in logs[1].read_text()
