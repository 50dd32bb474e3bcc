"""Spark TorchDistributor with the training rows fed through Spark: ``backends=["spark_dataframe"]``.

The files feed (``spark``) starts the shared loop in TorchDistributor's tasks and lets every rank
read the token shards itself. Here the data stage's tokenized train split travels through Spark,
as a team that hands TorchDistributor a DataFrame would feed it:

1. the driver reads the train token shards (the files ``read_token_split`` reads, in its order)
   as a DataFrame; a row's id is its index in that order (file name, then row in the file), the
   index the files feed uses;
2. the plan (``partition_plan``) is DistributedSampler's seeded shuffle at epoch 0: rank r gets
   the rows the files feed's rank r trains in its first epoch, padded like DistributedSampler
   (the first rows of the shuffle once more) to ``rows_per_rank`` each, because ranks that run
   different step counts hang DDP's all-reduce. The plan's numbers go to ``<cell>/data_feed.json``;
3. the rows are hash-partitioned into exactly world_size partitions with partition r holding
   rank r's rows (``partition_keys``), and ``TorchDistributor._train_on_dataframe`` runs
   ``pipelines.platforms.spark.feed.train_worker`` in one barrier task per partition (rank =
   partition id). Each rank reads its partition once and trains on it, every row once per epoch.

Only the training rows travel through Spark: validation and test evaluation keep reading the token
shards (the shared loop), as under every other backend, and the loop still opens the train shards
for their row count. Everything (session, DataFrame, barrier stage, reading the partition) is
inside the cell's timed window, since that is what feeding data through Spark costs: start-up
(launch -> first step) includes it.

The barrier tasks need executors: a ``local[...]`` master is refused before the cell starts
(``local_master_refusal``; pipelines.run.preflight checks it before the data stage too), unless the
cell runs across launch hosts (``run_cell(..., hosts=...)``), which builds its own standalone
cluster on them (``pipelines.platforms.spark.hosts``; ``platform_mode`` cluster-<k>-hosts).

    python -m pipelines run --profile nightly --set 'backends=["spark", "spark_dataframe"]'
"""

from __future__ import annotations

import logging
from itertools import chain
from typing import ClassVar

from pipelines.platforms.spark import distributor as spark_torch
from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import BenchmarkConfig, ConfigError, TrainingStrategy
from pipelines.platforms.spark.distributor import is_local_master
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.platforms.spark.hosts import SparkOnHosts

log = logging.getLogger(__name__)
FEED_RECORD = "data_feed.json"


def local_master_refusal(master: str) -> str | None:
    """Why ``master`` cannot run the dataframe feed, or None when it can."""
    if not is_local_master(master):
        return None
    return (f"spark_master={master!r} cannot run the spark_dataframe backend: it feeds the training rows "
            "to the ranks in Spark barrier tasks on executors, and a local master has none. Set "
            "spark_master to 'embedded' (a standalone cluster the run starts and stops) or a cluster "
            "master URL (spark://host:7077), or leave spark_dataframe out of backends.")


def partition_plan(rows: int, world_size: int, seed: int):
    """-> pandas frame (row_id, rank, position): rank r trains ``row_id`` as its ``position``-th row.

    DistributedSampler's own epoch-0 split (shuffle with ``seed``, padded with the first rows of
    the shuffle to a multiple of world_size), so both feeds give each rank the same rows at first.
    """
    import pandas as pd
    from torch.utils.data import DistributedSampler

    frames = []
    for rank in range(world_size):
        ids = list(DistributedSampler(range(rows), num_replicas=world_size, rank=rank, shuffle=True, seed=seed))
        frames.append(pd.DataFrame({"row_id": pd.Series(ids, dtype="int64"), "rank": rank,
                                    "position": pd.Series(range(len(ids)), dtype="int32")}))
    plan = pd.concat(frames, ignore_index=True)
    plan["rank"] = plan["rank"].astype("int32")
    return plan


def partition_keys(spark, world_size: int) -> list[int]:
    """One key per rank r such that ``repartition(world_size, key)`` puts the key's rows in
    partition r.

    Spark's hash partitioning places a row in partition pmod(hash(key), N) (HashPartitioning is
    the SQL ``hash``, murmur3 with seed 42), and TorchDistributor makes partition r rank r.
    Partitioning by the rank itself would collide: hash(0) and hash(1) both fall in partition 1
    of 2, which would leave a task without rows. So the keys are found with Spark's own hash, on
    the driver (an inline table folds to a local scan: no job on the executors).
    """
    candidates = 64 * world_size
    values = ", ".join(f"({i}L)" for i in range(candidates))
    found: dict[int, int] = {}
    for row in spark.sql(f"SELECT id, pmod(hash(id), {world_size}) AS target "
                         f"FROM VALUES {values} AS candidates(id)").collect():
        found.setdefault(row["target"], row["id"])
    missing = [r for r in range(world_size) if r not in found]
    if missing:
        raise RuntimeError(f"no partition key among {candidates} candidates hashes to partition(s) "
                           f"{missing} of {world_size}")
    return [int(found[r]) for r in range(world_size)]


