"""The Spark driver of a cell across hosts, run on hosts[0] (``hosts.driver_argv``):

    python -m pipelines.platforms.spark.driver --cell-dir <cell> --launch-time <s> --master spark://... --feed files

It opens the cell's session on the cluster built on the hosts and runs the feed's training step.
"""

from __future__ import annotations

import argparse
import logging
import os

from pipelines.platforms.spark import distributor
from pipelines.platforms.spark.adapter import SparkBackend, SparkPerJobBackend
from pipelines.platforms.spark.dataframe import SparkDataFrameBackend, SparkDataFramePerJobBackend
from pipelines.platforms.spark.hosts import FEEDS, session_conf
from pipelines.training.cell import CellSpec

ADAPTERS = {cls.name: cls for cls in (SparkBackend, SparkPerJobBackend, SparkDataFrameBackend,
                                      SparkDataFramePerJobBackend)}  # the Spark platforms' adapters


def drive(cell_dir: str, launch_time: float, master: str, feed: str) -> None:
    """The cell's session on ``master`` (the cluster on the hosts), the feed's training step."""
    spec = CellSpec.read(cell_dir)
    backend = ADAPTERS[spec.backend]()
    if backend.data_feed != feed:
        raise ValueError(f"--feed {feed}: the cell's backend {spec.backend} feeds {backend.data_feed!r}")
    address = os.environ["SPARK_LOCAL_IP"]
    distributor.run_distributor(spec, launch_time, backend.train, master=master, conf=session_conf(address))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the Spark driver of a cell across hosts")
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    parser.add_argument("--master", required=True, help="spark://<host0 address>:<port>")
    parser.add_argument("--feed", required=True, choices=FEEDS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s driver: %(message)s")
    drive(args.cell_dir, args.launch_time, args.master, args.feed)


if __name__ == "__main__":
    main()
