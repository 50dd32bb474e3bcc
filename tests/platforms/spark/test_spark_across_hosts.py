"""Spark across the hosts of an emulated cluster: a standalone cluster built on them, both data feeds.

``run_cell(..., "spark" | "spark_dataframe", 2, hosts=cluster.hosts)`` on a 2-host, 100 Mbit/s
cluster: the master, one 1-core worker per host and the driver run inside the hosts
(``pipelines.platforms.spark.hosts``), TorchDistributor's barrier stage puts one rank on each host's
executor, the gradients cross the link, the phases add up, and after the cell nothing of it is
left running (no process in the hosts, no Spark JVM). The builders and the teardown on failure
are tested without root. Run alone:
    .venv/bin/python -m pytest tests/platforms/spark/test_spark_across_hosts.py -q -s
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from pipelines.platforms.spark import hosts as spark_hosts, distributor as spark_torch
from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

MB = 10**6
HOSTS = [SimpleNamespace(name=f"h{k}", address=f"10.213.0.{k + 1}") for k in range(2)]


def _config(tmp_path: Path, imdb_dir: Path, bert_tiny_dir: Path, **overrides):
    from pipelines.config import load_config

    return load_config("smoke", {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(tmp_path / "runs"),
        "epochs": 1, "max_seq_len": 32, "batch_policy": "per_worker", "batch_size": 16,
        "backends": ["spark", "spark_dataframe", "spark_per_job", "spark_dataframe_per_job"], "worker_counts": [2],
        **overrides})


def test_daemon_driver_and_session_settings_bind_each_host(tmp_path, imdb_dir, bert_tiny_dir):
    home = Path("/spark")
    master = spark_hosts.master_argv(home, HOSTS[0], 7177)
    assert master[:2] == ["/spark/bin/spark-class", spark_hosts.MASTER_CLASS]
    assert master[master.index("--host") + 1] == "10.213.0.1" and master[master.index("--port") + 1] == "7177"
    worker = spark_hosts.worker_argv(home, "spark://10.213.0.1:7177", HOSTS[1], 1, tmp_path / "w")
    assert worker[1:3] == [spark_hosts.WORKER_CLASS, "spark://10.213.0.1:7177"]
    opts = dict(zip(worker[3::2], worker[4::2]))
    assert opts == {"--host": "10.213.0.2", "--cores": "1", "--memory": spark_hosts.WORKER_MEMORY,
                    "--webui-port": "0", "--work-dir": str(tmp_path / "w")}
    env = spark_hosts.daemon_env({"PATH": "/bin", "SPARK_LOCAL_IP": "127.0.0.1", "PIPELINES_SPARK_STATE": "/x"},
                                 HOSTS[1], tmp_path, python="py")
    assert (env["SPARK_LOCAL_IP"], env["SPARK_NO_DAEMONIZE"], env["PYSPARK_PYTHON"]) == ("10.213.0.2", "1", "py")
    assert "PIPELINES_SPARK_STATE" not in env  # not mistaken for an embedded cluster's daemon

    conf = spark_hosts.session_conf("10.213.0.1")
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.213.0.1"
    assert conf["spark.executorEnv.GLOO_SOCKET_IFNAME"] == conf["spark.executorEnv.TP_SOCKET_IFNAME"] == "eth0"
    driver = spark_hosts.driver_argv(Path("/r/cells/spark-w2-r0"), 12.5, "spark://10.213.0.1:7177", "dataframe",
                                     python="py")
    assert driver[:3] == ["py", "-m", "pipelines.platforms.spark.driver"]
    parser = argparse.ArgumentParser()
    for flag in ("--cell-dir", "--launch-time", "--master", "--feed"):
        parser.add_argument(flag)
    args = parser.parse_args(driver[3:])
    assert (args.cell_dir, float(args.launch_time), args.master, args.feed) == (
        "/r/cells/spark-w2-r0", 12.5, "spark://10.213.0.1:7177", "dataframe")
    assert spark_hosts.driver_env({"SPARK_LOCAL_IP": "127.0.0.1"}, HOSTS[0])["SPARK_LOCAL_IP"] == "10.213.0.1"
    with pytest.raises(ValueError, match="feed must be one of"):
        spark_hosts.driver_argv(Path("/r/c"), 1.0, "spark://x:1", "rows")

    cfg = _config(tmp_path, imdb_dir, bert_tiny_dir)  # spark_master stays local[*]: the hosts bring a master
    assert spark_torch.distributor_settings(cfg, 2, False)["local_mode"] is True
    assert spark_torch.distributor_settings(cfg, 2, False, master="spark://10.213.0.1:7177")["local_mode"] is False
    spec = SimpleNamespace(config=cfg, world_size=2)
    assert spark_torch.platform_fields(spec, hosts=2)["platform_mode"] == "cluster-2-hosts"
    assert spark_torch.platform_fields(spec)["platform_mode"] == "local"


class _FakeHost(SimpleNamespace):
    def stop_processes(self, grace_s=3.0):
        self.stopped = grace_s
        return [1]


def test_every_host_is_stopped_when_the_start_fails_and_a_bad_split_starts_nothing(tmp_path, monkeypatch):
    hosts = [_FakeHost(name=h.name, address=h.address, stopped=None) for h in HOSTS]
    spec = SimpleNamespace(world_size=2, cell_dir=tmp_path, cell=SimpleNamespace(log=tmp_path / "train.log",
                                                                          provision=tmp_path / "provision.json"))

    def boom(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(spark_hosts, "start_daemons", boom)
    with pytest.raises(KeyboardInterrupt):
        spark_hosts.launch(spec, 1.0, hosts, "files")
    assert [h.stopped for h in hosts] == [spark_hosts.STOP_GRACE_S] * 2
    fresh = [_FakeHost(name=h.name, address=h.address, stopped=None) for h in HOSTS]
    with pytest.raises(ValueError, match="workers=3 cannot be split evenly over 2 host"):
        spark_hosts.launch(SimpleNamespace(**{**vars(spec), "world_size": 3}), 1.0, fresh, "files")
    assert [h.stopped for h in fresh] == [None, None]


def _spark_jvms(since: float, marks: list[str]) -> list[str]:
    """Java processes started since ``since`` whose command line or environment names one of ``marks``."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "create_time"]):
        try:
            if "java" not in (proc.info["name"] or "") or proc.info["create_time"] < since - 1:
                continue
            text = " ".join(proc.info["cmdline"] or []) + " " + " ".join(f"{k}={v}" for k, v in proc.environ().items())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(mark in text for mark in marks):
            found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:300]}")
    return found


