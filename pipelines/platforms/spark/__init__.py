"""Spark TorchDistributor, with two data feeds: each rank reads the token files (``spark``), or
gets its rows through a Spark DataFrame (``spark_dataframe``).

``adapter.py`` / ``dataframe.py``: the two adapters; ``distributor.py``: the cell's SparkSession
and TorchDistributor call they share; ``hosts.py``: a standalone cluster built on the run's
hosts; ``feed.py``: the dataframe feed's training process. The Spark engine itself (session,
the run's embedded cluster) is ``pipelines.engines.spark``: the data stage uses it too.

A one-host cell's driver (the SparkSession with its JVM) runs in a process of its own
(``pipelines.platforms.driver``) in its cluster's network namespace: the run's for the embedded
cluster, the cell's own for local mode or a per-job cluster, this host's for a ``spark://`` URL.

On a cluster master each barrier task runs one torchrun: every rank is local rank 0 of 1, so the
shared loop leaves those ranks to the OS scheduler instead of pinning them all to one core
(``pipelines.training.distributed.pin_cpu_cores``; pinned, two executors on one 2-core host took
1.9x the training time). A rank's placement in the result names the executor it ran in
(``workdir_placement``: read from the executor's working directory).
"""

import json
import logging

from pipelines.engines.spark import SERVICE, SparkSettings  # the Spark engine's: the data stage uses them too
from pipelines.platforms import Platform, register

log = logging.getLogger(__name__)


def embedded_cluster_pids(paths) -> list[int]:
    """What a Spark cell uses but does not start: the run's embedded Spark Master and Workers."""
    try:
        info = paths.engine_cluster_info("spark")
        return [int(p) for p in json.loads(info.read_text()).get("pids", [])] if info.exists() else []
    except Exception as err:  # a measure: never a reason to fail the cell
        log.warning("resources: the embedded Spark cluster's pids are unreadable: %s", err)
        return []


_FEATURES = {
    "scheduler": ("the standalone master places TorchDistributor's barrier tasks on the hosts' executors",
                  "tests/platforms/spark/test_spark_across_hosts.py::test_a_spark_cell_across_two_emulated_hosts"),
    "data integration": ("a DataFrame's partitions reach the ranks through a barrier stage (the dataframe feed)",
                         "tests/platforms/spark/test_spark_dataframe.py::"
                         "test_every_training_row_reaches_exactly_one_rank_once_per_epoch"),
}
_SSH_REFUSAL = ("across SSH machines its standalone master and workers would stay running after the cell, bound "
                "to the machines' addresses, without the cluster's authentication secret; until they get a "
                "per-cell secret and a tracked stop, run it on emulated hosts or on a Spark cluster of your own "
                "(engines.spark.master=spark://...)")
# An executor runs in <worker work dir>/<app id>/<executor id>; its Python workers and the torchrun
# ranks a barrier task starts inherit that working directory: a rank's placement names its executor
_EXECUTOR_DIR = (r"/(app-\d+-\d+)/(\d+)$", "executor {0}/{1}")
_COMMON = dict(daemons=embedded_cluster_pids, process_kinds=(("pyspark", "pyspark_worker"),), ssh_refusal=_SSH_REFUSAL,
               distributions=("pyspark",), programs=("java",), features=_FEATURES,
               coordinator_note="Spark's master", retries_note="Spark `spark.task.maxFailures`",
               workdir_placement=_EXECUTOR_DIR,
               prediction_note="the study's Spark moved data and models through Spark",
               result_renames={"spark_session": "platform_session"})  # its results before the field was neutral
def _remote_ranks(config) -> str | None:  # barrier tasks run torchrun on that cluster's executors
    master = config.engine("spark").master
    return f"engines.spark.master={master}" if master.startswith(("spark://", "k8s://", "yarn")) else None


_STANDING = dict(lifetime="standing", remote_ranks=_remote_ranks, services=(SERVICE,  # the engine's embedded cluster
                                                f"{__name__}.standing:STANDING_SERVICE"))
_PER_JOB = dict(lifetime="per_job", default=False, smoke=False)  # named where a run compares lifetimes
_FEEDS_NOTE = ("spark and spark_dataframe are the same TorchDistributor run with two data feeds: each rank "
               "reads the token files (files feed), or the tokenized DataFrame's partitions reach the ranks "
               "through a Spark barrier stage (dataframe feed); their difference is what feeding the data "
               "through Spark costs.")
_LOCAL = ("TorchDistributor in local mode starts torchrun on the driver: no executor, no barrier stage, each "
          "rank reads the token files itself. It measures a SparkSession plus TorchDistributor's launch, not "
          "a Spark cluster's scheduling or data feed.")
PLATFORM = register(Platform(
    name="spark", adapter=f"{__name__}.adapter:SparkBackend", order=10, label="Spark TorchDistributor",
    colour="#c2410c", settings=SparkSettings, study_overhead=1.87,  # the study: Spark 2.87x DDP's time
    mode_caveats={"local": _LOCAL}, **_COMMON, **_STANDING,
    # Spark as teams deploy it: barrier tasks on a standalone cluster (the data stage uses it too)
    profile_settings={"nightly": {"master": "embedded"}, "paper": {"master": "embedded"}}))
PER_JOB = register(Platform(
    name="spark_per_job", adapter=f"{__name__}.adapter:SparkPerJobBackend", order=11,
    label="Spark TorchDistributor, per-job cluster", colour="#fb923c", study_overhead=1.87, variant_of="spark",
    **_COMMON, **_PER_JOB))
DATAFRAME = register(Platform(
    name="spark_dataframe", adapter=f"{__name__}.dataframe:SparkDataFrameBackend", order=40,
    label="Spark TorchDistributor (DataFrame feed)", colour="#b45309",  # engines.spark: the same Spark
    study_overhead=1.87,  # the study's one Spark figure, beside both data feeds
    smoke=False,  # needs executors: the smoke profile's local master has none
    study_note=_FEEDS_NOTE, **_COMMON, **_STANDING))
DATAFRAME_PER_JOB = register(Platform(
    name="spark_dataframe_per_job", adapter=f"{__name__}.dataframe:SparkDataFramePerJobBackend", order=41,
    label="Spark TorchDistributor (DataFrame feed), per-job cluster", colour="#d97706", study_overhead=1.87,
    variant_of="spark_dataframe", **_COMMON, **_PER_JOB))
