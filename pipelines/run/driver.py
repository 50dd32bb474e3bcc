"""The entry point of a cell's driver process, started by ``pipelines.platforms.driver.launch`` in
its cluster's network namespace:

    python -m pipelines.run.driver --cell-dir <cell> --launch-time <s> --adapter <module:Class>

It reads the cell's spec, records its pid and network namespace (``<cell>/driver.json``: the
runner stops what is left in a namespace of the cell's own), and calls ``drive(spec, launch_time)``
of the runner's adapter class (the platform's, or a subclass of it); an error it raises is recorded
there too, for the runner's message. SIGTERM takes its whole tree
down and exits at once (``signals.end_tree_on_signal``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from pipelines.cluster import netns
from pipelines.measure.signals import end_tree_on_signal
from pipelines.platforms.driver import RECORD
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.training.cell import CellSpec


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a platform's driver for a one-host cell")
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    parser.add_argument("--adapter", required=True, help="module:Class of the cell's adapter")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s driver: %(message)s", stream=sys.stdout)
    end_tree_on_signal()  # SIGTERM (the runner's stop, or the kernel's when the runner died): the tree goes
    spec = CellSpec.read(args.cell_dir)
    record = {"pid": os.getpid(), "netns": netns.of_process(os.getpid())}
    atomic_write_json(spec.cell_dir / RECORD, record)
    module, _, cls = args.adapter.partition(":")
    adapter = getattr(importlib.import_module(module), cls)()  # the runner's class (a test's subclass too)
    try:
        adapter.drive(spec, args.launch_time)
    except Exception as err:  # what went wrong, for the runner's error (the log has the traceback)
        atomic_write_json(spec.cell_dir / RECORD, {**record, "error": f"{type(err).__name__}: {err}"[-4000:]})
        raise


if __name__ == "__main__":
    main()
