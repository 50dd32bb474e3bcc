"""``spark_master="embedded"``: the run starts its own Spark standalone cluster (real master +
workers from the pyspark distribution, 127.0.0.1), preprocesses and trains the spark cells on it
in barrier mode, and stops it afterwards: after a finished run and after a failure. Its secret and
its daemons' lifetime (a SIGKILLed CLI, the sweep): tests/engines/spark/test_spark_security.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.cluster import netns
from pipelines.engines.spark import cluster as spark_cluster, daemons as spark_daemons
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import RunPaths
from tests.run.test_cli import ROOT, cli, data_options

pytestmark = pytest.mark.slow


def _spark_daemons(folder: Path) -> list[int]:
    """Pids of Spark master/worker JVMs whose command line names ``folder`` (this test's cluster)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"org.apache.spark.deploy" in cmd and str(folder).encode() in cmd + environ:
            pids.append(int(proc.name))
    return pids


def test_cluster_is_stopped_when_the_work_inside_fails(tmp_path, make_config):
    paths = RunPaths(tmp_path / "run")
    config: BenchmarkConfig = make_config(spark_master="embedded")
    with pytest.raises(RuntimeError, match="a cell failed"):
        with spark_cluster.embedded_cluster(paths, config) as url:
            assert url.startswith("spark://127.0.0.1:")
            info = json.loads(paths.engine_cluster_info("spark").read_text())
            assert len(info["pids"]) == 1 + spark_cluster.host_workers()  # master + one worker per core
            assert info["owner"].startswith(f"{os.getpid()}:")  # tied to the CLI (test_spark_security.py)
            assert spark_daemons.secret_for(url) == info["secret"]  # its drivers authenticate
            assert spark_cluster.is_running(paths) and spark_cluster.master_url(config, paths) == url
            assert _spark_daemons(paths.engine_cluster("spark"))
            raise RuntimeError("a cell failed")
    assert not paths.engine_cluster_info("spark").exists() and not _spark_daemons(paths.engine_cluster("spark"))  # no leftover JVM
    with pytest.raises(spark_cluster.ClusterNotRunning, match="was not started"):
        spark_cluster.master_url(config, paths)
    assert spark_cluster.master_url(make_config(spark_master="local[2]"), paths) == "local[2]"


def test_sigterm_during_the_run_still_stops_the_cluster(tmp_path, imdb_dir, bert_tiny_dir):
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "run", "--profile", "smoke", "--output", str(out),
                             "--run-id", "stopped", "--set", "spark_master=embedded",
                             *data_options(imdb_dir, bert_tiny_dir)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    paths = RunPaths(out / "stopped")
    deadline = time.monotonic() + 180
    while not spark_cluster.is_running(paths) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert spark_cluster.is_running(paths), proc.communicate()[0][-3000:] if proc.poll() is not None else "not up"
    proc.send_signal(signal.SIGTERM)  # as `timeout`, systemd or an Airflow task kill would
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM" in output
    assert not paths.engine_cluster_info("spark").exists() and not _spark_daemons(paths.engine_cluster("spark"))
    # the run's network namespace the cluster ran in is gone with it (no holder names this run)
    assert netns.run_state(paths) is None
    assert not [pid for pid, folder in netns.holders() if folder == netns.run_folder(paths).resolve()]


def test_bad_spark_master_is_refused_with_the_field_named(make_config):
    with pytest.raises(Exception, match="spark_master"):
        make_config(spark_master="sprak://typo:7077")


@pytest.mark.heavy  # ~3 min; CI: the cluster path in test_spark_dataframe.py, test_spark_security.py
def test_run_trains_spark_on_its_embedded_cluster_and_stops_it(tmp_path, imdb_dir, bert_tiny_dir):
    out = tmp_path / "runs"
    proc = cli("run", "--profile", "smoke", "--output", str(out), "--run-id", "embedded",
               "--set", "spark_master=embedded", "--set", 'backends=["ddp", "spark"]',
               "--set", "worker_counts=[2]", "--set", "max_seq_len=32",
               *data_options(imdb_dir, bert_tiny_dir), cwd=tmp_path)
    paths = RunPaths(out / "embedded")
    assert proc.returncode == 0, proc.stderr[-4000:]
    spark = json.loads(paths.cell("spark", 2, 0).result.read_text())
    ddp = json.loads(paths.cell("ddp", 2, 0).result.read_text())
    assert spark["status"] == "ok" and spark["platform_mode"] == "cluster" and ddp["platform_mode"] == "torchrun"
    # each rank ran in its own executor of the cluster (2 workers x 1 core): recorded per rank
    executors = [p.split(" executor ")[1] for p in spark["placements"]]
    assert len(set(executors)) == 2 and all(e.startswith("app-") for e in executors), spark["placements"]
    assert " executor " not in " ".join(ddp["placements"]) and len(ddp["placements"]) == 2
    # barrier tasks ran on the embedded cluster's executors: their stderr names the barrier sync
    stderr = "".join(p.read_text(errors="replace") for p in paths.engine_cluster("spark").glob("worker*/app-*/*/stderr"))
    assert "BarrierTaskContext" in stderr
    # the data stage ran there too, and everything is gone afterwards
    master_log = (paths.engine_cluster("spark") / "master.log").read_text()
    assert "Registered app preprocess" in master_log and "Registered app train-spark-w2-r0" in master_log
    assert not paths.engine_cluster_info("spark").exists() and not _spark_daemons(paths.engine_cluster("spark"))
    report = (paths.root / "report" / "report.md").read_text()
    assert "| spark | cluster, files feed | 2 |" in report and "Local modes are not" not in report
