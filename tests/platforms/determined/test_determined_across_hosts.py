"""Determined's Trainer across the hosts of an emulated cluster: one torchrun per host, gloo and
Determined's chief ZMQ server over the shaped link.

``run_cell(..., "determined", 2, hosts=cluster.hosts)`` on a 2-host, 100 Mbit/s cluster: rank 0
on h0, rank 1 on h1, Determined's local mode across the two nodes (its chief on h0, the ports
the adapter picked), the gradients cross the link, the phases add up and nothing is left on the
hosts. The launch's command and environment are checked without root. Run alone:
    .venv/bin/python -m pytest tests/platforms/determined/test_determined_across_hosts.py -q -s
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed.run as torchrun

from pipelines.platforms.determined import storage
from pipelines import platforms
from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

MB = 10**6


def _config(tmp_path: Path, imdb_dir: Path, bert_tiny_dir: Path, **overrides):
    from pipelines.config import load_config

    return load_config("smoke", {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(tmp_path / "runs"),
        "epochs": 1, "max_seq_len": 32, "batch_policy": "per_worker", "batch_size": 16,
        "backends": ["determined"], "worker_counts": [2], **overrides})


class _FakeHost(SimpleNamespace):
    """Records the launches; ``run`` answers the free-port probe with fixed ports."""

    def run(self, argv, env=None, **kwargs):
        self.launched.append((list(argv), dict(env or {})))
        return subprocess.Popen(["echo", "29401 29402 29403"], **kwargs)

    def link_bytes(self):
        return 0, 0


def test_the_launch_is_ddps_torchrun_with_determineds_chief_on_host0(tmp_path, imdb_dir, bert_tiny_dir,
                                                                    monkeypatch):
    from pipelines.platforms.determined import adapter as determined
    from pipelines.platforms.determined.adapter import DeterminedBackend

    hosts = [_FakeHost(name=f"h{k}", address=f"10.213.0.{k + 1}", launched=[]) for k in range(2)]
    seen = {}
    monkeypatch.setattr(determined, "execute_on_hosts",
                        lambda cmds, env, hs, logs: seen.update(cmds=cmds, env=env, hosts=hs, logs=logs))
    monkeypatch.setattr(DeterminedBackend, "_prepare", lambda self, spec, t: {})
    cfg = _config(tmp_path, imdb_dir, bert_tiny_dir).for_cell(2, 0, None)
    cell_dir = tmp_path / "cells" / "determined-w2-r0"
    spec = SimpleNamespace(config=cfg, world_size=2, cell_dir=cell_dir,
                           cell=RunPaths(tmp_path).cell("determined", 2, 0))
    backend = DeterminedBackend()
    backend.launch_on_hosts(spec, 12.5, hosts)

    assert seen["hosts"] == hosts and len(seen["cmds"]) == 2
    workdir = str(storage.workdir(spec.cell))
    for node, cmd in enumerate(seen["cmds"]):
        assert cmd[:3] == ["env", "-C", workdir]  # Determined copies the cwd into its checkpoints
        args = torchrun.get_args_parser().parse_args(cmd[6:])
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", node, "1")
        assert (args.rdzv_backend, args.rdzv_endpoint) == ("static", "10.213.0.1:29401")
        assert args.training_script == "pipelines.platforms.determined.trial"
    env = seen["env"]
    assert env["DET_CHIEF_IP"] == "10.213.0.1" and env["USE_TORCH_DISTRIBUTED"] == "1"
    assert (env["INTER_TRAIN_PROCESS_COMM_PORT_1"], env["INTER_TRAIN_PROCESS_COMM_PORT_2"]) == ("29402", "29403")
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert len(hosts[0].launched) == 1 and not hosts[1].launched  # the ports: probed on host 0 only
    assert json.loads(spec.cell.placements.read_text()) == [
        {"rank": 0, "host": "h0", "address": "10.213.0.1"}, {"rank": 1, "host": "h1", "address": "10.213.0.2"}]
    assert backend.platform_fields(spec) == {"platform_mode": "local-2-nodes"}
    caveats = platforms.get("determined").mode_caveats
    assert caveats["local-2-nodes"] == caveats["local"]


def test_hosts_with_a_master_a_multi_node_config_or_a_bad_split_are_refused(tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell

    hosts = [_FakeHost(name=f"h{k}", address=f"10.213.0.{k + 1}", launched=[]) for k in range(2)]
    paths = RunPaths(tmp_path / "run")
    cfg = _config(tmp_path, imdb_dir, bert_tiny_dir)
    with pytest.raises(ValueError, match="cannot be split evenly over 2 host"):
        run_cell(cfg, paths, "determined", 3, hosts=hosts)
    with pytest.raises(ValueError, match="master schedules"):
        run_cell(_config(tmp_path, imdb_dir, bert_tiny_dir, determined_master="http://m:8080"), paths,
                 "determined", 2, hosts=hosts)
    assert not any(h.launched for h in hosts)
    assert not paths.cell("determined", 3, 0).spec.exists() and not paths.cell("determined", 2, 0).spec.exists()


_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_determined_cell_across_two_emulated_hosts(tmp_path, imdb_dir, bert_tiny_dir, monkeypatch):
    monkeypatch.setenv("LOGLEVEL", "INFO")  # torchrun logs each node's rendezvous (group_rank=...)
    from pipelines.run.cells import run_cell
    from pipelines.cluster import EmulatedCluster
    from pipelines.training import phases

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "detx-run"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    with EmulatedCluster("detx", hosts=2, network="100mbit") as cluster:
        result = run_cell(config, paths, "determined", 2, hosts=cluster.hosts)
        left = {h.name: h.pids() for h in cluster.hosts}  # the launch waited for every torchrun
        addresses = [h.address for h in cluster.hosts]
    assert left == {"h0": [], "h1": []}, left

    assert result.status == "ok" and result.world_size == 2, result.error
    assert result.platform_mode == "local-2-nodes"
    assert result.test is not None and result.phases["compute"] > 0 and result.phases["communication"] > 0
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds
    # 96 training rows, 16 per rank and batch, 2 ranks: 3 optimizer steps per epoch on each rank
    assert result.steps_per_epoch == 3, result.steps_per_epoch

    cell = paths.cell("determined", 2, 0)
    placements = json.loads(cell.placements.read_text())
    assert placements == [{"rank": 0, "host": "h0", "address": addresses[0]},
                          {"rank": 1, "host": "h1", "address": addresses[1]}]
    assert result.placements == [f"h{k} {addresses[k]}" for k in (0, 1)]
    worker = json.loads(cell.worker_result.read_text())  # what the ranks themselves reported
    assert worker["placements"] == [f"h{k} {addresses[k]}" for k in (0, 1)], worker["placements"]
    for node, text in enumerate((cell.log.read_text(), cell.node_log(1).read_text())):
        for line in (f"group_rank={node}", f"global_ranks=[{node}]", "group_world_size=2"):
            assert line in text, f"node {node} log lacks {line!r}:\n{text[-2000:]}"
    moved = json.loads(cell.link_bytes.read_text())
    assert result.link_bytes == moved and set(moved) == {"h0", "h1"}
    for host, counts in moved.items():  # the gradients crossed the link, both ways
        assert counts["tx"] > MB and counts["rx"] > MB, (host, counts)
    print(f"\ndetermined across 2 hosts @100mbit: total {result.total_seconds:.2f}s, start-up "
          f"{result.startup_seconds:.2f}s, communication {result.phases['communication']:.2f}s, "
          f"compute {result.phases['compute']:.2f}s, steps/epoch {result.steps_per_epoch}, "
          f"phases {json.dumps(result.phases)}, bytes {json.dumps(moved)}")
