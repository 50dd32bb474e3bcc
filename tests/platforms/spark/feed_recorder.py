"""Test-only rank side of the dataframe feed that writes down which rows each rank trains.

``RecordingFeed`` is the production ``SparkPartitionFeed`` with its train loader's sampler wrapped:
each epoch, the rows the loader is about to yield (train-split row ids, in training order) go to
``<cell>/feed-record/rank<r>-epoch<e>.json``. Given to the backend as ``feed`` (a class attribute),
it travels to the barrier tasks by reference (cloudpickle), so the ranks import this module.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.data import DataLoader, Sampler

from pipelines.platforms.spark.dataframe import SparkDataFrameBackend
from pipelines.platforms.spark.feed import SparkPartitionFeed

RECORD_DIR = "feed-record"


class RecordingSampler(Sampler[int]):
    def __init__(self, inner, row_ids: list[int], folder: Path, rank: int) -> None:
        self.inner, self.row_ids, self.folder, self.rank = inner, row_ids, folder, rank

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        order = list(self.inner)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{self.rank}-epoch{self.inner.epoch}.json").write_text(
            json.dumps([self.row_ids[i] for i in order]))
        return iter(order)


class RecordingFeed(SparkPartitionFeed):
    def prepare_loader(self, loader, env):
        loader = super().prepare_loader(loader, env)
        sampler = RecordingSampler(loader.sampler, self.row_ids.tolist(), Path(self.spec.cell_dir) / RECORD_DIR,
                                   env.rank)
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler)


def recorded(cell_dir: Path) -> dict[tuple[int, int], list[int]]:
    """{(rank, epoch): row ids in training order} of one cell."""
    out = {}
    for path in sorted((Path(cell_dir) / RECORD_DIR).glob("rank*-epoch*.json")):
        rank, epoch = path.stem.removeprefix("rank").split("-epoch")
        out[int(rank), int(epoch)] = json.loads(path.read_text())
    return out


class RecordingDataFrameBackend(SparkDataFrameBackend):
    """The dataframe feed with ``RecordingFeed`` on its ranks: a module of its own, so the cell's
    driver process (``pipelines.run.driver --adapter``) imports it without a test module."""

    feed = RecordingFeed
