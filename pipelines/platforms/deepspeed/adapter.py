"""DeepSpeed's adapter: its own launcher (the ``deepspeed`` command) starts the shared loop.

The ``deepspeed`` command is ``deepspeed.launcher.runner``; it is run as
``python -m deepspeed.launcher.runner`` (the same ``main``, in the interpreter of the project).

One host: ``--num_gpus <workers>`` (on a CPU host the "GPUs" are rank slots; DeepSpeed's CPU
accelerator, ``DS_ACCELERATOR=cpu``, would otherwise count NUMA nodes), ``--master_port`` a free
port, run in a private network namespace where one can be made (as torchrun's standalone cells
are), ``--no_local_rank`` (the worker reads LOCAL_RANK from the environment) and ``--module``.
The runner starts ``deepspeed.launcher.launch``, which starts the ranks and stops them all when
one fails. GPU hosts: ``DS_ACCELERATOR=cuda`` and NCCL; CPU hosts: gloo (no oneCCL needed).

Several hosts (``launch_on_hosts``, e.g. the hosts of ``pipelines.cluster.EmulatedCluster``, or
SSH hosts): a hostfile (``<cell>/hostfile``, ``h<k> slots=<per host>``) and DeepSpeed's
``--no_ssh`` per-node mode: one ``deepspeed --hostfile F --no_ssh --node_rank k --master_addr
<host 0> --master_port P`` per host, started by the project's ``Host.run``, as the DDP adapter
starts one torchrun per host. Why not its default multi-node runner (pdsh over SSH from node 0):
it needs passwordless SSH from the driver's host into every host (an sshd in each emulated
host's namespace, host keys, an authorized key made for the purpose) and ``pdsh``; the processes
it starts would hang off sshd, outside what ``Host.run`` tracks (the host's cgroups and
namespace: resources, the host-loss fault and clean-up all go through it). ``--no_ssh`` is the
mode DeepSpeed documents for clusters whose scheduler starts one launcher per node, which is
what ``Host.run`` is. Global rank = node rank x per host + local rank, the hostfile's order,
so rank 0 is on host 0 (``placements.json``); gloo / NCCL are bound to the hosts' ``eth0``.

Recovery: DeepSpeed's launcher restarts nothing (``matrix.platform_retries`` does not apply);
a lost host fails the attempt and the project's retry resumes from the last checkpoint.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys
from pathlib import Path

from pipelines.cluster.processes import free_port, free_port_on, run_to_end
from pipelines.config import BenchmarkConfig, TrainingStrategy
from pipelines.platforms import torchrun
from pipelines.platforms.contract import TrainingBackend
from pipelines.runfolder.fileio import atomic_write_json, atomic_write_text
from pipelines.training.cell import CellSpec

log = logging.getLogger(__name__)
WORKER = "pipelines.platforms.deepspeed.worker"
RUNNER = "deepspeed.launcher.runner"  # the `deepspeed` command's module
STOP_GRACE_S = 35.0  # its launch.py gives the ranks 30 s after SIGTERM


def local_slots(world_size: int, env: dict[str, str], gpus: int) -> list[str]:
    """The runner's options for ``world_size`` ranks on this host: on a CPU host ``--num_gpus N``
    (rank slots); on a GPU host ``--include localhost:<ids>``, the first ``world_size`` of the GPUs
    CUDA_VISIBLE_DEVICES names (all when unset): the runner would drop CUDA_VISIBLE_DEVICES
    itself and count from GPU 0."""
    if not gpus:
        return ["--num_gpus", str(world_size)]
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or \
        [str(i) for i in range(gpus)]
    if world_size > len(visible):
        raise ValueError(f"deepspeed: {world_size} workers need {world_size} GPUs (one rank per GPU); this host "
                         f"has {len(visible)} ({', '.join(visible)})")
    return ["--include", "localhost:" + ",".join(visible[:world_size])]


def runner_command(module: str, cell_dir: Path, launch_time: float, *, master_port: int,
                   slots: list[str] | None = None, hostfile: Path | None = None, node_rank: int | None = None,
                   master_addr: str | None = None, python: str = sys.executable) -> list[str]:
    """The ``deepspeed`` command line of one node: on this host alone (``slots``: ``local_slots``)
    or as node ``node_rank`` of a hostfile's nodes (``--no_ssh``)."""
    cmd = [python, "-m", RUNNER, "--master_port", str(master_port)]
    if hostfile is None:
        cmd += list(slots or [])
    else:
        cmd += ["--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(node_rank), "--master_addr",
                str(master_addr)]
    return [*cmd, "--no_local_rank", "--module", module, "--cell-dir", str(cell_dir),
            "--launch-time", repr(launch_time)]


def hostfile_text(hosts: list, per_host: int) -> str:
    """DeepSpeed's hostfile: ``<name> slots=<processes>`` per host, in node-rank order."""
    return "".join(f"{host.name} slots={per_host}\n" for host in hosts)


def accelerator_env(env: dict[str, str], gpus: bool | None = None) -> dict[str, str]:
    """``DS_ACCELERATOR``: cuda on GPU hosts, cpu (gloo) elsewhere."""
    gpus = torchrun.has_gpus() if gpus is None else gpus
    return {**env, "DS_ACCELERATOR": "cuda" if gpus else "cpu"}


