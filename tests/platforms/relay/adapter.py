"""Relay's adapter: the shared worker under torchrun, through the launch helpers every
torchrun-based platform uses; across hosts one torchrun per host (static rendezvous on host 0)."""

from __future__ import annotations

import os

from pipelines.cluster.processes import free_port_on
from pipelines.platforms import torchrun
from pipelines.platforms.contract import TrainingBackend
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.training.cell import CellSpec

WORKER = "tests.platforms.relay.worker"


def _env(spec: CellSpec, base, processes: int, hosts=None) -> dict[str, str]:
    """The ranks import this folder's worker by name: the project root on their path."""
    env = (torchrun.host_env(spec.config, base, processes) if hosts
           else torchrun.launch_env(spec.config, base, processes))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


class RelayBackend(TrainingBackend):
    name = "relay"

    def preflight(self, config, cells):
        limit = config.engine(self.name).max_workers
        too_many = [f"relay: {n} workers is over engines.relay.max_workers={limit}" for _, n in cells if n > limit]
        return [*too_many, *super().preflight(config, cells)]

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        self._hosts_by_cell().pop(spec.cell_dir, None)
        cmd = torchrun.worker_command(spec.config, spec.world_size, spec.cell_dir, launch_time, module=WORKER)
        torchrun.execute(cmd, _env(spec, os.environ, spec.world_size), spec.cell.log)

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        per_host = torchrun.host_nproc(spec.world_size, len(hosts))
        port = free_port_on(hosts[0])
        cmds = torchrun.host_torchrun_commands(spec.world_size, spec.cell_dir, launch_time, hosts, port,
                                               max_restarts=spec.config.matrix.platform_retries, module=WORKER)
        logs = [spec.cell.log] + [spec.cell.node_log(k) for k in range(1, len(hosts))]
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        try:
            torchrun.execute_on_hosts(cmds, _env(spec, os.environ, per_host, hosts), hosts, logs)
        finally:  # which host each rank ran on (the result's placements)
            atomic_write_json(spec.cell.placements, torchrun.host_placements(spec.world_size, hosts))

    def platform_fields(self, spec: CellSpec) -> dict:
        hosts = self._hosts_by_cell().get(spec.cell_dir)
        return {"platform_mode": f"relay-{hosts}-hosts" if hosts else "relay-local"}
