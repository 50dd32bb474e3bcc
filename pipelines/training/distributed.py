"""The loop seam: who joins the process group, who wraps the model, who prepares the loaders.

The shared loop (``pipelines.training.loop.run_training``) never decides these itself; it asks
a ``Distributed`` object. The default, ``TorchDistributed``, is what torchrun-started ranks need
(torchrun sets RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, also where a platform starts it):
join the group (nccl on GPU, gloo on CPU) unless one exists, wrap the model in
``DistributedDataParallel`` (the loop registers the strategy's comm hook on it, timed by
``comm_timer``: the "communication" phase), leave the loaders alone, and destroy the group at the end only if
it created it (``optimizer_options``: extra AdamW arguments, none by default). A platform
that owns some of these (its own ranks, process group, model or loader preparation) subclasses it
and overrides the step it owns, without copying the loop; one whose engine owns backward, the
optimizer step and the checkpoint's state returns it from ``engine`` (``pipelines.training.engine``).
Training strategies (``pipelines.training.strategies``) plug in here too: ``sharding=fsdp`` calls
``shard_model`` instead of ``wrap_model``; comm hooks and local SGD are registered on whatever
DistributedDataParallel module ``wrap_model`` returns. A platform's worker (in its package) does,
for example:

    class PlatformDistributed(TorchDistributed):
        def ranks(self): ...                          # from the platform's own worker context
        def on_epoch_end(self, env, epoch, path, m): ...  # hand each epoch's checkpoint to the platform

    run_training(spec, launch_time, distributed=PlatformDistributed())
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipelines.training.engine import TorchEngine
from pipelines.training.phases import CommTimer


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    cores: tuple[int, ...] = ()  # CPU cores this rank is pinned to (CPU hosts)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device_label(self) -> str:
        """What this rank ran on, for the result: ``cuda:0`` or ``cpu:cores 0,1``."""
        if self.device.type == "cuda":
            return f"cuda:{self.device.index}"
        return "cpu:cores " + ",".join(map(str, self.cores)) if self.cores else "cpu"


def pin_cpu_cores(local_rank: int, local_world: int, threads: int, world: int = 1) -> tuple[int, ...]:
    """Give each rank of this node its own ``threads`` cores of the allowed set, so ranks (and
    the host lock's one cell) never share a core; wraps around when cores are short.

    A launcher that starts one process per "node" (a platform running one torchrun per task of
    its own) gives every rank local rank 0 of 1, even when several such nodes share a host: pinning
    would put them all on the same core (measured: 1.9x the training time of two such ranks on one
    2-core host). Those ranks (local world 1 in a larger world) are left to the OS scheduler."""
    allowed = sorted(os.sched_getaffinity(0))
    if local_world == 1 and (world > 1 or len(allowed) < 2):
        return () if world > 1 else tuple(allowed)
    cores = tuple(allowed[(local_rank * threads + i) % len(allowed)] for i in range(threads))
    os.sched_setaffinity(0, cores)
    return cores


def device_name(device: torch.device) -> str:
    return f"cuda:{torch.cuda.get_device_name(device)}" if device.type == "cuda" else "cpu"


def autocast(device: torch.device):
    """bf16 autocast on GPU; full fp32 on CPU (bf16 on CPU is slower here, not faster)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    if env.world_size > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()


class TorchDistributed:
    """torchrun's contract: process group from the environment, DistributedDataParallel wrapping."""

    def __init__(self) -> None:
        self.created_group = False
        self.comm_timer = CommTimer()  # gradient all-reduce time, the "communication" phase

    def ranks(self) -> tuple[int, int, int, int | None]:
        """(rank, world size, local rank, local world size or None when no launcher started
        this process) from torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE."""
        local_world = os.environ.get("LOCAL_WORLD_SIZE")
        return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                int(os.environ.get("LOCAL_RANK", 0)), int(local_world) if local_world else None)

    def cuda_device(self, local_rank: int) -> torch.device:
        """This rank's GPU: CUDA_VISIBLE_DEVICES (set per cell) picks the GPUs, the local rank one."""
        return torch.device("cuda", local_rank)

    def setup(self) -> DistEnv:
        """Read the ranks (``ranks``); join the process group if world > 1."""
        rank, world, local_rank, local_world = self.ranks()
        cores: tuple[int, ...] = ()
        if torch.cuda.is_available():
            device = self.cuda_device(local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
            if local_world is not None:  # started by a launcher (torchrun, a platform's workers)
                cores = pin_cpu_cores(local_rank, local_world, torch.get_num_threads(), world)
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            self.created_group = True
        return DistEnv(rank, world, local_rank, device, cores)

    def wrap_model(self, model: torch.nn.Module, env: DistEnv) -> torch.nn.Module:
        """The module the training steps call; its parameters must be ``model``'s."""
        if env.world_size == 1:
            return model
        # the loop registers the strategy's comm hook on it, timed by ``comm_timer``
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)

    def shard_model(self, model: torch.nn.Module, env: DistEnv) -> torch.nn.Module:
        """Strategy ``sharding=fsdp`` (instead of ``wrap_model``): FSDP2 ``fully_shard`` in place;
        the loop builds the optimizer after it, over the sharded parameters."""
        from pipelines.training.strategies import shard_model

        return shard_model(model)

    def prepare_loader(self, loader, env: DistEnv):
        return loader

    def optimizer_options(self, env: DistEnv) -> dict:
        """Extra keyword arguments for the loop's ``torch.optim.AdamW`` (e.g. ``{"fused": True}``)."""
        return {}

    def runtime(self, strategy, env: DistEnv, class_counts):
        """The cell's strategy runtime for this rank (``pipelines.training.runtime.runtime_for``); a
        framework that shards the model itself (e.g. a ZeRO-3 engine: padded evaluation, the final
        model gathered on rank 0) returns its own ``Replicated`` subclass."""
        from pipelines.training.runtime import runtime_for

        return runtime_for(strategy, self, env, class_counts)

    def engine(self, env: DistEnv) -> TorchEngine:
        """Who runs backward, the optimizer and scheduler steps and the checkpoint's state
        (``pipelines.training.engine``): plain torch by default; a platform whose engine owns
        them returns its own."""
        return TorchEngine()

    def on_epoch_end(self, env: DistEnv, epoch: int, checkpoint_path: str | None, metrics: dict) -> None:
        """Called on every rank at the end of the checkpoint phase of each epoch (``checkpoint_path``:
        the file rank 0 just wrote, None on the other ranks): a platform that tracks
        checkpoints itself registers it here (its own report call). Nothing by default."""

    def teardown(self) -> None:
        """Destroy the process group if (and only if) ``setup`` created it."""
        if self.created_group and dist.is_initialized():
            dist.destroy_process_group()
        self.created_group = False
