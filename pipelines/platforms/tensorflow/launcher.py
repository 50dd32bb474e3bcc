"""TensorFlow's launcher: it has none of its own (a multi-worker job is one process per worker, each
told the cluster by ``TF_CONFIG``), so this starts a host's ranks (``worker.py``) as children.

    python -m pipelines.platforms.tensorflow.launcher --cell-dir D --launch-time T --nproc 2
        # one host: 2 ranks on free loopback ports
    python -m pipelines.platforms.tensorflow.launcher --cell-dir D --launch-time T \\
        --workers h0:p0,h1:p1 --ranks 1     # this host's ranks of every rank's address

A rank failing stops the others (the first failure's exit code is this one's); SIGTERM here stops them
(SIGTERM, then SIGKILL after ``STOP_GRACE_S``); each rank dies with this process (``PR_SET_PDEATHSIG``),
so a SIGKILLed launcher leaves none.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time

from pipelines.cluster.processes import _die_with_parent, stop_tree

WORKER_MODULE = "pipelines.platforms.tensorflow.worker"
STOP_GRACE_S = 10.0
POLL_S = 0.1


def loopback_workers(count: int) -> str:
    """``count`` different free loopback ports as TF_CONFIG's worker list (bound together, released
    just before the ranks bind them)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return ",".join(f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--nproc", type=int, help="start this many ranks on loopback ports")
    who.add_argument("--ranks", help="start these ranks (comma-separated) of --workers")
    parser.add_argument("--workers", help="host:port of every rank, comma-separated (with --ranks)")
    args = parser.parse_args(argv)
    if args.nproc is not None:
        if args.nproc < 1:
            raise SystemExit(f"--nproc {args.nproc}: at least one rank")
        workers, ranks = loopback_workers(args.nproc), list(range(args.nproc))
    elif not args.workers:
        raise SystemExit("--ranks needs --workers (every rank's host:port)")
    else:
        workers, ranks = args.workers, [int(r) for r in args.ranks.split(",")]
    raise SystemExit(launch_ranks(ranks, workers, args.cell_dir, args.launch_time))


def launch_ranks(ranks: list[int], workers: str, cell_dir: str, launch_time: float) -> int:
    """Start ``ranks`` as children; -> the first failure's exit code (0: all finished)."""
    children = [subprocess.Popen([sys.executable, "-m", WORKER_MODULE, "--cell-dir", cell_dir,  # noqa: PLW1509
                                  "--launch-time", repr(launch_time), "--workers", workers, "--index", str(rank)],
                                 preexec_fn=_die_with_parent) for rank in ranks]

    def stop(signum, _frame):
        stop_tree(children, STOP_GRACE_S)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            codes = [c.poll() for c in children]
            failed = next((code for code in codes if code not in (None, 0)), None)
            if failed is not None:
                print(f"a rank exited with {failed}: stopping the others", flush=True)
                return failed
            if all(code == 0 for code in codes):
                return 0
            time.sleep(POLL_S)
    finally:
        stop_tree(children, STOP_GRACE_S)


if __name__ == "__main__":
    main()
