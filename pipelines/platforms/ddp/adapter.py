"""PyTorch DDP through torchrun: ``python -m torch.distributed.run ... -m pipelines.training.worker``.

``workers`` (the cell's world size) is the TOTAL number of processes, over all nodes.

One node (default): ``--standalone --nproc-per-node <workers>``. Several nodes: set
``ddp_nnodes``, ``ddp_node_rank`` and ``ddp_rdzv_endpoint`` (host:port on node 0, where the
rendezvous store listens) and run the same cell of the same run folder on every node, each
with its own node rank (tests/platforms/ddp/test_multinode_ddp.py does it on loopback):

    cfg = read_config(paths.config).model_copy(update=dict(
        ddp_nnodes=2, ddp_node_rank=K, ddp_rdzv_endpoint="node0:29400"))
    run_cell(cfg, paths, "ddp", workers=4)          # on node K = 0, 1: 2 processes each

Each node starts ``workers / ddp_nnodes`` processes (not divisible -> ``ValueError``). The
rendezvous is torchrun's *static* one, so global rank = node_rank * nproc_per_node +
local_rank and rank 0 always runs on node 0 (the c10d rendezvous would order nodes by host
name/pid instead, and rank 0 could land anywhere). The run folder must be on storage every
node sees at the same path. Node 0 does what a single node does (writes ``cell.json``, reads
rank 0's ``worker_result.json``, writes ``result.json``). A node with rank > 0 writes
nothing but its own log ``train-node<k>.log``: after its processes exit it waits (at most
``SECONDARY_RESULT_WAIT_S``) until node 0 has (re)written ``result.json`` and returns that
result, so every node's ``run_cell`` returns the same record. Should a node > 0 fail,
``run_cell`` records the failure in ``result.json`` as for any cell; node 0 finishing later
writes its own result over it.

Several hosts driven from this process (``run_cell(..., hosts=cluster.hosts)``, e.g. the hosts of
``pipelines.cluster.EmulatedCluster``): ``launch_on_hosts`` starts one torchrun per host
(``host.run``) with node rank = host index, the static rendezvous on ``host0.address:<free
port>`` and ``workers / len(hosts)`` processes each; gloo is bound to the hosts' ``eth0``. Node
0 logs to ``train.log``, node k to ``train-node<k>.log``; one node failing stops the others.
The config keeps ``engines.ddp.nnodes = 1`` (this process is every node's driver); the result
says ``platform_mode = torchrun-<k>-nodes``. Beside it the cell gets ``placements.json`` (rank ->
host, from the static rendezvous) and ``link_bytes.json`` (bytes each host's interface sent and
received during the launch).

``engines.ddp.elastic`` (across the run's hosts only): torchrun's elastic mode instead, ``--nnodes
MIN:MAX`` (MIN = ``engines.ddp.elastic_min_nodes``) with the c10d rendezvous on host 0 and
``--max-restarts`` = ``matrix.platform_retries``. A lost host's agent exiting is then not the end of
the cell: the survivors' agents restart their workers at the smaller world size and the training
loop resumes from the last checkpoint at that size; the cell ends when the survivors finish. The
same command started again on the lost host (``fault=host_return``) rejoins, and the agents grow
back to the full world size. Losing host 0 loses the rendezvous store: the survivors cannot go
on, and only the project's retry recovers the cell. The rendezvous, not the host index, orders the
nodes, so rank 0 may run on any host (it writes the result into the shared cell folder).

The command, environment and execution come from ``pipelines.platforms.torchrun`` (torchrun's command
line, the ranks' environment, teeing the output to ``<cell>/train.log``), which other platforms that
start ranks with torchrun use too, each with its own entry module.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.cluster.processes import free_port_on
from pipelines.measure import faults
from pipelines.platforms.torchrun import (elastic_host_commands, execute, execute_on_hosts, host_env, host_nproc,
                                          host_placements, host_torchrun_commands, launch_env, nproc_per_node,
                                          worker_command)
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.runfolder.results import CellResult

log = logging.getLogger(__name__)
# How long a node > 0 waits, after its own processes exit, for node 0's result.json: rank 0
# still runs the final test evaluation then (seconds on the smoke profile, minutes on paper).
SECONDARY_RESULT_WAIT_S = 1800.0


def torchrun_nodes(config: BenchmarkConfig) -> dict:
    """This node among the launch's nodes, from the platform's own settings (``engines.ddp``):
    torchrun's ``nnodes``, ``node_rank`` and ``rdzv_endpoint`` (one node by default)."""
    ddp = config.engine("ddp")
    return {"nnodes": ddp.nnodes, "node_rank": ddp.node_rank, "rdzv_endpoint": ddp.rdzv_endpoint}


