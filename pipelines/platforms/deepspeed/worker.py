"""DeepSpeed's training process: the shared loop in one rank, started by DeepSpeed's launcher.

    deepspeed --num_gpus 2 --no_local_rank --module pipelines.platforms.deepspeed.worker \\
        --cell-dir runs/<id>/cells/deepspeed-w2-r0 --launch-time <epoch s>

The launcher (``deepspeed.launcher.launch``, one per node) sets RANK / WORLD_SIZE / LOCAL_RANK,
MASTER_ADDR / MASTER_PORT and LOCAL_SIZE (its name for the local world size). The loop runs as
under every platform (same model, data, seed, phases, checkpoints and result file) with this
seam (``pipelines.training.distributed``):

- ``DeepSpeedDistributed``: the process group joined by torch (gloo on CPU, NCCL on GPU) and
  handed to ``deepspeed.init_distributed``; the model left unwrapped (no DDP: DeepSpeed reduces
  the gradients); the engine is ``pipelines.platforms.deepspeed.engine.DeepSpeedEngine``;
- ``ZeroRuntime``: the strategy's runtime with what ZeRO-3 changes (as FSDP does): every rank
  runs as many evaluation forwards as the rank with the largest share (each forward all-gathers
  the parameters), and the final model is gathered onto rank 0 for its test and export;
- ``CommsLoggerTimer``: the "communication" phase and the bytes per step from DeepSpeed's comms
  logger (every collective DeepSpeed issues, its latency and message size; the ops of the
  epoch's evaluation and checkpoint are dropped at the epoch's end).
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import sys
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.distributed as dist

from pipelines.training.cell import CellSpec
from pipelines.training.distributed import DistEnv, TorchDistributed
from pipelines.training.phases import CommTimer
from pipelines.training.runtime import Replicated

log = logging.getLogger("pipelines.training")


def _ds_comm():
    """``deepspeed.comm.comm``: its comms logger (message sizes) and op timers (latencies)."""
    from deepspeed.comm import comm as ds_comm

    return ds_comm


class CommsLoggerTimer(CommTimer):
    """``take()``: seconds DeepSpeed's collectives took since the last call; also counts their
    message bytes. DeepSpeed's comms logger times every op with a named timer of
    ``deepspeed.comm.comm.timers`` and logs its message size; the latencies it logs are the
    timer's running total (``elapsed(reset=False)``), so the time is read from the timers
    themselves (``elapsed(reset=True)``: the sum of the ops since the last read), the sizes from
    the logger (count x size per op and size)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def _drain(self) -> tuple[float, int]:
        ds_comm = _ds_comm()
        seconds = sum(t.elapsed(reset=True) for t in ds_comm.timers.get_timers().values()) / 1000.0
        size = sum(int(msg_size) * int(entry[0]) for sizes in ds_comm.comms_logger.comms_dict.values()
                   for msg_size, entry in sizes.items())
        ds_comm.comms_logger.reset_data()
        return seconds, size

    def take(self) -> float:
        seconds, size = self._drain()
        self.bytes += size
        return seconds + super().take()

    def discard(self) -> None:
        """Forget what was logged since the last ``take`` (evaluation, checkpoint, set-up)."""
        self._drain()


def skip_op_builds() -> None:
    """Tell DeepSpeed no compiled op is available. This platform uses none (the loop's AdamW, torch's
    collectives); the one DeepSpeed would otherwise build on a CPU host, at every process group's
    start, is the shared-memory all-reduce of its inference path (gcc + ninja, about 2 minutes here
    the first time). DeepSpeed probes its ops once into ``deepspeed.ops.__compatible_ops__`` and
    keeps edits to that table; this fills it first (no probe, no build)."""
    import deepspeed.ops

    if "__compatible_ops__" not in vars(deepspeed.ops):
        deepspeed.ops.__compatible_ops__ = defaultdict(bool)


