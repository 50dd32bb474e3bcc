"""The run's standing Spark cluster on its emulated hosts (``pipelines.run.services``): a master
on hosts[0] and a worker on every host, started once before the first standing Spark cell and
kept for the next ones (as teams keep a Spark cluster and submit jobs to it); stopped before a
cell of another platform and at the run's end. A per-job cell starts its own (``hosts.launch``).
"""

from __future__ import annotations

import logging

from pipelines.cluster.processes import identity, still
from pipelines.config import BenchmarkConfig
from pipelines.platforms.spark.hosts import standing_folder as _folder, standing_state as _state, start_daemons, stop_hosts
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths

log = logging.getLogger(__name__)


def _run_hosts(paths: RunPaths) -> list:
    from pipelines.cluster import lifecycle

    state = lifecycle._read(paths)
    if state is None or not lifecycle.is_running(paths):
        raise RuntimeError("the run's emulated cluster is not running: no hosts for the standing Spark cluster")
    return lifecycle.attach(state).hosts


class StandingOnHosts:
    name = "standing Spark cluster on the hosts"

    def at_setup(self, config: BenchmarkConfig) -> bool:
        return False

    def wanted(self, config: BenchmarkConfig) -> bool:
        return config.cluster.kind == "emulated"

    def running(self, paths: RunPaths) -> bool:
        state = _state(paths)
        return bool(state) and all(still(mark) for mark in state.get("identities", []))

    def start(self, paths: RunPaths, config: BenchmarkConfig, tied_to_caller: bool = False) -> str:
        hosts = _run_hosts(paths)
        # one worker core per rank a host runs at the run's largest worker count (one barrier task each)
        per_host = max(max(1, w // len(hosts)) for w in config.matrix.worker_counts)
        cores = per_host * config.training.threads_per_worker
        stop_hosts(hosts)  # what an earlier cell or a failed start left
        url, procs = start_daemons(hosts, _folder(paths), cores, with_procs=True)
        atomic_write_json(_folder(paths) / "state.json", {"url": url, "pids": [p.pid for p in procs],
                                                          "identities": [identity(p.pid) for p in procs],
                                                          "hosts": [h.name for h in hosts]})
        return url

    def stop(self, paths: RunPaths) -> list[int]:
        state = _state(paths)
        if state is None:
            return []
        (_folder(paths) / "state.json").unlink(missing_ok=True)
        try:
            hosts = _run_hosts(paths)
        except RuntimeError:  # the hosts are gone, and everything on them
            return []
        return stop_hosts(hosts)


STANDING_SERVICE = StandingOnHosts()
