"""The dataframe feed's rank side: train on the rows this rank received through Spark.

``pipelines.platforms.spark.dataframe`` builds the tokenized train DataFrame (one partition per
rank) and runs ``train_worker`` in TorchDistributor's barrier tasks. In each task
TorchDistributor writes the partition to a local Arrow file before it starts the rank;
``SparkPartitionFeed.prepare_loader`` reads it once per cell with pyspark's
``_get_spark_partition_data_loader`` into a ``TensorDataset`` and hands the shared loop a train
loader over those rows instead of the files feed's. ``PartitionSampler`` shows every row of
the partition once per epoch. Validation and test rows are still read from the token shards
(the shared loop), so only the training rows travel through Spark.
"""

from __future__ import annotations

import logging
import time

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from pipelines.training.cell import CellSpec
from pipelines.data.tokens import FEED_COLUMNS
from pipelines.training.distributed import DistEnv, TorchDistributed

log = logging.getLogger("pipelines.training")
READ_BATCH = 512  # rows per batch while reading the partition (one pass; any size gives the same rows)


class PartitionSampler(Sampler[int]):
    """Every row of the partition once per epoch.

    Epoch 0 keeps the plan's order (the plan is DistributedSampler's seeded shuffle), so the first
    epoch trains exactly what the files feed trains; each later epoch is a permutation seeded by
    seed + epoch (``set_epoch``, as DistributedSampler does), within this rank's rows.
    """

    def __init__(self, rows: int, seed: int) -> None:
        self.rows, self.seed, self.epoch = rows, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.rows

    def __iter__(self):
        if self.epoch == 0:
            return iter(range(self.rows))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.rows, generator=generator).tolist())


class SparkPartitionFeed(TorchDistributed):
    """torchrun's contract (TorchDistributor sets it per barrier task), with the train loader
    replaced by one over this task's Spark partition."""

    def __init__(self, spec: CellSpec, rows_per_rank: int) -> None:
        super().__init__()
        self.spec, self.rows_per_rank = spec, rows_per_rank
        self.row_ids: torch.Tensor | None = None  # train-split row id of each local row, in order

    def read_partition(self, env: DistEnv) -> dict[str, torch.Tensor]:
        """This task's partition, read once, columns by name, rows in the plan's order."""
        from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

        # num_samples = the planned count: fewer rows would wrap around, which the check below sees
        batches = list(_get_spark_partition_data_loader(num_samples=self.rows_per_rank, batch_size=READ_BATCH,
                                                        num_workers=0))
        columns = dict(zip(FEED_COLUMNS, (torch.cat(c) for c in zip(*batches))))
        order = torch.argsort(columns["position"])
        columns = {name: values[order] for name, values in columns.items()}
        ranks = sorted(set(columns["rank"].tolist()))
        if ranks != [env.rank] or not torch.equal(columns["position"], torch.arange(self.rows_per_rank)):
            raise RuntimeError(
                f"rank {env.rank}: its Spark partition holds rows planned for rank(s) {ranks} at "
                f"{len(set(columns['position'].tolist()))} distinct position(s); the plan gives every rank "
                f"{self.rows_per_rank} rows (positions 0..{self.rows_per_rank - 1}). Spark did not place "
                "partition r = rank r's rows (pipelines.platforms.spark.dataframe.partition_keys).")
        return columns

    def prepare_loader(self, loader: DataLoader, env: DistEnv) -> DataLoader:
        start = time.perf_counter()
        rows = self.read_partition(env)
        self.row_ids = rows["row_id"]
        dataset = TensorDataset(rows["input_ids"].long(), rows["attention_mask"].long(), rows["label"].long())
        if env.is_main:
            log.info("dataframe feed: %d rows from this task's Spark partition in %.2fs", len(dataset),
                     time.perf_counter() - start)
        return DataLoader(dataset, batch_size=loader.batch_size,
                          sampler=PartitionSampler(len(dataset), self.spec.config.training.seed))


def train_worker(cell_dir: str, launch_time: float, rows_per_rank: int, feed: type | None = None) -> None:
    """One rank of the dataframe feed (a barrier task of ``TorchDistributor._train_on_dataframe``)."""
    from pipelines.training.loop import run_training
    from pipelines.training.process import setup_logging

    setup_logging()
    spec = CellSpec.read(cell_dir)
    run_training(spec, float(launch_time), distributed=(feed or SparkPartitionFeed)(spec, int(rows_per_rank)))
