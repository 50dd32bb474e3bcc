"""Spark standalone cluster on loopback: a master and two workers (1 core, 1 GiB each) started
from the pyspark distribution; the ``spark`` backend trains through them in barrier mode
(TorchDistributor local_mode=False: one torchrun per Spark task, on the executors) and must
reproduce a local 2-process DDP run exactly.

The cluster is a module fixture: the embedded cluster of ``pipelines.engines.spark.cluster``
(``$SPARK_HOME/bin/spark-class`` with SPARK_HOME = the pyspark package folder, 127.0.0.1, free
ports, logs and work dirs under tmp; every process group is stopped at the end). Run alone:
    .venv/bin/python -m pytest tests/platforms/spark/test_spark_cluster.py -q
"""

from __future__ import annotations

import time

import pytest

from pipelines.runfolder.paths import RunPaths

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """-> (master URL, folder with master/worker logs and the workers' work dirs): the project's
    own embedded cluster (pipelines.engines.spark.cluster) with 2 workers of 1 core."""
    from pipelines.engines.spark import cluster

    paths = RunPaths(tmp_path_factory.mktemp("spark-cluster"))
    url = cluster.start(paths, workers=2)
    try:
        yield url, paths.engine_cluster("spark")
    finally:
        from pipelines.engines.spark.session import stop_spark

        try:
            stop_spark(jvm=True)  # before the master goes; py4j's gateway JVM too: none beside later cells
        finally:
            cluster.stop(paths)


@pytest.fixture(autouse=True)
def _no_session_left_on_the_cluster():
    """A session of this process holds the cluster's cores (2 workers x 1): a cell's driver process,
    started after it, would get no executor. Each test's session ends with it."""
    yield
    from pipelines.engines.spark.session import stop_spark

    stop_spark()


def test_get_spark_moves_from_a_local_session_to_the_cluster(spark_cluster):
    """A local session left by an earlier test must not be reused for a cluster master."""
    from pipelines.engines.spark.session import get_spark

    url, _ = spark_cluster
    local = get_spark("local[2]", app_name="earlier-test")
    assert local.sparkContext.master == "local[2]"
    assert get_spark("local[*]") is local  # local masters are interchangeable: kept
    cluster = get_spark(url, app_name="scaleout")
    assert cluster.sparkContext.master == url
    assert local.sparkContext._jsc is None  # the local context was stopped, not reused
    assert cluster.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12  # executors work


@pytest.mark.heavy  # ~75 s; CI: spark on a standalone cluster in test_spark_across_hosts.py, tests/compose
def test_spark_backend_trains_on_the_cluster_like_local_ddp(spark_cluster, scaleout_config, scaleout_paths,
                                                              single_node_w2, assert_same_training):
    from pipelines.run.cells import run_cell
    from pipelines.platforms.spark.distributor import task_slots
    from pipelines.engines.spark.session import get_spark

    url, work = spark_cluster
    result = run_cell(scaleout_config(spark_master=url), scaleout_paths, "spark", 2)
    assert result.status == "ok" and result.world_size == 2 and result.backend == "spark"
    assert result.platform_mode == "cluster"  # barrier tasks on the executors, not torchrun on the driver
    assert result.versions["launcher"] == "TorchDistributor"
    spark = get_spark(url)
    assert spark.sparkContext.master == url and task_slots(spark, 2) == 2  # 2 workers x 1 core

    # One barrier task (= one torchrun node) ran in the executor of each of the two workers.
    for i in (1, 2):
        stderr = "".join(p.read_text(errors="replace") for p in (work / f"worker{i}").glob("app-*/*/stderr"))
        assert "BarrierTaskContext" in stderr and "finished global sync successfully" in stderr, (
            f"worker {i}'s executor ran no barrier task:\n{stderr[-3000:]}")
    assert_same_training(result, single_node_w2)


@pytest.mark.heavy  # 24 s in CI, beside the cluster test above that CI keeps
def test_more_processes_than_cluster_slots_is_refused_not_hung(spark_cluster, scaleout_config,
                                                                scaleout_paths, monkeypatch):
    from pipelines.run.cells import run_cell

    url, _ = spark_cluster
    monkeypatch.setenv("PIPELINES_SPARK_SLOT_WAIT_S", "20")  # the cell's driver process: its executors start anew
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="needs 3 concurrent Spark tasks but .* offers 2"):
        run_cell(scaleout_config(spark_master=url), scaleout_paths, "spark", 3)
    assert time.monotonic() - started < 60
