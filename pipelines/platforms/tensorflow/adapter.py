"""TensorFlow's adapter: ``worker.py``'s ranks on one host or across the run's hosts.

One host: ``python -m pipelines.platforms.tensorflow.launcher --nproc N`` in a loopback-only network
namespace of the cell's own (the ranks' gRPC servers listen on every interface), which starts the
ranks on free loopback ports. Several hosts: free ports on every host, then on each host
``--workers <every rank's host:port> --ranks <its ranks>`` (rank r on host r // per_host, rank 0 on
host 0); one host failing stops the others (``execute_on_hosts``), and ``placements.json`` says where
each rank ran.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from pipelines.config import BenchmarkConfig, TrainingStrategy
from pipelines.platforms.contract import TrainingBackend
from pipelines.platforms.tensorflow import MODE
from pipelines.platforms.torchrun import STOP_GRACE_S, execute_on_hosts, host_nproc, host_placements, isolated
from pipelines.training.cell import CellSpec
from pipelines.cluster.processes import free_ports_on, run_to_end
from pipelines.runfolder.fileio import atomic_write_json

LAUNCHER_MODULE = "pipelines.platforms.tensorflow.launcher"
LIBRARIES = ("tensorflow", "keras", "keras_hub")


def missing_libraries() -> list[str]:
    return [name for name in LIBRARIES if importlib.util.find_spec(name) is None]


class TensorFlowBackend(TrainingBackend):
    name = "tensorflow"

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        out = super().preflight(config, cells)
        missing = missing_libraries()
        if missing:
            out.append(f"tensorflow: {', '.join(missing)} not installed in {sys.executable}'s environment: "
                       "pip install -r requirements-tensorflow.txt (scripts/bootstrap.sh does; the compose image "
                       "leaves them out)")
        return out

    def strategy_refusal(self, strategy: TrainingStrategy, world_size: int) -> str | None:
        """MultiWorkerMirroredStrategy is synchronous data parallelism with its own all-reduce: the
        shared loop's strategies (comm hooks, local SGD, FSDP, pipeline, async, class imbalance) are
        written against torch and not re-implemented here."""
        if strategy.name != "default":
            return (f"strategy {strategy.name!r} on tensorflow: its worker trains the default strategy only "
                    "(MultiWorkerMirroredStrategy: every step's gradients all-reduced over the workers); the "
                    "shared loop's strategies are torch code")
        return None

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        cmd = [sys.executable, "-m", LAUNCHER_MODULE, "--cell-dir", str(spec.cell_dir),
               "--launch-time", repr(launch_time), "--nproc", str(spec.world_size)]
        run_to_end(isolated(cmd), dict(os.environ), spec.cell.log, what="tensorflow workers", grace_s=STOP_GRACE_S)

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        per_host = host_nproc(spec.world_size, len(hosts))
        addresses = [f"{host.address}:{port}" for host in hosts for port in free_ports_on(host, per_host)]
        cmds = [[sys.executable, "-m", LAUNCHER_MODULE, "--cell-dir", str(spec.cell_dir),
                 "--launch-time", repr(launch_time), "--workers", ",".join(addresses),
                 "--ranks", ",".join(str(k * per_host + i) for i in range(per_host))]
                for k in range(len(hosts))]
        logs = [spec.cell.log] + [spec.cell.node_log(k) for k in range(1, len(hosts))]
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        try:
            execute_on_hosts(cmds, dict(os.environ), hosts, logs, what="tensorflow workers")
        finally:
            atomic_write_json(spec.cell.placements, host_placements(spec.world_size, hosts))

    def versions(self) -> dict[str, str]:
        return {"launcher": "TF_CONFIG per worker"}

    def platform_fields(self, spec: CellSpec) -> dict:
        hosts = self._hosts_by_cell().pop(spec.cell_dir, 1)
        return {"platform_mode": MODE if hosts == 1 else f"{MODE}-{hosts}-hosts"}
