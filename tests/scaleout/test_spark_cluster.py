"""Spark standalone cluster on loopback: a master and two workers (1 core, 1 GiB each) started
from the pyspark distribution; the ``spark`` backend trains through them in barrier mode
(TorchDistributor local_mode=False: one torchrun per Spark task, on the executors) and must
reproduce a local 2-process DDP run exactly.

The cluster is a module fixture: ``$SPARK_HOME/bin/spark-class`` with SPARK_HOME = the pyspark
package folder, SPARK_LOCAL_IP=127.0.0.1, free ports, logs and work dirs under tmp; every
process group is killed at the end. Run alone:
    .venv/bin/python -m pytest tests/scaleout/test_spark_cluster.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STARTUP_S = 120  # JVM start on a loaded 2-core box


def _spark_class(home: Path, args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # own group: the JVM and its children


def _wait_for_line(log: Path, needle: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        dead = [p.args[1] for p in procs if p.poll() is not None]
        assert not dead, f"{dead} exited; {log}:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {needle!r} in {log} after {STARTUP_S}s:\n{log.read_text()[-3000:]}")


def _stop_session_on(master: str) -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    running = SparkContext._active_spark_context
    if running is not None and running.master == master:
        SparkSession.builder.getOrCreate().stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory, free_port):
    """-> (master URL, folder with master/worker logs and the workers' work dirs)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    work = tmp_path_factory.mktemp("spark-cluster")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(work), "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = [_spark_class(home, ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", str(port), "--webui-port", str(free_port())],
                          env, work / "master.log")]
    try:
        _wait_for_line(work / "master.log", "I have been elected leader", procs)
        for i in (1, 2):
            procs.append(_spark_class(home, [
                "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(work / f"worker{i}"),
            ], env, work / f"worker{i}.log"))
        for i in (1, 2):
            _wait_for_line(work / f"worker{i}.log", "Successfully registered with master", procs)
        yield url, work
    finally:
        try:
            _stop_session_on(url)  # before the master goes: the next test gets a local session
        finally:
            for proc in reversed(procs):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in reversed(procs):
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def test_get_spark_moves_from_a_local_session_to_the_cluster(spark_cluster):
    """A local session left by an earlier test must not be reused for a cluster master."""
    from pipelines.spark_session import get_spark

    url, _ = spark_cluster
    local = get_spark("local[2]", app_name="earlier-test")
    assert local.sparkContext.master == "local[2]"
    assert get_spark("local[*]") is local  # local masters are interchangeable: kept
    cluster = get_spark(url, app_name="scaleout")
    assert cluster.sparkContext.master == url
    assert local.sparkContext._jsc is None  # the local context was stopped, not reused
    assert cluster.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12  # executors work


def test_spark_backend_trains_on_the_cluster_like_local_ddp(spark_cluster, scaleout_config, scaleout_paths,
                                                              single_node_w2, assert_same_training):
    from pipelines.backends import run_cell
    from pipelines.backends.spark import task_slots
    from pipelines.spark_session import get_spark

    url, work = spark_cluster
    result = run_cell(scaleout_config(spark_master=url), scaleout_paths, "spark", 2)
    assert result.status == "ok" and result.world_size == 2 and result.backend.value == "spark"
    assert result.versions["launcher"] == "TorchDistributor"
    spark = get_spark(url)
    assert spark.sparkContext.master == url and task_slots(spark, 2) == 2  # 2 workers x 1 core

    # One barrier task (= one torchrun node) ran in the executor of each of the two workers.
    for i in (1, 2):
        stderr = "".join(p.read_text(errors="replace") for p in (work / f"worker{i}").glob("app-*/*/stderr"))
        assert "BarrierTaskContext" in stderr and "finished global sync successfully" in stderr, (
            f"worker {i}'s executor ran no barrier task:\n{stderr[-3000:]}")
    assert_same_training(result, single_node_w2)


def test_more_processes_than_cluster_slots_is_refused_not_hung(spark_cluster, scaleout_config,
                                                                scaleout_paths, monkeypatch):
    from pipelines.backends import run_cell, spark

    url, _ = spark_cluster
    monkeypatch.setattr(spark, "SLOT_WAIT_S", 20.0)  # the cell's own session: its executors start anew
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="needs 3 concurrent Spark tasks but .* offers 2"):
        run_cell(scaleout_config(spark_master=url), scaleout_paths, "spark", 3)
    assert time.monotonic() - started < 60