class ZeroRuntime(Replicated):
    """The loop's runtime for DeepSpeed: ZeRO-3 shards the parameters (see the module docstring)."""

    def __init__(self, strategy, distributed: DeepSpeedDistributed, env: DistEnv,
                 class_counts: Callable[[], list[int]], zero_stage: int) -> None:
        super().__init__(strategy, distributed, env, class_counts)
        self.zero_stage = zero_stage
        self.sharded = zero_stage == 3 and env.world_size > 1

    def eval_batches(self, rows: int, batch_size: int) -> int | None:
        if not self.sharded:
            return None
        return math.ceil(math.ceil(rows / self.env.world_size) / batch_size)

    def final_model(self, model: torch.nn.Module, rebuild: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """ZeRO-3: the parameters gathered (a collective: every rank), one full copy on rank 0."""
        if not self.sharded:
            return model
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            full = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} if self.env.is_main else None
        if not self.env.is_main:
            return model
        copy = rebuild()
        copy.load_state_dict(full)
        return copy.to(self.env.device)

    @property
    def comm_bytes_per_step(self) -> float | None:
        """Bytes of DeepSpeed's collectives per training step, this rank (the comms logger's sizes)."""
        steps = self.hooks.steps if self.hooks is not None else 0
        timer = self.distributed.comm_timer
        if not steps or self.env.world_size == 1 or not timer.bytes:
            return None
        return timer.bytes / steps


class DeepSpeedDistributed(TorchDistributed):
    """DeepSpeed's launcher environment, its process group and engine; no DDP wrapper."""

    def __init__(self, spec: CellSpec) -> None:
        super().__init__()
        self.spec = spec
        self.settings = spec.config.engine("deepspeed")
        self.comm_timer = CommsLoggerTimer()
        self.ds_engine = None  # the engine of this rank (``engine``), released by ``teardown``

    def ranks(self) -> tuple[int, int, int, int | None]:
        """The launcher's RANK / WORLD_SIZE / LOCAL_RANK, and LOCAL_SIZE as the local world size."""
        rank, world, local_rank, local_world = super().ranks()
        local_size = os.environ.get("LOCAL_SIZE")
        return rank, world, local_rank, int(local_size) if local_size else local_world

    def setup(self) -> DistEnv:
        env = super().setup()  # the device, CPU cores, and torch's group (gloo / NCCL) when world > 1
        import deepspeed

        skip_op_builds()
        had_group = dist.is_initialized()
        deepspeed.init_distributed(dist_backend="nccl" if env.device.type == "cuda" else "gloo",
                                   verbose=env.is_main)
        self.created_group = self.created_group or (not had_group and dist.is_initialized())
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its config dumps: the cell's log stays readable
        return env

    def wrap_model(self, model: torch.nn.Module, env: DistEnv) -> torch.nn.Module:
        """The model itself: ``deepspeed.initialize`` (the engine's ``attach``) wraps it."""
        return model

    def runtime(self, strategy, env: DistEnv, class_counts) -> ZeroRuntime:
        return ZeroRuntime(strategy, self, env, class_counts, self.settings.zero_stage)

    def engine(self, env: DistEnv):
        from pipelines.platforms.deepspeed.engine import DeepSpeedEngine, ds_config

        config = ds_config(self.spec.config.training.batch_size, env.world_size, self.settings.zero_stage,
                           self.settings.offload)
        engine = DeepSpeedEngine(config, env.is_main, self.spec.cell.checkpoints)
        engine.after_attach = self.comm_timer.discard  # initialize's broadcasts are no training step's
        self.ds_engine = engine
        return engine

    def on_epoch_end(self, env: DistEnv, epoch: int, checkpoint_path: str | None, metrics: dict) -> None:
        self.comm_timer.discard()  # the evaluation's and checkpoint's collectives

    def teardown(self) -> None:
        """DeepSpeed's engine released (``destroy``: its optimizer's buffers and hooks), then the group."""
        engine, self.ds_engine = self.ds_engine, None
        try:
            if engine is not None and engine.ds is not None:
                engine.ds.destroy()
        finally:
            gc.collect()
            super().teardown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True,
                        help="time.time() when the adapter started; start-up is measured from it")
    args = parser.parse_args(argv)
    from pipelines.training.loop import run_training
    from pipelines.training.process import setup_logging

    setup_logging()
    spec = CellSpec.read(args.cell_dir)
    run_training(spec, args.launch_time, distributed=DeepSpeedDistributed(spec))
    exit_now()


def exit_now(code: int = 0) -> None:
    """Leave without the interpreter's finalization, once the rank's work is done and its group
    destroyed: seen once in 17 local ZeRO-1 cells, a rank aborted at the very end ("terminate
    called without an active exception", exit -6: a C++ thread still joinable when destructed),
    and DeepSpeed's launcher then fails the whole cell. The result is written (rank 0, atomically)
    and the logs flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