def _file_version(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns  # CellResult.write replaces the file: a new inode


def wait_for_new_result(path: Path, before: tuple[int, int] | None, timeout: float,
                        interval: float = 0.5) -> CellResult:
    """Node 0's result.json once it differs from the version seen at launch (``before``)."""
    deadline = time.monotonic() + timeout
    while True:
        if _file_version(path) not in (None, before):
            return CellResult.read(path)
        if time.monotonic() > deadline:
            raise TimeoutError(f"node 0 wrote no new {path} within {timeout:.0f}s after this node's "
                               "processes finished; see node 0's train.log")
        time.sleep(interval)


class DDPBackend(TrainingBackend):
    name = "ddp"

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths,
            cell: CellPaths | None = None, repeat: int = 0, strategy: str | None = None,
            hosts: list | None = None) -> CellResult:
        strategy = strategy or config.matrix.strategies[0].name
        cell = cell or paths.cell(self.name, world_size, repeat, strategy)
        if hosts:
            return self._run_on_hosts(config, world_size, paths, cell, repeat, strategy, hosts)
        nproc_per_node(world_size, config.engine("ddp").nnodes)  # refuse a bad split before anything is written
        # every node: missing inputs and unsupported strategies fail before the rendezvous
        self.spec(config, world_size, paths, cell, repeat, strategy)
        if config.engine("ddp").node_rank == 0:
            return super().run(config, world_size, paths=paths, cell=cell, repeat=repeat, strategy=strategy)
        return self._run_secondary_node(config, world_size, cell)

    def _run_on_hosts(self, config: BenchmarkConfig, world_size: int, paths: RunPaths, cell: CellPaths,
                      repeat: int, strategy: str, hosts: list) -> CellResult:
        """Every node from here (``launch_on_hosts``): refuse what cannot work before anything is written."""
        ddp = config.engine("ddp")
        if ddp.nnodes != 1 or ddp.node_rank != 0 or ddp.rdzv_endpoint:
            raise ValueError(f"ddp: hosts= drives every node from this process; leave engines.ddp as one node "
                             f"(got nnodes={ddp.nnodes}, node_rank={ddp.node_rank}, "
                             f"rdzv_endpoint={ddp.rdzv_endpoint!r})")
        host_nproc(world_size, len(hosts))  # a bad split
        try:
            return super().run(config, world_size, paths=paths, cell=cell, repeat=repeat, strategy=strategy,
                               hosts=hosts)
        finally:
            self._hosts_by_cell().pop(cell.root, None)

    def _run_secondary_node(self, config: BenchmarkConfig, world_size: int, cell: CellPaths) -> CellResult:
        """Node k > 0: start this node's ranks, then return the result node 0 writes."""
        node = config.engine("ddp").node_rank
        cell.root.mkdir(parents=True, exist_ok=True)
        before = _file_version(cell.result)  # node 0 cannot finish before this node joined
        launch_time = time.time()
        nodes = torchrun_nodes(config)
        per_node = nproc_per_node(world_size, nodes["nnodes"])
        log.info("ddp: node %d/%d of %s, %d process(es) here", node, nodes["nnodes"], cell.name, per_node)
        # cell.json is node 0's: its workers and ours read it only after the rendezvous.
        cmd = worker_command(config, world_size, cell.root, launch_time, **nodes)
        execute(cmd, launch_env(config, os.environ, per_node), cell.node_log(node))
        result = wait_for_new_result(cell.result, before, SECONDARY_RESULT_WAIT_S)
        if result.status != "ok":
            raise RuntimeError(f"node 0 reported the cell failed: {result.error}")
        log.info("ddp: node %d done; node 0 wrote %s", node, cell.result)
        return result

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        nodes = torchrun_nodes(spec.config)
        cmd = worker_command(spec.config, spec.world_size, spec.cell_dir, launch_time, **nodes)
        env = launch_env(spec.config, os.environ, nproc_per_node(spec.world_size, nodes["nnodes"]))
        execute(cmd, env, spec.cell.log)

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """One torchrun per host (node rank = index), static rendezvous on host 0; writes the cell's
        ``placements.json`` (``run`` records what each host's interface moved meanwhile).
        ``engines.ddp.elastic``: ``_launch_elastic``."""
        if spec.config.engine("ddp").elastic:
            return self._launch_elastic(spec, launch_time, hosts)
        per_host = host_nproc(spec.world_size, len(hosts))
        port = free_port_on(hosts[0])
        cmds = host_torchrun_commands(spec.world_size, spec.cell_dir, launch_time, hosts, port,
                                      max_restarts=spec.config.matrix.platform_retries)
        env = host_env(spec.config, os.environ, per_host)
        logs = [spec.cell.log] + [spec.cell.node_log(k) for k in range(1, len(hosts))]
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        try:
            execute_on_hosts(cmds, env, hosts, logs)
        finally:
            atomic_write_json(spec.cell.placements, host_placements(spec.world_size, hosts))

    def _launch_elastic(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """One elastic torchrun per host, c10d rendezvous on host 0: the survivors of a lost host go
        on at a smaller world size, and the same command started again on that host (what
        ``fault=host_return`` does, as an operator's supervisor would) brings it back in. No
        ``placements.json``: the rendezvous orders the nodes, so the ranks' own report says where
        each ran (the cell folder is shared: rank 0 writes the result from whichever host)."""
        config = spec.config
        min_nodes = min(config.engine("ddp").elastic_min_nodes, len(hosts))
        if config.matrix.fault != "none" and config.matrix.platform_retries < 1:
            raise ValueError("engines.ddp.elastic recovers a lost host only with matrix.platform_retries >= 1 "
                             "(flat name: platform_retries; torchrun's --max-restarts): got 0")
        per_host = host_nproc(spec.world_size, len(hosts))
        cmds = elastic_host_commands(spec.world_size, spec.cell_dir, launch_time, hosts, free_port_on(hosts[0]),
                                     min_nodes=min_nodes, max_restarts=config.matrix.platform_retries)
        env = host_env(config, os.environ, per_host)
        # each round's rank 0 publishes its own store address: with the agent's shared store (the
        # default) a node that rejoins waits for MASTER_ADDR that the round's rank 0, holding its store
        # from round 0, never writes again (torch 2.13: DistStoreError after 60 s, measured here)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        logs = [spec.cell.log] + [spec.cell.node_log(k) for k in range(1, len(hosts))]
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        for host, cmd, log_path in zip(hosts, cmds, logs):  # what a returning host runs again
            faults.offer_restart(spec.cell, host, cmd, env, log_path)
        try:
            execute_on_hosts(cmds, env, hosts, logs, elastic=True)
        finally:
            faults.withdraw_restarts(spec.cell)

    def versions(self) -> dict[str, str]:
        return {"launcher": "torchrun"}

    def platform_fields(self, spec: CellSpec) -> dict:
        nodes = self._hosts_by_cell().get(spec.cell_dir) or spec.config.engine("ddp").nnodes
        elastic = "-elastic" if nodes > 1 and spec.config.engine("ddp").elastic else ""
        return {"platform_mode": "torchrun" if nodes == 1 else f"torchrun{elastic}-{nodes}-nodes"}
