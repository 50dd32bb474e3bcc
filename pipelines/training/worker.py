"""The worker entry point torchrun and TorchDistributor run in every rank.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m pipelines.training.worker --cell-dir runs/<id>/cells/<cell> --launch-time <epoch s>

Reads ``<cell-dir>/cell.json`` (``pipelines.training.cell.CellSpec``, written by the backend adapter)
and the RANK/LOCAL_RANK/WORLD_SIZE env that torchrun sets, runs the shared loop, and rank 0
writes ``<cell-dir>/worker_result.json`` (``pipelines.training.process.RankProcess``: what every
rank does under every launcher). Pass paths, not data: every argument is a string,
so the same call works as well where a platform pickles it to its workers.
"""

from __future__ import annotations

import argparse


def train_worker(cell_dir: str, launch_time: float) -> None:
    """Train one cell in this process (one rank). Called by torchrun and TorchDistributor."""
    from pipelines.training.cell import CellSpec
    from pipelines.training.loop import run_training
    from pipelines.training.process import setup_logging

    setup_logging()
    run_training(CellSpec.read(cell_dir), float(launch_time))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True,
                        help="time.time() when the adapter started; start-up is measured from it")
    args = parser.parse_args(argv)
    train_worker(args.cell_dir, args.launch_time)


if __name__ == "__main__":
    main()