def execute(cmd: list[str], env: dict[str, str], log_path: Path) -> None:
    """Run one ``deepspeed`` launcher to completion, teeing its output to ``log_path``; raise with
    the tail when it fails. Interrupted, it stops the launcher's tree; killed outright, its guard does (the
    runner dies of the kernel's SIGTERM without passing it on: pipelines.cluster.tree_guard)."""
    guarded = [sys.executable, "-m", "pipelines.cluster.tree_guard", "--grace-s", str(STOP_GRACE_S), "--", *cmd]
    run_to_end(guarded, env, log_path, what="deepspeed", grace_s=STOP_GRACE_S + 5)


class DeepSpeedBackend(TrainingBackend):
    name = "deepspeed"

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        if importlib.util.find_spec("deepspeed") is None:
            return [("deepspeed: the deepspeed package is not installed here (requirements.txt pins it; install "
                     "with DS_BUILD_OPS=0: its ops are built only when used, and this platform uses none)")]
        gpus = torchrun.gpu_count() if config.cluster.kind == "local" else 0  # one host: one rank per GPU
        found = []
        for _, workers in cells:
            try:
                local_slots(workers, dict(os.environ), gpus)
            except ValueError as err:
                found.append(str(err))
        return [*dict.fromkeys(found), *super().preflight(config, cells)]

    def strategy_refusal(self, strategy: TrainingStrategy, world_size: int) -> str | None:
        """DeepSpeed reduces (ZeRO: partitions) the gradients itself: the DDP-only strategies do not
        apply. Class imbalance (the loop's sampler or loss weights) runs as everywhere."""
        if strategy.comm_hook != "none" or strategy.sync_every > 1:
            return (f"strategy {strategy.name!r} on deepspeed: DDP comm hooks and local SGD are registered on a "
                    "DistributedDataParallel model, and DeepSpeed's engine reduces the gradients itself (no DDP "
                    "wrapper); compare ZeRO stages with engines.deepspeed.zero_stage instead")
        if strategy.sharding == "fsdp":
            return ("strategy 'fsdp' on deepspeed: DeepSpeed shards with ZeRO, not FSDP; ZeRO-3 partitions the "
                    "parameters as FSDP does: set engines.deepspeed.zero_stage=3")
        if strategy.pipeline_microbatches:
            return (f"strategy {strategy.name!r} on deepspeed: DeepSpeed's engine runs the whole model's forward "
                    "and backward on every rank (its own pipeline engine, deepspeed.pipe, is not wired in); "
                    "run pipeline cells on a platform that runs the shared loop with its own wrapper")
        if strategy.asynchronous:
            return (f"strategy {strategy.name!r} on deepspeed: DeepSpeed's engine steps the optimizer itself after "
                    "reducing the gradients, so no parameter server can take the update; run async cells on a "
                    "platform whose shared loop steps its own optimizer")
        return super().strategy_refusal(strategy, world_size)

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        self._hosts_by_cell().pop(spec.cell_dir, None)
        gpus = torchrun.gpu_count()
        env = accelerator_env(torchrun.launch_env(spec.config, os.environ, gpus=0), gpus=bool(gpus))
        slots = local_slots(spec.world_size, env, gpus)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # in the slots; the launcher sets it for its ranks
        cmd = runner_command(WORKER, spec.cell_dir, launch_time, master_port=free_port(), slots=slots)
        self._warn_retries(spec)
        execute(torchrun.isolated(cmd), env, spec.cell.log)

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """One ``deepspeed --no_ssh`` per host (node rank = index), master on host 0; writes the
        cell's hostfile and ``placements.json``."""
        per_host = torchrun.host_nproc(spec.world_size, len(hosts))
        hostfile = atomic_write_text(spec.cell.root / "hostfile", hostfile_text(hosts, per_host))
        port = free_port_on(hosts[0])
        cmds = [runner_command(WORKER, spec.cell_dir, launch_time, master_port=port, hostfile=hostfile,
                               node_rank=k, master_addr=hosts[0].address) for k in range(len(hosts))]
        env = accelerator_env(torchrun.host_env(spec.config, os.environ, per_host))
        env.pop("CUDA_VISIBLE_DEVICES", None)  # the launcher sets it from the hostfile's slots
        logs = [spec.cell.log] + [spec.cell.node_log(k) for k in range(1, len(hosts))]
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        self._warn_retries(spec)
        try:
            torchrun.execute_on_hosts(cmds, env, hosts, logs, what="the deepspeed launcher")
        except RuntimeError as err:
            raise RuntimeError(str(err).replace("torchrun on", "deepspeed on", 1)) from None
        finally:
            atomic_write_json(spec.cell.placements, torchrun.host_placements(spec.world_size, hosts))

    def _warn_retries(self, spec: CellSpec) -> None:
        if spec.config.matrix.platform_retries:
            log.warning("deepspeed: its launcher restarts nothing; matrix.platform_retries=%d does not apply "
                        "(the project's cell retry resumes from the last checkpoint)",
                        spec.config.matrix.platform_retries)

    def versions(self) -> dict[str, str]:
        try:
            version = importlib.metadata.version("deepspeed")
        except importlib.metadata.PackageNotFoundError:
            version = "missing"
        return {"deepspeed": version, "launcher": "deepspeed"}

    def platform_fields(self, spec: CellSpec) -> dict:
        mode = spec.config.engine(self.name).mode
        hosts = self._hosts_by_cell().get(spec.cell_dir)
        return {"platform_mode": f"{mode}-{hosts}-hosts" if hosts else mode}