_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
# heavy (60-80 s each): at a landing spark_per_job's cross-host cell is its host-loss case's retry
# (tests/platforms/test_host_loss.py), which checks that nothing of it is left on the hosts; this one adds its
# phases, its worker logs and that no Spark JVM of it is left anywhere; the DataFrame feed is checked on a
# standalone cluster at a landing (tests/platforms/spark/test_spark_dataframe.py)
@pytest.mark.heavy
@pytest.mark.parametrize("backend", ["spark_per_job", "spark_dataframe_per_job"])
def test_a_spark_cell_across_two_emulated_hosts(backend, tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell
    from pipelines.cluster import EmulatedCluster
    from pipelines.training import phases

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "sparkx-run"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    started = time.time()
    with EmulatedCluster("sparkx", hosts=2, network="100mbit") as cluster:
        addresses = [h.address for h in cluster.hosts]
        result = run_cell(config, paths, backend, 2, hosts=cluster.hosts)
        left = {h.name: h.pids() for h in cluster.hosts}  # the launch stopped everything it started
        jvms = _spark_jvms(started, [str(tmp_path), *addresses])
    assert left == {"h0": [], "h1": []}, left
    assert jvms == [], jvms

    assert result.status == "ok" and result.world_size == 2, result.error
    assert result.platform_mode == "cluster-2-hosts" and result.data_feed == (
        "dataframe" if "dataframe" in backend else "files")
    assert result.test is not None and result.phases["compute"] > 0 and result.phases["provision"] > 0
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds

    # each rank's own report: its host, its eth0 address, the executor that started it
    hosts = {p.split()[0]: p for p in result.placements}
    assert sorted(hosts) == ["h0", "h1"], result.placements
    for k, name in enumerate(("h0", "h1")):
        assert hosts[name].startswith(f"{name} {addresses[k]} executor app-"), result.placements
    cell = paths.cell(backend, 2, 0)
    assert not cell.placements.exists()  # nothing but the ranks says where they ran
    moved = json.loads(cell.link_bytes.read_text())
    assert result.link_bytes == moved and set(moved) == {"h0", "h1"}
    for host, counts in moved.items():  # the gradients (and Spark's own traffic) crossed the link
        assert counts["tx"] > MB and counts["rx"] > MB, (host, counts)
    work = cell.root / spark_hosts.DAEMON_DIR
    assert {p.name for p in work.glob("worker-*.log")} == {"worker-h0.log", "worker-h1.log"}
    print(f"\n{backend} across 2 hosts @100mbit: total {result.total_seconds:.2f}s, start-up "
          f"{result.startup_seconds:.2f}s, training {result.training_seconds:.2f}s, teardown "
          f"{result.phases.get('teardown', float('nan')):.2f}s, placements {result.placements}, "
          f"phases {json.dumps(result.phases)}, bytes {json.dumps(moved)}")
