"""A platform's driver for a one-host cell, in a process of its own, in its cluster's network namespace:

    python -m pipelines.run.driver --cell-dir <cell> --launch-time <s> --adapter <module:Class>

Some platforms' drivers (a library's session object with its JVM, a cluster client's ``init`` and
its trainer) run in the process that calls them and reach their cluster over loopback, while the
cluster and what it starts (executors, torchrun's store, a head node's control services and its
workers) listen on every interface unless they live in a loopback-only network namespace
(``pipelines.cluster.netns``); the driver must then live there too. So the adapter's ``launch``
starts that process (``launch`` here) in:

- the run's namespace, when the cell uses a cluster the run keeps standing on this host (an
  embedded or standing cluster of the platform: each records where it runs);
- a namespace of the cell's own, when the cluster is the cell's (a per-job cluster, a platform's
  local mode): held open from the driver's start (``netns.pin``), so that after the driver exits whatever
  it left there is proved to be the cell's, and stopped;
- this host's, when the cluster is someone else's, reached over the network (a cluster URL or
  address in the platform's settings).

Which of these a platform's cells use is said in its package (``pipelines/platforms/<name>/``).

That process (``pipelines.run.driver``) reads the cell's spec and calls ``drive(spec, launch_time)`` of the runner's adapter
class (``--adapter module:Class``: the platform's, or a subclass of it); its output
is teed to the cell's log. A fresh driver process per cell is also how teams submit a job
(a cluster's submit command, a job's entrypoint script), and every runner (CLI, DAG task, bench) pays the same
start-up inside the cell's window. A signal to the cell's runner stops the driver's tree
(``run_to_end``); a SIGKILLed runner takes it down through ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from pipelines.cluster import netns
from pipelines.cluster.processes import run_to_end
from pipelines.training.cell import CellSpec

log = logging.getLogger(__name__)
MODULE = "pipelines.run.driver"  # the process's entry point
RECORD = "driver.json"  # in the cell folder: the driver's pid and network namespace
STOP_GRACE_S = 30.0  # SIGTERM -> SIGKILL: the driver stops its session / cluster meanwhile


def launch(adapter, spec: CellSpec, launch_time: float, where: netns.Namespace) -> None:
    """Run the cell's driver process (``MODULE``, calling ``adapter``'s class's ``drive``) in ``where`` to
    completion; raise with its output's tail when it fails. Afterwards, whatever it left in a
    namespace of its own is stopped."""
    record = spec.cell_dir / RECORD
    record.unlink(missing_ok=True)
    cls = type(adapter)
    cmd = [*where.prefix, sys.executable, "-m", MODULE, "--cell-dir", str(spec.cell_dir),
           "--launch-time", repr(launch_time), "--adapter", f"{cls.__module__}:{cls.__qualname__}"]
    log.info("%s: the driver runs in %s", spec.backend, {"own": "a network namespace of the cell's own",
                                                        "run": "the run's network namespace, with its cluster",
                                                        "host": "this host's network namespace"}[where.kind])
    pinned: list[int] = []  # the namespace of the cell's own, held open until what is left in it is stopped

    def started(proc) -> None:
        if where.kind == "own" and (fd := netns.pin(proc.pid)) is not None:
            pinned.append(fd)

    try:
        run_to_end(cmd, os.environ, spec.cell.log, what=f"the {spec.backend} driver", grace_s=STOP_GRACE_S,
                   started=started)
    except RuntimeError as err:
        said = _read(record).get("error")  # the driver's own exception first, then its log's tail
        if said:
            raise RuntimeError(f"the {spec.backend} driver failed: {said}\n{err}") from None
        raise
    finally:
        for fd in pinned:
            left = netns.stop_pinned(fd)
            if left:
                log.warning("%s: stopped %d process(es) the driver left in its namespace: %s", spec.backend,
                            len(left), left)


def _read(record) -> dict:
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return {}