def training_frame(spark, paths: RunPaths, world_size: int, seed: int):
    """-> (DataFrame of FEED_COLUMNS in world_size partitions, partition r = rank r's rows; the
    numbers of the plan for data_feed.json)."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from pipelines.data.tokens import FEED_COLUMNS  # pandas: not at import (the DAG file lists platforms)

    split = paths.token_split("train")
    files = sorted(split.glob("part-*.parquet"))  # read_token_split's files, in its order
    if not files:
        raise FileNotFoundError(f"no token shards (part-*.parquet) in {split}: run preprocessing first")
    offsets, rows = {}, 0
    for f in files:  # row counts from the parquet footers: the id of a file's first row
        offsets[f.name] = rows
        rows += pq.read_metadata(f).num_rows
    plan = partition_plan(rows, world_size, seed)
    keys = partition_keys(spark, world_size)
    plan["partition_key"] = plan["rank"].map(dict(enumerate(keys))).astype("int64")

    # every column type is one pyspark's partition loader converts (no array<tinyint>: the int8
    # mask travels as array<int>); the ranks get the columns in FEED_COLUMNS order
    first_row = F.create_map(*chain.from_iterable((F.lit(name), F.lit(n)) for name, n in offsets.items()))
    tokens = spark.read.parquet(*map(str, files)).select(
        (first_row[F.col("_metadata.file_name")] + F.col("_metadata.row_index")).alias("row_id"),
        F.col("input_ids").cast("array<int>"), F.col("attention_mask").cast("array<int>"),
        F.col("label").cast("bigint"))
    frame = (tokens.join(F.broadcast(spark.createDataFrame(plan)), "row_id")
             .repartition(world_size, "partition_key")
             .select(*FEED_COLUMNS))
    rows_per_rank = len(plan) // world_size
    record = {"feed": "dataframe", "source": str(split), "files": [f.name for f in files], "rows": rows,
              "world_size": world_size, "rows_per_rank": rows_per_rank, "padded_rows": len(plan) - rows,
              "plan": f"DistributedSampler(shuffle=True, seed={seed}) at epoch 0, padded like it",
              "spark_partitions": world_size}
    return frame, record


class SparkDataFrameBackend(SparkOnHosts, TrainingBackend):
    name = "spark_dataframe"
    data_feed = "dataframe"
    # the rank side (a pipelines.training.distributed.TorchDistributed subclass); None = the
    # default, pipelines.platforms.spark.feed.SparkPartitionFeed (imported in the ranks only)
    feed: ClassVar[type | None] = None

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        # on a cluster's hosts the cell brings its own standalone master (pipelines.platforms.spark.hosts)
        refusal = local_master_refusal(config.engine("spark").master) if config.cluster.kind == "local" else None
        return [*([refusal] if refusal else []), *super().preflight(config, cells)]

    def strategy_refusal(self, strategy: TrainingStrategy, world_size: int) -> str | None:
        """A pipeline's every stage needs the rows of the whole global batch; this feed hands each
        rank its own partition (the files feed, ``spark``, runs pipelines)."""
        if strategy.pipeline_microbatches:
            return (f"strategy {strategy.name!r} on {self.name}: every pipeline stage needs every row of a "
                    "step's global batch, and the dataframe feed gives each rank its own partition; run it on "
                    "the files feed (spark)")
        return super().strategy_refusal(strategy, world_size)

    def spec(self, config: BenchmarkConfig, world_size: int, paths: RunPaths, cell: CellPaths,
             repeat: int, strategy: str | None = None) -> CellSpec:
        problem = None if getattr(self, "_on_hosts", False) else local_master_refusal(config.engine("spark").master)
        if problem:
            raise ConfigError(problem)
        return super().spec(config, world_size, paths, cell, repeat, strategy)

    def train(self, spark, distributor, spec: CellSpec, launch_time: float) -> None:
        from pipelines.platforms.spark.feed import train_worker

        # the plan is small (3 ints a row): Arrow makes it a DataFrame in one piece
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        frame, record = training_frame(spark, spec.paths, spec.world_size, spec.config.training.seed)
        atomic_write_json(spec.cell_dir / FEED_RECORD, record)
        log.info("dataframe feed: %d train rows -> %d partition(s) of %d rows (%d padded)", record["rows"],
                 spec.world_size, record["rows_per_rank"], record["padded_rows"])
        distributor._train_on_dataframe(train_worker, frame, str(spec.cell_dir), launch_time,
                                        record["rows_per_rank"], self.feed)

    def platform_fields(self, spec: CellSpec) -> dict:
        return spark_torch.platform_fields(spec, hosts=self.hosts_used(spec))

    def versions(self) -> dict[str, str]:
        return spark_torch.versions(launcher="TorchDistributor._train_on_dataframe")


class SparkDataFramePerJobBackend(SparkDataFrameBackend):
    """The dataframe feed on a Spark cluster of the cell's own, brought up inside its window
    (on this host: an embedded one, which has the executors the feed needs)."""

    name = "spark_dataframe_per_job"
