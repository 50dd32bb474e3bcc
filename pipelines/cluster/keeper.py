"""The process that owns a run's emulated cluster: builds it, holds it, stops it on SIGTERM.

    python -m pipelines.cluster.keeper --state <run>/cluster/cluster.json --name r1a2b --hosts 2 \\
        --network 1gbit [--memory-mb 4096] [--owner-pid <pid>]

Why a process of its own: the cluster's namespaces and cgroups carry their owner's PID
(``pipelines.cluster.leftovers``: a dead owner's leftovers are swept by the next start), and the
cluster must outlive the DAG task that started it, as the run's other standing clusters do. The keeper
writes the state file once the cluster is up (``status: "ready"``: what ``lifecycle.attach``
reads to reach the hosts from any process), then waits: SIGTERM, SIGINT or SIGHUP, or the death of
``--owner-pid`` (the CLI that started it), stops the cluster (every process on its hosts is
killed, namespaces and cgroups deleted) and marks the state ``stopped``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import psutil

from pipelines.cluster.emulated import EmulatedCluster
from pipelines.cluster.processes import identity
from pipelines.runfolder.fileio import atomic_write_json

log = logging.getLogger("pipelines.cluster.keeper")


def state_of(cluster: EmulatedCluster) -> dict:
    """Everything another process needs to reach the hosts (``lifecycle.attach``)."""
    return {
        # the keeper's pid with its start time: what stop() checks before any signal (a reused pid is not it)
        "status": "ready", "keeper_pid": os.getpid(), "keeper": identity(os.getpid()), "name": cluster.name,
        "prefix": cluster.prefix,
        "switch_netns": cluster.switch_netns, "network": cluster.network.text, "memory_mb": cluster.memory_mb,
        "cpu_fraction": cluster.cpu_fraction,
        "cgroup_parents": {c: str(p) for c, p in cluster.cgroup_parents.items()},
        "hosts": [{"name": h.name, "netns": h.netns, "address": h.address, "core": h.core,
                   "cgroups": [str(c) for c in h.cgroups]} for h in cluster.hosts],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--network", required=True)
    parser.add_argument("--memory-mb", type=int)
    parser.add_argument("--cpu-fraction", type=float, help="each host's CPU quota, a share of its core")
    parser.add_argument("--owner-pid", type=int, help="stop the cluster when this process ends")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s keeper[%(process)d]: %(message)s")

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    cluster = EmulatedCluster(args.name, hosts=args.hosts, memory_mb=args.memory_mb, network=args.network,
                              cpu_fraction=args.cpu_fraction)
    with cluster:
        atomic_write_json(args.state, state_of(cluster))
        log.info("cluster %s up: %s", cluster.prefix, cluster.hosts)
        while not stop.wait(1.0):
            if args.owner_pid and not psutil.pid_exists(args.owner_pid):
                log.warning("owner %d is gone: stopping the cluster", args.owner_pid)
                break
        log.info("stopping cluster %s", cluster.prefix)
    atomic_write_json(args.state, {**state_of(cluster), "status": "stopped"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
